"""A request's life: its tokens, how many are computed, and when each came out.

A request is WAITING until the scheduler admits it, RUNNING while it has
tokens in the KV cache, FINISHED at the end. "Prefill" and "decode" are not
states of the code, only of the counters: the request is decoding when all
its tokens but the last sampled one are in the cache.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from numbers import Integral, Real


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0          # 0: greedy
    top_k: int | None = None          # None: no top-k filter
    top_p: float = 1.0                # nucleus sampling; 1.0: off
    seed: int | None = None           # per-request generator, reproducible alone
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, Integral) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r}: must be an integer >= 1")
        if not isinstance(self.temperature, Real) or not self.temperature >= 0 or math.isinf(self.temperature):
            raise ValueError(f"temperature={self.temperature!r}: must be a finite number >= 0 (0 = greedy)")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, Integral)
                                       or self.top_k < 1):
            raise ValueError(f"top_k={self.top_k!r}: must be None or an integer >= 1")
        if not isinstance(self.top_p, Real) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, Integral)):
            raise ValueError(f"seed={self.seed!r}: must be None or an integer")
        stops = self.stop_token_ids or ()
        if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in stops):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r}: must be integers")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timestamps in seconds on the engine's clock, and the serving metrics.

    TTFT = first token - arrival; TPOT = (E2E - TTFT) / (output tokens - 1),
    a per-request mean; ITL = every gap between consecutive tokens.
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
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int] | None
    prompt_len: int
    output_token_ids: list[int]
    finished: bool
    metrics: RequestMetrics
    finish_reason: str | None = None     # "length", "eos", "stop"
    tag: str | None = None               # workload label, e.g. "long" or "decoder"
    text: str | None = None              # the output decoded so far, when the engine has a tokenizer


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
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.text: str | None = None          # set by an engine that has a tokenizer

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
            request_id=self.request_id, prompt_token_ids=self.prompt_token_ids,
            prompt_len=self.prompt_len, output_token_ids=list(self.output_token_ids),
            finished=self.is_finished, metrics=self.metrics, finish_reason=self.finish_reason,
            tag=self.tag, text=self.text)

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.value}, prompt={self.prompt_len}, "
                f"out={len(self.output_token_ids)}, computed={self.num_computed_tokens})")
