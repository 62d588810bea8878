"""Chapter 9's checkers: a correct answer passes, every shortcut and usual mistake fails with a
message that names it, the chapter's printed code (`one_program`, `key_tiles`, the engine's
kernels) passes no task, and the references behind the hidden cases agree with the engine.

The two Triton tasks run the learner's kernel in the interpreter: the module skips where
this process compiles triton for a GPU. ~16 s of CPU on this machine (the kernels' cases).
"""
import ast
import importlib.util
import math
import random
import re
import sys
from pathlib import Path

import pytest
import torch

import minillm
import minillm.grading as ex
from minillm.attention import causal_mask, merge_attention
from minillm.grading import ch09
from minillm.grading._hidden import ch09 as hidden
from minillm.grading._reference import ch09 as ref
from minillm.kernels import triton_attention as ta
from minillm.sim.accounting import step_cost

if not ta.triton_available() or not ta.INTERPRETED:
    pytest.skip("chapter 9's Triton tasks run in triton's interpreter", allow_module_level=True)
tl, triton = ta.tl, ta.triton
ROOT = Path(__file__).resolve().parents[1]
EXERCISE = ROOT / "exercises" / "solutions" / "src" / "09_the_mixed_step_on_a_gpu.py"
CHAPTER = ROOT / "notebooks" / "src" / "09_the_mixed_step_on_a_gpu.py"


def printed(name: str):
    """A function chapter 9 prints, defined on its own as a learner who copies it has it."""
    node = next(n for n in ast.parse(CHAPTER.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"torch": torch, "step_cost": step_cost, "cfg": minillm.ModelConfig.preset("llama-3-8b")}
    exec(compile(ast.fix_missing_locations(ast.Module([node], [])), "<chapter 09>", "exec"), namespace)
    return namespace[name]


# ---- the handed-out chunk kernel, with some of its bugs repaired ------------------------------
BUGS = {"base": ("qk_scale = scale ", "qk_scale = scale * 1.4426950408889634 "),
        "diagonal": ("prefix_end = tl.cdiv(first_q + 1, TILE_N) * TILE_N", "prefix_end = (first_q + 1) // TILE_N * TILE_N"),
        "last_tile": ("diag_end = (last_q + 1) // TILE_N * TILE_N", "diag_end = last_q + 1")}
FIXED = {bug: new for bug, (_, new) in BUGS.items()}
VARIANTS = {                                       # name: (bugs left, extra (old, new) edits)
    "handed_out": (("base", "diagonal", "last_tile"), ()),
    "only_base_left": (("base",), ()),
    "only_last_tile_left": (("last_tile",), ()),
    "only_diagonal_left": (("diagonal",), ()),
    "diagonal_and_last_tile_left": (("diagonal", "last_tile"), ()),
    "walks_every_tile": ((), ((FIXED["last_tile"], "diag_end = seq_end + TILE_N"),)),
    "masks_every_tile": ((), ((FIXED["diagonal"], "prefix_end = 0 * TILE_N"),)),
    "masks_a_whole_tile_more": ((), ((FIXED["diagonal"], "prefix_end = first_q // TILE_N * TILE_N"),)),
    "base_e_instead": (("base",), (("tl.math.exp2", "tl.exp"),)),
    "acc_not_rescaled": ((), (("acc = acc * alpha[:, None] + tl.dot(p, v)", "acc = acc + tl.dot(p, v)"),)),
}


@pytest.fixture(scope="module")
def chunk_variants(tmp_path_factory):
    """Each variant of the handed-out kernel as a @triton.jit function in a module of its own file
    (triton reads a kernel's source)."""
    source = EXERCISE.read_text()
    start = source.index("@triton.jit\ndef chunk_kernel(")
    kernel = source[start:source.index("\n\n\n", start)]
    for old, _ in BUGS.values():
        assert old in kernel, old
    lines = ["import triton", "import triton.language as tl", ""]
    for name, (left, extra) in VARIANTS.items():
        text = kernel.replace("def chunk_kernel(", f"def {name}(")
        for bug, (old, new) in BUGS.items():
            if bug not in left:
                text = text.replace(old, new)
        for old, new in extra:
            assert old in text, old
            text = text.replace(old, new)
        lines += [text, "", ""]
    path = tmp_path_factory.mktemp("ch09") / "chunk_variants.py"
    path.write_text("\n".join(lines))
    spec = importlib.util.spec_from_file_location("chunk_variants", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


# ---- merge kernels with the usual slips ------------------------------------------------------
@triton.jit
def merge_plain_average(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments, HEAD_DIM: tl.constexpr,
                        MAX_SEGMENTS: tl.constexpr):
    row, segments, dims = tl.program_id(0), tl.arange(0, MAX_SEGMENTS), tl.arange(0, HEAD_DIM)
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments, mask=segments < num_segments, other=float("-inf"))
    weight = tl.where(lse > float("-inf"), 1.0, 0.0)
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=(weight > 0)[:, None], other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0))


