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
                 vLLM V1's order (Scheduler.schedule in
                 vllm/v1/core/sched/scheduler.py): the running requests
                 first (the decodes, and a prompt left mid-chunk, which gets
                 what the budget has left), then waiting prompts, all within
                 max_num_batched_tokens (our token_budget).
  chunked_prefill_first  SGLang's default: prompts are chunked as under
                 "chunked" (--chunked-prefill-size), but a step is
                 prefill-only or decode-only, and prefill goes first
                 (get_next_batch_to_run in python/sglang/srt/managers/
                 scheduler.py: "Run prefill first if possible"; mixing a chunk
                 with the decodes needs --enable-mixed-chunk, False by default
                 in python/sglang/srt/arg_groups/fields/schedule.py). Chunking without mixing
                 caps each step, yet every decode still waits for the whole
                 prompt: the stall is cut into pieces, not cured.

Short prompts stuck behind a long one (vllm-project/vllm#21495): under
"chunked", three knobs with vLLM's names and meanings (vllm/config/scheduler.py;
V1 runs only the threshold and refuses the partial-prefill pair at startup,
so those two follow V0's scheduler):
  long_prefill_token_threshold  a prompt with more uncomputed tokens than
                 this is "long"; no request gets more than this many tokens
                 in one step (vLLM V1's cap in vllm/v1/core/sched/scheduler.py),
                 so the rest of the chunk goes to the prompts behind it. 0: off.
  max_num_partial_prefills      how many prompts may be mid-prefill at once
                 (vLLM PR #10235); above 1 the step's prefill tokens are split
                 evenly among them, and a threshold left at 0 becomes 4% of
                 the model's context, as in vLLM.
  max_long_partial_prefills     how many of those may be long: a short prompt
                 overtakes a long one that would exceed it.

Speculative decoding (speculative.py, chapter 12): with a speculator, a decode
is scheduled with 1 + its drafts (ScheduledStep.drafts). Drafts count against
token_budget: as in vLLM V1 they come before the prompts' chunks (the chunk gets
what they leave), or after them with SpeculativeConfig(draft_budget="chunk_first").

Chunks of equal work (chunk_sizing="equal_work", chunk_sizing.py): a prompt
is split into as many chunks as chunk_size makes, but each chunk gets the same
work (matmuls plus attention) rather than the same tokens, so the late chunks,
which attend to a long prefix, are shorter and no step of the prefill is the
slowest by far. Against the step's chunk_size, a prompt's tokens then count by
their work, in units of the prompt's average token (a planned chunk of a long
prompt counts chunk_size; a short prompt, its length); token_budget still
caps the step's real tokens.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from .chunk_sizing import chunk_end, prefill_work, tokens_within
from .kv_cache import BlockManager
from .request import Request, RequestStatus
from .validation import check_choice, check_int

POLICIES = ("prefill_first", "decode_first", "chunked", "chunked_prefill_first")
CHUNK_SIZINGS = ("fixed", "equal_work")


# Policies that split prompts, where the partial-prefill knobs apply.
PARTIAL_PREFILL_POLICIES = ("chunked",)
CHUNKING_POLICIES = ("chunked", "chunked_prefill_first")
DEFAULT_LONG_PREFILL_FRACTION = 0.04     # vLLM: 4% of max_model_len when partial prefills > 1


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked"
    chunk_size: int = 512             # most prefill tokens in one step ("chunked")
    token_budget: int | None = None   # most tokens of any kind in one step; None: no cap
    max_num_seqs: int = 64            # most requests running at once
    long_prefill_token_threshold: int = 0   # tokens; a longer prompt is "long" and capped per step
    max_num_partial_prefills: int = 1       # prompts mid-prefill at once (1: FCFS, chapter 6)
    max_long_partial_prefills: int = 1      # of which long ones
    chunk_sizing: str = "fixed"             # "equal_work": chunks of equal work, not tokens
    break_even_len: int | None = None       # equal_work: a token's matmuls, in keys (None: the model's FLOPs)

    def __post_init__(self):
        check_choice("policy", self.policy, POLICIES)
        check_choice("chunk_sizing", self.chunk_sizing, CHUNK_SIZINGS)
        object.__setattr__(self, "break_even_len", check_int(
            "break_even_len", self.break_even_len, 0, allow_none=True,
            hint="None for the model's ModelConfig.attention_break_even_len"))
        if self.chunk_sizing != "fixed" and self.policy not in CHUNKING_POLICIES:
            raise ValueError(f"chunk_sizing={self.chunk_sizing!r}: sizes the chunks of policies that "
                             f"split prompts {CHUNKING_POLICIES}, not policy={self.policy!r}")
        for name, value in (("chunk_size", check_int("chunk_size", self.chunk_size, 1, hint="256 or 512")),
                            ("token_budget", check_int("token_budget", self.token_budget, 1,
                                                       allow_none=True, hint="None or 2048")),
                            ("max_num_seqs", check_int("max_num_seqs", self.max_num_seqs, 1, hint="64"))):
            object.__setattr__(self, name, value)      # numpy integers become ints
        if self.policy == "chunked" and self.token_budget is not None and self.token_budget < self.max_num_seqs:
            raise ValueError(f"token_budget={self.token_budget} < max_num_seqs={self.max_num_seqs}: under "
                             "'chunked' every running decode needs a token each step, so the budget must "
                             "be at least max_num_seqs")
        self._check_partial_prefill_knobs()

    def _check_partial_prefill_knobs(self):
        for name, value in (
                ("long_prefill_token_threshold", check_int("long_prefill_token_threshold",
                                                           self.long_prefill_token_threshold, 0,
                                                           hint="0 turns the per-step cap off")),
                ("max_num_partial_prefills", check_int("max_num_partial_prefills", self.max_num_partial_prefills, 1)),
                ("max_long_partial_prefills", check_int("max_long_partial_prefills",
                                                        self.max_long_partial_prefills, 1))):
            object.__setattr__(self, name, value)
        t = self.long_prefill_token_threshold
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(f"max_long_partial_prefills={self.max_long_partial_prefills}: must be at most "
                             f"max_num_partial_prefills={self.max_num_partial_prefills} (as in vLLM)")
        uses_knobs = t > 0 or self.max_num_partial_prefills > 1
        if uses_knobs and self.policy not in PARTIAL_PREFILL_POLICIES:
            knob = "long_prefill_token_threshold" if t > 0 else "max_num_partial_prefills"
            value = t if t > 0 else self.max_num_partial_prefills
            raise ValueError(f"{knob}={value}: only applies to policies that split prompts "
                             f"{PARTIAL_PREFILL_POLICIES}, not policy={self.policy!r}")

    def for_model(self, cfg) -> "SchedulerConfig":
        """This config with break_even_len filled in from the model's FLOPs
        where chunk_sizing needs it and it was left None."""
        if self.chunk_sizing == "fixed" or self.break_even_len is not None:
            return self
        return replace(self, break_even_len=cfg.attention_break_even_len)

    def long_prefill_threshold(self, max_model_len: int | None) -> int:
        """The threshold in force: as set, or vLLM's 4% of the context when
        partial prefills are on and it was left at 0 (chunk_size without a context)."""
        if self.long_prefill_token_threshold or self.max_num_partial_prefills == 1:
            return self.long_prefill_token_threshold
        if max_model_len is None:
            return self.chunk_size
        return max(1, int(max_model_len * DEFAULT_LONG_PREFILL_FRACTION))


@dataclass
class ScheduledStep:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # Speculative decoding: request id -> the draft tokens it verifies this step (vLLM's
    # scheduled_spec_decode_tokens); its num_new_tokens counts them: 1 + len(drafts).
    drafts: dict[int, list[int]] = field(default_factory=dict)

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
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 max_model_len: int | None = None, speculator=None):
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.speculator = speculator          # speculative.Speculator, or None: no drafts
        self.long_prefill_threshold = config.long_prefill_threshold(max_model_len)
        if config.chunk_sizing == "equal_work" and config.break_even_len is None:
            raise ValueError("chunk_sizing='equal_work' needs break_even_len: pass "
                             "SchedulerConfig.for_model(model_cfg), or set it (e.g. 2944 for 'tiny')")
        # equal_work: request id -> (first token, end, number of chunks) of its prefill
        self._prefill_plans: dict[int, tuple[int, int, int]] = {}
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
        self.block_manager.free(request.request_id)
        self._prefill_plans.pop(request.request_id, None)

    def abort(self, request: Request) -> None:
        """Drop a waiting or running request and free its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.block_manager.free(request.request_id)
        self._prefill_plans.pop(request.request_id, None)

    def _preempt(self, request: Request, step: ScheduledStep) -> None:
        """Free the request's blocks; it recomputes prompt + outputs later."""
        self.running.remove(request)
        self.block_manager.free(request.request_id)
        self._prefill_plans.pop(request.request_id, None)     # replanned when it comes back
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        step.preempted.append(request)

    def _make_room(self, request: Request, num_tokens: int, step: ScheduledStep) -> bool:
        """Preempt the newest running requests not yet in this step until
        `request` can hold num_tokens. False if the request itself had to go."""
        if self.block_manager.can_allocate(request.request_id, num_tokens):
            return True                    # the common case: no set to build
        scheduled = {id(r) for r, _ in step.scheduled}
        while not self.block_manager.can_allocate(request.request_id, num_tokens):
            victims = [r for r in self.running if id(r) not in scheduled]
            victim = victims[-1]
            self._preempt(victim, step)
            if victim is request:
                return False
        return True

    def _tokens_that_fit(self, request: Request, wanted: int, reserve_blocks: int = 0) -> int:
        """The most of `wanted` new tokens the free blocks (less a reserve) can hold."""
        free_blocks = max(0, self.block_manager.num_free_blocks - reserve_blocks)
        room = (self.block_manager.capacity_tokens(request.request_id)
                + free_blocks * self.block_manager.block_size
                - request.num_computed_tokens)
        return max(0, min(wanted, room))

    def _schedule(self, step: ScheduledStep, request: Request, num_tokens: int) -> None:
        self.block_manager.allocate(request.request_id, request.num_computed_tokens + num_tokens)
        step.scheduled.append((request, num_tokens))

    def _admit(self, request: Request) -> None:
        self.waiting.remove(request)        # the head, unless a short prompt overtook a long one
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
                self._schedule_decodes_and_drafts(step)
        elif policy == "chunked_prefill_first":
            self._schedule_chunked(step, with_decodes=False)
            if not step:
                self._schedule_decodes_and_drafts(step)
        else:  # decode_first
            if not self.running:
                self._schedule_whole_prompts(step)
            else:
                self._schedule_decodes_and_drafts(step)
        return step

    def _schedule_decodes_and_drafts(self, step: ScheduledStep) -> None:
        """A step of decodes only, each with its drafts when speculating."""
        budget = self.config.token_budget
        used = self._schedule_decodes(step, budget)
        self._schedule_drafts(step, None if budget is None else budget - used)

    def _schedule_drafts(self, step: ScheduledStep, tokens_left: int | None) -> int:
        """Speculative decoding: give the step's decodes their draft tokens, in running
        order, at most tokens_left in all (None: no cap); returns how many. Drafts count
        against the budget like any token (vLLM V1's num_tokens_with_spec), the last
        decodes' drafts are the ones cut when it runs short, and a draft never evicts
        anyone: it takes free blocks, leaving one per running request, or is not made."""
        if self.speculator is None:
            return 0
        added = 0
        for i, (request, num_tokens) in enumerate(step.scheduled):
            if tokens_left is not None and added >= tokens_left:
                break
            if num_tokens != 1 or not request.is_decoding:
                continue
            limit = self.speculator.max_drafts(request, self.max_model_len)
            if tokens_left is not None:
                limit = min(limit, tokens_left - added)
            limit = self._tokens_that_fit(request, 1 + limit, reserve_blocks=len(self.running)) - 1
            drafts = self.speculator.propose(request, limit) if limit > 0 else []
            if not drafts:
                continue
            drafts = list(drafts[:limit])
            self.block_manager.allocate(request.request_id, request.num_computed_tokens + 1 + len(drafts))
            step.scheduled[i] = (request, 1 + len(drafts))
            step.drafts[request.request_id] = drafts
            added += len(drafts)
        return added

    def _drafts_first(self) -> bool:
        return self.speculator is not None and self.speculator.draft_budget == "drafts_first"

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
            cached = self._claim_cached_prefix(request)
            n = request.num_uncomputed_tokens
            if admitted and budget is not None and used + n > budget:
                self._release_cached_prefix(request, cached)
                break
            # Admit only what fits beside one free block per running request,
            # as "chunked" does: evicting a runner to admit a prompt trades
            # places, and the evicted one evicts the next on its return (four
            # 100-token prompts on 9 blocks recomputed 26x their tokens).
            # Without room the running decodes go instead.
            if self._tokens_that_fit(request, n, reserve_blocks=len(self.running)) < n:
                self._release_cached_prefix(request, cached)
                break
            self._admit(request)
            self._schedule(step, request, n)
            used += n
            admitted += 1
        return admitted

    def _schedule_chunked(self, step: ScheduledStep, with_decodes: bool = True) -> None:
        budget = self.config.token_budget
        used = self._schedule_decodes(step, budget) if with_decodes else 0
        if with_decodes and self._drafts_first():     # vLLM V1: the chunk gets what drafts leave
            used += self._schedule_drafts(step, None if budget is None else budget - used)
        self._schedule_prefill_chunks(step, budget, used)
        if with_decodes and self.speculator is not None and not self._drafts_first():
            self._schedule_drafts(step, None if budget is None else budget - step.num_tokens)

    def _schedule_prefill_chunks(self, step: ScheduledStep, budget: int | None, used: int) -> None:
        prefill_left = self.config.chunk_size
        if budget is not None:
            # under equal_work this bounds budget units, not tokens: _prefill_cap caps the tokens
            prefill_left = min(prefill_left, budget - used)
        if self.config.max_num_partial_prefills > 1:
            self._schedule_partial_prefills(step, prefill_left)
            return
        # Prompts already running (split in an earlier step) come first: FCFS.
        for request in list(self.running):
            if prefill_left < 1:
                return
            if request not in self.running or request.is_decoding:
                continue
            n = self._continue_prefill(step, request, self._prefill_cap(request, prefill_left, step))
            prefill_left -= self._budget_spent(request, n)
        # A step that had to preempt admits nobody: the freed blocks would go
        # straight to the request just evicted, to be evicted again next step.
        while (self.waiting and not step.preempted and prefill_left >= 1
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[0]
            n = self._start_prefill(step, request, prefill_left)
            if n == 0:
                return
            prefill_left -= self._budget_spent(request, n)

    def _schedule_partial_prefills(self, step: ScheduledStep, prefill_left: int) -> None:
        """vLLM's concurrent partial prefills (PR #10235): up to
        max_num_partial_prefills prompts share the step's prefill tokens
        evenly, at most max_long_partial_prefills of them long; a short
        prompt overtakes a long one that would exceed that."""
        cfg = self.config
        scheduled = {id(r) for r, _ in step.scheduled}
        ongoing = [r for r in self.running if not r.is_decoding and id(r) not in scheduled]
        is_long = lambda r: r.num_uncomputed_tokens > self.long_prefill_threshold
        num_long = sum(map(is_long, ongoing))
        newcomers = []
        for request in self.waiting if not step.preempted else ():
            if (len(ongoing) + len(newcomers) >= cfg.max_num_partial_prefills
                    or len(self.running) + len(newcomers) >= cfg.max_num_seqs):
                break
            if is_long(request):
                if num_long >= cfg.max_long_partial_prefills:
                    continue
                num_long += 1
            newcomers.append(request)
        if not ongoing and not newcomers:
            return
        share = max(1, prefill_left // (len(ongoing) + len(newcomers)))
        for request in ongoing:
            if prefill_left < 1:
                return
            if request in self.running:                 # not preempted to make room meanwhile
                n = self._continue_prefill(step, request, self._prefill_cap(request, min(share, prefill_left), step))
                prefill_left -= self._budget_spent(request, n)
        for request in newcomers:
            if prefill_left < 1 or step.preempted:
                return
            n = self._start_prefill(step, request, min(share, prefill_left))
            if n == 0:
                return
            prefill_left -= self._budget_spent(request, n)

    # ---- one prompt's prefill tokens ----------------------------------------------------
    def _prefill_cap(self, request: Request, budget_left, step: ScheduledStep) -> int:
        """The most prefill tokens request may get now: what it has left, what
        the step's prefill budget buys (chunk_size tokens, or under equal_work
        that much of the request's chunk work), long_prefill_token_threshold
        (vLLM V1's cap), and what token_budget leaves of the step's tokens."""
        if self.config.chunk_sizing == "equal_work":
            wanted = self._equal_work_tokens(request, budget_left)
        else:
            wanted = min(request.num_uncomputed_tokens, budget_left)
        if self.long_prefill_threshold > 0:
            wanted = min(wanted, self.long_prefill_threshold)
        if self.config.token_budget is not None and self.config.chunk_sizing == "equal_work":
            # a planned chunk can hold more tokens than the units it spends (fixed: never)
            wanted = min(wanted, self.config.token_budget - step.num_tokens)
        return max(0, wanted)

    # ---- chunks of equal work (chunk_sizing="equal_work") ------------------------------------
    def _plan(self, request: Request) -> tuple[int, int, int]:
        """(first token, end, chunks) of the request's prefill, fixed when it
        starts: as many chunks as chunk_size makes of what is left then."""
        plan = self._prefill_plans.get(request.request_id)
        if plan is None:
            first = request.num_computed_tokens
            end = first + request.num_uncomputed_tokens
            plan = (first, end, -(-(end - first) // self.config.chunk_size))
            self._prefill_plans[request.request_id] = plan
        return plan

    def _work_per_token(self, request: Request) -> float:
        """The work of the request's average prefill token: the budget's unit."""
        first, end, _ = self._plan(request)
        return prefill_work(first, end - first, self.config.break_even_len) / (end - first)

    def _equal_work_tokens(self, request: Request, budget_left) -> int:
        """Tokens up to the plan's next boundary, or fewer if the step's budget
        has less than a whole chunk_size left."""
        first, end, num_chunks = self._plan(request)
        start = request.num_computed_tokens
        wanted = chunk_end(first, end, num_chunks, start, self.config.break_even_len,
                           align=self._boundary_align()) - start
        if budget_left < self.config.chunk_size:
            work = budget_left * self._work_per_token(request)
            wanted = min(wanted, tokens_within(start, work, self.config.break_even_len))
        return wanted

    def _boundary_align(self) -> int:
        """Equal-work boundaries fall on KV blocks where a chunk holds at least
        8 of them (at C=256 that ran 3-4% faster in all, docs/chunk-cost.md); rounding moves
        a boundary by up to half a block, which for a chunk of a few blocks would
        undo the equalising (at C=64 the aligned steps were the lumpier)."""
        block = self.block_manager.block_size
        return block if self.config.chunk_size >= 8 * block else 1

    def _budget_spent(self, request: Request, num_tokens: int):
        """How much of the step's prefill budget num_tokens of request use:
        the tokens, or under equal_work their work in average tokens."""
        if self.config.chunk_sizing != "equal_work" or num_tokens == 0:
            return num_tokens
        work = prefill_work(request.num_computed_tokens, num_tokens, self.config.break_even_len)
        return work / self._work_per_token(request)

    def _continue_prefill(self, step: ScheduledStep, request: Request, wanted: int) -> int:
        """Schedule up to `wanted` more tokens of a running prompt, preempting
        newer requests for blocks if needed; returns how many it got."""
        if wanted <= 0:
            return 0
        n = self._tokens_that_fit(request, wanted)
        if n == 0:
            if not self._make_room(request, request.num_computed_tokens + 1, step):
                return 0
            n = self._tokens_that_fit(request, wanted)
        self._schedule(step, request, n)
        return n

    def _start_prefill(self, step: ScheduledStep, request: Request, tokens_left: int) -> int:
        """Admit a waiting prompt with up to tokens_left of its tokens, starting
        after its cached prefix; 0 (and nothing changed) if none fit."""
        cached = self._claim_cached_prefix(request)
        # Keep one free block per running request, so that their next
        # decodes do not have to evict the newcomer at once.
        n = self._tokens_that_fit(request, self._prefill_cap(request, tokens_left, step),
                                  reserve_blocks=len(self.running))
        if n == 0:
            self._release_cached_prefix(request, cached)
            self._prefill_plans.pop(request.request_id, None)    # planned from a prefix it let go
            return 0
        self._admit(request)
        self._schedule(step, request, n)
        return n

    # ---- prefix caching hooks (no-ops without prefix_cache) -----------------------------
    def _claim_cached_prefix(self, request: Request) -> int:
        """A waiting request skips its longest cached prefix: whole blocks, never
        its last token. Returns the tokens this call claimed (0: none)."""
        if request.num_computed_tokens or self.block_manager.block_tables.get(request.request_id):
            return 0
        # A cached block has no logits: a request that wants its prompt's logprobs
        # computes the whole prompt, as vLLM V1 does (KVCacheManager.get_computed_blocks,
        # vllm/v1/core/kv_cache_manager.py at 003df29, skips the lookup for such requests).
        if request.params.prompt_logprobs is not None:
            return 0
        request.num_computed_tokens = self.block_manager.claim_cached_prefix(request)
        return request.num_computed_tokens

    def _release_cached_prefix(self, request: Request, cached: int) -> None:
        if cached:
            self.block_manager.release_cached_prefix(request, cached)
            request.num_computed_tokens = 0
