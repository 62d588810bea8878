"""The serving loop: schedule -> pack -> forward -> sample -> record.

EngineCore is the loop itself, shared by two executors:
  ModelExecutor   runs the real model on this device; time is the wall clock
  (simulator.py)  asks the cost model how long the step would take on a GPU
so everything the simulator shows also happens in the real engine.

Every step is recorded in `trace` (which request got how many tokens, when
the step started and ended) and every token is timestamped, which is all
the metrics need.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .batch_invariant import check_batch_invariant
from .detokenizer import IncrementalDetokenizer
from .device import free_memory_bytes, synchronize
from .kv_cache import BlockManager, blocks_for, check_pool_fits
from .logprobs import logprob_dicts
from .model import LlamaModel
from .model_runner import ModelRunner, StepChunk
from .prefill import check_prompt
from .prefix_cache import make_block_manager
from .request import Request, RequestOutput, RequestStatus, SamplingParams
from .sampler import make_generator, sample_token
from .scheduler import ScheduledStep, Scheduler, SchedulerConfig
from .speculative import Speculator, num_computed_after, verify
from .validation import ArgumentTypeError, check_instance, check_int, check_int_sequence, check_real, is_int


@dataclass
class StepRecord:
    start: float                                   # seconds on the engine's clock
    end: float
    scheduled: list[tuple[int, int]]               # (request_id, num_new_tokens)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[int] = field(default_factory=list)
    # Speculative decoding: request_id -> (drafted, accepted) for each request that
    # verified drafts this step; it emitted 1 + accepted tokens (speculative.py).
    spec: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


class WallClock:
    """perf_counter seconds since the engine started; idle gaps before the
    next arrival can be skipped, so benchmarks do not sleep."""

    def __init__(self):
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def skip_to(self, t: float) -> None:
        self._origin -= max(0.0, t - self.now())

    def advance(self, seconds: float) -> None:   # real time advances by itself
        pass


class VirtualClock:
    """Simulated time: moves only when told to."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def skip_to(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class RequestFailed(Exception):
    """What an executor hands back, in place of a token, for a request whose
    part of the step failed (e.g. its sampling raised): that request finishes
    with finish_reason="error" and the others keep going."""


@dataclass
class Sampled:
    """What an executor hands back for one request of a step, when a bare
    token id does not say it all (an int t means Sampled([t]))."""
    token_ids: list[int]                                   # emitted this step, in order ([] mid-prompt)
    logprobs: list[dict[int, float]] | None = None         # one per token, for a request that asked
    prompt_logprobs: list[dict[int, float]] = field(default_factory=list)   # prompt positions from:
    first_prompt_position: int = 0


def as_sampled(result) -> Sampled | RequestFailed | None:
    """An executor's answer for one request, in one shape (None: it gave none)."""
    if is_int(result):
        return Sampled([int(result)])
    return result


