"""Checkers for exercises/12_speculative_decoding: drafts, verification and the budget.

The expected values come from the engine, computed before the learner's function runs
(its verification, its Scheduler with a drafter that proposes a chosen number of drafts,
EngineCore steps on a clock with no model) or from checker-local statistics of the
learner's own samples; the engine's answers raise while the learner's code runs.
"""
from __future__ import annotations

import math
import random

import torch

from ..engine import EngineCore, Sampled, VirtualClock
from ..kv_cache import BlockManager
from ..request import SamplingParams
from ..scheduler import SchedulerConfig
from ..speculative import SpeculativeConfig, Speculator, expected_tokens_per_verification, verify_greedy
from ._common import (ExerciseFailed, call_text, checker, crashed, fail as _fail, forbid, function_name,
                      grade_prediction, learner_call, passed, show)

__all__ = ["check_verify_packed_step", "check_plan_step", "check_long_prompt_steps",
           "check_speculative_sample", "check_best_k"]

_VERIFY = ("minillm.speculative.verify_greedy", "minillm.speculative.verify", "minillm.speculative.rejection_sample")
_ENGINE = ("minillm.engine.EngineCore.step", "minillm.scheduler.Scheduler.schedule",
           "minillm.scheduler.Scheduler._schedule_drafts", "minillm.sim.simulator.simulate")
_FORMULA = ("minillm.speculative.expected_tokens_per_verification",
            "minillm.speculative.expected_acceptance_rate")


# ---------------------------------------------------------------------------
# 1. Verify a packed step, greedily
# ---------------------------------------------------------------------------
def _logits_with_targets(targets: list[int], vocab: int, rng: random.Random) -> torch.Tensor:
    rows = torch.tensor([[rng.uniform(-2.0, 2.0) for _ in range(vocab)] for _ in targets], dtype=torch.float32)
    for i, t in enumerate(targets):
        rows[i, t] = 3.0 + rng.random()
    return rows


def _random_request(rng: random.Random, vocab: int):
    """(query_len, drafts, targets of its rows) for one request of a packed step."""
    kind = rng.choice(["verify", "verify", "verify", "decode", "mid_prompt", "last_chunk"])
    if kind == "mid_prompt":
        n = rng.randint(1, 6)
        return n, None, [rng.randrange(vocab) for _ in range(n)]
    if kind in ("decode", "last_chunk"):
        n = 1 if kind == "decode" else rng.randint(2, 6)
        return n, [], [rng.randrange(vocab) for _ in range(n)]
    k = rng.randint(1, 5)
    targets = [rng.randrange(vocab) for _ in range(k + 1)]
    agree = rng.choice([0, k, rng.randint(0, k)])            # none, all, or some of the drafts right
    drafts = targets[:agree] + [(targets[i] + rng.randint(1, vocab - 1)) % vocab for i in range(agree, k)]
    if rng.random() < 0.5 and agree < k - 1:                   # a right draft after a wrong one
        drafts[agree + 1] = targets[agree + 1]
    return k + 1, drafts, targets


def _hand_picked_steps(vocab: int):
    return [
        [(4, [1, 2, 3], [1, 2, 3, 4])],                        # every draft right: 3 + the bonus
        [(4, [1, 5, 3], [1, 2, 3, 4])],                        # wrong at 2, right at 3: stop at 2
        [(1, [], [7]), (3, [6, 6], [6, 0, 8])],                # a plain decode, then a verification
        [(5, None, [0, 1, 2, 3, 4]), (3, [9, 9], [9, 9, 9])],  # a chunk mid-prompt emits nothing
        [(3, [], [3, 4, 5]), (2, [2], [1, 6])],                # a prompt's last chunk: its last row
    ]


