"""A request's life: its tokens, how many are computed, and when each came out.

A request is WAITING until the scheduler admits it, RUNNING while it has
tokens in the KV cache, FINISHED at the end. "Prefill" and "decode" are not
states of the code, only of the counters: the request is decoding when all
its tokens but the last sampled one are in the cache.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .logprobs import check_num_logprobs
from .validation import check_bool, check_int, check_int_sequence, check_real

# torch's CPU generator keeps only the low 32 bits of a seed (0, 2**32 and
# 2**63 give the same samples), so a larger seed is refused, not folded.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0          # 0: greedy
    top_k: int | None = None          # None: no top-k filter
    top_p: float = 1.0                # nucleus sampling; 1.0: off
    seed: int | None = None           # per-request generator, reproducible alone
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None         # per output token: its logprob and the top k (logprobs.py)
    prompt_logprobs: int | None = None  # per prompt token after the first: the same

    def __post_init__(self):
        # Normalise to plain Python values: numpy integers are welcome, and a
        # value that passes here must work everywhere downstream (sampling
        # runs after the scheduler committed the step).
        fields = dict(
            max_tokens=check_int("max_tokens", self.max_tokens, 1, hint="max_tokens=32"),
            temperature=check_real("temperature", self.temperature, 0, hint="0 for greedy, 0.8 to sample"),
            top_k=check_int("top_k", self.top_k, 1, allow_none=True, hint="None or 50"),
            top_p=check_real("top_p", self.top_p, 0, 1, exclusive_minimum=True, hint="1.0 for off, 0.9"),
            seed=check_int("seed", self.seed, 0, MAX_SEED, allow_none=True,
                           hint="a seed below 2**32; torch's generator keeps 32 bits"),
            stop_token_ids=() if self.stop_token_ids is None else check_int_sequence(
                "stop_token_ids", self.stop_token_ids, 0, hint="[2] or None"),
            ignore_eos=check_bool("ignore_eos", self.ignore_eos),
            logprobs=check_num_logprobs("logprobs", self.logprobs),
            prompt_logprobs=check_num_logprobs("prompt_logprobs", self.prompt_logprobs),
        )
        for name, value in fields.items():
            object.__setattr__(self, name, value)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timestamps in seconds on the engine's clock, and the serving metrics.

    TTFT = first token - arrival; TPOT = (E2E - TTFT) / (output tokens - 1),
    a per-request mean; ITL = every gap between consecutive token arrivals. The
    tokens of one step arrive together (speculative decoding emits several), stamped
    with one time, as one streamed chunk: that is one gap, as `vllm bench serve`
    counts it (one ITL per chunk, vllm/benchmarks/lib/endpoint_request_func.py).
    """
    arrival_time: float
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between arrivals: tokens stamped with the same time came in one step."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:]) if b != a]


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int] | None
    prompt_len: int
    output_token_ids: list[int]
    finished: bool
    metrics: RequestMetrics
    finish_reason: str | None = None     # "length", "eos", "stop", "abort", "error"
    error: str | None = None             # finish_reason "error": what went wrong
    tag: str | None = None               # workload label, e.g. "long" or "decoder"
    text: str | None = None              # the output decoded so far, when the engine has a tokenizer
    # SamplingParams.logprobs: one {token_id: logprob} per output token (the token, then the top k)
    logprobs: list[dict[int, float]] | None = None
    # SamplingParams.prompt_logprobs: one such dict per prompt position, None for the first;
    # filled chunk by chunk, so a request still in its prefill holds the positions computed so far
    prompt_logprobs: list[dict[int, float] | None] | None = None


class Request:
    def __init__(self, request_id: int, prompt_token_ids: list[int] | None, params: SamplingParams,
                 arrival_time: float, prompt_len: int | None = None, tag: str | None = None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.prompt_len = len(prompt_token_ids) if prompt_token_ids is not None else int(prompt_len)
        self.params = params
        self.tag = tag
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0          # tokens whose K/V are in the cache
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None         # why a request finished with "error"
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.text: str | None = None          # set by an engine that has a tokenizer
        self.logprobs: list[dict[int, float]] | None = None if params.logprobs is None else []
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            None if params.prompt_logprobs is None else [None])

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """One token left to compute, and it is a sampled one."""
        return bool(self.output_token_ids) and self.num_uncomputed_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output (the real engine needs ids)."""
        prompt = self.prompt_token_ids
        if end <= self.prompt_len:
            return prompt[start:end]
        return (prompt + self.output_token_ids)[start:end]

    def append_token(self, token_id: int, time_s: float) -> None:
        self.output_token_ids.append(int(token_id))
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = time_s
        self.metrics.token_times.append(time_s)

    def next_prompt_logprob_position(self) -> int | None:
        """The first prompt position whose logprobs are still missing (None: not
        asked, or all there). A recompute after preemption does not fill them twice."""
        if self.prompt_logprobs is None or len(self.prompt_logprobs) >= self.prompt_len:
            return None
        return len(self.prompt_logprobs)

    def add_prompt_logprobs(self, first_position: int, entries: list[dict[int, float]]) -> None:
        """Record the logprobs of prompt positions first_position, first_position + 1, ..."""
        if first_position != len(self.prompt_logprobs):
            raise ValueError(f"prompt logprobs from position {first_position}: positions "
                             f"0..{len(self.prompt_logprobs) - 1} are filled, so the next is {len(self.prompt_logprobs)}")
        self.prompt_logprobs.extend(entries[:self.prompt_len - first_position])

    def check_stop(self, eos_token_ids: tuple[int, ...]) -> str | None:
        last = self.output_token_ids[-1]
        if not self.params.ignore_eos and last in eos_token_ids:
            return "eos"
        if last in self.params.stop_token_ids:
            return "stop"
        if len(self.output_token_ids) >= self.params.max_tokens:
            return "length"
        return None

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            # A copy: the caller may edit its output without editing the request.
            request_id=self.request_id,
            prompt_token_ids=None if self.prompt_token_ids is None else list(self.prompt_token_ids),
            prompt_len=self.prompt_len, output_token_ids=list(self.output_token_ids),
            finished=self.is_finished, metrics=self.metrics, finish_reason=self.finish_reason,
            error=self.error, tag=self.tag, text=self.text,
            logprobs=None if self.logprobs is None else list(self.logprobs),
            prompt_logprobs=None if self.prompt_logprobs is None else list(self.prompt_logprobs))

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.value}, prompt={self.prompt_len}, "
                f"out={len(self.output_token_ids)}, computed={self.num_computed_tokens})")
