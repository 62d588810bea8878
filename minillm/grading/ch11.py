"""Checkers for exercises/11_bit_for_bit: which configurations keep the bits, the step that
makes a pipeline batch-variant, a streaming log-sum-exp whose bits do not depend on its
chunks, and distances in ulps.

Expected values come from the engine or from checker-local computations that are not the
task's answer: which runs are the same computation is read off the engine's forward calls
(`record_forward`) and the mode's guarantee is measured; the planted variant step of each
pipeline is known by construction; the log-sum-exp is checked against float64 and against
the learner's own results on other chunkings; ulps are counted by walking the floats
(`torch.nextafter`) or ranking every bfloat16 value. The engine functions that answer a
task raise while the learner's function runs.
"""
from __future__ import annotations

import math
import random

import torch

from ..config import ModelConfig
from ..loader import build_model
from ..prefill import prefill_kv
from ._common import call_text, checker, fail as _fail, learner_call, passed, record_forward, show

__all__ = ["check_keeps_bits", "check_first_variant_step", "check_streaming_logsumexp", "check_ulp_distance"]

_RUN_THE_MODEL = ("minillm.prefill.prefill_kv", "minillm.engine.LLMEngine", "minillm.model.LlamaModel.forward",
                  "minillm.model_runner.ModelRunner.execute", "minillm.grading._reference.ch11.keeps_bits")
_ULPS = ("minillm.book.bits.ulp_distance", "minillm.book.bits._ordered", "minillm.book.bits.bit_difference",
         "minillm.grading._reference.ch11.ulp_distance")
_SMALL = ModelConfig.preset("tiny").replace(num_layers=2)     # hidden 512, GQA 8/2, head_dim 64
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


# ---------------------------------------------------------------------------
# 1. Predict, then measure: which configurations keep the bits
# ---------------------------------------------------------------------------
_RUNS = []          # one _Runs per process: the same configurations give the same runs


class _Runs:
    """Runs of one prompt on a small model, per dtype: the forward steps each run made and its bits."""

    def __init__(self):
        self.models = {name: build_model(_SMALL, seed=0, dtype=dtype) for name, dtype in _DTYPES.items()}
        self.cache = {}

    def run(self, dtype, prompt_len, chunk_size=None, neighbours=0, threads=1, batch_invariant=False):
        key = (dtype, prompt_len, chunk_size, neighbours, threads, batch_invariant)
        if key not in self.cache:
            model = self.models[dtype]
            ids = [(7 * i + 3) % _SMALL.vocab_size for i in range(prompt_len)]
            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                with record_forward(model) as record:
                    kv, logits = prefill_kv(model, ids, chunk_size=chunk_size, batch_invariant=batch_invariant,
                                            neighbours=[(1, 20 + 9 * i) for i in range(neighbours)])
            finally:
                torch.set_num_threads(before)
            steps = [(call.query_lens, call.cached_lens) for call in record.calls]
            self.cache[key] = (steps, kv, logits)
        return self.cache[key]


def _keeps_bits_cases(rng: random.Random):
    """(chunk_size, prompt_len, neighbours, threads, batch_invariant, dtype): hand-picked, then random."""
    cases = [(None, 40, 0, 1, False, "float32"),       # the reference itself, run again
             (16, 40, 0, 1, False, "float32"),         # chunks
             (64, 40, 0, 1, False, "bfloat16"),        # a chunk longer than the prompt
             (40, 40, 0, 1, False, "float32"),         # a chunk exactly the prompt: one whole prefill
             (16, 40, 3, 2, True, "bfloat16"),         # the mode, with everything changed
             (None, 40, 2, 1, False, "float32"),       # neighbours only
             (None, 40, 0, 2, False, "float32"),       # another thread count only
             (8, 40, 0, 1, False, "float64")]          # float64 rounds too
    for _ in range(22):
        prompt_len = rng.randint(6, 60)
        chunk = rng.choice([None, rng.randint(1, prompt_len - 1), rng.randint(1, prompt_len - 1),
                            prompt_len + rng.choice([0, rng.randint(1, 40)])])
        cases.append((chunk, prompt_len, rng.choice([0, 0, 1, 3]), rng.choice([1, 1, 2]), rng.random() < 0.3,
                      rng.choice(list(_DTYPES))))
    return cases


