"""Which requests get how many tokens in the next step.

Pure Python: no torch, no clock. State in (waiting queue, running list, free
KV blocks), plan out: a list of (request, num_new_tokens). The same scheduler
drives the real engine and the simulator.

Policies:
  prefill_first  a step with waiting prompts runs them whole (as many as the
                 token budget allows, at least one); running decodes wait.
                 Best TTFT, and a long prompt stalls every decoding stream.
  decode_first   a waiting prompt is admitted only when nothing is decoding
                 (request-level batching): smooth TPOT, long TTFT.
  chunked        stall-free batching (Sarathi-Serve): every running decode
                 gets its token first, then prompts, first come first served,
                 get prefill tokens until the step holds chunk_size of them
                 or hits token_budget. A prompt that does not fit is split
                 and continues next step. A step is C_prefill + N_decode tokens.
  chunked_prefill_first  SGLang's default: prompts are chunked as under
                 "chunked", but a step is prefill-only or decode-only, and
                 prefill goes first (mixing a chunk with the decodes needs
                 SGLang's --enable-mixed-chunk, off by default:
                 python/sglang/srt/server_args.py). Chunking without mixing
                 caps each step, yet every decode still waits for the whole
                 prompt: the stall is cut into pieces, not cured.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from numbers import Integral

from .kv_cache import BlockManager
from .request import Request, RequestStatus

POLICIES = ("prefill_first", "decode_first", "chunked", "chunked_prefill_first")


def _check_positive_int(name: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name}={value!r}: must be a positive integer{extra}")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked"
    chunk_size: int = 512             # most prefill tokens in one step ("chunked")
    token_budget: int | None = None   # most tokens of any kind in one step; None: no cap
    max_num_seqs: int = 64            # most requests running at once

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}: unknown; choose one of {POLICIES}")
        _check_positive_int("chunk_size", self.chunk_size)
        _check_positive_int("token_budget", self.token_budget, allow_none=True)
        _check_positive_int("max_num_seqs", self.max_num_seqs)
        if self.policy == "chunked" and self.token_budget is not None and self.token_budget < self.max_num_seqs:
            raise ValueError(f"token_budget={self.token_budget} < max_num_seqs={self.max_num_seqs}: under "
                             "'chunked' every running decode needs a token each step, so the budget must "
                             "be at least max_num_seqs")


@dataclass
class ScheduledStep:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def num_decode_tokens(self) -> int:
        return sum(n for r, n in self.scheduled if r.is_decoding)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.blocks = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # ---- bookkeeping ----------------------------------------------------------
    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request) -> None:
        request.status = RequestStatus.FINISHED
        self.running.remove(request)
        self.blocks.free(request.request_id)

    def _preempt(self, request: Request, step: ScheduledStep) -> None:
        """Free the request's blocks; it recomputes prompt + outputs later."""
        self.running.remove(request)
        self.blocks.free(request.request_id)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        step.preempted.append(request)

    def _make_room(self, request: Request, num_tokens: int, step: ScheduledStep) -> bool:
        """Preempt the newest running requests not yet in this step until
        `request` can hold num_tokens. False if the request itself had to go."""
        scheduled = {id(r) for r, _ in step.scheduled}
        while not self.blocks.can_allocate(request.request_id, num_tokens):
            victims = [r for r in self.running if id(r) not in scheduled]
            victim = victims[-1]
            self._preempt(victim, step)
            if victim is request:
                return False
        return True

    def _tokens_that_fit(self, request: Request, wanted: int, reserve_blocks: int = 0) -> int:
        """The most of `wanted` new tokens the free blocks (less a reserve) can hold."""
        free_blocks = max(0, self.blocks.num_free_blocks - reserve_blocks)
        room = (self.blocks.capacity_tokens(request.request_id)
                + free_blocks * self.blocks.block_size
                - request.num_computed_tokens)
        return max(0, min(wanted, room))

    def _schedule(self, step: ScheduledStep, request: Request, num_tokens: int) -> None:
        self.blocks.allocate(request.request_id, request.num_computed_tokens + num_tokens)
        step.scheduled.append((request, num_tokens))

    def _admit(self, request: Request) -> None:
        self.waiting.popleft()
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    # ---- policies ---------------------------------------------------------------
    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        policy = self.config.policy
        if policy == "chunked":
            self._schedule_chunked(step)
        elif policy == "prefill_first":
            if not self._schedule_whole_prompts(step):
                self._schedule_decodes(step, budget=self.config.token_budget)
        elif policy == "chunked_prefill_first":
            self._schedule_chunked(step, with_decodes=False)
            if not step:
                self._schedule_decodes(step, budget=self.config.token_budget)
        else:  # decode_first
            if not self.running:
                self._schedule_whole_prompts(step)
            else:
                self._schedule_decodes(step, budget=self.config.token_budget)
        return step

    def _schedule_decodes(self, step: ScheduledStep, budget: int | None) -> int:
        """One token for every running decode, preempting if blocks run out."""
        used = 0
        for request in list(self.running):
            if request not in self.running or not request.is_decoding:
                continue
            if budget is not None and used >= budget:
                break
            if self._make_room(request, request.num_computed_tokens + 1, step):
                self._schedule(step, request, 1)
                used += 1
        return used

    def _schedule_whole_prompts(self, step: ScheduledStep) -> int:
        """Admit waiting prompts whole, as many as the budget allows (>= 1)."""
        budget = self.config.token_budget
        used = admitted = 0
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            n = request.num_uncomputed_tokens
            if admitted and budget is not None and used + n > budget:
                break
            if not self.blocks.can_allocate(request.request_id, n):
                if admitted or not self.running:
                    break
                # The first prompt must go in: make room from the newest runner.
                self._preempt(self.running[-1], step)
                continue
            self._admit(request)
            self._schedule(step, request, n)
            used += n
            admitted += 1
        return admitted

    def _schedule_chunked(self, step: ScheduledStep, with_decodes: bool = True) -> None:
        budget = self.config.token_budget
        used = self._schedule_decodes(step, budget) if with_decodes else 0
        prefill_left = self.config.chunk_size
        if budget is not None:
            prefill_left = min(prefill_left, budget - used)
        # Prompts already running (split in an earlier step) come first: FCFS.
        for request in list(self.running):
            if prefill_left <= 0:
                return
            if request not in self.running or request.is_decoding:
                continue
            wanted = min(request.num_uncomputed_tokens, prefill_left)
            n = self._tokens_that_fit(request, wanted)
            if n == 0:
                if not self._make_room(request, request.num_computed_tokens + 1, step):
                    continue
                n = self._tokens_that_fit(request, wanted)
            self._schedule(step, request, n)
            prefill_left -= n
        # A step that had to preempt admits nobody: the freed blocks would go
        # straight to the request just evicted, to be evicted again next step.
        while (self.waiting and not step.preempted and prefill_left > 0
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[0]
            # Keep one free block per running request, so that their next
            # decodes do not have to evict the newcomer at once.
            n = self._tokens_that_fit(request, min(request.num_uncomputed_tokens, prefill_left),
                                      reserve_blocks=len(self.running))
            if n == 0:
                return
            self._admit(request)
            self._schedule(step, request, n)
            prefill_left -= n
