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
from dataclasses import dataclass, field

import torch

from .detokenizer import IncrementalDetokenizer
from .device import synchronize
from .kv_cache import BlockManager, blocks_for
from .model_runner import ModelRunner, StepChunk, check_prompt
from .request import Request, RequestOutput, SamplingParams
from .sampler import make_generator, sample_token
from .scheduler import ScheduledStep, Scheduler, SchedulerConfig


@dataclass
class StepRecord:
    start: float                                   # seconds on the engine's clock
    end: float
    scheduled: list[tuple[int, int]]               # (request_id, num_new_tokens)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[int] = field(default_factory=list)

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


class EngineCore:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, executor, clock,
                 eos_token_ids: tuple[int, ...] = (), max_model_len: int | None = None):
        if not isinstance(config, SchedulerConfig):
            raise TypeError(f"sched must be a SchedulerConfig, got {type(config).__name__}")
        self.config = config
        self.block_manager = block_manager
        self.scheduler = Scheduler(config, block_manager)
        self.executor = executor
        self.clock = clock
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_model_len = max_model_len
        self.trace: list[StepRecord] = []
        self.requests: dict[int, Request] = {}
        self._next_id = 0
        self.vocab_size: int | None = None    # None: requests carry lengths, not token ids

    # ---- requests ---------------------------------------------------------------
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

    def add_request(self, prompt_token_ids, params: SamplingParams | None = None,
                    arrival_time: float | None = None, *, prompt_len: int | None = None,
                    tag: str | None = None) -> int:
        """Queue a request; returns its id. A bad request is refused alone
        (ValueError) and leaves the engine as it was."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt_token_ids = self._check_prompt(prompt_token_ids, prompt_len)
        length = len(prompt_token_ids) if prompt_token_ids is not None else prompt_len
        self._check_request(length, params)
        request_id = self._next_id
        self._next_id += 1
        arrival = self.clock.now() if arrival_time is None else float(arrival_time)
        request = Request(request_id, prompt_token_ids, params, arrival, prompt_len=length, tag=tag)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def _check_prompt(self, prompt_token_ids, prompt_len):
        return prompt_token_ids  # the real engine checks ids against its model

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop -----------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; return the requests that got a token in it."""
        start = self.clock.now()
        plan = self.scheduler.schedule()
        if not plan:
            return []
        decode_tokens = sum(n for r, n in plan.scheduled if r.is_decoding)
        samples = [r.num_computed_tokens + n == r.num_tokens for r, n in plan.scheduled]
        sampled_tokens, duration_s = self.executor.execute(plan, samples)
        if duration_s is not None:
            self.clock.advance(duration_s)
        end = self.clock.now()
        outputs = []
        for (request, n), sample in zip(plan.scheduled, samples):
            request.num_computed_tokens += n
            if not sample:
                continue
            request.append_token(sampled_tokens[request.request_id], end)
            reason = request.check_stop(self.eos_token_ids)
            if reason is None and self.max_model_len is not None and request.num_tokens >= self.max_model_len:
                reason = "length"
            if reason is not None:
                request.finish_reason = reason
                request.metrics.finish_time = end
                self.scheduler.finish(request)
                self.executor.release(request)
            self._on_token(request)
            outputs.append(request.to_output())
        self.trace.append(StepRecord(
            start=start, end=end,
            scheduled=[(r.request_id, n) for r, n in plan.scheduled],
            num_prefill_tokens=plan.num_tokens - decode_tokens, num_decode_tokens=decode_tokens,
            preempted=[r.request_id for r in plan.preempted]))
        return outputs

    def _on_token(self, request: Request) -> None:
        """Hook after each sampled token (the real engine decodes text here)."""

    def generate(self, prompts, params=None, progress: bool = False) -> list[RequestOutput]:
        """Run the prompts to completion; outputs in input order."""
        prompts = list(prompts)
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"params has {len(params)} entries for {len(prompts)} prompts")
            params_list = list(params)
        else:
            params_list = [params] * len(prompts)
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):   # refuse before queuing any
            try:
                p = p if p is not None else SamplingParams()
                self._check_request(len(self._check_prompt(prompt, None)), p)
            except ValueError as e:
                raise ValueError(f"prompts[{i}]: {e}") from None
        ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params_list)]
        self._run_until(lambda: all(self.requests[i].is_finished for i in ids), progress, len(ids))
        return [self.requests[i].to_output() for i in ids]

    def _run_until(self, done, progress: bool, total: int) -> None:
        bar = _progress_bar(progress, total)
        finished_before = 0
        while not done():
            self.step()
            if bar is not None:
                finished = sum(r.is_finished for r in self.requests.values())
                bar.update(finished - finished_before)
                finished_before = finished
        if bar is not None:
            bar.close()

    def run_workload(self, workload, progress: bool = False) -> list[RequestOutput]:
        """Serve a workloads.Workload: requests join at their arrival times
        (or when their `after` condition holds); idle gaps are skipped."""
        pending = sorted(enumerate(workload.requests), key=lambda item: item[1].arrival_time)
        added: dict[int, int] = {}
        bar = _progress_bar(progress, len(pending))
        while pending or self.has_unfinished_requests():
            now = self.clock.now()
            for index, spec in list(pending):
                if spec.is_due(now, self.requests.values()):
                    added[index] = self.add_request(
                        workload.prompt_ids(index, self.vocab_size), SamplingParams(
                            max_tokens=spec.max_tokens, ignore_eos=True, temperature=0.0),
                        # A timed request arrived at its own time, possibly mid-step:
                        # its TTFT includes the wait for the step boundary.
                        arrival_time=spec.arrival_time if spec.after is None else now,
                        prompt_len=spec.prompt_len, tag=spec.tag)
                    pending.remove((index, spec))
            if not self.has_unfinished_requests():
                timed = [s.arrival_time for _, s in pending if s.after is None]
                if not timed:
                    break
                self.clock.skip_to(min(timed))
                continue
            for out in self.step():
                if out.finished and bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [self.requests[added[i]].to_output() for i in sorted(added)]


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

    def __init__(self, model, block_manager: BlockManager, backend: str | None = None):
        self.runner = ModelRunner(model, block_manager, backend=backend)
        self.device = model.device
        self._generators: dict[int, torch.Generator | None] = {}

    def execute(self, plan: ScheduledStep, samples: list[bool]):
        chunks = [StepChunk(r.request_id, r.token_ids(r.num_computed_tokens, r.num_computed_tokens + n),
                            r.num_computed_tokens, sample=s)
                  for (r, n), s in zip(plan.scheduled, samples)]
        logits = self.runner.execute(chunks)                         # [num sampled, vocab]
        tokens, row = {}, 0
        for (request, _), sample in zip(plan.scheduled, samples):
            if sample:
                if request.request_id not in self._generators:
                    self._generators[request.request_id] = make_generator(request.params, request.request_id)
                tokens[request.request_id] = sample_token(
                    logits[row].float(), request.params, self._generators[request.request_id])
                row += 1
        synchronize(self.device)
        return tokens, None

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
    if model.device.type == "cuda":
        free_bytes = torch.cuda.mem_get_info(model.device)[0] // 2
    else:
        free_bytes = min(_available_ram_bytes() // 10, CPU_POOL_CAP_BYTES)
    return max(1, min(wanted, free_bytes // bytes_per_block))


def _available_ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30


class LLMEngine(EngineCore):
    """The real engine: a model, a scheduler config and a paged KV pool."""

    def __init__(self, model, sched: SchedulerConfig | None = None, block_size: int = 16,
                 num_blocks: int | None = None, backend: str | None = None, tokenizer=None):
        sched = sched if sched is not None else SchedulerConfig()
        if num_blocks is None:
            num_blocks = default_num_blocks(model, sched.max_num_seqs, block_size)
        blocks = BlockManager(num_blocks, block_size)
        super().__init__(sched, blocks, ModelExecutor(model, blocks, backend), WallClock(),
                         eos_token_ids=model.cfg.eos_token_ids, max_model_len=model.cfg.max_position)
        self.model = model
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

    def _check_prompt(self, prompt_token_ids, prompt_len):
        return check_prompt(self.model, prompt_token_ids, arg="prompt_token_ids")