def _keeps_bits_why(case, expected: bool) -> str:
    chunk, prompt_len, neighbours, threads, invariant, dtype = case
    whole = chunk is None or chunk >= prompt_len
    if invariant:
        return ("with batch_invariant=True every row is computed alone, in an order fixed by its position: "
                "the bits are guaranteed whatever the chunks, neighbours, threads or dtype (section 3)")
    if expected:
        return ("this run makes exactly the reference's forward steps on as many threads: the same computation "
                "gives the same bits" + (" (a chunk at least as long as the prompt is one whole prefill)"
                                         if chunk is not None else ""))
    if not whole:
        extra = " float64 rounds too, only less (chapter 4)." if dtype == "float64" else ""
        return ("chunks move the log-sum-exp merge to the chunk's boundary and change every GEMM's row count "
                f"(sections 2.1 and 2.3): nothing keeps the bits.{extra}")
    if neighbours:
        return ("neighbours change the row count of every GEMM of the step; this CPU happens to compute rows alike "
                "from 4 rows up, but a row count below that (or another library) does not: not guaranteed (2.1)")
    return "another thread count splits the GEMMs' rows differently (section 2.2): not guaranteed"


@checker
def check_keeps_bits(fn, seed: int | None = None):
    """keeps_bits(chunk_size, prompt_len, neighbours, threads, batch_invariant, dtype) -> bool: guaranteed
    the bits of the reference run (the whole prompt alone, 1 thread, same dtype and same mode)?"""
    rng = random.Random(seed)
    if not _RUNS:
        _RUNS.append(_Runs())
    runs = _RUNS[0]
    expected, measured = [], []
    cases = _keeps_bits_cases(rng)
    for case in cases:                         # the engine first: what each run computes and its bits
        chunk, prompt_len, neighbours, threads, invariant, dtype = case
        ref_steps, ref_kv, ref_logits = runs.run(dtype, prompt_len, batch_invariant=invariant)
        steps, kv, logits = runs.run(dtype, prompt_len, chunk, neighbours, threads, invariant)
        same_bits = torch.equal(kv, ref_kv) and torch.equal(logits, ref_logits)
        if invariant and not same_bits:
            raise RuntimeError(f"the engine broke its batch-invariant promise on {case}")
        expected.append(invariant or (steps == ref_steps and threads == 1))
        measured.append(same_bits)
    for case, want, same in zip(cases, expected, measured):
        got = learner_call(fn, *case, forbidden=_RUN_THE_MODEL,
                           why="predict from what each run computes, then the checker measures.")
        if not isinstance(got, bool):
            _fail(f"{call_text(fn, *case)} returned {show(got)}: return True (guaranteed the same bits) or False")
        if got != want:
            seen = "kept its bits" if same else "changed its bits"
            _fail(f"{call_text(fn, *case)} returned {got}: {_keeps_bits_why(case, want)} "
                  f"(measured here: this run {seen})")
    lucky = sum(s and not e for s, e in zip(measured, expected))
    passed(f"keeps_bits: {len(cases)} configurations right; measured here, {sum(measured)} kept their bits, "
           f"{lucky} of them without a guarantee")


# ---------------------------------------------------------------------------
# 2. The step that makes a pipeline batch-variant
# ---------------------------------------------------------------------------
class Step:
    """One named step of a pipeline: [T, d] -> [T, d]."""

    def __init__(self, name: str, fn, kind: str = "row-wise"):
        self.name, self.fn, self.kind = name, fn, kind

    def __call__(self, x):
        return self.fn(x)

    def __repr__(self):
        return self.name