class EngineCore:
    """The loop, executor-agnostic.

    max_trace_steps: keep only the last this-many steps in `trace` (None: all;
    the book plots whole traces, a long-running server needs a bound).
    max_finished_requests: finished requests stay in `requests` (for lookups
    such as `engine.requests[rid].metrics`) until this many newer ones have
    finished; the outputs themselves are returned by step() and generate().
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, executor, clock,
                 eos_token_ids: tuple[int, ...] = (), max_model_len: int | None = None,
                 max_trace_steps: int | None = None, max_finished_requests: int = 1024,
                 speculator=None):
        check_instance("config", config, SchedulerConfig, "a SchedulerConfig",
                       hint="SchedulerConfig(policy='chunked')")
        check_instance("block_manager", block_manager, BlockManager, "a BlockManager",
                       hint="BlockManager(num_blocks=64, block_size=16)")
        # Chunks of equal work weigh a token by the model's shape: an executor
        # that runs a model (real or simulated) carries its config.
        model_cfg = getattr(executor, "cfg", None)
        if model_cfg is not None:
            config = config.for_model(model_cfg)
        self.config = config
        self.block_manager = block_manager
        self.scheduler = Scheduler(config, block_manager, max_model_len=max_model_len, speculator=speculator)
        self.executor = executor
        self.clock = clock
        self.eos_token_ids = check_int_sequence("eos_token_ids", tuple(eos_token_ids), 0)
        self.max_model_len = check_int("max_model_len", max_model_len, 2, allow_none=True)
        self.max_trace_steps = check_int("max_trace_steps", max_trace_steps, 1, allow_none=True,
                                         hint="None, or 10000 for a long run")
        self.max_finished_requests = check_int("max_finished_requests", max_finished_requests, 0)
        self.trace: list[StepRecord] = []
        self.requests: dict[int, Request] = {}
        self._finished_ids: deque[int] = deque()     # oldest first, to evict from `requests`
        self._next_id = 0
        self.vocab_size: int | None = None    # None: requests carry lengths, not token ids

    # ---- requests ---------------------------------------------------------------
    def _check_params(self, params, arg: str = "params") -> SamplingParams:
        if params is None:
            return SamplingParams()
        return check_instance(arg, params, SamplingParams, "a SamplingParams",
                              hint="SamplingParams(max_tokens=32), or SamplingParams(**a_dict)")

    def _check_request(self, prompt_len: int, params: SamplingParams) -> None:
        if self.max_model_len is not None and prompt_len >= self.max_model_len:
            raise ValueError(f"prompt of {prompt_len} tokens: the model allows at most "
                             f"{self.max_model_len - 1} prompt tokens (max_position {self.max_model_len})")
        longest = prompt_len + params.max_tokens
        if self.max_model_len is not None:
            longest = min(longest, self.max_model_len)
        needed = blocks_for(longest, self.block_manager.block_size)
        if needed > self.block_manager.num_blocks:
            raise ValueError(f"prompt of {prompt_len} tokens + max_tokens={params.max_tokens} needs {needed} "
                             f"KV blocks but the pool has only num_blocks={self.block_manager.num_blocks}")

    def _check_prompt(self, prompt_token_ids, prompt_len) -> tuple[list[int] | None, int]:
        """(token ids or None, prompt length). The simulator's requests may
        carry a length alone; the real engine checks ids against its model."""
        if prompt_token_ids is None:
            return None, check_int("prompt_len", prompt_len, 1, hint="give prompt_token_ids or prompt_len=16")
        ids = list(check_int_sequence("prompt_token_ids", list(prompt_token_ids), 0))
        if not ids:
            raise ValueError("prompt_token_ids=[]: the prompt is empty; give at least one token id")
        return ids, len(ids)

    def add_request(self, prompt_token_ids, params: SamplingParams | None = None,
                    arrival_time: float | None = None, *, prompt_len: int | None = None,
                    tag: str | None = None) -> int:
        """Queue a request; returns its id. Everything the request needs is
        checked here, so a bad request is refused alone (ValueError or
        TypeError naming the argument) and leaves the engine as it was.

        arrival_time: seconds on the engine's clock, not in its future (None: now).
        """
        params = self._check_params(params)
        prompt_token_ids, length = self._check_prompt(prompt_token_ids, prompt_len)
        self._check_request(length, params)
        now = self.clock.now()
        arrival = check_real("arrival_time", arrival_time, allow_none=True, hint="None for now")
        if arrival is not None and arrival > now:
            raise ValueError(f"arrival_time={arrival!r}: in the future of the engine's clock (now {now:.6f} s); "
                             "a request arrives when it is added (try None)")
        if tag is not None:
            check_instance("tag", tag, str, "a string or None")
        request_id = self._next_id
        self._next_id += 1
        request = Request(request_id, prompt_token_ids, params, now if arrival is None else arrival,
                          prompt_len=length, tag=tag)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort_request(self, request_id: int) -> RequestOutput | None:
        """Stop a request now (vLLM's name): its blocks go back to the pool at
        once and it is never scheduled again. Returns its output, finished
        with finish_reason="abort"; None if it had already finished."""
        request_id = check_int("request_id", request_id, 0)
        if request_id >= self._next_id:
            raise ValueError(f"request_id={request_id}: no such request (ids so far: 0..{self._next_id - 1})")
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        self._finish(request, "abort", self.clock.now())
        return request.to_output()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def _finish(self, request: Request, reason: str, time_s: float, error: str | None = None) -> None:
        request.finish_reason = reason
        request.error = error
        request.metrics.finish_time = time_s
        if reason in ("abort", "error"):        # may be waiting, or mid-prompt
            self.scheduler.abort(request)
        else:
            self.scheduler.finish(request)
        self.executor.release(request)
        # Bounded memory: the oldest finished requests leave `requests`.
        self._finished_ids.append(request.request_id)
        while len(self._finished_ids) > self.max_finished_requests:
            self.requests.pop(self._finished_ids.popleft(), None)

    # ---- the loop -----------------------------------------------------------------
    def _save_state(self):
        """What a step may change before its forward pass succeeds: the queues,
        the running requests' counters and the block tables."""
        running = [(r, r.status, r.num_computed_tokens, r.num_preemptions) for r in self.scheduler.running]
        return (list(self.scheduler.waiting), running, self.block_manager.checkpoint())

    def _restore_state(self, saved) -> None:
        waiting, running, blocks = saved
        for request in waiting:           # a waiting request holds no computed tokens
            request.status, request.num_computed_tokens = RequestStatus.WAITING, 0
        for request, status, num_computed, num_preemptions in running:
            request.status, request.num_computed_tokens, request.num_preemptions = \
                status, num_computed, num_preemptions
        self.scheduler.waiting = deque(waiting)
        self.scheduler.running = [r for r, *_ in running]
        self.block_manager.rollback(blocks)

    def step(self) -> list[RequestOutput]:
        """Run one step; return the requests that got a token (or finished) in it.

        A request whose own part of the step fails finishes with
        finish_reason="error"; a failure of the whole step (the forward pass)
        puts the engine back as it was before the step and raises.
        """
        start = self.clock.now()
        saved = self._save_state()
        try:
            plan = self.scheduler.schedule()
            if not plan:
                return []
            # Which requests reach their last token this step, so get one sampled (drafts
            # are not the request's tokens yet: a verification emits 1 + accepted).
            emits_token = [r.num_computed_tokens + n - len(plan.drafts.get(r.request_id, ())) == r.num_tokens
                           for r, n in plan.scheduled]
            num_decode_tokens = plan.num_decode_tokens     # before the counters move
            sampled_tokens, duration_s = self.executor.execute(plan, emits_token)
        except BaseException:
            self._restore_state(saved)
            raise
        if duration_s is not None:
            self.clock.advance(duration_s)
        end = self.clock.now()
        outputs, spec = [], {}
        for (request, n), emits in zip(plan.scheduled, emits_token):
            result = as_sampled(sampled_tokens.get(request.request_id))
            num_drafts = len(plan.drafts.get(request.request_id, ()))
            error = self._result_error(request, result, emits, num_drafts)
            if error is not None:
                self._finish(request, "error", end, error=error)
                outputs.append(request.to_output())
                continue
            request.num_computed_tokens = num_computed_after(
                request.num_computed_tokens, n, num_drafts, len(result.token_ids) if num_drafts else 0)
            if num_drafts:      # the rejected drafts' blocks go back; their slots are overwritten later
                spec[request.request_id] = (num_drafts, len(result.token_ids) - 1)
                self.block_manager.shrink(request.request_id, request.num_computed_tokens)
            self.block_manager.cache_computed_blocks(request)   # prefix caching: name full, computed blocks
            if result is not None and result.prompt_logprobs:
                request.add_prompt_logprobs(result.first_prompt_position, result.prompt_logprobs)
            if not emits:
                continue
            self._append_tokens(request, result, end)
            if num_drafts and not request.is_finished:
                self.block_manager.cache_computed_blocks(request)   # the blocks its accepted drafts filled
            outputs.append(request.to_output())
        self._record(StepRecord(
            start=start, end=end,
            scheduled=[(r.request_id, n) for r, n in plan.scheduled],
            num_prefill_tokens=plan.num_tokens - num_decode_tokens, num_decode_tokens=num_decode_tokens,
            preempted=[r.request_id for r in plan.preempted], spec=spec))
        return outputs

    @staticmethod
    def _result_error(request: Request, result, emits: bool, num_drafts: int = 0) -> str | None:
        """Why the executor's answer for this request cannot be used (None: it can)."""
        if isinstance(result, RequestFailed):
            return str(result)
        if result is not None and not isinstance(result, Sampled):
            return f"executor gave no token: {result!r}"
        if emits and (result is None or not result.token_ids):
            return f"executor gave no token: {result!r}"
        if num_drafts and len(result.token_ids) > 1 + num_drafts:
            return (f"executor gave {len(result.token_ids)} tokens for a verification of {num_drafts} drafts "
                    f"(at most 1 + drafts)")
        if result is not None and result.prompt_logprobs and request.prompt_logprobs is not None \
                and result.first_prompt_position != len(request.prompt_logprobs):
            return (f"executor gave prompt logprobs from position {result.first_prompt_position}, "
                    f"but the next missing one is {len(request.prompt_logprobs)}")
        return None

    def _append_tokens(self, request: Request, result: Sampled, time_s: float) -> None:
        """Append the step's tokens (with their logprobs) until one stops the request:
        nothing after a stop token, nothing past max_tokens or the context."""
        for i, token in enumerate(result.token_ids):
            request.append_token(token, time_s)
            if request.logprobs is not None and result.logprobs is not None:
                request.logprobs.append(result.logprobs[i])
            reason = request.check_stop(self.eos_token_ids)
            if reason is None and self.max_model_len is not None and request.num_tokens >= self.max_model_len:
                reason = "length"
            if reason is not None:
                self._finish(request, reason, time_s)
            self._on_token(request)
            if reason is not None:
                return

    def _record(self, record: StepRecord) -> None:
        self.trace.append(record)
        if self.max_trace_steps is not None and len(self.trace) > self.max_trace_steps:
            del self.trace[0]     # a list (the book slices it); a memmove of pointers per step

    def _serve(self, ids: list[int], progress: bool, add_due=None, total: int | None = None
               ) -> dict[int, RequestOutput]:
        """Step until every request in ids, and every one add_due() adds, has
        finished; their final outputs by id. add_due() -> (new ids, more to come)."""
        bar = _progress_bar(progress, len(ids) if total is None else total)
        final: dict[int, RequestOutput] = {}
        wanted = set(ids)
        more_to_come = add_due is not None
        while True:
            if more_to_come:
                new_ids, more_to_come = add_due()
                wanted.update(new_ids)
            if not more_to_come and not wanted - final.keys():
                break
            if not self.has_unfinished_requests():
                raise RuntimeError(f"requests {sorted(wanted - final.keys())[:8]} have no output and "
                                   "nothing is left to run (aborted from another thread?)")
            for out in self.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return final

    def _on_token(self, request: Request) -> None:
        """Hook after each sampled token (the real engine decodes text here)."""

    def generate(self, prompts, params=None, progress: bool = False) -> list[RequestOutput]:
        """Run the prompts to completion; outputs in input order."""
        if isinstance(prompts, (str, bytes)):
            raise ArgumentTypeError(f"prompts={prompts!r}: must be a list of prompts, each a list of "
                                    "token ids (try tokenizer.encode(text) for each)")
        prompts = list(prompts)
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"params has {len(params)} entries for {len(prompts)} prompts")
            params_list = [self._check_params(p, f"params[{i}]") for i, p in enumerate(params)]
        else:
            params_list = [self._check_params(params)] * len(prompts)
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):   # refuse before queuing any
            try:
                self._check_request(self._check_prompt(prompt, None)[1], p)
            except ValueError as e:      # ArgumentTypeError included
                raise type(e)(f"prompts[{i}]: {e}") from None
        ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params_list)]
        final = self._serve(ids, progress)
        return [final[i] for i in ids]

    def run_workload(self, workload, progress: bool = False) -> list[RequestOutput]:
        """Serve a workloads.Workload: requests join at their arrival times,
        counted from the start of this call (or when their `after` condition
        holds); idle gaps are skipped. Every request yields an output."""
        if not hasattr(workload, "requests") or not hasattr(workload, "prompt_ids"):
            raise ArgumentTypeError(f"workload={workload!r}: must be a minillm.workloads.Workload "
                                    "(e.g. workloads.poisson_mix())")
        for i, spec in enumerate(workload.requests):     # refuse before serving any
            try:
                self._check_request(spec.prompt_len, SamplingParams(max_tokens=spec.max_tokens))
            except ValueError as e:
                raise ValueError(f"workload.requests[{i}]: {e}") from None
        run_start = self.clock.now()
        pending = sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_time)
        added: dict[int, int] = {}                 # workload index -> request id
        served: list[Request] = []                 # what `after` conditions look at

        def add_due() -> tuple[list[int], bool]:
            # A loop, not a recursive call: a closure that calls itself holds
            # itself, and the engine, in a reference cycle, so a dropped engine
            # and its KV pool would wait for the garbage collector, which then
            # frees them in the middle of some later step (10-20 ms on a CPU).
            while True:
                now = self.clock.now()
                # 1 ns of slack: after skip_to(run_start + t), now - run_start may
                # round to just below t.
                elapsed_s = now - run_start + 1e-9
                new_ids = []
                for index, spec in list(pending):
                    if not spec.is_due(elapsed_s, served):
                        continue
                    # A timed request arrived at its own time, possibly mid-step:
                    # its TTFT includes the wait for the step boundary.
                    arrival = min(now, run_start + spec.arrival_time) if spec.after is None else now
                    rid = self.add_request(
                        workload.prompt_ids(index, self.vocab_size),
                        SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True, temperature=0.0),
                        arrival_time=arrival, prompt_len=spec.prompt_len, tag=spec.tag)
                    added[index] = rid
                    served.append(self.requests[rid])
                    new_ids.append(rid)
                    pending.remove((index, spec))
                if new_ids or not pending or self.has_unfinished_requests():
                    return new_ids, bool(pending)
                timed = [s.arrival_time for _, s in pending if s.after is None]
                if not timed:   # validated workloads cannot get here; never drop silently
                    raise RuntimeError(f"workload requests {[i for i, _ in pending][:8]} wait on "
                                       "`after` conditions that can no longer hold")
                self.clock.skip_to(run_start + min(timed))      # idle until the next arrival

        final = self._serve([], progress, add_due, total=len(workload.requests))
        return [final[added[i]] for i in sorted(added)]