@triton.jit
def merge_raw_exp(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments, HEAD_DIM: tl.constexpr,
                  MAX_SEGMENTS: tl.constexpr):
    row, segments, dims = tl.program_id(0), tl.arange(0, MAX_SEGMENTS), tl.arange(0, HEAD_DIM)
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments, mask=segments < num_segments, other=float("-inf"))
    weight = tl.exp(lse)                                    # no max subtracted: overflows past 88
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=(lse > float("-inf"))[:, None], other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0))


@triton.jit
def merge_unnormalised(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments, HEAD_DIM: tl.constexpr,
                       MAX_SEGMENTS: tl.constexpr):
    row, segments, dims = tl.program_id(0), tl.arange(0, MAX_SEGMENTS), tl.arange(0, HEAD_DIM)
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments, mask=segments < num_segments, other=float("-inf"))
    weight = tl.where(lse > float("-inf"), tl.exp(lse - tl.max(lse, 0)), 0.0)
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=(weight > 0)[:, None], other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0))


@triton.jit
def merge_nan_leak(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments, HEAD_DIM: tl.constexpr,
                   MAX_SEGMENTS: tl.constexpr):
    row, segments, dims = tl.program_id(0), tl.arange(0, MAX_SEGMENTS), tl.arange(0, HEAD_DIM)
    real = segments < num_segments
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments, mask=real, other=float("-inf"))
    weight = tl.where(lse > float("-inf"), tl.exp(lse - tl.max(lse, 0)), 0.0)
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=real[:, None], other=0.0)              # an empty segment's NaN output is read
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0))


@triton.jit
def merge_reads_garbage(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments, HEAD_DIM: tl.constexpr,
                        MAX_SEGMENTS: tl.constexpr):
    row, segments, dims = tl.program_id(0), tl.arange(0, MAX_SEGMENTS), tl.arange(0, HEAD_DIM)
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments)          # past num_segments too
    weight = tl.where(lse > float("-inf"), tl.exp(lse - tl.max(lse, 0)), 0.0)
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=(weight > 0)[:, None], other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0))