def _diagnose_verify(got, expected, drafts, n, index) -> str:
    where = f"request {index} (query_len {n}, drafts {drafts})"
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in got):
        return f"{where}: return a list of token ids (ints) per request; got {show(got)}"
    got = list(got)
    if drafts is None:
        return f"{where}: a chunk in the middle of a prompt emits nothing; you emitted {got}"
    if len(got) > len(expected) and got[:len(expected)] == expected:
        return (f"{where}: you emitted {got}, expected {expected}: accepting past the first mismatch; after a "
                "wrong draft every later row was computed from a wrong input")
    if got == expected[:-1] and len(expected) == len(drafts) + 1:
        return (f"{where}: you emitted {got}, expected {expected}: forgetting the bonus token; when all k drafts "
                "agree, row k predicts one more token")
    if got == expected[:-1]:
        return (f"{where}: you emitted {got}, expected {expected}: at the first mismatch emit that row's argmax "
                "(a verification emits 1 + accepted tokens, never only the accepted drafts)")
    if got[:-1] == expected[:-1] and len(got) == len(expected) and len(got) <= len(drafts) \
            and got[-1] == drafts[len(got) - 1]:
        return f"{where}: you emitted {got}, expected {expected}: at the mismatch the draft was wrong: emit the target"
    return (f"{where}: you emitted {got}, expected {expected}: its rows are its last 1 + len(drafts) rows, after "
            "the rows of every request before it in the packed step")


@checker
def check_verify_packed_step(verify_packed_step, seed: int | None = None, *, num_cases: int = 200):
    """verify_packed_step(logits, query_lens, drafts) -> the tokens each request emits."""
    rng = random.Random(seed)
    vocab = 10
    cases = _hand_picked_steps(vocab) + [[_random_request(rng, vocab) for _ in range(rng.randint(1, 6))]
                                         for _ in range(num_cases)]
    for case in cases:
        query_lens = [n for n, _, _ in case]
        drafts = [d for _, d, _ in case]
        logits = torch.cat([_logits_with_targets(t, vocab, rng) for _, _, t in case])         # [T, vocab]
        expected, start = [], 0
        for n, d in zip(query_lens, drafts):                                              # the engine's rule
            rows = logits[start:start + n]
            start += n
            expected.append([] if d is None else verify_greedy(rows[n - 1 - len(d):], list(d)))
        got = learner_call(verify_packed_step, logits.clone(), list(query_lens),
                           [None if d is None else list(d) for d in drafts], forbidden=_VERIFY,
                           why="write the acceptance rule yourself.")
        if not isinstance(got, (list, tuple)) or len(got) != len(case):
            _fail(f"{call_text(verify_packed_step, logits, query_lens, drafts)} returned {show(got)}: "
                  f"return one list of tokens per request ({len(case)} here)")
        for i, (g, e) in enumerate(zip(got, expected)):
            if g is None or list(g) != e:
                _fail(_diagnose_verify(g, e, drafts[i], query_lens[i], i) + f" [step of {len(case)} requests, "
                      f"query_lens {query_lens}]")
    passed(f"verify_packed_step: {len(cases)} packed steps verified as the engine verifies them")


# ---------------------------------------------------------------------------
# Engine harness: streams decoding with chosen drafts, a prompt arriving
# ---------------------------------------------------------------------------
class _RejectEveryDraft:
    """An executor with no model: each verification keeps none of its drafts (streams
    never finish early; what the steps hold is what the scheduler decided)."""
    cfg = None

    def execute(self, plan, emits):
        return {r.request_id: Sampled([1]) for (r, _), e in zip(plan.scheduled, emits) if e}, 1.0

    def release(self, request):
        pass


class _ChosenDrafts(Speculator):
    """Proposes, for each stream, as many drafts as it is told (none until told)."""

    def __init__(self, draft_budget: str):
        super().__init__(SpeculativeConfig(num_speculative_tokens=0, draft_budget=draft_budget))
        self.counts: dict[int, int] = {}

    def max_drafts(self, request, max_model_len):
        return self.counts.get(request.request_id, 0)

    def propose(self, request, max_num_tokens):
        return [2] * max(0, min(max_num_tokens, self.counts.get(request.request_id, 0)))


