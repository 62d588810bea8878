"""Chapter 9's checkers: a correct answer passes, every shortcut fails with a message that
names the mistake, and the chapter's own printed code does not pass the transfer task.

For each checker, a correct function and shortcut attempts: the engine's own function,
skipping the method, a hard-coded value, wrong-but-close variants. The references the
checkers rest on are held equal to the engine (the kernel's tile arithmetic, the causal
mask, the accounting).
"""
import ast
import math
import random
import re
from pathlib import Path

import pytest
import torch

import minillm
import minillm.grading as ex
from minillm.attention import causal_mask, merge_attention
from minillm.grading import ch09
from minillm.grading._reference import ch09 as ref
from minillm.kernels import triton_attention as ta
from minillm.sim.accounting import step_cost

ROOT = Path(__file__).resolve().parents[1]


def printed(name: str):
    """A function chapter 9 prints, defined here on its own as a learner who copies it has it
    (with the chapter's globals it reads: cfg and step_cost)."""
    source = (ROOT / "notebooks" / "src" / "09_the_mixed_step_on_a_gpu.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"torch": torch, "step_cost": step_cost, "cfg": minillm.ModelConfig.preset("llama-3-8b")}
    exec(compile(ast.fix_missing_locations(ast.Module([node], [])), "<chapter 09>", "exec"), namespace)
    return namespace[name]


# ---- correct answers (the tests' own; the notebook has its own) ------------------------------
def tile_mask(cached_len, query_len, first_row, num_rows, tile, block_size):
    mask = torch.zeros(num_rows, block_size, dtype=torch.bool)
    for r in range(num_rows):
        for k in range(block_size):
            key = tile * block_size + k
            mask[r, k] = first_row + r < query_len and key < cached_len + query_len and key <= cached_len + first_row + r
    return mask


def softmax_update(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=1))
    scale = (m - m_new).exp()
    weights = (scores - m_new[:, None]).exp()
    return m_new, scale * l + weights.sum(1), scale[:, None] * acc + weights @ v