def _progress_bar(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="requests", leave=False)


# ---------------------------------------------------------------------------
# The real executor and engine
# ---------------------------------------------------------------------------
class ModelExecutor:
    """Packs a scheduled step for the model runner and samples the tokens."""

    def __init__(self, model, block_manager: BlockManager, backend: str | None = None,
                 batch_invariant: bool = False):
        self.runner = ModelRunner(model, block_manager, backend=backend, batch_invariant=batch_invariant)
        self.cfg = model.cfg
        self.device = model.device
        self._generators: dict[int, torch.Generator | None] = {}

    def execute(self, plan: ScheduledStep, emits_token: list[bool]):
        chunks = [self._chunk(r, n, emits, plan.drafts.get(r.request_id, ()))
                  for (r, n), emits in zip(plan.scheduled, emits_token)]
        logits = self.runner.execute(chunks)                         # [rows asked for, vocab]
        results, row = {}, 0
        for (request, _), emits, chunk in zip(plan.scheduled, emits_token, chunks):
            num_rows = len(chunk.rows_with_logits())
            if num_rows:
                results[request.request_id] = self._outcome(request, chunk, logits[row:row + num_rows], emits,
                                                            plan.drafts.get(request.request_id, ()))
            row += num_rows
        synchronize(self.device)
        return results, None

    @staticmethod
    def _chunk(request, num_new: int, emits: bool, drafts=()) -> StepChunk:
        """The request's tokens of this step, and the rows whose logits it needs:
        the last one to sample from, and for prompt_logprobs every row that
        predicts a prompt token not yet scored (row at position p scores token p + 1).
        A verification is the pending token and its drafts: all 1 + k rows."""
        start = request.num_computed_tokens
        if drafts:
            token_ids = request.token_ids(start, start + num_new - len(drafts)) + list(drafts)
            return StepChunk(request.request_id, token_ids, start,
                             logits_rows=list(range(num_new - len(drafts) - 1, num_new)))
        chunk = StepChunk(request.request_id, request.token_ids(start, start + num_new), start, sample=emits)
        first_missing = request.next_prompt_logprob_position()
        if first_missing is not None:
            rows = list(range(max(first_missing - 1, start) - start,
                              min(request.prompt_len - 1, start + num_new) - start))
            chunk.logits_rows = rows + ([num_new - 1] if emits else [])
        return chunk

    def _outcome(self, request, chunk: StepChunk, logits: torch.Tensor, emits: bool,
                 drafts=()) -> Sampled | RequestFailed:
        """One request's part of the step from its logits rows; a failure here is that request's alone.

        logits: [rows, vocab] for chunk.rows_with_logits(), the sampled row last."""
        try:
            params = request.params
            if request.request_id not in self._generators:
                self._generators[request.request_id] = make_generator(params, request.request_id)
            if drafts:                              # a verification: logits rows of 1 + k
                tokens = verify(logits, list(drafts), params, self._generators[request.request_id])
                logprobs = (logprob_dicts(logits[:len(tokens)], tokens, params.logprobs)
                            if params.logprobs is not None else None)
                return Sampled(tokens, logprobs)
            num_prompt_rows = len(logits) - int(emits)
            outcome = Sampled([])
            if num_prompt_rows:
                first_row = chunk.rows_with_logits()[0]
                first_position = chunk.num_cached + first_row + 1        # the prompt token it scores
                scored = request.prompt_token_ids[first_position:first_position + num_prompt_rows]
                outcome.prompt_logprobs = logprob_dicts(logits[:num_prompt_rows], scored, params.prompt_logprobs)
                outcome.first_prompt_position = first_position
            if emits:
                token = sample_token(logits[-1].float(), params, self._generators[request.request_id])
                outcome.token_ids = [token]
                if params.logprobs is not None:
                    outcome.logprobs = logprob_dicts(logits[-1:], [token], params.logprobs)
            return outcome
        except Exception as e:     # noqa: BLE001 -- any error here is this request's, not the step's
            return RequestFailed(f"sampling failed: {type(e).__name__}: {e}")

    def release(self, request) -> None:
        self._generators.pop(request.request_id, None)