_ROW_WISE = [Step("x * 3", lambda x: x * 3), Step("x + 0.5", lambda x: x + 0.5), Step("abs", lambda x: x.abs()),
             Step("flip columns", lambda x: torch.flip(x, [1])), Step("clamp(-2, 2)", lambda x: x.clamp(-2, 2)),
             Step("leaky relu", lambda x: torch.where(x > 0, x, 0.25 * x)),
             Step("divide by the row's max |x|", lambda x: x / x.abs().amax(dim=1, keepdim=True).clamp_min(1e-6)),
             Step("softmax with the row's max", lambda x: torch.softmax(x, dim=1))]
# Each changes a row with its neighbours; "semantic" ones change the value, "numeric" ones
# only the rounding (mathematically the row alone), "others" leave row 0's... see _plant.
_VARIANT = [Step("subtract the batch mean", lambda x: x - x.mean(0), "semantic"),
            Step("divide by the batch's max |x|", lambda x: x / x.abs().max().clamp_min(1e-6), "semantic"),
            Step("cumulative sum over rows", lambda x: x.cumsum(0), "semantic"),
            Step("softmax shifted by the batch's max", lambda x: torch.exp(x - x.max()) /
                 torch.exp(x - x.max()).sum(1, keepdim=True), "numeric"),
            Step("add then subtract the batch's column sums", lambda x: (x * 7 + x.sum(0)) - x.sum(0), "numeric")]
_ROW0 = Step("replace row 0 by the batch mean", lambda x: torch.cat([x.mean(0, keepdim=True), x[1:]]), "others")


def _differs_alone(step, x, row) -> bool:
    return not torch.equal(step(x)[row:row + 1], step(x[row:row + 1]))


def _pipeline(rng: random.Random, gen: torch.Generator, numeric: bool | None = None):
    """(steps, batch, row, index of the first step that changes the row, what the learner may confuse)."""
    while True:
        rows, dim = rng.randint(3, 9), rng.choice([4, 8, 16])
        batch = torch.randn(rows, dim, generator=gen) * rng.choice([1.0, 30.0])
        row = rng.randrange(1, rows)
        steps = [rng.choice(_ROW_WISE) for _ in range(rng.randint(2, 6))]
        plant_at = rng.randrange(0, len(steps) + 1)
        pool = [s for s in _VARIANT if numeric is None or (s.kind == "numeric") == numeric]
        planted = rng.choice(pool)
        steps.insert(plant_at, planted)
        decoy_at = None
        if rng.random() < 0.5:                   # a step that changes only row 0, before the planted one
            decoy_at = rng.randrange(0, plant_at + 1)
            steps.insert(decoy_at, _ROW0)
            plant_at += 1
        x = batch
        for i, step in enumerate(steps):          # verify the planted step, and that nothing earlier moves `row`
            if i == plant_at:
                if _differs_alone(step, x, row):
                    return steps, batch, row, plant_at, decoy_at
                break
            if _differs_alone(step, x, row):
                break
            x = step(x)


def _first_change(steps, batch, row):
    """Checker-side sanity check of a pipeline (the planted index is known by construction)."""
    x = batch
    for i, step in enumerate(steps):
        if _differs_alone(step, x, row):
            return i
        x = step(x)
    return None


def _first_change_on_the_original(steps, batch, row):
    """The answer of a tool that feeds every step the original batch (not the pipeline's input)."""
    return next((i for i, step in enumerate(steps) if _differs_alone(step, batch, row)), None)


def _variant_why(fn, steps, batch, row, expected, decoy_at, got) -> str:
    if isinstance(got, int) and got == expected + 1:
        return "steps are numbered from 0 (the index into the list)"
    if got == _first_change_on_the_original(steps, batch, row) and got != _first_change(steps, batch, row):
        return ("you fed every step the original batch: inside the pipeline step i sees the output of steps "
                "0..i-1; test each step on that input, the row alone against the row inside it")
    if decoy_at is not None and got == decoy_at:
        return (f"step {decoy_at} ({steps[decoy_at]!r}) changes row 0, not row {row}: compare the row you were "
                "asked about, alone against inside the batch")
    if steps[expected].kind == "numeric" and (got is None or (isinstance(got, int) and got > expected)):
        return (f"step {expected} ({steps[expected]!r}) is the row alone in exact arithmetic, but its rounding "
                "depends on the other rows: compare bits (torch.equal), not closeness")
    if isinstance(got, int) and got < expected:
        return (f"step {got} ({steps[got]!r}) computes row {row} from row {row} alone: run it on the row by itself "
                "and on the batch, feeding both the same input")
    return ""


