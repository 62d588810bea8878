"""Model-free runs of the engine's own loop: what the checkers of chapters 6 and 8 measure.

The learner's answer is a prediction (how many steps, how many tokens); the checker
runs EngineCore, the loop the real engine and the simulator share, with an executor
that stands in for the model (a fixed token, one time unit per step) and counts.
Nothing here is an answer: it is the engine, asked.
"""
from __future__ import annotations

from ..engine import EngineCore, VirtualClock
from ..kv_cache import BlockManager
from ..request import SamplingParams
from ..scheduler import SchedulerConfig


class CountingExecutor:
    """Stands in for the model: a fixed token, one time unit per step."""

    def execute(self, plan, samples):
        return {r.request_id: 0 for (r, _), s in zip(plan.scheduled, samples) if s}, 1.0

    def release(self, request):
        pass


def model_free_core(config: SchedulerConfig, block_manager) -> EngineCore:
    """The engine's loop with the counting executor and a virtual clock."""
    return EngineCore(config, block_manager, CountingExecutor(), VirtualClock())


def roomy_blocks(num_tokens: int, block_size: int = 16) -> BlockManager:
    """A pool that holds num_tokens with room to spare: no memory limit in these runs."""
    return BlockManager(num_tokens // block_size + 64, block_size)


def first_token_step(core: EngineCore, request_ids, max_steps: int = 100_000) -> dict:
    """Step the core until every request in request_ids has its first token (or
    max_steps pass); {request_id: the step, counted from 1, that gave its first token}."""
    waiting, found = set(request_ids), {}
    for step in range(1, max_steps + 1):
        if not waiting:
            break
        core.step()
        for rid in list(waiting):
            if core.requests[rid].output_token_ids:
                found[rid] = step
                waiting.discard(rid)
    return found


def one_token(**extra) -> SamplingParams:
    return SamplingParams(max_tokens=1, ignore_eos=True, **extra)