def count_tiles(query_lens, cached_lens, block_size, rows_per_tile, partial_last_unmasked=False,
                step_wide_key_tiles=False, floor_first=False):
    kinds = [0, 0, 0]
    longest = max(c + n for n, c in zip(query_lens, cached_lens))
    for n, c in zip(query_lens, cached_lens):
        num_key_tiles = -(-((longest if step_wide_key_tiles else c + n)) // block_size)
        for first in range(0, n, rows_per_tile):
            lo, hi = c + first, c + min(first + rows_per_tile, n) - 1
            for j in range(num_key_tiles):
                last_key = (j + 1) * block_size - 1
                if partial_last_unmasked:
                    last_key = min(last_key, c + n - 1)
                full = last_key < lo if floor_first else last_key <= lo
                kinds[0 if full else 1 if j * block_size <= hi else 2] += 1
    return tuple(kinds)


def intensity(cfg, n, c, b, flops_per_mac=2, pairs=None, flop_heads=None, kv_heads=None, writes=True,
              use_bytes=True):
    pairs = n * c + n * (n + 1) // 2 if pairs is None else pairs
    flops = 2 * flops_per_mac * pairs * cfg.head_dim * (flop_heads or cfg.num_heads)
    kv = (kv_heads or cfg.num_kv_heads) * cfg.head_dim
    elements = 2 * c * kv + (2 * n * kv + 2 * n * cfg.num_heads * cfg.head_dim if writes else 0)
    return flops / (elements * (b if use_bytes else 1))


def _naive_softmax_update(m, l, acc, scores, v):                 # exp of raw scores: overflows
    m_new = torch.maximum(m, scores.amax(dim=1))
    return m_new, l + scores.exp().sum(1), acc + scores.exp() @ v


CASES = {
    "check_tile_mask": (tile_mask, [
        ("the engine's causal_mask", lambda c, n, f, r, t, b: causal_mask(n, c + n)[f:f + r, t * b:(t + 1) * b],
         "minillm.attention.causal_mask"),
        ("top-left: no cached offset", lambda c, n, f, r, t, b: tile_mask(0, n, f, r, t, b)
         & (t * b + torch.arange(b) < c + n)[None, :], "as if nothing were cached"),
        ("key < query", lambda c, n, f, r, t, b: tile_mask(c, n, f, r, t, b)
         & ~torch.eye(r, b, dtype=torch.bool).roll(c + f - t * b, 1) if 0 <= c + f - t * b < b else
         tile_mask(c, n, f, r, t, b) & (t * b + torch.arange(b)[None, :] < c + f + torch.arange(r)[:, None]),
         "key <= query"),
        ("padding rows see keys", lambda c, n, f, r, t, b:
         (t * b + torch.arange(b)[None, :] <= c + f + torch.arange(r)[:, None]) & (t * b + torch.arange(b) < c + n),
         "rows past the request's query_len"),
        ("an int mask", lambda *a: tile_mask(*a).int(), "return a bool tensor"),
    ]),
    "check_online_softmax_update": (softmax_update, [
        ("torch.softmax over the tile", lambda m, l, acc, s, v: (torch.maximum(m, s.amax(1)), l + 1,
                                                                  acc + torch.softmax(s, 1) @ v), "torch.softmax"),
        ("acc not rescaled", lambda m, l, acc, s, v: (softmax_update(m, l, acc, s, v)[0],
                                                      softmax_update(m, l, acc, s, v)[1],
                                                      acc + (s - softmax_update(m, l, acc, s, v)[0][:, None]).exp() @ v),
         "acc is not rescaled"),
        ("l not rescaled", lambda m, l, acc, s, v: (softmax_update(m, l, acc, s, v)[0],
                                                    l + (s - softmax_update(m, l, acc, s, v)[0][:, None]).exp().sum(1),
                                                    softmax_update(m, l, acc, s, v)[2]), "running sum l"),
        ("the tile's max alone", lambda m, l, acc, s, v: softmax_update(torch.full_like(m, float("-inf")), l, acc, s, v),
         "running max m"),
        ("exp of raw scores", _naive_softmax_update, "running sum l"),
        ("two values returned", lambda m, l, acc, s, v: softmax_update(m, l, acc, s, v)[:2], "three things"),
    ]),
    "check_count_tiles": (count_tiles, [
        ("the engine's key_tiles", lambda ql, cl, b, r: tuple(map(sum, zip(*[
            (u, t - u, -(-(c + n) // b) - t) for n, c in zip(ql, cl) for f in range(0, n, r)
            for u, t in [ta.key_tiles(c, f, min(r, n - f), b)]]))), "minillm.kernels.triton_attention.key_tiles"),
        ("partial last block unmasked", lambda *a: count_tiles(*a, partial_last_unmasked=True), "past the sequence's end"),
        ("every request walks the step's longest sequence", lambda *a: count_tiles(*a, step_wide_key_tiles=True),
         "ITS key tiles"),
        ("unmasked only strictly before the first row", lambda *a: count_tiles(*a, floor_first=True),
         "LAST key is at or before"),
        ("hard-coded chapter answer", lambda *a: (12, 9, 6), "returned (12, 9, 6)"),
    ]),
    "check_attention_intensity": (intensity, [
        ("the accounting", lambda cfg, n, c, b: (lambda o: (o["attn_scores"][0] + o["attn_values"][0])
                                                / (o["attn_scores"][1] + o["attn_values"][1]))(
            step_cost(cfg, [(n, c)], dtype_bytes=b).by_op), "minillm.sim.accounting.step_cost"),
        ("1 FLOP per multiply-add", lambda *a: intensity(*a, flops_per_mac=1), "half the FLOPs"),
        ("n * (c + n) pairs", lambda cfg, n, c, b: intensity(cfg, n, c, b, pairs=n * (c + n)), "n * (c + n) pairs"),
        ("FLOPs per KV head", lambda cfg, n, c, b: intensity(cfg, n, c, b, flop_heads=cfg.num_kv_heads), "QUERY head"),
        ("K and V per query head", lambda cfg, n, c, b: intensity(cfg, n, c, b, kv_heads=cfg.num_heads),
         "num_kv_heads"),
        ("only the cache read", lambda *a: intensity(*a, writes=False), "writes the new tokens' K and V"),
        ("elements, not bytes", lambda *a: intensity(*a, use_bytes=False), "dtype_bytes"),
        ("the decode's 4, always", lambda *a: 4.0, "returned 4.0"),
    ]),
}
# The chapter computes the intensity with step_cost (forbidden here) and for one model:
# copied as it is printed, it must not pass.
PRINTED_ON_TRANSFER = [("check_attention_intensity", lambda cfg, n, c, b: printed("attention_intensity")(n, c))]
COPYABLE = {"check_tile_mask", "check_online_softmax_update"}     # the chapter prints a sketch of each


def test_every_chapter_9_checker_is_tested_here():
    assert set(CASES) == set(ch09.__all__) and set(ch09.__all__) <= set(ex.__all__)


@pytest.mark.parametrize("checker", sorted(CASES))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CASES[checker][0], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, name, fn, says, capsys):
    with pytest.raises(AssertionError) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


@pytest.mark.parametrize("checker, fn", PRINTED_ON_TRANSFER, ids=[c for c, _ in PRINTED_ON_TRANSFER])
def test_the_chapters_printed_code_does_not_pass_the_transfer_task(checker, fn):
    for seed in (None, 11):
        with pytest.raises(AssertionError):
            getattr(ex, checker)(fn, seed=seed)


def test_copying_the_chapter_earns_at_most_half_the_points():
    source = (ROOT / "exercises" / "solutions" / "src" / "09_the_mixed_step_on_a_gpu.py").read_text()
    points = {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*#\s*points:\s*(\d+)", source)}
    assert set(points) == set(ch09.__all__), "every checker is a graded task of the notebook"
    assert sum(points[c] for c in COPYABLE) * 2 <= sum(points.values())


# ---- the references the checkers rest on ------------------------------------------------------
def test_the_tile_mask_reference_is_a_block_of_the_bottom_right_causal_mask():
    rng = random.Random(0)
    for _ in range(200):
        block_size, n, c = rng.choice([4, 16]), rng.randint(1, 40), rng.randint(0, 50)
        first = rng.randrange(n)
        rows, tile = rng.randint(1, 16), rng.randrange(-(-(c + n) // block_size))
        full = torch.zeros(first + rows, (tile + 1) * block_size, dtype=torch.bool)
        mask = causal_mask(n, c + n)[first:first + rows, tile * block_size:(tile + 1) * block_size]
        full[:mask.shape[0], :mask.shape[1]] = mask
        assert torch.equal(ref.tile_mask(c, n, first, rows, tile, block_size), full[:rows, :block_size])


def test_the_tile_count_reference_is_the_kernels_tile_arithmetic():
    rng = random.Random(1)
    for _ in range(80):
        k = rng.randint(1, 4)
        query_lens = [rng.choice([1, rng.randint(1, 70)]) for _ in range(k)]
        cached_lens = [rng.randint(0, 60) for _ in range(k)]
        block_size, rows = rng.choice([4, 16, 32]), rng.choice([1, 8, 16, 32])
        requests, first_rows = ta.plan_tiles(query_lens, group=1, block_m=rows)
        counts = [0, 0, 0]
        for b, first in zip(requests, first_rows):
            n, c = query_lens[b], cached_lens[b]
            unmasked, total = ta.key_tiles(c, first, min(rows, n - first), block_size)
            counts[0] += unmasked
            counts[1] += total - unmasked
            counts[2] += -(-(c + n) // block_size) - total
        assert tuple(counts) == ref.count_tiles(query_lens, cached_lens, block_size, rows)


def test_the_online_softmax_reference_over_tiles_is_one_softmax_and_the_merge():
    gen = torch.Generator().manual_seed(0)
    scores, v = torch.randn(3, 12, generator=gen, dtype=torch.float64) * 30, torch.randn(12, 5, dtype=torch.float64)
    m, l, acc = torch.full((3,), float("-inf"), dtype=torch.float64), torch.zeros(3, dtype=torch.float64), \
        torch.zeros(3, 5, dtype=torch.float64)
    for start in range(0, 12, 4):
        m, l, acc = ref.online_softmax_update(m, l, acc, scores[:, start:start + 4], v[start:start + 4])
    torch.testing.assert_close(acc / l[:, None], torch.softmax(scores, 1) @ v, atol=1e-12, rtol=0)
    lse_a, lse_b = torch.logsumexp(scores[:, :6], 1), torch.logsumexp(scores[:, 6:], 1)
    merged, _ = merge_attention(torch.softmax(scores[:, :6], 1) @ v[:6], lse_a, torch.softmax(scores[:, 6:], 1) @ v[6:], lse_b)
    torch.testing.assert_close(acc / l[:, None], merged, atol=1e-12, rtol=0)


def test_the_intensity_reference_equals_the_accounting():
    for name in ("llama-3-8b", "llama-2-7b", "tiny"):
        cfg = minillm.ModelConfig.preset(name)
        for n, c, b in [(1, 4096, 2), (512, 4096, 2), (2048, 0, 1), (7, 3, 4)]:
            by_op = step_cost(cfg, [(n, c)], dtype_bytes=b).by_op
            expected = (by_op["attn_scores"][0] + by_op["attn_values"][0]) / (by_op["attn_scores"][1]
                                                                             + by_op["attn_values"][1])
            assert math.isclose(ref.attention_intensity(cfg, n, c, b), expected, rel_tol=1e-12)
    assert round(ref.attention_intensity(minillm.ModelConfig.preset("llama-3-8b"), 1, 4096, 2), 1) == 4.0