@checker
def check_first_variant_step(fn, seed: int | None = None, *, num_cases: int = 60):
    """first_variant_step(steps, batch, row) -> index of the first step whose output for `row` changes
    when the row runs alone, or None."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    cases = [_pipeline(rng, gen, numeric=True) for _ in range(3)]
    cases += [_pipeline(rng, gen) for _ in range(num_cases)]
    cases.append(([rng.choice(_ROW_WISE) for _ in range(4)], torch.randn(5, 8, generator=gen), 2, None, None))
    if _first_change(*cases[-1][:3]) is not None:          # the row-wise steps must not move a row here either
        raise RuntimeError("a row-wise step of the checker changes a row's bits on this machine")
    for steps, batch, row, expected, decoy_at in cases:
        got = learner_call(fn, list(steps), batch.clone(), row, forbidden=("minillm.grading._reference.ch11."
                                                                         "first_variant_step",),
                           why="run the steps yourself.")
        if got != expected:
            why = _variant_why(fn, steps, batch, row, expected, decoy_at, got)
            where = "None (no step changes it)" if expected is None else f"{expected} ({steps[expected]!r})"
            _fail(f"{call_text(fn, steps, batch, row)} returned {show(got)}, expected {where}"
                  + (f": {why}" if why else ""))
    passed(f"first_variant_step: the first batch-variant step found in {len(cases)} pipelines "
           "(1-ulp rounding, decoys that change another row, pipelines with none)")


# ---------------------------------------------------------------------------
# 3. A streaming log-sum-exp whose bits do not depend on its chunks
# ---------------------------------------------------------------------------
def _numel(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel()
    if isinstance(state, (int, float)) or state is None:
        return 1
    if isinstance(state, dict):
        return sum(_numel(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_numel(v) for v in state)
    return 1


def _random_cuts(rng: random.Random, n: int) -> list[int]:
    cuts, at = [], 0
    while at < n:
        step = rng.choice([1, 2, 3, 5, 7, 16, 33, 64])
        cuts.append(min(step, n - at))
        at += cuts[-1]
    return cuts


def _wider_numbers(state, dtype) -> str | None:
    """The first float type of the state other than the scores' (Python floats are float64)."""
    if isinstance(state, torch.Tensor):
        return str(state.dtype).removeprefix("torch.") if state.is_floating_point() and state.dtype != dtype else None
    if isinstance(state, float):
        return "a Python float (float64)" if dtype != torch.float64 else None
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    return next((w for w in (_wider_numbers(v, dtype) for v in values) if w), None)


def _stream(fn, scores, cuts, tile, limit) -> dict[int, torch.Tensor]:
    """Feed the scores piece by piece; {position after each piece: the log-sum-exp returned there}."""
    state, at, results = None, 0, {}
    dtype = str(scores.dtype).removeprefix("torch.")
    for size in cuts:
        piece = scores[at:at + size].clone()
        got = learner_call(fn, state, piece, tile, forbidden=("minillm.grading._reference.ch11.lse_step",),
                           why="merge the tiles yourself.")
        if not isinstance(got, tuple) or len(got) != 2:
            _fail(f"{call_text(fn, state, piece, tile)} returned {show(got)}: return (state, log-sum-exp so far)")
        state, value = got
        at += size
        if _numel(state) > limit:
            _fail(f"after {at} of {len(scores)} scores your state holds {_numel(state)} numbers (tile={tile}): "
                  f"it must stay within a tile and a few running values ({limit}); keeping every score is "
                  "what a streaming reduction avoids")
        other = _wider_numbers(state, scores.dtype)
        if other == "float32":
            _fail(f"{dtype} scores: your state keeps float32 numbers: create the running values in the scores' "
                  "dtype (scores.new_tensor(...), or dtype=scores.dtype), not torch's default float32")
        if other:
            _fail(f"{dtype} scores: your state keeps numbers as {other}. A wider type only makes the rounding of a "
                  "moving order rarer to see, it does not fix the order (float64 scores have no wider type): keep "
                  f"the state in the scores' dtype ({dtype}) and fix the order of the sums by position")
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            _fail(f"{call_text(fn, state, piece, tile)} returned {show(value)} as the log-sum-exp: a one-element tensor")
        if value.dtype != scores.dtype:
            _fail(f"{dtype} scores: you returned the log-sum-exp as {str(value.dtype).removeprefix('torch.')}: "
                  f"return it in the scores' dtype ({dtype}), computed in that dtype")
        results[at] = value.reshape(())
    return results