def _streams_core(num_streams: int, token_budget: int, chunk_size: int, draft_budget: str):
    """(core, stream ids, drafter): num_streams requests decoding, no draft proposed yet."""
    drafter = _ChosenDrafts(draft_budget)
    core = EngineCore(SchedulerConfig(chunk_size=chunk_size, token_budget=token_budget, max_num_seqs=num_streams + 1),
                      BlockManager(20_000, 16), _RejectEveryDraft(), VirtualClock(), max_model_len=1_000_000,
                      speculator=drafter)
    streams = [core.add_request(None, SamplingParams(max_tokens=100_000), prompt_len=2) for _ in range(num_streams)]
    while not all(core.requests[s].output_token_ids for s in streams):
        core.step()
    return core, streams, drafter


def engine_plan(stream_drafts, prompt_left, token_budget, chunk_size):
    """The engine's scheduler on this state: (drafts per stream, prompt tokens)."""
    core, streams, drafter = _streams_core(len(stream_drafts), token_budget, chunk_size, "drafts_first")
    drafter.counts.update(zip(streams, stream_drafts))
    prompt = core.add_request(None, SamplingParams(max_tokens=1), prompt_len=prompt_left)
    plan = core.scheduler.schedule()
    tokens = dict((r.request_id, n) for r, n in plan.scheduled)
    return [len(plan.drafts.get(s, ())) for s in streams], tokens.get(prompt, 0)


# ---------------------------------------------------------------------------
# 2. Plan a step: drafts and a chunk in one budget
# ---------------------------------------------------------------------------
def _all_or_nothing(stream_drafts, free):
    """Drafts in stream order, but a stream's drafts only when all of them fit (a usual slip)."""
    out = []
    for proposed in stream_drafts:
        out.append(proposed if proposed <= free else 0)
        free -= out[-1]
    return out