# ---- the counting tasks' usual slips ----------------------------------------------------------
def window_tiles(query_lens, cached_lens, tile_n, rows, window, *, diagonal_unmasked=False, floor_query_tiles=False,
                 ignore_window=False, diagonal_from_last_row=False, padded_rows=False, window_shift=0):
    """A test-local arithmetic answer, with the usual slips as switches."""
    counts = [0, 0, 0]
    for n, c in zip(query_lens, cached_lens):
        num_key_tiles = -(-(c + n) // tile_n)
        for first in range(0, n // rows * rows if floor_query_tiles else n, rows):
            p0 = c + first
            p1 = c + first + rows - 1 if padded_rows else c + min(first + rows, n) - 1
            w = 10**12 if ignore_window else window + window_shift
            edge = p1 if diagonal_from_last_row else p0
            for j in range(num_key_tiles):
                k0, k1 = j * tile_n, (j + 1) * tile_n - 1
                if k0 > p1 or k1 < p0 - w + 1:
                    counts[2] += 1
                elif (k0 <= edge if diagonal_unmasked else k1 <= edge) and k0 >= p1 - w + 1:
                    counts[0] += 1
                else:
                    counts[1] += 1
    return tuple(counts)


def key_tiles_count(query_lens, cached_lens, tile_n, rows, window):
    """The chapter's key_tiles body and a loop over the query tiles (no window): printed code."""
    counts = [0, 0, 0]
    for n, c in zip(query_lens, cached_lens):
        for first in range(0, n, rows):
            first_pos = c + first
            last_pos = first_pos + min(rows, n - first) - 1
            unmasked, total = (first_pos + 1) // tile_n, last_pos // tile_n + 1
            counts[0] += unmasked
            counts[1] += total - unmasked
            counts[2] += -(-(c + n) // tile_n) - total
    return tuple(counts)


def intensity(cfg, n, c, b, kv_b, flops_per_mac=2, pairs=None, flop_heads=None, kv_heads=None, writes=True,
              use_bytes=True, one_dtype=False):
    pairs = n * c + n * (n + 1) // 2 if pairs is None else pairs
    flops = 2 * flops_per_mac * pairs * cfg.head_dim * (flop_heads or cfg.num_heads)
    kv = (kv_heads or cfg.num_kv_heads) * cfg.head_dim
    kv_elements = 2 * c * kv + (2 * n * kv if writes else 0)
    q_out_elements = 2 * n * cfg.num_heads * cfg.head_dim if writes else 0
    if not use_bytes:
        return flops / (kv_elements + q_out_elements)
    return flops / (kv_elements * (b if one_dtype else kv_b) + q_out_elements * b)


_STEP_COST_SOURCE = __import__("inspect").getsource(step_cost)      # read now: the checker forbids step_cost


def chapter5_attention_lines(cfg, n, c, b, kv_b):
    """Chapter 5's printed step_cost, its attention lines pasted as they are (one dtype for all)."""
    source = _STEP_COST_SOURCE
    lines = source[source.index("    # Attention:"):source.index("    per_layer = {")]
    scope = {"pairs": n * c + n * (n + 1) // 2, "hd": cfg.head_dim, "cfg": cfg, "kv": cfg.kv_size, "q": cfg.q_size,
             "b": b, "num_cached": c, "num_tokens": n}
    exec("\n".join(line[4:] for line in lines.splitlines()), scope)
    return (scope["scores_f"] + scope["values_f"]) / (scope["k_read"] + scope["v_read"] + scope["k_write"]
                                                      + scope["v_write"] + scope["scores_a"] + scope["values_a"])


def launch_variant(query_lens, cached_lens, hkv, group, block_m, tile_n, splits, *, times_splits=False,
                   no_group=False, whole_sequence=False):
    programs, runs = ref.predicted_launch(query_lens, cached_lens, hkv, 1 if no_group else group, block_m, tile_n,
                                          splits)
    if whole_sequence:
        rows = block_m // group
        runs = hkv * sum(-(-(c + n) // tile_n) * len(range(0, n, rows)) for n, c in zip(query_lens, cached_lens))
    return programs, runs * (splits if times_splits else 1)


def lifted_planners(query_lens, cached_lens, hkv, group, block_m, tile_n, splits):
    """The engine's own planners, called: forbidden while the learner's function runs."""
    requests, first_rows = ta.plan_tiles(query_lens, group, block_m)
    return len(requests) * hkv * splits, 0


def tile_mask_no_padding(c, n, f, r, t, b):
    key = t * b + torch.arange(b)
    return (key[None, :] <= c + f + torch.arange(r)[:, None]) & (key < c + n)[None, :]


def tile_mask_causal_only(c, n, f, r, t, b):
    return t * b + torch.arange(b)[None, :] <= c + f + torch.arange(r)[:, None]


CASES = {
    "check_tile_mask": (ref.tile_mask, [
        ("the engine's causal_mask", lambda c, n, f, r, t, b: causal_mask(n, c + n)[f:f + r, t * b:(t + 1) * b],
         "minillm.attention.causal_mask"),
        ("top-left: no cached offset", lambda c, n, f, r, t, b: ref.tile_mask(0, n, f, r, t, b)
         & (t * b + torch.arange(b) < c + n)[None, :], "as if nothing were cached"),
        ("key < query", lambda c, n, f, r, t, b: ref.tile_mask(c, n, f, r, t, b)
         & (t * b + torch.arange(b)[None, :] < c + f + torch.arange(r)[:, None]), "key <= query"),
        ("padding rows see keys (issue 39: 09.1)", tile_mask_no_padding, "is padding"),
        ("padding rows see keys, no end bound", tile_mask_causal_only, "is padding"),
        ("the mask inverted", lambda *a: ~ref.tile_mask(*a), "may NOT see"),
        ("an int mask", lambda *a: ref.tile_mask(*a).int(), "return a bool tensor"),
    ]),
    "check_count_window_tiles": (ref.count_window_tiles, [
        ("the chapter's key_tiles in a loop", key_tiles_count, "the window"),
        ("the engine's key_tiles", lambda ql, cl, t, r, w: ta.key_tiles(cl[0], 0, r, t) + (0,),
         "minillm.kernels.triton_attention.key_tiles"),
        ("the diagonal tile counted unmasked (issue 39: 09.3)",
         lambda *a: window_tiles(*a, diagonal_unmasked=True), "LAST key is at or before"),
        ("a floor on query tiles (issue 39: 09.3)", lambda *a: window_tiles(*a, floor_query_tiles=True),
         "ceil(n / rows_per_tile) query tiles"),
        ("the window ignored", lambda *a: window_tiles(*a, ignore_window=True), "the window"),
        ("the diagonal edge from the last row (the trial's 09.3)",
         lambda *a: window_tiles(*a, diagonal_from_last_row=True), "set by the query tile's FIRST row"),
        ("padding rows counted (the trial's 09.3)", lambda *a: window_tiles(*a, padded_rows=True),
         "do not count"),
        ("a window of W - 1 keys (the trial's 09.3)", lambda *a: window_tiles(*a, window_shift=-1),
         "W keys in all"),
        ("a window of W + 1 keys", lambda *a: window_tiles(*a, window_shift=1), "W - 1 before it"),
        ("the chapter's answer, hard-coded", lambda *a: (12, 9, 6), "returned (12, 9, 6)"),
    ]),
    "check_attention_intensity": (ref.attention_intensity, [
        ("the accounting", lambda cfg, n, c, b, kv_b: (lambda o: (o["attn_scores"][0] + o["attn_values"][0])
                                                      / (o["attn_scores"][1] + o["attn_values"][1]))(
            step_cost(cfg, [(n, c)], dtype_bytes=b).by_op), "minillm.sim.accounting.step_cost"),
        ("chapter 5's printed lines, one dtype (issue 39: 09.4)", chapter5_attention_lines, "in its own dtype"),
        ("one dtype for everything", lambda *a: intensity(*a, one_dtype=True), "in its own dtype"),
        ("1 FLOP per multiply-add", lambda *a: intensity(*a, flops_per_mac=1), "half the FLOPs"),
        ("n * (c + n) pairs", lambda cfg, n, c, b, kv_b: intensity(cfg, n, c, b, kv_b, pairs=n * (c + n)),
         "n * (c + n) pairs"),
        ("n * n / 2 pairs (the trial's 09.4)", lambda cfg, n, c, b, kv_b: intensity(cfg, n, c, b, kv_b,
                                                                                    pairs=n * c + n * n // 2),
         "also sees ITSELF"),
        ("FLOPs per KV head", lambda cfg, n, c, b, kv_b: intensity(cfg, n, c, b, kv_b, flop_heads=cfg.num_kv_heads),
         "QUERY head"),
        ("K and V per query head", lambda cfg, n, c, b, kv_b: intensity(cfg, n, c, b, kv_b, kv_heads=cfg.num_heads),
         "num_kv_heads"),
        ("only the cache read", lambda *a: intensity(*a, writes=False), "only K and V"),
        ("the new K and V left out (the trial's 09.4)", lambda cfg, n, c, b, kv_b: 4 * (n * c + n * (n + 1) // 2)
         * cfg.head_dim * cfg.num_heads / (2 * c * cfg.kv_size * kv_b + 2 * n * cfg.q_size * b),
         "new tokens' K and V"),
        ("K and V only (the trial's 09.4)", lambda cfg, n, c, b, kv_b: 4 * (n * c + n * (n + 1) // 2) * cfg.head_dim
         * cfg.num_heads / (2 * (c + n) * cfg.kv_size * kv_b), "only K and V"),
        ("the output left out", lambda cfg, n, c, b, kv_b: 4 * (n * c + n * (n + 1) // 2) * cfg.head_dim
         * cfg.num_heads / (2 * (c + n) * cfg.kv_size * kv_b + n * cfg.q_size * b), "Q (read by the scores) or"),
        ("everything at the KV cache's byte", lambda cfg, n, c, b, kv_b: intensity(cfg, n, c, kv_b, kv_b),
         "in its own dtype"),
        ("elements, not bytes", lambda *a: intensity(*a, use_bytes=False), "dtype's bytes"),
        ("the decode's 4, always", lambda *a: 4.0, "returned 4"),
    ]),
    "check_merge_kernel": (ref.merge_kernel, [
        ("a plain average", merge_plain_average, "a plain average"),
        ("exp of raw log-sum-exps", merge_raw_exp, "subtract the row's largest lse"),
        ("weights not normalised", merge_unnormalised, "do not add up to one"),
        ("an empty segment's NaN read", merge_nan_leak, "0 * nan is nan"),
        ("garbage past num_segments read", merge_reads_garbage, "only the first num_segments"),
        ("the engine's merge kernel, pasted", ta.merge_segments_kernel, "crashed"),
        ("chapter 1's merge_attention (not a kernel)", merge_attention, "is not a @triton.jit kernel"),
    ]),
    "check_predicted_launch": (ref.predicted_launch, [
        ("the engine's planners", lifted_planners, "minillm.kernels.triton_attention.plan_tiles"),
        ("tile runs times the segments", lambda *a: launch_variant(*a, times_splits=True),
         "splitting adds programs, not tile runs"),
        ("GQA not folded", lambda *a: launch_variant(*a, no_group=True), "GQA folds"),
        ("the whole sequence per program", lambda *a: launch_variant(*a, whole_sequence=True),
         "skips the key tiles past its last row"),
        ("no segment axis", lambda ql, cl, h, g, bm, t, s: (ref.predicted_launch(ql, cl, h, g, bm, t, 1)[0],
                                                            ref.predicted_launch(ql, cl, h, g, bm, t, s)[1]),
         "a third axis"),
        ("floats", lambda *a: tuple(float(x) for x in ref.predicted_launch(*a)), "two integers"),
    ]),
}
CHUNK_SHORTCUTS = [   # (variant or callable, what the message must say)
    ("handed_out", "the handed-out kernel's results, all its bugs still there"),
    ("only_base_left", "exp2(x) is 2**x"),
    ("only_last_tile_left", "stops before the tile that holds the last row's key"),
    ("only_diagonal_left", "LAST key is at or before"),
    ("diagonal_and_last_tile_left", "2 of the handed-out kernel's bugs remain"),
    ("walks_every_tile", "where"),
    ("masks_every_tile", "masks 9 of its 9 key tiles"),
    ("base_e_instead", "softmax now runs on exp"),
    ("acc_not_rescaled", "differ from reference_attention"),
]
COPYABLE = {"check_tile_mask"}            # the chapter's one_program holds the mask of a tile


def test_every_chapter_9_checker_is_tested_here():
    assert set(CASES) | {"check_fixed_chunk_kernel"} == set(ch09.__all__) and set(ch09.__all__) <= set(ex.__all__)


def test_the_public_checkers_import_neither_the_references_nor_the_hidden_cases():
    tree = ast.parse((ROOT / "minillm" / "grading" / "ch09.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not ({"_reference", "_hidden"} & imported) and not any("_reference" in m or "_hidden" in m for m in modules)


@pytest.mark.parametrize("checker", sorted(CASES) + ["check_fixed_chunk_kernel"])
def test_a_correct_answer_passes(checker, capsys):
    answer = ref.fixed_chunk_kernel if checker == "check_fixed_chunk_kernel" else CASES[checker][0]
    assert getattr(ex, checker)(answer, seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


def test_another_correct_window_count_passes():
    ex.check_count_window_tiles(window_tiles, seed=5)


SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


# Some shortcuts are numerically wrong on purpose (exp of a raw log-sum-exp overflows):
# the interpreter's numpy says so, and the checker's message is what is tested.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, name, fn, says, capsys):
    with pytest.raises(AssertionError) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


@pytest.mark.parametrize("variant, says", CHUNK_SHORTCUTS, ids=[v for v, _ in CHUNK_SHORTCUTS])
def test_a_kernel_with_bugs_left_fails_naming_them(variant, says, chunk_variants):
    with pytest.raises(AssertionError) as failure:
        ex.check_fixed_chunk_kernel(getattr(chunk_variants, variant), seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{variant}: {first_line}"
    if variant in ("handed_out", "diagonal_and_last_tile_left"):      # finding them is the task: not listed
        assert not any(word in first_line for word in ("LAST key", "last row's key", "exp2"))


def test_a_kernel_that_masks_one_tile_more_than_it_must_still_passes(chunk_variants):
    """Masking the tile that holds the program's first row when that row is the tile's last slot is
    harmless (the tile needs no mask, but masking it changes no score): only masking tiles every row
    sees whole, beyond that one, is refused."""
    ex.check_fixed_chunk_kernel(chunk_variants.masks_a_whole_tile_more, seed=3)


@triton.jit
def always_masked(q_ptr, k_ptr, v_ptr, out_ptr, cached_len, num_new, scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr):
    """The learner trial's kernel (issue 39, 09.2): one loop over the tiles up to the last row's, every tile
    masked. Its rows are right; before the mask count it earned the task's points."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + dims[None, :], mask=(rows < num_new)[:, None], other=0.0)
    query_pos = cached_len + rows
    seq_len = cached_len + num_new
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    last_pos = tl.minimum(cached_len + tl.program_id(0) * BLOCK_M + BLOCK_M, seq_len) - 1
    for j in range(0, last_pos // TILE_N + 1):
        keys = j * TILE_N + tl.arange(0, TILE_N)
        k = tl.load(k_ptr + keys[:, None] * HEAD_DIM + dims[None, :], mask=(keys < seq_len)[:, None], other=0.0)
        v = tl.load(v_ptr + keys[:, None] * HEAD_DIM + dims[None, :], mask=(keys < seq_len)[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale * 1.4426950408889634
        scores = tl.where((keys[None, :] <= query_pos[:, None]) & (keys < seq_len)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.math.exp2(m - m_new)
        p = tl.math.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * HEAD_DIM + dims[None, :], acc / l[:, None], mask=(rows < num_new)[:, None])


def test_a_kernel_that_masks_every_tile_fails_with_a_named_message():
    with pytest.raises(AssertionError) as failure:
        ex.check_fixed_chunk_kernel(always_masked, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert "the rows are right, but it masks" in first_line and "no mask" in first_line, first_line


def test_the_handed_out_kernel_cannot_be_repaired_by_diffing_it_against_the_chapter():
    """Issue 39's trial (09.2) repaired the old handed-out kernel line by line from the printed
    _attention_tile_program. Now no repaired line is a line of the printed program, and one bug (the
    softmax's base) has no counterpart there at all: the printed program never calls exp2."""
    import inspect
    source = EXERCISE.read_text()

    def code_lines(text):
        return {re.sub(r"\s+", " ", line.split("#", 1)[0]).strip() for line in text.splitlines()} - {""}

    start = source.index("def chunk_kernel(")
    handed_out = code_lines(source[start:source.index("\n\n\n", start)])
    start = source.index("def fixed_chunk_kernel(")
    repaired = code_lines(source[start:source.index("### END SOLUTION", start)]) - handed_out
    printed_program = code_lines(inspect.getsource(ta._attention_tile_program))
    assert len(repaired) >= 3, repaired
    assert not repaired & printed_program, repaired & printed_program
    assert "exp2" in source[source.index("def chunk_kernel("):] and "exp2" not in inspect.getsource(
        ta._attention_tile_program)


@pytest.mark.parametrize("fn, says", [
    (printed("one_program"), "is not a @triton.jit kernel"),               # the chapter's torch sketch
    (ta.attention_tile_kernel, "crashed"),                                   # the engine's kernel, pasted as is
], ids=["one_program", "the engine's kernel"])
def test_the_chapters_printed_code_does_not_pass_the_debug_task(fn, says):
    with pytest.raises(AssertionError) as failure:
        ex.check_fixed_chunk_kernel(fn)
    assert says in str(failure.value).splitlines()[0]


def test_the_chapters_key_tiles_does_not_pass_the_window_task_for_any_seed():
    for seed in (None, 11, 12):
        with pytest.raises(AssertionError):
            ex.check_count_window_tiles(key_tiles_count, seed=seed)


def test_copying_the_chapter_earns_at_most_a_fifth_of_the_points():
    source = EXERCISE.read_text()
    points = {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*#\s*points:\s*(\d+)", source)}
    assert set(points) == set(ch09.__all__), "every checker is a graded task of the notebook"
    assert sum(points[c] for c in COPYABLE) * 5 <= sum(points.values())


def test_a_stub_kernel_counts_as_not_attempted(tmp_path):
    path = tmp_path / "stub_kernel.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                    "def fixed_chunk_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cached_len, num_new, scale, "
                    "HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr):\n"
                    "    raise NotImplementedError\n")
    spec = importlib.util.spec_from_file_location("stub_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(NotImplementedError):
        ex.check_fixed_chunk_kernel(module.fixed_chunk_kernel)


# ---- hidden cases: the references pass them, a wrong answer does not ------------------------
@pytest.mark.parametrize("checker", sorted(hidden.HIDDEN))
def test_the_reference_answers_pass_the_hidden_cases(checker):
    answer = {"check_fixed_chunk_kernel": ref.fixed_chunk_kernel, "check_merge_kernel": ref.merge_kernel}.get(
        checker) or CASES[checker][0]
    for kwargs in hidden.HIDDEN[checker]:
        getattr(ex, checker)(answer, **kwargs)
    extra = getattr(hidden, "hidden_" + checker, None)
    if extra is not None:
        extra(answer)


def test_the_hidden_checks_catch_what_the_public_cases_might_miss():
    with pytest.raises(AssertionError):
        hidden.hidden_check_count_window_tiles(lambda *a: window_tiles(*a, diagonal_unmasked=True))
    with pytest.raises(AssertionError):
        hidden.hidden_check_predicted_launch(lambda *a: launch_variant(*a, times_splits=True))
    with pytest.raises(AssertionError):
        hidden.hidden_check_tile_mask(tile_mask_no_padding)


# ---- the references agree with the engine ------------------------------------------------------
def test_the_window_count_with_an_endless_window_is_the_chapters_diagonal_rule():
    rng = random.Random(1)
    for _ in range(60):
        k = rng.randint(1, 4)
        query_lens = [rng.choice([1, rng.randint(1, 70)]) for _ in range(k)]
        cached_lens = [rng.randint(0, 90) for _ in range(k)]
        tile_n, rows = rng.choice([16, 32, 64]), rng.choice([1, 8, 16, 32])
        assert ref.count_window_tiles(query_lens, cached_lens, tile_n, rows, 10**9) == \
            key_tiles_count(query_lens, cached_lens, tile_n, rows, None)
        window = rng.randint(1, 150)
        assert ref.count_window_tiles(query_lens, cached_lens, tile_n, rows, window) == \
            ch09._window_tiles(query_lens, cached_lens, tile_n, rows, window) == \
            window_tiles(query_lens, cached_lens, tile_n, rows, window)


def test_the_predicted_launch_reference_is_what_the_interpreter_counts():
    for args in [([7, 1, 30], [3, 90, 0], 2, 2, 16, 16, 1), ([1, 1, 1], [40, 130, 5], 1, 4, 16, 32, 4),
                 ([33], [17], 2, 1, 32, 64, 3)]:
        assert ref.predicted_launch(*args) == ch09._measured_launch(*args)


def test_the_tile_mask_reference_is_a_block_of_the_bottom_right_causal_mask():
    rng = random.Random(0)
    for _ in range(200):
        block_size, n, c = rng.choice([4, 16, 48]), rng.randint(1, 40), rng.randint(0, 50)
        first = rng.randrange(n)
        rows, tile = rng.randint(1, 16), rng.randrange(-(-(c + n) // block_size))
        assert torch.equal(ref.tile_mask(c, n, first, rows, tile, block_size),
                           ch09._engine_tile_mask(c, n, first, rows, tile, block_size))


def test_the_chunk_emulation_without_bugs_is_reference_attention():
    from minillm.attention import reference_attention
    q, k, v = ch09._chunk_case(13, 37, 16, seed=0)
    exact = reference_attention(q.double()[:, None], k.double()[:, None], v.double()[:, None])[:, 0]
    torch.testing.assert_close(ch09._chunk_emulation(q, k, v, 13, 16, 16), exact, atol=1e-12, rtol=0)
    for bug in ch09._CHUNK_BUGS:            # each bug alone changes the result on this case
        assert not torch.allclose(ch09._chunk_emulation(q, k, v, 13, 16, 16, (bug,)), exact, atol=1e-3,
                                  equal_nan=True)


def test_the_intensity_reference_equals_the_accounting():
    for name in ("llama-3-8b", "llama-2-7b", "tiny"):
        cfg = minillm.ModelConfig.preset(name)
        for n, c, b in [(1, 4096, 2), (512, 4096, 2), (2048, 0, 1), (7, 3, 4)]:
            by_op = step_cost(cfg, [(n, c)], dtype_bytes=b).by_op
            expected = (by_op["attn_scores"][0] + by_op["attn_values"][0]) / (by_op["attn_scores"][1]
                                                                             + by_op["attn_values"][1])
            assert math.isclose(ref.attention_intensity(cfg, n, c, b, b), expected, rel_tol=1e-12)
            for kv_b in (1, 2, 4):
                assert math.isclose(ref.attention_intensity(cfg, n, c, b, kv_b),
                                    ch09._accounted_intensity(cfg, n, c, b, kv_b), rel_tol=1e-12)
    llama = minillm.ModelConfig.preset("llama-3-8b")
    assert round(ref.attention_intensity(llama, 1, 4096, 2, 2), 1) == 4.0
    assert round(ref.attention_intensity(llama, 1, 4096, 2, 1), 1) == 8.0       # an fp8 cache doubles a decode's


def test_chapter_5s_printed_attention_lines_are_what_the_paste_test_lifts():
    """The lines chapter 5 prints (show_source(step_cost, ...)) hold the attention block the shortcut test
    pastes; pasted with one dtype they give the accounting's intensity, and fail the fp8 task."""
    chapter5 = (ROOT / "notebooks" / "src" / "05_flops_and_io.py").read_text()
    assert 'show_source(step_cost, start="# Per layer."' in chapter5
    llama = minillm.ModelConfig.preset("llama-3-8b")
    assert math.isclose(chapter5_attention_lines(llama, 512, 4096, 2, 2), ref.attention_intensity(llama, 512, 4096,
                                                                                                     2, 2))
    assert not math.isclose(chapter5_attention_lines(llama, 1, 4096, 2, 1), ref.attention_intensity(llama, 1, 4096,
                                                                                                       2, 1))


# ---- the learner trial of exercises 6-10 (notes/trial_6_10.md), chapter 9's findings -------------------
def _task_markdown(number: int) -> str:
    text = EXERCISE.read_text()
    start = text.index(f"# ## {number}. ")
    return text[start:text.index("\n# %%\n", start)]


def test_09_1_the_hint_does_not_promise_a_condition_the_others_imply():
    """The trial: the hint promised three conditions, but a slot past the sequence's end is never at or
    before a real row's position: two conditions (causal, real row) make the mask."""
    hint = _task_markdown(1)
    assert "there are three" not in hint and "follows from the others" in hint
    two_conditions = lambda c, n, f, r, t, b: ((t * b + torch.arange(b))[None, :] <= c + f + torch.arange(r)[:, None]) \
        & ((f + torch.arange(r)) < n)[:, None]
    ex.check_tile_mask(two_conditions, seed=3)


def test_09_3_the_statement_says_padding_rows_do_not_count_and_both_readings_are_named():
    """The trial: whether rows past query_len count was unclear, and both readings got a bare
    `returned (0, 5, 1), expected (3, 2, 1)`."""
    assert "do not count" in _task_markdown(3)
    for slip in ("padded_rows", "padding_sees_nothing"):
        with pytest.raises(AssertionError) as failure:
            ex.check_count_window_tiles(lambda *a, s=slip: ch09._window_tiles(*a, slip=s))
        assert "do not count" in str(failure.value).splitlines()[0]
