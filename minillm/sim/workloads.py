"""Workloads: who arrives when, with how long a prompt and how many tokens.

A Workload is plain data, served the same way by the real engine
(LLMEngine.run_workload) and by the simulator.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..validation import check_instance, check_int, check_real


@dataclass(frozen=True)
class WorkloadRequest:
    prompt_len: int
    max_tokens: int
    arrival_time: float = 0.0                   # seconds after the start
    after: tuple[str, int] | None = None        # or: once every request tagged
                                                # after[0] has after[1] output tokens
    tag: str = ""

    def __post_init__(self):
        # Checked here, not when served: a zero-length prompt or a NaN arrival
        # used to make run_workload spin forever.
        object.__setattr__(self, "prompt_len", check_int("prompt_len", self.prompt_len, 1, hint="64"))
        object.__setattr__(self, "max_tokens", check_int("max_tokens", self.max_tokens, 1, hint="16"))
        object.__setattr__(self, "arrival_time", check_real("arrival_time", self.arrival_time, 0,
                                                            hint="0.0, seconds after the start"))
        check_instance("tag", self.tag, str, "a string")
        if self.after is not None:
            if not isinstance(self.after, (tuple, list)) or len(self.after) != 2 \
                    or not isinstance(self.after[0], str):
                raise ValueError(f"after={self.after!r}: must be None or (tag, num_output_tokens) "
                                 "(try ('decoder', 8))")
            object.__setattr__(self, "after", (self.after[0], check_int("after[1]", self.after[1], 0)))

    def is_due(self, now: float, requests) -> bool:
        if self.after is None:
            return self.arrival_time <= now
        tag, num_tokens = self.after
        tagged = [r for r in requests if r.tag == tag]
        return bool(tagged) and all(len(r.output_token_ids) >= num_tokens or r.is_finished for r in tagged)


@dataclass(frozen=True)
class Workload:
    requests: tuple[WorkloadRequest, ...]
    seed: int = 0
    description: str = ""
    params: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        requests = tuple(self.requests)
        for i, spec in enumerate(requests):
            check_instance(f"requests[{i}]", spec, WorkloadRequest, "a WorkloadRequest")
            # `after` must name a tag of an EARLIER request: an unknown tag or a
            # cycle would wait forever, and the request would produce no output.
            if spec.after is not None and not any(r.tag == spec.after[0] for r in requests[:i]):
                known = sorted({r.tag for r in requests[:i]})
                raise ValueError(f"requests[{i}].after={spec.after!r}: no earlier request is tagged "
                                 f"{spec.after[0]!r} (earlier tags: {known})")
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "seed", check_int("seed", self.seed))

    def prompt_ids(self, index: int, vocab_size: int | None) -> list[int] | None:
        """Seeded random prompt tokens (None when no vocabulary: simulation)."""
        if vocab_size is None:
            return None
        rng = random.Random(self.seed * 1_000_003 + index)
        return [rng.randrange(vocab_size) for _ in range(self.requests[index].prompt_len)]


def long_prompt_interference(prompt_len: int = 2048, num_decoders: int = 4,
                             decoder_prompt_len: int = 64, warmup_tokens: int = 8,
                             decoder_output_len: int | None = None,
                             long_output_len: int = 16, seed: int = 0) -> Workload:
    """num_decoders streams are decoding when one long prompt arrives.

    The long prompt arrives once every stream has produced warmup_tokens
    tokens, whatever the policy; the streams then keep decoding well past its
    first token (by default long enough to outlast a prefill chunked into
    16-token pieces), so their token gaps show any stall it causes.
    """
    prompt_len = check_int("prompt_len", prompt_len, 1)
    num_decoders = check_int("num_decoders", num_decoders, minimum=0)
    decoder_prompt_len = check_int("decoder_prompt_len", decoder_prompt_len, 1)
    warmup_tokens = check_int("warmup_tokens", warmup_tokens, 1)
    long_output_len = check_int("long_output_len", long_output_len, 1)
    if decoder_output_len is None:
        decoder_output_len = warmup_tokens + prompt_len // 16 + 2 * long_output_len
    decoder_output_len = check_int("decoder_output_len", decoder_output_len, minimum=warmup_tokens + 1)
    decoders = tuple(WorkloadRequest(decoder_prompt_len, decoder_output_len, tag="decoder")
                     for _ in range(num_decoders))
    after = ("decoder", warmup_tokens) if num_decoders else None
    long = WorkloadRequest(prompt_len, long_output_len, after=after, tag="long")
    return Workload(decoders + (long,), seed=seed,
                    description=f"{num_decoders} streams decoding, then one {prompt_len}-token prompt",
                    params=dict(prompt_len=prompt_len, num_decoders=num_decoders,
                                decoder_prompt_len=decoder_prompt_len, warmup_tokens=warmup_tokens,
                                decoder_output_len=decoder_output_len, long_output_len=long_output_len,
                                probe_tag="long", stream_tag="decoder"))


def poisson_mix(num_requests: int = 32, rate_per_s: float = 4.0, prompt_len=(32, 512),
                output_len=(16, 128), seed: int = 0) -> Workload:
    """Requests arriving as a Poisson process (exponential gaps at rate_per_s;
    rate_per_s=inf: all at t=0), prompt and output lengths uniform in ranges."""
    num_requests = check_int("num_requests", num_requests, 1)
    rate_per_s = check_real("rate_per_s", rate_per_s, 0, exclusive_minimum=True, allow_inf=True,
                            hint="4.0, or float('inf') for all at once")
    for name, bounds in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
            raise ValueError(f"{name}={bounds!r}: must be a (low, high) pair (try (32, 512))")
        low, high = (check_int(f"{name}[{j}]", v, 1) for j, v in enumerate(bounds))
        if low > high:
            raise ValueError(f"{name}=({low}, {high}): need 1 <= low <= high")
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(num_requests):
        requests.append(WorkloadRequest(rng.randint(*prompt_len), rng.randint(*output_len),
                                        arrival_time=t, tag="poisson"))
        if rate_per_s != float("inf"):
            t += rng.expovariate(rate_per_s)
    return Workload(tuple(requests), seed=seed,
                    description=f"{num_requests} requests, Poisson at {rate_per_s}/s",
                    params=dict(num_requests=num_requests, rate_per_s=rate_per_s,
                                prompt_len=prompt_len, output_len=output_len))


# ---- steady traffic: arrivals at a rate, lengths from a named distribution ----

@dataclass(frozen=True)
class LengthDist:
    """How long a prompt or an output is. kind "fixed": always `a` tokens;
    "uniform": a..b inclusive; "lognormal": median `a`, 90th percentile `b`
    (a log-normal matched to two published statistics)."""
    kind: str
    a: int
    b: int = 0

    def sample(self, rng: random.Random, low: int, high: int) -> int:
        """One length, clipped to [low, high] (the model's context bounds it)."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(self.a, self.b)
        else:
            mu = math.log(self.a)
            sigma = (math.log(self.b) - mu) / _Z90
            value = round(rng.lognormvariate(mu, sigma))
        return max(low, min(high, int(value)))


_Z90 = 1.2815515655446004            # the standard normal's 90th percentile

# name -> (prompt lengths, output lengths, where the statistics come from)
LENGTH_MIXES: dict[str, tuple[LengthDist, LengthDist, str]] = {
    "fixed": (LengthDist("fixed", 512), LengthDist("fixed", 128),
              "512 in, 128 out for every request"),
    "uniform": (LengthDist("uniform", 100, 1024), LengthDist("uniform", 100, 1024),
                "uniform 100-1024 tokens in and out: nano-vllm's bench.py and mini-sglang's "
                "benchmark/offline/bench.py (randint(100, 1024) for both)"),
    # Sarathi-Serve (Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference
    # with Sarathi-Serve", OSDI'24, arXiv:2403.02310), Table 2 "Datasets used for
    # evaluation": median / P90 / std of prompt and output tokens. We match a log-normal
    # to the median and P90 of each (the std is not matched). openchat_sharegpt4:
    # prompts 1730 / 5696 / 2088, outputs 415 / 834 / 101; arxiv_summarization: prompts
    # 7059 / 12985 / 3638, outputs 208 / 371 / 265. The paper drops requests longer
    # than 8192 (chat) and 16384 (arxiv) tokens in all (section 5, "Workloads"). The
    # chat trace the paper's artifact replays (microsoft/sarathi-serve,
    # data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv (branch
    # niyama_asplos2026 of microsoft/sarathi-serve), 30,731
    # requests, LLaMA-2 tokenizer) gives the same medians and P90s (1730 / 5696, 415 /
    # 834) and a prompt std of 2088, but an output std of 266, not 101: Table 2's two
    # output stds look swapped. The arxiv trace is not in the repository.
    "chat": (LengthDist("lognormal", 1730, 5696), LengthDist("lognormal", 415, 834),
             "openchat_sharegpt4, Sarathi-Serve (arXiv:2403.02310) Table 2: prompts median 1730 / "
             "P90 5696, outputs median 415 / P90 834 tokens"),
    "long_prompt": (LengthDist("lognormal", 7059, 12985), LengthDist("lognormal", 208, 371),
                    "arxiv_summarization, Sarathi-Serve (arXiv:2403.02310) Table 2: prompts median "
                    "7059 / P90 12985, outputs median 208 / P90 371 tokens"),
}


def arrival_times(num_requests: int, rate_per_s: float, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Arrival times (s) as `vllm bench serve` draws them: gaps from a gamma
    distribution of shape `burstiness` and mean 1/rate_per_s. burstiness=1 is
    a Poisson process; below 1 the arrivals bunch up, above 1 they even out.
    rate_per_s=inf: everyone at t=0. The first request arrives at t=0."""
    num_requests = check_int("num_requests", num_requests, 1)
    rate_per_s = check_real("rate_per_s", rate_per_s, 0, exclusive_minimum=True, allow_inf=True,
                            hint="requests per second; float('inf') for all at once")
    burstiness = check_real("burstiness", burstiness, 0, exclusive_minimum=True, hint="1.0 = Poisson")
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(num_requests):
        times.append(t)
        if rate_per_s != math.inf:
            t += rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))
    return times


def steady_traffic(rate_per_s: float = 4.0, num_requests: int = 64, lengths: str = "uniform",
                   burstiness: float = 1.0, max_model_len: int = 4096, seed: int = 0) -> Workload:
    """num_requests arriving at rate_per_s (gamma gaps, see arrival_times), with
    prompt and output lengths drawn from LENGTH_MIXES[lengths].

    Lengths are clipped so that prompt + output fits max_model_len (default
    4096, the smallest preset context). The published mixes are longer than
    that: at 4096, 22% of "chat" prompts and 89% of "long_prompt" prompts are
    cut to the context (5% and 41% at 8192), so the long-prompt mix becomes
    nearly fixed ~3.9k-token prompts and the chat mix loses its P90.
    Seeded: the same seed gives the same lengths at every rate, so a sweep
    over the rate changes the arrivals only.
    """
    if lengths not in LENGTH_MIXES:
        raise ValueError(f"lengths={lengths!r}: choose one of {tuple(LENGTH_MIXES)}")
    max_model_len = check_int("max_model_len", max_model_len, 2)
    times = arrival_times(num_requests, rate_per_s, burstiness, seed)
    prompt_dist, output_dist, source = LENGTH_MIXES[lengths]
    rng = random.Random(seed + 7919)                 # lengths independent of the arrivals
    requests = []
    for t in times:
        output_len = output_dist.sample(rng, 1, max_model_len // 4)
        prompt_len = prompt_dist.sample(rng, 1, max_model_len - output_len - 1)
        requests.append(WorkloadRequest(prompt_len, output_len, arrival_time=t, tag=lengths))
    return Workload(tuple(requests), seed=seed,
                    description=f"{num_requests} requests at {rate_per_s:g}/s ({lengths}: {source})",
                    params=dict(rate_per_s=rate_per_s, num_requests=num_requests, lengths=lengths,
                                burstiness=burstiness, max_model_len=max_model_len))