def _even_shares(stream_drafts, free):
    """Drafts shared evenly among the streams when they do not all fit (a usual slip)."""
    if sum(stream_drafts) <= free:
        return list(stream_drafts)
    return [min(proposed, free // len(stream_drafts)) for proposed in stream_drafts]


def _chunk_first(stream_drafts, prompt_left, budget, chunk_size):
    """The plan under chunk_first: the streams' tokens, the chunk, then the drafts in order."""
    free = budget - len(stream_drafts)
    chunk = max(0, min(chunk_size, prompt_left, free))
    free -= chunk
    drafts = []
    for proposed in stream_drafts:
        drafts.append(max(0, min(proposed, free)))
        free -= drafts[-1]
    return drafts, chunk


@checker
def check_plan_step(plan_step, seed: int | None = None, *, num_cases: int = 150):
    """plan_step(stream_drafts, prompt_left, token_budget, chunk_size) -> (drafts per stream, chunk)."""
    rng = random.Random(seed)
    cases = [([4, 4, 4, 4], 300, 64, 64), ([4] * 8, 300, 40, 40), ([8, 0, 8], 100, 12, 64), ([2, 2], 5, 100, 64),
             ([4] * 8, 300, 36, 36)]
    for _ in range(num_cases):
        n = rng.randint(1, 8)
        stream_drafts = [rng.choice([0, rng.randint(0, 8)]) for _ in range(n)]
        budget = n + 1 + rng.choice([0, rng.randint(0, 20), rng.randint(0, 120)])
        cases.append((stream_drafts, rng.randint(1, 400), budget, rng.choice([budget, rng.randint(1, 256)])))
    for stream_drafts, prompt_left, budget, chunk_size in cases:
        expected = engine_plan(stream_drafts, prompt_left, budget, chunk_size)
        args = (list(stream_drafts), prompt_left, budget, chunk_size)
        got = learner_call(plan_step, *args, forbidden=_ENGINE, why="apply the rule in the statement.")
        call = call_text(plan_step, *args)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], (list, tuple))):
            _fail(f"{call} returned {show(got)}: return (a list of drafts per stream, the chunk's tokens)")
        drafts, chunk = list(got[0]), got[1]
        if (drafts, chunk) == (expected[0], expected[1]):
            continue
        n = len(stream_drafts)
        used = n + sum(d for d in drafts if isinstance(d, int)) + (chunk if isinstance(chunk, int) else 0)
        if used > budget and drafts == list(stream_drafts) and sum(drafts):
            _fail(f"{call} returned {got}: {used} tokens, over token_budget={budget}: counting the drafts as free; "
                  f"a draft is a token of the step like any other")
        if used > budget:
            _fail(f"{call} returned {got}, expected {expected}: with the streams' own tokens that is {used} tokens, "
                  f"over token_budget={budget}: every stream keeps its own token before any draft is scheduled, "
                  f"so the drafts share token_budget - {n} streams")
        free = budget - n
        if drafts == _all_or_nothing(stream_drafts, free) != expected[0]:
            _fail(f"{call} returned {got}, expected {expected}: a stream whose drafts do not all fit got none of "
                  "them; the engine trims a stream's drafts to what the budget has left (it schedules part of them), "
                  "stream after stream")
        if drafts == _even_shares(stream_drafts, free) != expected[0]:
            _fail(f"{call} returned {got}, expected {expected}: you shared the drafts evenly among the streams; "
                  "the engine takes them stream after stream, in order, each trimmed to what is left, so the last "
                  "streams lose theirs first")
        if (drafts, chunk) == _chunk_first(stream_drafts, prompt_left, budget, chunk_size):
            _fail(f"{call} returned {got}, expected {expected}: that is the chunk-first rule; in vLLM V1 the "
                  "running requests come first, drafts included, and the chunk gets what they leave")
        if sum(drafts) > sum(expected[0]):
            _fail(f"{call} returned {got}, expected {expected}: every stream keeps its own token before any "
                  f"draft is scheduled: the drafts share token_budget - {n} streams")
        _fail(f"{call} returned {got}, expected {expected}: drafts in stream order, each trimmed to what the "
              "budget has left; then the chunk: min(chunk_size, what is left of the prompt, of the budget)")
    passed(f"plan_step: {len(cases)} steps planned as the engine's scheduler plans them")


# ---------------------------------------------------------------------------
# 3. Predict, then measure: the long prompt's prefill among speculating streams
# ---------------------------------------------------------------------------
MAX_MEASURED_STEPS = 400


def measured_long_prompt_steps(prompt_len, num_streams, k, token_budget, chunk_size, draft_budget):
    """Steps from the prompt's arrival to its first token, on the engine (inf past MAX_MEASURED_STEPS)."""
    core, streams, drafter = _streams_core(num_streams, token_budget, chunk_size, draft_budget)
    drafter.counts.update((s, k) for s in streams)
    prompt = core.add_request(None, SamplingParams(max_tokens=1), prompt_len=prompt_len)
    for step in range(1, MAX_MEASURED_STEPS + 1):
        core.step()
        if core.requests[prompt].output_token_ids:
            return step
    return math.inf


