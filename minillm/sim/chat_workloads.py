"""Chat-server workloads for chapter 8, served alike by LLMEngine.run_workload and simulate().

shared_system_prompt_chat  many chats that open with the same system prompt
                           (the case prefix caching exists for)
long_then_short            one long prompt, then short ones queued behind it
                           (vllm-project/vllm#21495)
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ..validation import check_int
from .workloads import Workload, WorkloadRequest


@dataclass(frozen=True)
class SharedPrefixWorkload(Workload):
    """A Workload whose prompts start with one of num_system_prompts shared prefixes."""
    system_prompt_len: int = 0
    num_system_prompts: int = 1

    def system_prompt_ids(self, which: int, vocab_size: int) -> list[int]:
        rng = random.Random(f"system-{self.seed}-{which}")
        return [rng.randrange(vocab_size) for _ in range(self.system_prompt_len)]

    def prompt_ids(self, index: int, vocab_size: int | None) -> list[int] | None:
        if vocab_size is None:
            return None
        shared = self.system_prompt_ids(index % self.num_system_prompts, vocab_size)
        rng = random.Random(f"user-{self.seed}-{index}")
        own = self.requests[index].prompt_len - self.system_prompt_len
        return shared + [rng.randrange(vocab_size) for _ in range(own)]


def shared_system_prompt_chat(num_requests: int = 32, system_prompt_len: int = 512, user_len=(16, 128),
                              output_len: int = 32, rate_per_s: float = float("inf"),
                              num_system_prompts: int = 1, seed: int = 0) -> SharedPrefixWorkload:
    """num_requests chats, each a system prompt of system_prompt_len tokens
    (one of num_system_prompts, in turn) plus a user message of user_len
    tokens (uniform in the range), arriving as a Poisson process at
    rate_per_s (inf: all at t=0); each asks for output_len tokens."""
    num_requests = check_int("num_requests", num_requests, 1)
    system_prompt_len = check_int("system_prompt_len", system_prompt_len, 0)
    output_len = check_int("output_len", output_len, 1)
    num_system_prompts = check_int("num_system_prompts", num_system_prompts, 1)
    low, high = user_len
    if not 1 <= low <= high:
        raise ValueError(f"user_len=({low}, {high}): need 1 <= low <= high")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s={rate_per_s!r}: must be > 0 (float('inf') for all at once)")
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(num_requests):
        requests.append(WorkloadRequest(system_prompt_len + rng.randint(low, high), output_len,
                                        arrival_time=t, tag="chat"))
        if rate_per_s != float("inf"):
            t += rng.expovariate(rate_per_s)
    return SharedPrefixWorkload(
        tuple(requests), seed=seed, system_prompt_len=system_prompt_len,
        num_system_prompts=num_system_prompts,
        description=f"{num_requests} chats sharing a {system_prompt_len}-token system prompt",
        params=dict(num_requests=num_requests, system_prompt_len=system_prompt_len, user_len=user_len,
                    output_len=output_len, rate_per_s=rate_per_s, num_system_prompts=num_system_prompts))


def long_then_short(long_len: int = 8192, num_short: int = 8, short_len: int = 64,
                    output_len: int = 16, seed: int = 0) -> Workload:
    """One long_len-token prompt, and num_short short prompts that arrive at
    the same moment but after it in the queue: first come, first served
    makes each of them wait for the whole long prefill."""
    long_len = check_int("long_len", long_len, 1)
    num_short = check_int("num_short", num_short, 1)
    short_len = check_int("short_len", short_len, 1)
    output_len = check_int("output_len", output_len, 1)
    requests = (WorkloadRequest(long_len, output_len, tag="long"),) + tuple(
        WorkloadRequest(short_len, output_len, tag="short") for _ in range(num_short))
    return Workload(requests, seed=seed,
                    description=f"one {long_len}-token prompt, then {num_short} of {short_len} tokens",
                    params=dict(long_len=long_len, num_short=num_short, short_len=short_len,
                                output_len=output_len))