def _partial_tile_why(fn, scores, tile) -> str | None:
    """Named diagnosis of the two ways a partial tile gets folded into the running values early."""
    waiting = min(tile - 1, len(scores))                  # a correct state keeps these and its running values
    if waiting < 3:
        return None
    state, _ = learner_call(fn, None, scores[:waiting].clone(), tile)
    if _numel(state) >= waiting:
        return None
    if _has_empty_tensor(state):
        return (f"after {waiting} scores (tile={tile}) your state keeps no waiting score: reporting the value "
                "folded them into the running values. Compute the value from the running values and the waiting "
                "scores, and return the state with the waiting scores still waiting")
    return (f"after {waiting} scores (tile={tile}) your state holds {_numel(state)} numbers: a partial tile must "
            "wait in the state until its tile is complete; folding it in now puts a boundary where the piece ends")


def _has_empty_tensor(state) -> bool:
    if isinstance(state, torch.Tensor):
        return state.numel() == 0
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    return any(_has_empty_tensor(v) for v in values)


def _lse_why(result: torch.Tensor, scores: torch.Tensor, tile: int) -> str:
    n = len(scores)
    full_tiles = n // tile * tile
    if full_tiles and n % tile and not result.isnan():
        if abs(result.double() - torch.logsumexp(scores[:full_tiles].double(), 0)) < 1e-4:
            return "the scores of the last, partial tile are missing from the value: they wait in the state, but count"
    if result.isnan() or (n >= tile and bool(torch.isinf(scores[:tile]).all())):
        return ("the first tile is all -inf (masked keys): while the running maximum is still -inf, "
                "exp(m_old - m_new) and exp(score - max) are exp(-inf + inf), which is nan")
    return "when a tile raises the running maximum, the running sum must be rescaled by exp(m_old - m_new)"


def _too_far(value: torch.Tensor, exact: torch.Tensor) -> bool:
    """The statement's tolerance: 1e-5 absolute up to |lse| = 1, relative above."""
    return bool(value.isnan()) or abs(value.double() - exact) > 1e-5 * max(1.0, abs(exact))