@checker
def check_long_prompt_steps(long_prompt_steps, seed: int | None = None, *, num_cases: int = 12):
    """long_prompt_steps(prompt_len, num_streams, k, token_budget, chunk_size, draft_budget): the
    predicted steps of the prompt's prefill; measured on the engine, exact (inf when starved)."""
    rng = random.Random(seed)
    cases = [(600, 8, 4, 64, 64, "drafts_first"), (600, 8, 4, 64, 64, "chunk_first"), (2048, 8, 4, 256, 256,
             "drafts_first"), (500, 8, 7, 64, 64, "drafts_first"), (700, 4, 2, 256, 100, "drafts_first")]
    while len(cases) < num_cases + 5:
        n, k = rng.randint(1, 8), rng.randint(1, 8)
        budget = rng.choice([n * (1 + k) + rng.randint(1, 200), rng.randint(n + 1, n * (1 + k))])
        chunk = rng.choice([budget, rng.randint(8, 256)])
        prompt_len = rng.randint(50, 1500)
        draft_budget = rng.choice(["drafts_first", "drafts_first", "chunk_first"])
        if math.ceil(prompt_len / max(1, min(chunk, budget - n * (1 + k)))) <= 150:
            cases.append((prompt_len, n, k, budget, chunk, draft_budget))
    for case in cases:
        measured = measured_long_prompt_steps(*case)
        prompt_len, n, k, budget, chunk, draft_budget = case
        got = learner_call(long_prompt_steps, *case, forbidden=_ENGINE,
                           why="predict the count from the scheduling rule, without running the engine.")
        call = call_text(long_prompt_steps, *case)
        if measured == math.inf or got == math.inf:
            if got != measured:
                _fail(f"{call} = {show(got)}, the engine measures {measured}: "
                      + ("the streams take the whole budget (n(1 + k) >= token_budget): the prompt gets no chunk "
                         "while they run; return math.inf" if measured == math.inf else
                         "the prompt does get a chunk every step here"))
            continue
        why = "each step the chunk is what the budget leaves; count the steps it takes to cover the prompt"
        if isinstance(got, (int, float)) and draft_budget == "drafts_first":
            if got == math.ceil(prompt_len / min(chunk, budget - n)):
                why = "counting the drafts as free: the streams take n(1 + k) tokens a step, not n"
            elif budget - n * k > 0 and got == math.ceil(prompt_len / min(chunk, budget - n * k)):
                why = "each stream verifies its pending token and its k drafts: 1 + k tokens, not k"
            elif got == math.ceil(prompt_len / (budget - n * (1 + k))):
                why = "the chunk is also capped by chunk_size"
        elif isinstance(got, (int, float)) and got == math.ceil(prompt_len / max(1, min(chunk, budget - n * (1 + k)))):
            why = "under chunk_first the chunk is scheduled before any draft: only the streams' own tokens come first"
        grade_prediction(call, got, measured, 0.0, why, unit=" steps")
    passed(f"long_prompt_steps: {len(cases)} predictions equal the engine's step counts")


# ---------------------------------------------------------------------------
# 4. Speculative sampling with prompt-lookup drafts
# ---------------------------------------------------------------------------
def _random_rows(rng: random.Random, k: int, vocab: int, drafts: list[int]) -> torch.Tensor:
    rows = []
    for i in range(k + 1):
        weights = [rng.uniform(0.05, 1.0) for _ in range(vocab)]
        if i < k:
            weights[drafts[i]] *= rng.choice([0.0, 1.0, 4.0, 10.0])       # drafts likely, or impossible
        total = sum(weights)
        rows.append([w / total for w in weights])
    return torch.tensor(rows, dtype=torch.float64)


def _tv(samples: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples, dtype=torch.long), minlength=len(p)).double()
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


NUM_SAMPLES, SAMPLE_TOLERANCE = 3000, 0.06


def _same_seed_same_tokens(fn, probs, drafts, seed: int, draws: int = 30) -> bool:
    """Does one generator seed replay the same tokens whatever the global generators' states?"""
    runs, python_state = [], random.getstate()
    try:
        for global_seed in (1, 2):
            generator = torch.Generator().manual_seed(seed)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(global_seed)
                random.seed(global_seed)
                runs.append([[int(t) for t in fn(probs.clone(), list(drafts), generator)] for _ in range(draws)])
    finally:
        random.setstate(python_state)
    return runs[0] == runs[1]