CPU_POOL_CAP_BYTES = 256 * 2**20


def default_num_blocks(model, max_num_seqs: int, block_size: int) -> int:
    """Enough for max_num_seqs requests of full context, capped at a share of
    the memory that is free: half of a GPU's free memory; on the CPU a tenth
    of the available RAM and at most 256 MiB (the pool is zero-filled, and
    notebooks build many engines)."""
    cfg = model.cfg
    wanted = max_num_seqs * blocks_for(cfg.max_position, block_size)
    bytes_per_block = cfg.kv_bytes_per_token(model.dtype.itemsize) * block_size
    free_bytes = free_memory_bytes(model.device)
    if model.device.type == "cuda":
        free_bytes //= 2
    else:
        free_bytes = min((free_bytes or 4 * 2**30) // 10, CPU_POOL_CAP_BYTES)
    if bytes_per_block > free_bytes:    # not even one block fits: do not round up to one
        raise ValueError(f"block_size={block_size}: one block of {bytes_per_block / 2**20:.0f} MiB exceeds the "
                         f"{free_bytes / 2**20:.0f} MiB the default pool may take (try block_size=16, "
                         "or pass num_blocks)")
    return min(wanted, free_bytes // bytes_per_block)


class LLMEngine(EngineCore):
    """The real engine: a model, a scheduler config and a paged KV pool."""

    def __init__(self, model, sched: SchedulerConfig | None = None, block_size: int = 16,
                 num_blocks: int | None = None, backend: str | None = None,
                 enable_prefix_caching: bool = False, tokenizer=None, *,
                 max_trace_steps: int | None = None, max_finished_requests: int = 1024,
                 speculative=None, batch_invariant: bool = False):
        check_instance("model", model, LlamaModel, "a model",
                       hint="minillm.build_model('tiny') or minillm.load_hf_model(path)")
        # batch_invariant: every row's bits independent of what shares its step (chapter 11)
        # (no backend named: the mode runs on sdpa, see attention.paged_attention)
        check_batch_invariant(batch_invariant, backend or model.backend)
        sched = sched if sched is not None else SchedulerConfig()
        check_instance("sched", sched, SchedulerConfig, "a SchedulerConfig", hint="SchedulerConfig(policy='chunked')")
        block_size = check_int("block_size", block_size, 1, hint="16")
        if num_blocks is None:
            num_blocks = default_num_blocks(model, sched.max_num_seqs, block_size)
        else:   # refuse a pool that cannot fit before the block manager counts out its free list
            num_blocks = check_pool_fits(num_blocks, model.cfg.kv_bytes_per_token(model.dtype.itemsize) * block_size,
                                         model.device)
        # enable_prefix_caching (vLLM's name): reuse the KV blocks of prefixes
        # already computed, e.g. a system prompt shared by many chats.
        blocks = make_block_manager(num_blocks, block_size, enable_prefix_caching)
        super().__init__(sched, blocks, ModelExecutor(model, blocks, backend, batch_invariant), WallClock(),
                         eos_token_ids=model.cfg.eos_token_ids, max_model_len=model.cfg.max_position,
                         max_trace_steps=max_trace_steps, max_finished_requests=max_finished_requests,
                         # speculative: a speculative.SpeculativeConfig (chapter 12), or None
                         speculator=None if speculative is None else Speculator(speculative))
        self.model = model
        self.batch_invariant = batch_invariant
        self.vocab_size = model.cfg.vocab_size
        self.tokenizer = tokenizer            # None: outputs carry ids only, text=None
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}

    def _on_token(self, request: Request) -> None:
        if self.tokenizer is None:
            return
        detokenizer = self._detokenizers.setdefault(request.request_id, IncrementalDetokenizer(self.tokenizer))
        detokenizer.push(request.output_token_ids[-1])
        if request.is_finished:
            detokenizer.flush()
            del self._detokenizers[request.request_id]
        request.text = detokenizer.text

    def _finish(self, request: Request, reason: str, time_s: float, error: str | None = None) -> None:
        super()._finish(request, reason, time_s, error)
        if reason in ("abort", "error"):     # no token follows to flush its text: drop it now
            self._detokenizers.pop(request.request_id, None)

    def _check_prompt(self, prompt_token_ids, prompt_len) -> tuple[list[int], int]:
        # A batch of prompts is not one prompt: refuse a 2-D tensor or array
        # rather than flatten it into one long prompt.
        ndim = getattr(prompt_token_ids, "ndim", 1)
        if ndim != 1:
            raise ValueError(f"prompt_token_ids has shape {tuple(prompt_token_ids.shape)}: one prompt must be "
                             "1-D (pass a batch as a list of prompts to generate())")
        ids = check_prompt(self.model, prompt_token_ids, arg="prompt_token_ids")
        if prompt_len is not None and check_int("prompt_len", prompt_len, 1) != len(ids):
            raise ValueError(f"prompt_len={prompt_len}: differs from the {len(ids)} prompt_token_ids given")
        return ids, len(ids)