@checker
def check_streaming_logsumexp(fn, seed: int | None = None, *, num_cases: int = 40):
    """lse_step(state, scores, tile) -> (state, log-sum-exp of every score so far); state is None at first.
    The same bits at a position however the scores before it were cut, within 1e-5 of float64 (absolute up
    to |lse| = 1, relative above); state and value in the scores' dtype (float32 or float64)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    for case in range(num_cases):
        n, tile = rng.randint(1, 200), rng.choice([4, 16, 32])
        scores = torch.randn(n, generator=gen, dtype=torch.float64) * rng.choice([1.0, 20.0, 60.0])
        if case < 12 or case % 4 != 3:           # every fourth vector from case 12 on stays float64: no wider type
            scores = scores.float()
        if case % 3 == 1 and n > tile:           # a masked stretch: a whole tile of -inf, the first one at times
            start = 0 if case % 2 else rng.randrange(0, n - tile + 1)
            scores[start:start + tile] = -math.inf
            outside = [i for i in range(n) if not start <= i < start + tile]
            scores[rng.choice(outside)] = 1.0    # never every score
        if case % 5 == 2:
            scores[-1] = scores.max() + 50.0      # the maximum arrives last
        limit = tile + 8
        whole = _stream(fn, scores, [n], tile, limit)[n]
        exact = torch.logsumexp(scores.double(), 0)
        if _too_far(whole, exact):
            _fail(f"{n} scores in one piece, tile={tile}: you returned {whole.item():.6f}, logsumexp is "
                  f"{exact.item():.6f}: {_lse_why(whole, scores, tile)}")
        for _ in range(3):
            cuts = _random_cuts(rng, n)
            got = _stream(fn, scores, cuts, tile, limit)
            if not torch.equal(got[n], whole):
                why = _partial_tile_why(fn, scores, tile) or (
                    "Cut at absolute multiples of tile (a partial tile waits in the state) and merge the tiles in "
                    "their order")
                _fail(f"{n} {str(scores.dtype).removeprefix('torch.')} scores, tile={tile}: in one piece you return "
                      f"{whole.item()!r}, in pieces of {cuts[:8]}{'...' if len(cuts) > 8 else ''} {got[n].item()!r}: "
                      f"the bits depend on where the pieces start. {why}")
            for at, value in got.items():          # every intermediate value, against its own prefix
                prefix = torch.logsumexp(scores[:at].double(), 0)
                if _too_far(value, prefix):
                    _fail(f"after {at} of {n} scores (pieces {cuts[:8]}{'...' if len(cuts) > 8 else ''}, tile="
                          f"{tile}) you returned {value.item():.6f}, the log-sum-exp so far is {prefix.item():.6f}: "
                          f"{_lse_why(value, scores[:at], tile)}")
    passed(f"streaming log-sum-exp: {num_cases} float32 and float64 score vectors, every chunking gives the same "
           "bits, within 1e-5 of float64 after every piece, masked tiles included")


# ---------------------------------------------------------------------------
# 4. Distances in ulps
# ---------------------------------------------------------------------------
def _walk(a: float, steps: int, dtype) -> float:
    """The float `steps` representable values above (or below) a, walking with nextafter."""
    x = torch.tensor(a, dtype=dtype)
    toward = torch.tensor(math.inf if steps > 0 else -math.inf, dtype=dtype)
    for _ in range(abs(steps)):
        x = torch.nextafter(x, toward)
        if x == 0:
            x = x.abs()                            # -0 and +0 are one value
    return x.item()


def _bf16_ranks():
    """Every finite bfloat16 value, sorted, +0 and -0 as one: a value's rank counts the values below it."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    finite = every[torch.isfinite(every)]
    return torch.unique(finite)                   # sorted, -0 == +0 merged


def _f32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


def _ulp_cases(rng: random.Random, dtype):
    pairs = []
    tiny = torch.finfo(torch.float32).tiny
    if dtype == torch.float32:
        for _ in range(30):
            a = _f32(rng.choice([rng.uniform(-4, 4), rng.uniform(-1e6, 1e6), rng.uniform(-1e-30, 1e-30)]))
            pairs.append((a, _walk(a, rng.randint(-6, 6), dtype), None))
        for k, j in ((3, 4), (1, 1), (0, 2)):                        # across zero, subnormals
            pairs.append((_walk(0.0, -k, dtype), _walk(0.0, j, dtype), k + j))
        pairs += [(0.0, -0.0, 0), (-0.0, -0.0, 0), (tiny, -tiny, 2 * 2**23)]
        pairs += [(_f32(3e38), _f32(-3e38), None), (-1.5, 1.5, None)]   # across zero, far: int32 overflows
    else:
        ranks = _bf16_ranks()
        for _ in range(30):
            i = rng.randrange(0, len(ranks))
            j = min(len(ranks) - 1, max(0, i + rng.randint(-300, 300)))
            pairs.append((ranks[i].item(), ranks[j].item(), abs(i - j)))
        pairs += [(0.0, -0.0, 0), (1.0, -1.0, None), (-3e38, 3e38, None)]
    return pairs