@checker
def check_speculative_sample(speculative_sample, seed: int | None = None, *, num_cases: int = 4):
    """speculative_sample(probs, drafts, generator) -> emitted tokens; their distribution is checked:
    position 1 against probs[0], position 2 (when draft 1 was kept) against probs[1]. With 3,000
    draws the sampling error is about 0.017 in total variation; the tolerance is 0.06."""
    rng = random.Random(seed)
    for case in range(num_cases):
        vocab, k = rng.randint(4, 7), rng.randint(1, 3)
        drafts = [rng.randrange(vocab) for _ in range(k)]
        probs = _random_rows(rng, k, vocab, drafts)
        if case == 0:                              # every draft likely right: bonus tokens happen
            for i, d in enumerate(drafts):
                probs[i] = torch.full((vocab,), 0.1 / (vocab - 1), dtype=torch.float64)
                probs[i, d] = 0.9
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        call = call_text(speculative_sample, probs, drafts, "<generator>")
        runs = []
        with forbid(speculative_sample, *_VERIFY, why="write the acceptance rule yourself."):
            outputs = []
            for _ in range(NUM_SAMPLES):      # the engine's answers stay switched off for all the draws
                args = (probs.clone(), list(drafts), generator)
                try:
                    outputs.append(speculative_sample(*args))
                except (NotImplementedError, ExerciseFailed):
                    raise
                except Exception as exc:      # noqa: BLE001 (any crash of the learner's code is reported)
                    crashed(speculative_sample, args, {}, exc)
            if case == 0 and not _same_seed_same_tokens(speculative_sample, probs, drafts, rng.randrange(2**31)):
                _fail(f"{call}: two generators seeded alike gave different tokens (torch's and Python's global "
                      "generators seeded differently): draw every random number from `generator` "
                      "(torch.rand(..., generator=generator)), so one seed replays a run")
        for out in outputs:
            if not isinstance(out, (list, tuple)) or not 1 <= len(out) <= k + 1:
                _fail(f"{call} returned {show(out)}: emit between 1 and k + 1 = {k + 1} tokens")
            out = [int(t) for t in out]
            if out[:-1] != drafts[:len(out) - 1]:
                _fail(f"{call} returned {out} for drafts {drafts}: accepting past the first mismatch; every token "
                      "but the last must be an accepted draft")
            runs.append(out)
        all_accepted = math.prod(float(probs[i, d]) for i, d in enumerate(drafts))
        if NUM_SAMPLES * all_accepted > 30 and not any(len(r) == k + 1 for r in runs):
            _fail(f"{call}: in {NUM_SAMPLES} draws no verification emitted {k + 1} tokens: forgetting the bonus "
                  f"token; when all {k} drafts are accepted, sample one more from probs[{k}]")
        repeated = next((r for r in runs if len(r) <= k and r[-1] == drafts[len(r) - 1]), None)
        if repeated is not None:
            _fail(f"{call} returned {repeated}: the last token repeats the rejected draft {drafts[len(repeated) - 1]}; "
                  "on a rejection sample from the residual max(0, p - q): for a point-mass draft, p without the draft")
        first = _tv([r[0] for r in runs], probs[0])
        kept = [r[1] for r in runs if len(r) > 1]
        accept_rate = len(kept) / len(runs)                    # the first draft was kept
        if first > SAMPLE_TOLERANCE:
            why = (f"the first draft {drafts[0]} was kept in {accept_rate:.0%} of the draws, its probability is "
                   f"{float(probs[0, drafts[0]]):.0%}: accept with probability p(d) (min(1, p/q) with q(d) = 1)"
                   if abs(accept_rate - float(probs[0, drafts[0]])) > 0.05 else
                   "on a rejection, sample p with the draft removed, renormalised")
            _fail(f"{call}: the first token's distribution is {first:.3f} away from probs[0] in total variation "
                  f"(allowed {SAMPLE_TOLERANCE}): {why}")
        if len(kept) > 400 and _tv(kept, probs[1]) > SAMPLE_TOLERANCE + 0.02:
            _fail(f"{call}: after an accepted first draft, the second token is {_tv(kept, probs[1]):.3f} away from "
                  "probs[1] in total variation: verify the next draft against the next row in the same way")
    passed(f"speculative_sample: {num_cases} target distributions kept, {NUM_SAMPLES} draws each")


