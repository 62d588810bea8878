"""Chapter 6's expected values, asked of the engine itself (its Scheduler, its step loop)."""
from __future__ import annotations

import random

from ...engine import EngineCore, VirtualClock
from ...kv_cache import BlockManager
from ...request import Request, RequestStatus, SamplingParams
from ...scheduler import Scheduler, SchedulerConfig


def engine_schedule_chunked(decoding, prefilling, chunk_size, token_budget, rng=None):
    """Ask the engine's Scheduler (policy "chunked") for the plan of one step.

    decoding: request ids that are decoding; prefilling: (request_id,
    tokens_left) in arrival order. The first prompts of `prefilling` are made
    "running" (already part-prefilled), the rest "waiting", as in a live engine.
    Returns {request_id: num_new_tokens}.
    """
    rng = rng or random.Random(0)
    num_requests = len(decoding) + len(prefilling)
    config = SchedulerConfig(policy="chunked", chunk_size=chunk_size, token_budget=token_budget,
                             max_num_seqs=max(1, num_requests))
    block_size = 16
    longest = max([tokens_left for _, tokens_left in prefilling] + [1]) + 64
    blocks = BlockManager(num_requests * (longest // block_size + 2) + 1, block_size)
    scheduler = Scheduler(config, blocks)
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    num_running_prompts = rng.randint(0, len(prefilling))
    running_decodes, running_prompts = [], []
    for rid in decoding:
        request = Request(rid, None, params, 0.0, prompt_len=rng.randint(1, 40))
        request.output_token_ids = [0] * rng.randint(1, 20)
        request.num_computed_tokens = request.num_tokens - 1
        running_decodes.append(request)
    for i, (rid, tokens_left) in enumerate(prefilling):
        already_computed = rng.randint(1, 48) if i < num_running_prompts else 0
        request = Request(rid, None, params, 0.0, prompt_len=already_computed + tokens_left)
        request.num_computed_tokens = already_computed
        if i < num_running_prompts:
            running_prompts.append(request)
        else:
            scheduler.waiting.append(request)
    # Interleave decodes and part-prefilled prompts (keeping each group's order),
    # as admissions over time would.
    running = []
    while running_decodes or running_prompts:
        source = running_decodes if (running_decodes and (not running_prompts or rng.random() < 0.5)) \
            else running_prompts
        running.append(source.pop(0))
    for request in running:
        request.status = RequestStatus.RUNNING
        blocks.allocate(request.request_id, request.num_computed_tokens)
        scheduler.running.append(request)
    plan = scheduler.schedule()
    return {r.request_id: n for r, n in plan.scheduled}


class _CountingExecutor:
    """Stands in for the model: a fixed token, one time unit per step."""

    def execute(self, plan, samples):
        return {r.request_id: 0 for (r, _), s in zip(plan.scheduled, samples) if s}, 1.0

    def release(self, request):
        pass


def engine_num_prefill_steps(prompt_len: int, chunk_size: int, num_decoding: int,
                             token_budget: int | None) -> int:
    """Run the engine (fake executor): streams decoding, then the prompt; count
    the steps from its arrival to its first token."""
    max_num_seqs = num_decoding + 1
    if token_budget is not None and token_budget < max_num_seqs:
        raise ValueError(f"token_budget={token_budget} < {max_num_seqs} running requests")
    config = SchedulerConfig(policy="chunked", chunk_size=chunk_size, token_budget=token_budget,
                             max_num_seqs=max_num_seqs)
    block_size = 16
    stream_len = prompt_len + 64
    blocks = BlockManager(max_num_seqs * (stream_len // block_size + 2), block_size)
    core = EngineCore(config, blocks, _CountingExecutor(), VirtualClock())
    params = SamplingParams(max_tokens=stream_len, ignore_eos=True)
    streams = [core.add_request(None, params, prompt_len=1) for _ in range(num_decoding)]
    while not all(core.requests[i].output_token_ids for i in streams):
        core.step()
    rid = core.add_request(None, SamplingParams(max_tokens=1, ignore_eos=True), prompt_len=prompt_len)
    steps = 0
    while not core.requests[rid].output_token_ids:
        core.step()
        steps += 1
    return steps


def engine_equal_work_chunks(prompt_len: int, chunk_size: int, break_even: int) -> list[int]:
    """Run the engine (fake executor) with chunk_sizing="equal_work" on one
    prompt, KV blocks of one token (so no boundary is rounded), and return the
    chunk sizes its steps gave the prompt."""
    config = SchedulerConfig(policy="chunked", chunk_size=chunk_size, chunk_sizing="equal_work",
                             break_even_len=break_even)
    core = EngineCore(config, BlockManager(prompt_len + 8, 1), _CountingExecutor(), VirtualClock())
    rid = core.add_request(None, SamplingParams(max_tokens=1, ignore_eos=True), prompt_len=prompt_len)
    sizes = []
    while not core.requests[rid].output_token_ids:
        core.step()
        sizes += [n for r, n in core.trace[-1].scheduled if r == rid]
    return sizes


WARMUP_TOKENS = 4


def simulated_stall(model, hardware, prompt_len: int, num_decoders: int, decoder_context: int) -> float:
    """The worst gap (max ITL) the streams see when the long prompt arrives under
    prefill_first, measured by the simulator: num_decoders streams with decoder_context
    tokens cached each when the prompt arrives."""
    from ...sim.simulator import simulate
    from ...sim.workloads import long_prompt_interference
    workload = long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders,
                                        warmup_tokens=WARMUP_TOKENS,
                                        decoder_prompt_len=decoder_context - WARMUP_TOKENS + 1, long_output_len=1)
    res = simulate(workload, SchedulerConfig(policy="prefill_first"), model=model, hardware=hardware)
    return res.summary()["decoder_itl_max_s"]


def engine_schedule_decode_first(decoding, waiting, token_budget, max_num_seqs, rng=None):
    """Ask the engine's Scheduler (policy "decode_first") for the plan of one step.

    decoding: request ids decoding; waiting: (request_id, prompt_len) in arrival
    order. Returns {request_id: num_new_tokens}."""
    rng = rng or random.Random(0)
    config = SchedulerConfig(policy="decode_first", token_budget=token_budget, max_num_seqs=max_num_seqs)
    block_size = 16
    longest = max([n for _, n in waiting] + [64]) + 64
    blocks = BlockManager((len(decoding) + len(waiting)) * (longest // block_size + 2) + 1, block_size)
    scheduler = Scheduler(config, blocks)
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for rid in decoding:
        request = Request(rid, None, params, 0.0, prompt_len=rng.randint(1, 40))
        request.output_token_ids = [0] * rng.randint(1, 20)
        request.num_computed_tokens = request.num_tokens - 1
        request.status = RequestStatus.RUNNING
        blocks.allocate(rid, request.num_computed_tokens)
        scheduler.running.append(request)
    for rid, prompt_len in waiting:
        scheduler.waiting.append(Request(rid, None, params, 0.0, prompt_len=prompt_len))
    plan = scheduler.schedule()
    return {r.request_id: n for r, n in plan.scheduled}