def _expected_ulps(pairs, dtype):
    if dtype == torch.bfloat16:
        ranks = _bf16_ranks()
        index = {v: i for i, v in enumerate(ranks.tolist())}
        return [abs(index[torch.tensor(a, dtype=dtype).float().item()] -
                    index[torch.tensor(b, dtype=dtype).float().item()]) for a, b, _ in pairs]
    out = []
    for a, b, known in pairs:
        if known is not None:
            out.append(known)
            continue
        # Walk from the smaller to the larger by binades: 2**23 floats per binade, plus the partial ones.
        out.append(_count_float32_between(min(a, b), max(a, b)))
    return out


def _count_float32_between(lo: float, hi: float) -> int:
    """Representable float32 values in (lo, hi], counted binade by binade with frexp (not bit views)."""
    def below(x: float) -> int:                # how many non-negative floats are < |x|, as a position
        x = abs(x)
        if x == 0:
            return 0
        m, e = math.frexp(x)                    # x = m * 2**e, 0.5 <= m < 1
        if e <= -126:                           # subnormal (below 2**-126): steps of 2**-149
            return round(x / 2**-149)
        return (e + 126) * 2**23 + round((m * 2 - 1) * 2**23)
    def position(x: float) -> int:
        return below(x) if x >= 0 else -below(x)
    return abs(position(hi) - position(lo))


def _ulp_why(got, expected, a, b, dtype) -> str:
    across_zero = math.copysign(1, a) != math.copysign(1, b)
    if across_zero and abs(int(got) - int(expected)) == 1:
        return ("off by one across zero: -0 must map to the same integer as +0 (a mapping such as ~bits puts -0 "
                "at -1, one below +0, so every distance across zero counts one ulp too many)")
    if (a < 0) != (b < 0) and not (a == 0 or b == 0):
        return ("a and b have opposite signs: a float's bits are a sign and a magnitude, so as plain integers "
                "the negatives run backwards; map them below zero before subtracting (and count in int64: the "
                "distance across zero can pass 2**31)")
    if a == 0 and b == 0:
        return "+0 and -0 are the same value: 0 ulps"
    if a < 0 and b < 0:
        return "two negative floats: the distance is the same as between their absolute values"
    return ""


@checker
def check_ulp_distance(fn, seed: int | None = None):
    """ulp_distance(a, b) -> int64 tensor: |a - b| in ulps of their dtype (float32 or bfloat16), elementwise."""
    rng = random.Random(seed)
    for dtype in (torch.float32, torch.bfloat16):
        pairs = _ulp_cases(rng, dtype)
        expected = torch.tensor(_expected_ulps(pairs, dtype), dtype=torch.int64)
        a = torch.tensor([p[0] for p in pairs], dtype=dtype)
        b = torch.tensor([p[1] for p in pairs], dtype=dtype)

        def explain(exc):
            if dtype == torch.bfloat16 and "view" in str(exc).lower():
                return "bfloat16 is 16 bits: view it as torch.int16, float32 as torch.int32"
            return None

        got = learner_call(fn, a, b, forbidden=_ULPS, why="count the ulps yourself.", explain=explain)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            _fail(f"{call_text(fn, a, b)} returned {show(got)}: return an int64 tensor of shape {list(expected.shape)}")
        if got.dtype != torch.int64:
            _fail(f"{call_text(fn, a, b)} returned {got.dtype}: return torch.int64 (a distance across zero in "
                  "float32 can pass 2**31)")
        wrong = (got != expected).nonzero().flatten()
        if len(wrong):
            i = int(wrong[0])
            x, y = a[i:i + 1], b[i:i + 1]
            why = _ulp_why(got[i], expected[i], pairs[i][0], pairs[i][1], dtype)
            _fail(f"{call_text(fn, x, y)}: a={a[i].item()!r}, b={b[i].item()!r} ({str(dtype).removeprefix('torch.')}):"
                  f" you returned {int(got[i])}, expected {int(expected[i])}" + (f": {why}" if why else ""))
    passed("ulp_distance: float32 and bfloat16, neighbours, subnormals, +0/-0 and pairs across zero counted right")