# ---------------------------------------------------------------------------
# 5. Choose k
# ---------------------------------------------------------------------------
def _step_models(rng: random.Random):
    base = rng.uniform(0.005, 0.05)
    per_token = base * rng.choice([0.002, 0.02, 0.1, 0.3])
    jump_at = rng.randint(2, 10)
    return [("affine", lambda k, b=base, c=per_token: b + c * k),
            ("a jump past a capture size", lambda k, b=base, c=per_token, j=jump_at: b + c * k + (b if k > j else 0)),
            ("quadratic", lambda k, b=base, c=per_token: b + c * k * k)]


def _best_k_crash(exc):
    if isinstance(exc, ZeroDivisionError):
        return ("at alpha = 1 the closed form (1 - alpha^(k+1)) / (1 - alpha) divides by zero: every draft is then "
                "accepted and a verification emits k + 1 tokens (take the limit, or sum the terms)")
    return None


@checker
def check_best_k(best_k, seed: int | None = None, *, num_cases: int = 60):
    """best_k(alpha, step_time_s, max_k) -> the k maximising expected tokens per second."""
    rng = random.Random(seed)
    cases = []
    for alpha in (0.0, 0.3, 0.6, 0.8, 0.9, 0.97, 1.0):
        for name, model in _step_models(rng):
            cases.append((alpha, name, model, rng.choice([4, 8, 16])))
    step = rng.uniform(0.005, 0.05)
    cases.append((0.0, "the same time for every k", lambda k, t=step: t, rng.choice([4, 8])))  # every k ties
    while len(cases) < num_cases:
        name, model = rng.choice(_step_models(rng))
        cases.append((round(rng.uniform(0.0, 1.0), 3), name, model, rng.randint(1, 16)))
    for alpha, name, step_time_s, max_k in cases:
        rates = [expected_tokens_per_verification(alpha, k) / step_time_s(k) for k in range(max_k + 1)]
        best = max(rates)
        expected = min(k for k, r in enumerate(rates) if r >= best * (1 - 1e-12))
        got = learner_call(best_k, alpha, step_time_s, max_k, forbidden=_FORMULA, explain=_best_k_crash,
                           why="write the expected tokens per verification yourself.")
        call = f"{function_name(best_k)}(alpha={alpha}, step_time_s=<{name}>, max_k={max_k})"
        if got == expected:
            continue
        if not isinstance(got, int) or isinstance(got, bool) or not 0 <= got <= max_k:
            _fail(f"{call} returned {show(got)}: return an int k in [0, {max_k}]")
        no_bonus = [(expected_tokens_per_verification(alpha, k) - 1) / step_time_s(k) for k in range(max_k + 1)]
        one_short = [(expected_tokens_per_verification(alpha, k) - alpha ** k) / step_time_s(k)
                     for k in range(max_k + 1)]                    # (1 - alpha^k) / (1 - alpha): k terms, not k + 1
        if got == max(range(max_k + 1), key=lambda k: (no_bonus[k], -k)):
            why = ("forgetting the bonus token: a verification emits 1 + accepted tokens, "
                   "1 + alpha + ... + alpha^k on average")
        elif got == max(range(max_k + 1), key=lambda k: (one_short[k], -k)):
            why = ("a verification with no drafts (k = 0) still emits 1 token, the target's own: the expected "
                   "tokens are 1 + alpha + ... + alpha^k, k + 1 terms ((1 - alpha^k) / (1 - alpha) has k)")
        elif math.isclose(rates[got], best, rel_tol=1e-9):
            why = "a tie: return the smallest of the best k"
        elif got == max_k:
            why = "more drafts cost a longer step: divide the tokens by the step's time"
        else:
            why = "compare the expected tokens per second of every k from 0 to max_k"
        _fail(f"{call} returned {got}, expected {expected} ({rates[got]:.1f} against {best:.1f} tokens/s): {why}")
    passed(f"best_k: {len(cases)} choices of k equal the best expected tokens per second")

