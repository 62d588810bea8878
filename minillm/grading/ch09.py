"""Checkers for exercises/09_the_mixed_step_on_a_gpu: the tile arithmetic and two Triton kernels.

Expected values come from the engine, computed before the learner's code runs: the
bottom-right causal mask (`attention.causal_mask`), `reference_attention`, the
log-sum-exp merge (`attention.merge_attention`), the accounting (`step_cost`), and the
engine's own kernel run in Triton's interpreter, whose grid is read and whose `tl.dot`
calls are counted. The sliding-window count is graded against masks built here (the
task asks for the arithmetic; a mask per tile pair is the slow, sure way). The engine's
functions that answer a task raise while the learner's function runs. The Triton tasks
launch the learner's `@triton.jit` kernel in the interpreter on CPU tensors, so the
notebook sets TRITON_INTERPRET=1 before anything imports triton.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import random

import torch

from ..attention import AttentionBatch, causal_mask, merge_attention, reference_attention
from ..config import PRESETS, ModelConfig
from ..kernels import triton_attention as ta
from ..kv_cache import BlockManager
from ..sim.accounting import step_cost
from ._common import call_text, checker, fail as _fail, learner_call, passed

__all__ = ["check_tile_mask", "check_fixed_chunk_kernel", "check_count_window_tiles", "check_attention_intensity",
           "check_merge_kernel", "check_predicted_launch"]

_MASKS = ("minillm.kernels.triton_attention.key_tiles", "minillm.kernels.triton_attention.plan_tiles",
          "minillm.attention.causal_mask")
_PLANNERS = ("minillm.kernels.triton_attention.triton_paged_attention", "minillm.kernels.triton_attention.key_tiles",
             "minillm.kernels.triton_attention.plan_tiles", "minillm.kernels.triton_attention.plan_segments")
_ACCOUNTING = ("minillm.sim.accounting.step_cost", "minillm.sim.accounting.causal_pairs",
               "minillm.chunk_sizing.causal_pairs")


# ---------------------------------------------------------------------------
# Launching a learner's Triton kernel
# ---------------------------------------------------------------------------
def _require_kernel(kernel, task: str):
    if ta.triton is None:
        _fail(f"{task}: triton is not importable here ({ta.TRITON_IMPORT_ERROR})")
    if not ta.INTERPRETED:
        _fail(f"{task}: this process compiles triton for a GPU; the exercise runs in the interpreter: restart "
              "the kernel and run the notebook's first cell (it sets TRITON_INTERPRET=1 before triton is imported)")
    if not (hasattr(kernel, "fn") and hasattr(kernel, "__getitem__")):
        _fail(f"{task}: {getattr(kernel, '__name__', type(kernel).__name__)} is not a @triton.jit kernel: "
              "decorate it with @triton.jit and launch-ready arguments")


def _launch(kernel, grid, args: tuple, constexprs: dict, case: str):
    """kernel[grid](*args, **constexprs), a crash reported as the learner's own error.

    The interpreter wraps an exception raised in a kernel in an InterpreterError; the
    cause is what the learner wrote (a stub's NotImplementedError stays one)."""
    def launch():
        try:
            kernel[grid](*args, **constexprs)
        except Exception as exc:      # noqa: BLE001
            cause = exc.__cause__
            if type(exc).__name__ == "InterpreterError" and cause is not None:
                raise cause.with_traceback(cause.__traceback__) from None
            raise
    launch.__name__ = f"{kernel.__name__}[{grid}]"
    learner_call(launch, explain=lambda exc: f"on {case}")


@contextlib.contextmanager
def _counting_dots():
    """Count the interpreter's tl.dot calls in the block: counts['dot']."""
    from triton.runtime import interpreter
    counts = {"dot": 0}
    original = interpreter.InterpreterBuilder.create_dot

    def counting(self, *args, **kwargs):
        counts["dot"] += 1
        return original(self, *args, **kwargs)
    interpreter.InterpreterBuilder.create_dot = counting
    try:
        yield counts
    finally:
        interpreter.InterpreterBuilder.create_dot = original


# ---------------------------------------------------------------------------
# 1. The mask of one tile
# ---------------------------------------------------------------------------
def _engine_tile_mask(cached_len, query_len, first_row, num_rows, tile, block_size) -> torch.Tensor:
    """The block of the engine's bottom-right mask a tile covers; rows and slots past the ends: False."""
    seq_len = cached_len + query_len
    full = torch.zeros(first_row + num_rows, (tile + 1) * block_size, dtype=torch.bool)
    block = causal_mask(query_len, seq_len)[first_row:first_row + num_rows, tile * block_size:(tile + 1) * block_size]
    full[first_row:first_row + block.shape[0], tile * block_size:tile * block_size + block.shape[1]] = block
    return full[first_row:, tile * block_size:]


def _mask_mistake(got: torch.Tensor, expected: torch.Tensor, args: tuple) -> str:
    cached_len, query_len, first_row, num_rows, tile, block_size = args
    rows = first_row + torch.arange(num_rows)
    query_pos = cached_len + rows
    key_pos = tile * block_size + torch.arange(block_size)
    real_rows = (rows < query_len)[:, None]
    in_seq = key_pos[None, :] < cached_len + query_len
    if torch.equal(got, ~expected):
        return "that is the mask of what a row may NOT see: True must mean the row sees the key"
    # A slip in the real rows' causal test (the padding rows are judged apart, below).
    slips = {("that mask places the queries at positions first_row + r, as if nothing were cached: "
              "they sit at cached_len + first_row + r (bottom-right alignment, chapter 1)"):
             key_pos[None, :] <= rows[:, None],
             "a query sees its own key too: key <= query, not key < query": key_pos[None, :] < query_pos[:, None]}
    for why, causal in slips.items():
        variant = causal & in_seq & real_rows
        if not torch.equal(variant, expected) and torch.equal(got & real_rows, variant):
            return why
    wrong = (got != expected).nonzero()
    r, k = (int(x) for x in wrong[0])
    if not bool(real_rows[r, 0]):
        return (f"row {r} is padding (new token {first_row + r} of a request with query_len={query_len}): "
                "a row past the request's new tokens holds no query and must see nothing")
    if not bool(in_seq[0, k]):
        return (f"slot {k} is key {int(key_pos[k])}, past the sequence's end ({cached_len + query_len} keys): "
                "it holds no key, so no row sees it")
    return ""


@checker
def check_tile_mask(fn, seed: int | None = None, *, num_cases: int = 200):
    """tile_mask(cached_len, query_len, first_row, num_rows, tile, block_size) -> bool [num_rows, block_size]."""
    rng = random.Random(seed)
    cases = [(13, 21, 0, 16, 1, 16),      # a chunk that starts mid-block: its diagonal tile
             (47, 1, 0, 4, 2, 16),        # a decode: one real row, three padding rows, a partly filled block
             (0, 10, 8, 4, 0, 16),        # the last query tile has rows past the request's end
             (2, 3, 0, 8, 0, 8)]          # a short chunk whose padding rows sit past the sequence's end
    for _ in range(num_cases):
        block_size = rng.choice([4, 16, 32])
        query_len, cached_len = rng.randint(1, 60), rng.choice([0, rng.randint(0, 80)])
        first_row = rng.randrange(0, query_len)
        tile = rng.randrange(0, -(-(cached_len + query_len) // block_size))
        cases.append((cached_len, query_len, first_row, rng.choice([1, 4, 8, 16]), tile, block_size))
    for args in cases:
        expected = _engine_tile_mask(*args)
        got = learner_call(fn, *args, forbidden=_MASKS, why="build it from the positions yourself.")
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            _fail(f"{call_text(fn, *args)} returned {type(got).__name__}"
                  f"{'' if not isinstance(got, torch.Tensor) else ' of ' + str(got.dtype)}: return a bool tensor")
        if tuple(got.shape) != tuple(expected.shape):
            _fail(f"{call_text(fn, *args)} returned shape {list(got.shape)}, expected {list(expected.shape)} "
                  "(num_rows, block_size)")
        if not torch.equal(got, expected):
            why = _mask_mistake(got, expected, args)
            _fail(f"{call_text(fn, *args)}: {why or 'the mask differs from the causal mask of those positions'}",
                  details=[f"expected:\n{expected.int()}", f"you returned:\n{got.int()}"])
    passed(f"tile_mask: {len(cases)} tiles (mid-block chunks, decodes, padding rows) are masked right")


# ---------------------------------------------------------------------------
# 2. Debug: the chunk kernel
# ---------------------------------------------------------------------------
_CHUNK_BUGS = {
    "diagonal": "the first loop (no mask) runs into the tile on the diagonal, so keys after a row's own position "
                "leak into that row: a key tile needs no mask only when its LAST key is at or before the "
                "program's FIRST row",
    "last_tile": "the second loop stops before the tile that holds the last row's key, so rows lose their own "
                 "and nearby keys (a row that sees no key at all comes out NaN): it must reach every tile whose "
                 "first key is at or before the program's last row",
    "base": "exp2(x) is 2**x, not e**x: the weights exp2 gives these scores are not softmax's e**(scale * q.k); "
            "scores that go to exp2 must be in base-2 units first",
}
LOG2_E = 1.4426950408889634


def _chunk_emulation(q, k, v, cached_len, block_m, tile_n, bugs=()) -> torch.Tensor:
    """The kernel of task 2 in float64 torch, with the given bugs of the handed-out kernel."""
    n, head_dim = q.shape
    seq_end = cached_len + n
    out = torch.full((n, head_dim), float("nan"), dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    qk_scale = head_dim ** -0.5 * (1.0 if "base" in bugs else LOG2_E)
    for first in range(0, n, block_m):
        rows = torch.arange(first, first + block_m)
        valid = rows < n
        q_tile = torch.where(valid[:, None], q[rows.clamp(max=n - 1)], 0.0)
        q_pos = cached_len + rows
        first_q, last_q = cached_len + first, min(cached_len + first + block_m, seq_end) - 1
        prefix_end = (-(-(first_q + 1) // tile_n) if "diagonal" in bugs else (first_q + 1) // tile_n) * tile_n
        diag_end = (last_q + 1) // tile_n * tile_n if "last_tile" in bugs else last_q + 1
        tiles = [(start, False) for start in range(0, prefix_end, tile_n)]
        tiles += [(start, True) for start in range(prefix_end, diag_end, tile_n)]
        m = torch.full((block_m,), float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros(block_m, dtype=torch.float64), torch.zeros(block_m, head_dim, dtype=torch.float64)
        for start, masked in tiles:
            keys = start + torch.arange(tile_n)
            key_valid = keys < seq_end
            k_tile = torch.where(key_valid[:, None], k[keys.clamp(max=seq_end - 1)], 0.0)
            v_tile = torch.where(key_valid[:, None], v[keys.clamp(max=seq_end - 1)], 0.0)
            scores = q_tile @ k_tile.T * qk_scale
            if masked:
                scores = scores.masked_fill(~(keys[None, :] <= q_pos[:, None]), float("-inf"))
            m_new = torch.maximum(m, scores.max(dim=1).values)
            alpha, p = torch.exp2(m - m_new), torch.exp2(scores - m_new[:, None])
            l, acc, m = l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v_tile, m_new
        out[rows[valid]] = (acc / l[:, None])[valid]
    return out


def _chunk_case(cached_len, n, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, head_dim, generator=g) * 2               # lively scores: maxima grow from tile to tile
    k, v = torch.randn(2, cached_len + n, head_dim, generator=g)
    return q, k, v


@contextlib.contextmanager
def _recording_tiles(block_m: int, tile_n: int):
    """What a kernel does per key tile, read off the interpreter: record["events"] lists "dot" for each
    tl.dot and "mask" for each integer comparison over a whole [BLOCK_M, TILE_N] tile (a causal mask
    compares positions); record["exp"] and record["exp2"] count the exponentials."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    record = {"events": [], "exp": 0, "exp2": 0}
    names = [name for name in dir(builder) if name.startswith("create_icmp")] + ["create_dot", "create_exp",
                                                                                 "create_exp2"]
    originals = {name: getattr(builder, name) for name in names}
    tile_shapes = {(block_m, tile_n), (tile_n, block_m)}

    def wrap(name, original):
        def recording(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            if name == "create_dot":
                record["events"].append("dot")
            elif name in ("create_exp", "create_exp2"):
                record[name[len("create_"):]] += 1
            elif tuple(getattr(out.data, "shape", ())) in tile_shapes:
                record["events"].append("mask")
            return out
        return recording
    for name, original in originals.items():
        setattr(builder, name, wrap(name, original))
    try:
        yield record
    finally:
        for name, original in originals.items():
            setattr(builder, name, original)


def _tile_visits(events) -> tuple[int, int]:
    """(key tiles run, of which masked): a run is two tl.dots (scores, then values); it is masked when a
    tile-wide position comparison comes after the run before it."""
    visits = masked = dots = 0
    seen_mask = False
    for event in events:
        if event == "mask":
            seen_mask = True
            continue
        dots += 1
        if dots % 2 == 0:
            visits += 1
            masked += seen_mask
            seen_mask = False
    return visits, masked


@checker
def check_fixed_chunk_kernel(fn, seed: int | None = None, *, block_m: int = 16, tile_ns=(16, 32),
                             head_dim: int = 16, num_random: int = 4):
    """fixed_chunk_kernel[(ceil(num_new / BLOCK_M),)](q, k, v, out, cached_len, num_new, scale, HEAD_DIM=,
    BLOCK_M=, TILE_N=): one request's chunk attention, against reference_attention, in the interpreter;
    the key tiles it runs and masks counted there too."""
    _require_kernel(fn, "fixed_chunk_kernel")
    rng = random.Random(seed)
    cases = [(13, 37, tile_ns[0]),       # a chunk starting mid-tile: every bug shows
             (0, 20, tile_ns[-1]),       # a whole prompt
             (40, 1, tile_ns[0]),        # a decode whose key sits in a partly filled tile
             (31, 3, tile_ns[-1]),       # a short chunk across a tile boundary
             (16, block_m, tile_ns[0]),  # a chunk that fills one query tile, starting on a tile boundary
             (47, 2 * block_m, tile_ns[0])]  # a first row at a tile's last slot: its tile needs no mask
    cases += [(rng.randint(0, 90), rng.randint(1, 50), rng.choice(tile_ns)) for _ in range(num_random)]
    for cached_len, n, tile_n in cases:
        q, k, v = _chunk_case(cached_len, n, head_dim, seed=rng.randrange(2**31))
        expected = reference_attention(q.double()[:, None], k.double()[:, None], v.double()[:, None])[:, 0]
        out = torch.full((n, head_dim), float("nan"))
        case = (f"a chunk of {n} new token{'s' if n > 1 else ''} over {cached_len} cached "
                f"(BLOCK_M={block_m}, TILE_N={tile_n}, HEAD_DIM={head_dim})")
        grid = (-(-n // block_m),)
        with _recording_tiles(block_m, tile_n) as record:
            _launch(fn, grid, (q, k, v, out, cached_len, n, head_dim ** -0.5),
                    dict(HEAD_DIM=head_dim, BLOCK_M=block_m, TILE_N=tile_n), case)
        close = torch.isclose(out.double(), expected, atol=1e-4, rtol=1e-4).all(dim=1)
        if not bool(close.all()):
            rows = (~close).nonzero().flatten().tolist()
            # Which of the handed-out kernel's bugs remain: the fewest that reproduce these rows.
            subsets = (bugs for size in range(1, len(_CHUNK_BUGS) + 1)
                       for bugs in itertools.combinations(_CHUNK_BUGS, size))
            remaining = next((bugs for bugs in subsets if torch.allclose(
                out.double(), _chunk_emulation(q, k, v, cached_len, block_m, tile_n, bugs),
                atol=1e-4, rtol=1e-4, equal_nan=True)), None)
            # One bug left is named; more are counted, not listed: finding them is the task.
            if remaining and len(remaining) == len(_CHUNK_BUGS):
                what = ("these are the handed-out kernel's results, all its bugs still there: shrink the case "
                        "until a single row is wrong, and follow that row through the loops")
            elif remaining and len(remaining) > 1:
                what = (f"{len(remaining)} of the handed-out kernel's bugs remain ({len(_CHUNK_BUGS) - len(remaining)} "
                        "fixed): shrink the case until a single row is wrong")
            elif remaining:
                what = _CHUNK_BUGS[remaining[0]]
            else:
                what = "the rows differ from reference_attention's"
            _fail(f"{fn.__name__} on {case}: rows {rows[:8]}{' ...' if len(rows) > 8 else ''} are wrong: {what}",
                  details=[f"row {rows[0]}: expected {expected[rows[0], :4].tolist()} ..., "
                           f"got {out[rows[0], :4].tolist()} ..."])
        # The method: a program runs the key tiles up to its last row's and no further, masks only those
        # across its diagonal, and keeps the base-2 softmax it was handed.
        programs = [(cached_len + first, min(cached_len + first + block_m, cached_len + n) - 1)
                    for first in range(0, n, block_m)]
        needed = sum(last_q // tile_n + 1 for _, last_q in programs)
        may_mask = sum(last_q // tile_n + 1 - first_q // tile_n for first_q, last_q in programs)
        visits, masked = _tile_visits(record["events"])
        if len(record["events"]) - record["events"].count("mask") > 2 * needed:
            _fail(f"{fn.__name__} on {case}: the rows are right, but its programs ran {visits} key tiles "
                  f"where {needed} suffice: a tile whose first key comes after the program's last row is never "
                  "needed, so it is never loaded (chapter 9's diagonal rule)")
        if masked > may_mask:
            _fail(f"{fn.__name__} on {case}: the rows are right, but it masks {masked} of its {visits} key tiles "
                  f"where {may_mask} at most cross a program's diagonal: a tile whose last key is at or before "
                  "the program's first row is seen whole by every row, so the first loop runs it with no mask "
                  "(the compare and the select cost every score of the tile)")
        if record["exp"] and not record["exp2"]:
            _fail(f"{fn.__name__} on {case}: the rows are right, but the softmax now runs on exp: repair the "
                  "kernel's base-2 softmax (exp2, one instruction on a GPU) rather than replace it: in which unit "
                  "must the scores be for exp2 to give softmax's weights?")
    passed(f"fixed_chunk_kernel: {len(cases)} chunks (mid-tile starts, decodes, whole prompts) equal "
           "reference_attention, loading only the tiles they need and masking only the diagonal")


# ---------------------------------------------------------------------------
# 3. The tiles of a sliding-window step
# ---------------------------------------------------------------------------
_WINDOW_SLIPS = {
    "query_floor": "a request of n new tokens has ceil(n / rows_per_tile) query tiles: the last, partly filled "
                   "one counts too",
    "step_keys": "each request walks ITS key tiles, ceil((cached + new) / tile_n), not the step's longest "
                 "sequence's",
    "first_key": "a key tile is unmasked only if its LAST key is at or before the query tile's FIRST row: the "
                 "tile on the diagonal needs the mask",
    "first_row_window": "the window's edge moves with the row: the query tile's LAST row has the latest window, "
                        "so a key tile is unmasked only if its first key lies inside that row's window",
    "past_end": "a key tile holding slots past the sequence's end is not seen whole: it needs the mask",
    "no_window": "the window: a row sees only the last `window` keys (its own included), so tiles wholly before "
                 "a query tile's window are skipped, and tiles across its edge are masked",
    "window_plus_one": "off by one at the window's edge: a window of W keys holds the row's own key and the "
                       "W - 1 before it",
    "window_minus_one": "off by one at the window's edge: a window of W keys holds the row's own key AND the "
                        "W - 1 before it, W keys in all",
    "last_row_diagonal": "the diagonal's edge is set by the query tile's FIRST row (its window's edge by the last): "
                         "a key tile is unmasked only if its last key is at or before the first row's position",
    "padded_rows": "rows past the request's new tokens hold no query and do not count, either way: a partly "
                   "filled query tile is judged by its real rows alone",
    "padding_sees_nothing": "rows past the request's new tokens do not count: a partly filled query tile is "
                            "unmasked on a key tile when every REAL row sees every slot of it",
}


def _window_tiles(query_lens, cached_lens, tile_n, rows_per_tile, window, slip=None) -> tuple[int, int, int]:
    """Classify every (query tile, key tile) pair by building its mask (slip: a usual mistake, for diagnosis)."""
    counts = [0, 0, 0]
    longest = max(c + n for n, c in zip(query_lens, cached_lens))
    reach = window + {"window_plus_one": 1, "window_minus_one": -1}.get(slip, 0)
    for n, c in zip(query_lens, cached_lens):
        seq_len = c + n
        num_key_tiles = -(-(longest if slip == "step_keys" else seq_len) // tile_n)
        keys = torch.arange(num_key_tiles * tile_n)
        tiles = n // rows_per_tile * rows_per_tile if slip == "query_floor" else n
        for first in range(0, tiles, rows_per_tile):
            last = first + rows_per_tile if slip == "padded_rows" else min(first + rows_per_tile, n)
            pos = c + torch.arange(first, last)[:, None]
            sees = (keys[None, :] <= pos) & (keys[None, :] < seq_len)
            if slip != "no_window":
                sees &= keys[None, :] > pos - reach
            sees = sees.view(len(pos), num_key_tiles, tile_n)                       # [rows, key tile, slot]
            whole = sees | ((keys >= seq_len).view(num_key_tiles, tile_n)[None] if slip == "past_end" else False)
            if slip == "first_key":                   # every row sees the tile's first key
                unmasked = whole[:, :, 0].all(dim=0)
            elif slip == "first_row_window":          # the first row sees the whole tile
                unmasked = whole[0].all(dim=1)
            elif slip == "last_row_diagonal":         # the last row sees the whole tile
                unmasked = whole[-1].all(dim=1)
            elif slip == "padding_sees_nothing" and first + rows_per_tile > n:
                unmasked = torch.zeros(num_key_tiles, dtype=torch.bool)
            else:
                unmasked = whole.all(dim=2).all(dim=0)
            some = sees.any(dim=2).any(dim=0)
            counts[0] += int(unmasked.sum())
            counts[1] += int((some & ~unmasked).sum())
            counts[2] += int((~some).sum())
    return tuple(counts)


@checker
def check_count_window_tiles(fn, seed: int | None = None, *, num_cases: int = 80):
    """count_window_tiles(query_lens, cached_lens, tile_n, rows_per_tile, window) -> (unmasked, masked, skipped)."""
    rng = random.Random(seed)
    cases = [([96], [40], 16, 32, 10_000),              # a window longer than the sequence: chapter 9's (12, 9, 6)
             ([96], [40], 16, 32, 50),                  # the same chunk, a window of 50 keys
             ([1, 1, 1], [15, 16, 47], 16, 16, 20),     # decodes: the window leaves their early tiles
             ([37, 1, 21, 5], [0, 47, 13, 32], 16, 8, 24),
             ([30], [0], 16, 16, 1)]                     # a window of one key: the row's own
    for _ in range(num_cases):
        k = rng.randint(1, 4)
        query_lens = [rng.choice([1, rng.randint(1, 80)]) for _ in range(k)]
        cached_lens = [rng.choice([0, rng.randint(0, 120)]) for _ in range(k)]
        cases.append((query_lens, cached_lens, rng.choice([16, 32, 64]), rng.choice([1, 8, 16, 32]),
                      rng.choice([1, rng.randint(2, 40), rng.randint(40, 200)])))
    for args in cases:
        expected = _window_tiles(*args)
        got = learner_call(fn, *[list(a) if isinstance(a, list) else a for a in args], forbidden=_MASKS,
                           why="work out each program's tiles from the positions yourself.")
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            _fail(f"{call_text(fn, *args)} returned {got!r}: return (unmasked, masked, skipped)")
        got = tuple(got)
        if got != expected:
            why = next((message for slip, message in _WINDOW_SLIPS.items()
                        if _window_tiles(*args, slip=slip) == got), "")
            if not why and sum(got) != sum(expected):
                why = (f"the pairs add up to {sum(got)}, but the step has {sum(expected)}: each request's query "
                       "tiles times its key tiles")
            _fail(f"{call_text(fn, *args)} returned {got}, expected {expected}{': ' + why if why else ''}")
    passed(f"count_window_tiles: {len(cases)} packed steps (windows of 1 key to longer than the sequence, "
           "decodes, chunks mid-tile) counted tile by tile")


# ---------------------------------------------------------------------------
# 4. Arithmetic intensity of one request's attention
# ---------------------------------------------------------------------------
def _configs(rng: random.Random) -> list[ModelConfig]:
    configs = [PRESETS["llama-3-8b"], PRESETS["llama-2-7b"], PRESETS["tiny"]]
    for _ in range(4):
        num_kv_heads = rng.choice([1, 2, 4, 8])
        head_dim = rng.choice([64, 128])
        num_heads = num_kv_heads * rng.choice([1, 2, 4, 8])
        configs.append(ModelConfig(name="random", vocab_size=1000, hidden_size=num_heads * head_dim,
                                   intermediate_size=1024, num_layers=rng.randint(1, 32), num_heads=num_heads,
                                   num_kv_heads=num_kv_heads, head_dim=head_dim))
    return configs


def _intensity_guesses(cfg, n: int, c: int, b: int, kv_b: int) -> dict:
    """{slip: (what to say, the intensities it gives)}: each guess counts one thing wrong."""
    pairs = n * c + n * (n + 1) // 2
    hd, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    flops = 4 * pairs * hd * hq
    kv_read, kv_write, q_read, out_write = 2 * c * hkv * hd, 2 * n * hkv * hd, n * hq * hd, n * hq * hd
    traffic = (kv_read + kv_write) * kv_b + (q_read + out_write) * b
    return {
        "dtypes": (f"K and V are {kv_b} byte(s) per element here (the KV cache's dtype), Q and the output {b}: "
                   "count each tensor in its own dtype",
                   [flops / ((kv_read + kv_write + q_read + out_write) * x) for x in (b, kv_b)]
                   + [flops / ((kv_read + kv_write) * b + (q_read + out_write) * kv_b)]),
        "half_flops": ("half the FLOPs: a dot product of length head_dim is 2 * head_dim FLOPs (a multiply and an "
                       "add), and the values (P V) cost as many as the scores (Q K^T)", [flops / 2 / traffic]),
        "full_pairs": ("you count n * (c + n) pairs: a new token sees the cache and the new tokens up to ITSELF",
                       [4 * n * (c + n) * hd * hq / traffic]),
        "half_square": ("you count n * n / 2 pairs among the new tokens: each new token also sees ITSELF, "
                        "n * (n + 1) / 2 in all", [4 * (n * c + n * n / 2) * hd * hq / traffic,
                                                   4 * (n * c + n * n // 2) * hd * hq / traffic]),
        "kv_head_flops": ("every QUERY head computes scores, not only the KV heads",
                          [4 * pairs * hd * hkv / traffic]),
        "mha_bytes": ("K and V are stored per KV head (num_kv_heads), not per query head",
                      [flops / ((2 * c * hq * hd + 2 * n * hq * hd) * kv_b + (q_read + out_write) * b)]),
        "k_or_v": ("count both the cached K AND the cached V read", [flops / (traffic - c * hkv * hd * kv_b)]),
        "no_kv_write": ("you leave out the new tokens' K and V, written to the cache in this step: count their "
                        "bytes", [flops / (traffic - kv_write * kv_b)]),
        "kv_only": ("you count only K and V: the step also reads Q and writes the attention's output",
                    [flops / ((kv_read + kv_write) * kv_b), flops / (kv_read * kv_b)]),
        "no_q_or_out": ("you leave out Q (read by the scores) or the output (written by the values): count both",
                        [flops / (traffic - out_write * b)]),
        "elements": ("bytes are elements times their dtype's bytes",
                     [flops / (kv_read + kv_write + q_read + out_write)]),
    }


def _intensity_mistake(fn, got: float, cfg, n: int, c: int, b: int, kv_b: int) -> str:
    """Name the slip whose guess the learner's number is. Where two slips give this case the same number
    (at 2 and 1 bytes, everything at one byte equals leaving out the output), cases with other dtypes,
    asked of the learner's function, decide."""
    def matching(number, guesses):
        return [slip for slip, (_, values) in guesses.items()
                if any(math.isclose(number, v, rel_tol=1e-9) for v in values)]
    guesses = _intensity_guesses(cfg, n, c, b, kv_b)
    slips = matching(got, guesses)
    for b_probe, kv_b_probe in ((4, 1), (4, 2)):
        if len(slips) <= 1:
            break
        probe = learner_call(fn, cfg, n, c, b_probe, kv_b_probe, forbidden=_ACCOUNTING, why="count them yourself.")
        if isinstance(probe, (int, float)) and not isinstance(probe, bool):
            slips = [slip for slip in slips
                     if slip in matching(float(probe), _intensity_guesses(cfg, n, c, b_probe, kv_b_probe))] or slips
    return guesses[slips[0]][0] if slips else ""


def _accounted_intensity(cfg, n: int, c: int, b: int, kv_b: int) -> float:
    """The accounting's attention FLOPs over its attention bytes, with K and V at kv_b bytes and Q and
    the output at b: step_cost counts elements at one byte each; the KV ones are its bytes_kv_*."""
    cost = step_cost(cfg, [(n, c)], dtype_bytes=1)
    flops = cost.by_op["attn_scores"][0] + cost.by_op["attn_values"][0]
    elements = cost.by_op["attn_scores"][1] + cost.by_op["attn_values"][1]
    kv_elements = cost.bytes_kv_read + cost.bytes_kv_write
    return flops / (kv_elements * kv_b + (elements - kv_elements) * b)


@checker
def check_attention_intensity(fn, seed: int | None = None, *, num_cases: int = 80):
    """attention_intensity(cfg, num_new, num_cached, dtype_bytes, kv_dtype_bytes) -> FLOPs per byte of that
    request's attention, K and V in kv_dtype_bytes, Q and the output in dtype_bytes."""
    rng = random.Random(seed)
    configs = _configs(rng)
    cases = [(PRESETS["llama-3-8b"], 1, 4096, 2, 1),               # a decode over an fp8 cache
             (PRESETS["llama-3-8b"], 512, 4096, 2, 2), (PRESETS["llama-3-8b"], 512, 4096, 2, 1),
             (PRESETS["llama-2-7b"], 1, 1000, 2, 2)]               # MHA: 1 FLOP per byte
    for _ in range(num_cases):
        b = rng.choice([1, 2, 4])
        cases.append((rng.choice(configs), rng.choice([1, rng.randint(1, 2048)]), rng.choice([0, rng.randint(0, 8192)]),
                      b, rng.choice([1, 2, b])))
    for cfg, n, c, b, kv_b in cases:
        expected = _accounted_intensity(cfg, n, c, b, kv_b)
        got = learner_call(fn, cfg, n, c, b, kv_b, forbidden=_ACCOUNTING,
                           why="count the FLOPs and the bytes from the shapes yourself.",
                           explain=lambda exc: ("the function takes five arguments: (cfg, num_new, num_cached, "
                                                "dtype_bytes, kv_dtype_bytes), the KV cache's dtype apart"
                                                if isinstance(exc, TypeError) and "positional" in str(exc) else None))
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isclose(float(got), expected,
                                                                                         rel_tol=1e-6):
            if isinstance(got, (int, float)) and not isinstance(got, bool):
                why = _intensity_mistake(fn, float(got), cfg, n, c, b, kv_b)
                off = f"{(float(got) - expected) / expected:+.3%} off"
                shown = f"{float(got):.7g}"
            else:
                why, off, shown = f"return a number, not {type(got).__name__}", "", repr(got)
            _fail(f"{call_text(fn, cfg, n, c, b, kv_b)} returned {shown}, expected {expected:.7g} FLOP/byte"
                  f"{' (' + off + ')' if off else ''}{': ' + why if why else ''}")
    passed(f"attention_intensity: {len(cases)} requests (decodes to long chunks, MHA and GQA, 1-4 byte dtypes, "
           "fp8 KV caches) agree with the accounting")


# ---------------------------------------------------------------------------
# 5. The split-KV merge, in Triton
# ---------------------------------------------------------------------------
def _segments_case(rows: int, num_segments: int, max_segments: int, head_dim: int, empty: float, spread: float,
                   gen: torch.Generator):
    """(seg_out, seg_lse) float32: real segments' outputs and log-sum-exps; empty ones lse -inf and output NaN;
    past num_segments, garbage: plausible log-sum-exps over NaN outputs. Segment 0 of every row holds keys."""
    seg_out = torch.full((rows, max_segments, head_dim), float("nan"))
    seg_lse = torch.rand(rows, max_segments, generator=gen) * spread + spread / 2
    seg_out[:, :num_segments] = torch.randn(rows, num_segments, head_dim, generator=gen)
    hollow = torch.rand(rows, num_segments, generator=gen) < empty
    hollow[:, 0] = False
    seg_lse[:, :num_segments][hollow] = float("-inf")
    seg_out[:, :num_segments][hollow] = float("nan")
    return seg_out, seg_lse


def _engine_merge(seg_out, seg_lse, num_segments) -> torch.Tensor:
    """Each row's real, non-empty segments folded with the engine's merge_attention, in float64."""
    rows = []
    for o, lse in zip(seg_out.double(), seg_lse.double()):
        keep = [s for s in range(num_segments) if lse[s] > float("-inf")]
        out, total = o[keep[0]][None, None], lse[keep[0]][None, None]
        for s in keep[1:]:
            out, total = merge_attention(out, total, o[s][None, None], lse[s][None, None])
        rows.append(out[0, 0])
    return torch.stack(rows)


def _merge_mistake(got, seg_out, seg_lse, num_segments, expected) -> str:
    o, lse = seg_out[:, :num_segments].double(), seg_lse[:, :num_segments].double()
    keys = lse > float("-inf")
    if got.isnan().any() or got.isinf().any():
        nan_rows = ~got.isfinite().all(dim=1)
        hollow_rows = ~keys.all(dim=1)
        if bool(hollow_rows.any()) and torch.equal(nan_rows, hollow_rows):
            return ("NaN exactly in the rows with an empty segment: a segment with no key (lse = -inf) has an "
                    "undefined output, and 0 * nan is nan: keep its output out of the sum, not just its weight")
        if num_segments < seg_lse.shape[1] and bool(nan_rows.all()):
            return ("every row is NaN: only the first num_segments segments are real, what lies past them is "
                    "garbage: mask it out of every load")
        if float(lse[keys].max()) > 88:
            return ("inf or NaN: exp of a log-sum-exp above ~88 overflows float32: subtract the row's largest "
                    "lse before exp")
        return "NaN or inf in the output"
    safe_o = torch.where(keys[..., None], o, 0.0)
    weights = torch.where(keys, torch.exp(lse - lse.masked_fill(~keys, float("-inf")).amax(1, keepdim=True)), 0.0)
    guesses = {
        "a plain average of the segments: each must count by its share of the row's softmax mass, from its lse":
            safe_o.sum(1) / keys.sum(1, keepdim=True),
        "the weights do not add up to one: divide the weighted sum by the sum of the weights":
            (safe_o * weights[..., None]).sum(1),
    }
    for why, value in guesses.items():
        if torch.allclose(got.double(), value, rtol=1e-4, atol=1e-5):
            return why
    return ""


@checker
def check_merge_kernel(fn, seed: int | None = None, *, head_dim: int = 16, max_segments: int = 8,
                       num_random: int = 4):
    """merge_kernel[(rows,)](seg_out, seg_lse, out, num_segments, HEAD_DIM=, MAX_SEGMENTS=): each row's
    split-KV segments merged, against the engine's merge_attention folded over them."""
    _require_kernel(fn, "merge_kernel")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    # (rows, real segments, share of empty segments, lse spread)
    cases = [(4, max_segments, 0.0, 300.0),        # every slot real, lse up to ~450: exp overflows unless shifted
             (4, max_segments - 3, 0.0, 20.0),     # garbage (NaN) past num_segments
             (6, max_segments - 2, 0.4, 20.0),     # empty segments: lse -inf, output NaN
             (3, 1, 0.0, 5.0)]                     # one segment: the merge is a copy
    cases += [(rng.randint(1, 6), rng.randint(1, max_segments), rng.choice([0.0, 0.3]), rng.choice([5.0, 200.0]))
              for _ in range(num_random)]
    for rows, num_segments, empty, spread in cases:
        seg_out, seg_lse = _segments_case(rows, num_segments, max_segments, head_dim, empty, spread, gen)
        expected = _engine_merge(seg_out, seg_lse, num_segments)
        out = torch.full((rows, head_dim), float("nan"))
        has_empty = bool((seg_lse[:, :num_segments] == float("-inf")).any())
        top = float(seg_lse[:, :num_segments].max())
        case = (f"{rows} rows of {num_segments} real segment{'s' if num_segments > 1 else ''} (MAX_SEGMENTS="
                f"{max_segments}{', some empty' if has_empty else ''}, lse up to {top:.0f})")
        _launch(fn, (rows,), (seg_out.clone(), seg_lse.clone(), out, num_segments),
                dict(HEAD_DIM=head_dim, MAX_SEGMENTS=max_segments), case)
        if not torch.allclose(out.double(), expected, rtol=1e-4, atol=1e-5):
            why = _merge_mistake(out, seg_out, seg_lse, num_segments, expected)
            _fail(f"{fn.__name__} on {case}: {why or 'the rows differ from the log-sum-exp merge of their segments'}",
                  details=[f"row 0: expected {expected[0, :4].tolist()} ..., got {out[0, :4].tolist()} ..."])
    passed(f"merge_kernel: {len(cases)} split rows (empty segments, garbage past the real ones, lse up to ~450) "
           "merge to the engine's result")


# ---------------------------------------------------------------------------
# 6. Predict, then count: a launch
# ---------------------------------------------------------------------------
def _measured_launch(query_lens, cached_lens, num_kv_heads, group, block_m, tile_n, num_kv_splits):
    """(programs, tile runs) of the engine's kernel on such a step, read off the interpreter."""
    block_size, head_dim = 16, 16
    seq_lens = [c + n for n, c in zip(query_lens, cached_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + 1, block_size)
    for b, seq_len in enumerate(seq_lens):
        manager.allocate(b, seq_len)
    slots = [s for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for s in manager.slot_mapping(b, c, c + n)]
    batch = AttentionBatch(list(query_lens), list(cached_lens), [manager.block_tables[b] for b in range(len(seq_lens))],
                           block_size, torch.tensor(slots))
    cache = torch.randn(manager.num_blocks, block_size, num_kv_heads, head_dim)
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim)
    grids = []
    kernel = ta.attention_tile_kernel

    class Recording:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]
    ta.attention_tile_kernel = Recording()
    try:
        with _counting_dots() as counts:
            ta.triton_paged_attention(q, cache, cache, batch, block_m=block_m, tile_n=tile_n,
                                      num_kv_splits=num_kv_splits)
    finally:
        ta.attention_tile_kernel = kernel
    return math.prod(grids[0]), counts["dot"] // 2


@checker
def check_predicted_launch(fn, seed: int | None = None, *, num_random: int = 2):
    """predicted_launch(query_lens, cached_lens, num_kv_heads, group, block_m, tile_n, num_kv_splits)
    -> (programs, tile_visits), exactly as the interpreter counts them on the engine's kernel."""
    if ta.triton is None or not ta.INTERPRETED:
        _require_kernel(None, "predicted_launch")
    rng = random.Random(seed)
    cases = [([1], [63], 2, 4, 16, 16, 1),                  # one decode: one query tile per KV head
             ([1, 1], [100, 20], 2, 2, 16, 32, 3),          # split decodes: the short one's last segments are empty
             ([20, 1], [10, 50], 1, 4, 16, 16, 1),          # GQA: a query tile holds block_m // group positions
             ([16], [0], 2, 1, 16, 16, 2),                  # one chunk filling one tile, split in two
             ([9, 1], [40, 7], 2, 2, 16, 32, 2)]            # a chunk mid-tile and a decode, split
    for _ in range(num_random):
        k = rng.randint(1, 3)
        group = rng.choice([1, 2, 4])
        cases.append(([rng.choice([1, rng.randint(1, 24)]) for _ in range(k)], [rng.randint(0, 60) for _ in range(k)],
                      rng.choice([1, 2]), group, 16, rng.choice([16, 32]), rng.choice([1, 2, 3])))
    for args in cases:
        query_lens, cached_lens, num_kv_heads, group, block_m, tile_n, splits = args
        programs, visits = _measured_launch(*args)
        got = learner_call(fn, *[list(a) if isinstance(a, list) else a for a in args], forbidden=_PLANNERS,
                           why="predict it from chapter 9's reasoning; the check measures it.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                         for x in got)):
            _fail(f"{call_text(fn, *args)} returned {got!r}: return (programs, tile_visits), two integers")
        got = tuple(got)
        if got == (programs, visits):
            continue
        # What the usual slips would predict, from the engine's planner (the learner's call is over).
        every_tile = sum(-(-(c + n) // tile_n) * len(range(0, n, block_m // group))
                         for n, c in zip(query_lens, cached_lens)) * num_kv_heads
        ungrouped_tiles = len(ta.plan_tiles(query_lens, 1, block_m)[0])
        floor_tiles = sum(n // (block_m // group) for n in query_lens)
        why = ""
        if got[0] != programs:
            if got[0] * splits == programs and splits > 1:
                why = "each segment of each query tile is a program of its own: the grid has a third axis"
            elif got[0] * num_kv_heads == programs and num_kv_heads > 1:
                why = "each KV head gets its own programs: the grid is (query tiles, KV heads, segments)"
            elif got[0] == ungrouped_tiles * num_kv_heads * splits and group > 1:
                why = (f"GQA folds the {group} query heads of a KV head into a tile's rows: a query tile holds "
                       f"block_m // group = {block_m // group} positions, not {block_m}")
            elif got[0] == floor_tiles * num_kv_heads * splits:
                why = "a request's last, partly filled query tile is a program too (ceil, not floor)"
        else:
            if got[1] == visits * splits and splits > 1:
                why = ("splitting adds programs, not tile runs: a segment runs only its slice of the tiles its "
                       "query tile needs")
            elif got[1] * num_kv_heads == visits and num_kv_heads > 1:
                why = "every KV head's programs run their own key tiles"
            elif got[1] == every_tile:
                why = "a program skips the key tiles past its last row's position: it does not walk the whole sequence"
        _fail(f"{call_text(fn, *args)}: you predicted {got}, the interpreter counts {(programs, visits)}"
              f"{': ' + why if why else ''}")
    passed(f"predicted_launch: {len(cases)} launches predicted exactly (programs and tile runs, split or not), "
           "as the interpreter counted them")
