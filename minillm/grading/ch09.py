"""Checkers for exercises/09_the_mixed_step_on_a_gpu: the tile arithmetic of a GPU attention kernel.

The expected values come from _reference/ch09 (brute force over the masks, held
equal to the engine's kernels.triton_attention and accounting.step_cost by
tests/test_grading_ch09.py). The engine's helpers that answer a task
(key_tiles, plan_tiles, step_cost, causal_pairs, the references themselves)
raise while the learner's function runs. Two tasks go past what chapter 9
prints: counting the tiles of a whole packed step (the chapter classifies one
request's tiles) and the arithmetic intensity counted from the shapes (the
chapter reads it off step_cost).
"""
from __future__ import annotations

import math
import random

import torch

from ..config import PRESETS, ModelConfig
from ..sim.accounting import step_cost
from ._common import call_text, checker, fail as _fail, learner_call, passed
from ._reference import ch09 as _ref

__all__ = ["check_tile_mask", "check_online_softmax_update", "check_count_tiles", "check_attention_intensity"]

_TILES = ("minillm.kernels.triton_attention.key_tiles", "minillm.kernels.triton_attention.plan_tiles",
          "minillm.grading._reference.ch09.tile_mask", "minillm.grading._reference.ch09.count_tiles",
          "minillm.attention.causal_mask")
_SOFTMAX = ("minillm.grading._reference.ch09.online_softmax_update", "minillm.attention.merge_attention",
            "torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "torch.logsumexp",
            "torch.Tensor.logsumexp")
_ACCOUNTING = ("minillm.sim.accounting.step_cost", "minillm.sim.accounting.causal_pairs",
               "minillm.chunk_sizing.causal_pairs", "minillm.grading._reference.ch09.attention_intensity")


# ---------------------------------------------------------------------------
# 1. The mask of one tile
# ---------------------------------------------------------------------------
def _mask_mistake(got: torch.Tensor, args: tuple) -> str:
    cached_len, query_len, first_row, num_rows, tile, block_size = args
    query_pos = cached_len + first_row + torch.arange(num_rows)
    key_pos = tile * block_size + torch.arange(block_size)
    causal = key_pos[None, :] <= query_pos[:, None]
    rows_ok = ((first_row + torch.arange(num_rows)) < query_len)[:, None]
    in_seq = key_pos[None, :] < cached_len + query_len
    if torch.equal(got, (key_pos[None, :] <= (first_row + torch.arange(num_rows))[:, None]) & in_seq & rows_ok):
        return ("that mask places the queries at positions first_row + r, as if nothing were cached: "
                "they sit at cached_len + first_row + r (bottom-right alignment, chapter 1)")
    if torch.equal(got, (key_pos[None, :] < query_pos[:, None]) & in_seq & rows_ok):
        return "a query sees its own key too: key <= query, not key < query"
    if torch.equal(got, causal & in_seq):
        return "rows past the request's query_len (the tile's padding) must see nothing"
    return ""


@checker
def check_tile_mask(fn, seed: int | None = None, *, num_cases: int = 200):
    """tile_mask(cached_len, query_len, first_row, num_rows, tile, block_size) -> bool [num_rows, block_size]."""
    rng = random.Random(seed)
    cases = [(13, 21, 0, 16, 1, 16),      # a chunk that starts mid-block: its diagonal tile
             (47, 1, 0, 4, 2, 16),        # a decode: the last block is partly empty
             (0, 10, 8, 4, 0, 16)]        # the last query tile has rows past the request's end
    for _ in range(num_cases):
        block_size = rng.choice([4, 16, 32])
        query_len, cached_len = rng.randint(1, 60), rng.choice([0, rng.randint(0, 80)])
        first_row = rng.randrange(0, query_len)
        tile = rng.randrange(0, -(-(cached_len + query_len) // block_size))
        cases.append((cached_len, query_len, first_row, rng.choice([1, 4, 8, 16]), tile, block_size))
    for args in cases:
        expected = _ref.tile_mask(*args)
        got = learner_call(fn, *args, forbidden=_TILES, why="build it from the positions yourself.")
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            _fail(f"{call_text(fn, *args)} returned {type(got).__name__}"
                  f"{'' if not isinstance(got, torch.Tensor) else ' of ' + str(got.dtype)}: return a bool tensor")
        if tuple(got.shape) != tuple(expected.shape):
            _fail(f"{call_text(fn, *args)} returned shape {list(got.shape)}, expected {list(expected.shape)} "
                  "(num_rows, block_size)")
        if not torch.equal(got, expected):
            why = _mask_mistake(got, args)
            _fail(f"{call_text(fn, *args)}: {why or 'the mask differs from the causal mask of those positions'}",
                  details=[f"expected:\n{expected.int()}", f"you returned:\n{got.int()}"])
    passed(f"tile_mask: {len(cases)} tiles (mid-block chunks, decodes, padding rows) are masked right")


# ---------------------------------------------------------------------------
# 2. The online-softmax update of one key tile
# ---------------------------------------------------------------------------
def _softmax_tiles(rng: random.Random, gen: torch.Generator):
    """A row block and its keys cut into tiles: (q-less) scores per tile, values per tile.
    Scores reach +-80, so exp without the running max overflows float32."""
    rows, dim = rng.randint(1, 6), rng.choice([1, 4, 8])
    num_tiles, tile = rng.randint(1, 5), rng.choice([2, 4, 16])
    scale = rng.choice([1.0, 10.0, 80.0])
    scores = [torch.randn(rows, tile, generator=gen, dtype=torch.float64) * scale for _ in range(num_tiles)]
    values = [torch.randn(tile, dim, generator=gen, dtype=torch.float64) for _ in range(num_tiles)]
    if num_tiles > 1 and rng.random() < 0.6:              # a masked diagonal tile: some -inf, never a whole row
        mask = torch.rand(rows, tile, generator=gen) < 0.5
        mask[:, 0] = False
        scores[-1] = scores[-1].masked_fill(mask, float("-inf"))
    if num_tiles > 1 and rng.random() < 0.3:              # a later tile with much larger scores: the max moves
        scores[-1] = scores[-1] + 40.0
    return scores, values


def _softmax_mistake(fn, scores, values) -> str:
    """Replay the tiles with the usual slips and name the one that matches the learner's end result."""
    def run(update):
        rows, dim = scores[0].shape[0], values[0].shape[1]
        m = torch.full((rows,), float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros(rows, dtype=torch.float64), torch.zeros(rows, dim, dtype=torch.float64)
        for s, v in zip(scores, values):
            m, l, acc = update(m, l, acc, s, v)
        return acc / l[:, None]

    def no_acc_rescale(m, l, acc, s, v):
        m2, l2, _ = _ref.online_softmax_update(m, l, acc, s, v)
        return m2, l2, acc + torch.exp(s - m2[:, None]) @ v

    def no_l_rescale(m, l, acc, s, v):
        m2, _, acc2 = _ref.online_softmax_update(m, l, acc, s, v)
        return m2, l + torch.exp(s - m2[:, None]).sum(dim=1), acc2

    def tile_max_only(m, l, acc, s, v):
        m2 = s.max(dim=1).values
        alpha = torch.exp(m - m2)
        p = torch.exp(s - m2[:, None])
        return m2, l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v

    slips = {"acc is not rescaled by exp(m_old - m_new) when the maximum grows": no_acc_rescale,
             "l (the running sum) is not rescaled by exp(m_old - m_new) when the maximum grows": no_l_rescale,
             "m_new must be the max of the old m AND the tile's scores, not the tile's max alone": tile_max_only}
    for why, slip in slips.items():
        try:
            wrong = run(slip)
        except Exception:      # noqa: BLE001
            continue
        got = _replay(fn, scores, values)[0]
        if got is not None and wrong.isfinite().all() and torch.allclose(got, wrong, atol=1e-9):
            return why
    return ""


def _replay(fn, scores, values):
    """Run the learner's update over the tiles: (final output, [(m, l, acc) after each tile])."""
    rows, dim = scores[0].shape[0], values[0].shape[1]
    m = torch.full((rows,), float("-inf"), dtype=torch.float64)
    l, acc = torch.zeros(rows, dtype=torch.float64), torch.zeros(rows, dim, dtype=torch.float64)
    states = []
    for s, v in zip(scores, values):
        result = learner_call(fn, m.clone(), l.clone(), acc.clone(), s.clone(), v.clone(), forbidden=_SOFTMAX,
                              why="update the running max, sum and accumulator yourself.")
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            return None, states
        m, l, acc = (torch.as_tensor(x, dtype=torch.float64) for x in result)
        states.append((m, l, acc))
    return acc / l[:, None], states


@checker
def check_online_softmax_update(fn, seed: int | None = None, *, num_cases: int = 60):
    """online_softmax_update(m, l, acc, scores, v) -> (m_new, l_new, acc_new) for one key tile."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    for case in range(num_cases):
        scores, values = _softmax_tiles(rng, gen)
        all_scores, all_values = torch.cat(scores, dim=1), torch.cat(values)
        expected = torch.softmax(all_scores, dim=1) @ all_values
        m = torch.full((scores[0].shape[0],), float("-inf"), dtype=torch.float64)
        first_args = (m, torch.zeros_like(m), torch.zeros(m.shape[0], values[0].shape[1], dtype=torch.float64),
                      scores[0], values[0])
        got, states = _replay(fn, scores, values)
        if got is None:
            _fail(f"{call_text(fn, *first_args)} must return three things: (m_new, l_new, acc_new)")
        # The state after each tile: m is the running max, l the sum of exp(score - m) so far.
        for t, (m_t, l_t, acc_t) in enumerate(states):
            seen = torch.cat(scores[:t + 1], dim=1)
            m_ref = seen.max(dim=1).values
            l_ref = torch.exp(seen - m_ref[:, None]).sum(dim=1)
            if m_t.shape != m_ref.shape or not torch.allclose(m_t, m_ref):
                _fail(f"after key tile {t} of {len(scores)} the running max m is {m_t.tolist()}, expected "
                      f"{m_ref.tolist()}: m_new = max(m_old, the tile's largest score), per row")
            if l_t.shape != l_ref.shape or not torch.allclose(l_t, l_ref, rtol=1e-9, atol=0):
                _fail(f"after key tile {t} of {len(scores)} the running sum l is {l_t.tolist()}, expected "
                      f"{l_ref.tolist()}: the sum of exp(score - m_new) over every key seen so far "
                      "(keep acc and l unnormalised; divide once, after the last tile)")
        if not got.isfinite().all() or not torch.allclose(got, expected, rtol=1e-9, atol=1e-12):
            why = _softmax_mistake(fn, scores, values) or (
                "the tiles' outputs do not add up to one softmax over all keys")
            nan = "" if got.isfinite().all() else " (NaN or inf: exp of scores without subtracting the max overflows)"
            _fail(f"{len(scores)} key tiles with scores up to {all_scores[all_scores.isfinite()].abs().max():.0f}: "
                  f"{why}{nan}")
    passed(f"online_softmax_update: {num_cases} rows of tiles (growing maxima, masked keys, scores up to 120) "
           "give one softmax")


# ---------------------------------------------------------------------------
# 3. The tiles of a whole packed step
# ---------------------------------------------------------------------------
@checker
def check_count_tiles(fn, seed: int | None = None, *, num_cases: int = 150):
    """count_tiles(query_lens, cached_lens, block_size, rows_per_tile) -> (unmasked, masked, skipped)."""
    rng = random.Random(seed)
    cases = [([96], [40], 16, 32),                    # the chapter's chunk: (12, 9, 6)
             ([1, 1, 1], [15, 16, 47], 16, 16),       # decodes: full last block or not
             ([37, 1, 21, 5], [0, 47, 13, 32], 16, 16)]
    for _ in range(num_cases):
        k = rng.randint(1, 5)
        query_lens = [rng.choice([1, rng.randint(1, 80)]) for _ in range(k)]
        cached_lens = [rng.choice([0, rng.randint(0, 100)]) for _ in range(k)]
        cases.append((query_lens, cached_lens, rng.choice([4, 16, 32]), rng.choice([1, 8, 16, 32])))
    for args in cases:
        expected = _ref.count_tiles(*args)
        got = learner_call(fn, *[list(a) if isinstance(a, list) else a for a in args], forbidden=_TILES,
                           why="work out each program's tiles from the positions yourself.")
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            _fail(f"{call_text(fn, *args)} returned {got!r}: return (unmasked, masked, skipped)")
        got = tuple(got)
        if got != expected:
            unmasked, masked, skipped = expected
            hint = ""
            if sum(got) != sum(expected):
                hint = (f"; the pairs add up to {sum(got)}, but the step has {sum(expected)} (query tile, key "
                        "tile) pairs: each request's query tiles times ITS key tiles, ceil(seq_len / block_size)")
            elif got[0] > unmasked and got[1] < masked:
                hint = ("; a tile that holds a slot past the sequence's end (a decode's last, partly filled "
                        "block) needs the mask too")
            elif got[0] < unmasked:
                hint = ("; a key tile is unmasked when its LAST key is at or before the query tile's FIRST "
                        "position: cached_len + first_row")
            _fail(f"{call_text(fn, *args)} returned {got}, expected {expected}{hint}")
    passed(f"count_tiles: {len(cases)} packed steps (decodes, chunks mid-block, prefix-cached prompts) "
           "counted tile by tile")


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


def _intensity_mistake(got: float, cfg, n: int, c: int, b: int) -> str:
    pairs = n * c + n * (n + 1) // 2
    hd, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    flops = 4 * pairs * hd * hq
    traffic = (2 * c * hkv * hd + 2 * n * hkv * hd + 2 * n * hq * hd) * b
    guesses = {
        ("half the FLOPs: a dot product of length head_dim is 2 * head_dim FLOPs (a multiply and an add), "
         "and the values (P V) cost as many as the scores (Q K^T)"): flops / 2 / traffic,
        "you count n * (c + n) pairs: a new token sees the cache and the new tokens up to ITSELF":
            4 * n * (c + n) * hd * hq / traffic,
        "every QUERY head computes scores, not only the KV heads": 4 * pairs * hd * hkv / traffic,
        "K and V are stored per KV head (num_kv_heads), not per query head": flops / (
            (2 * c * hq * hd + 2 * n * hq * hd + 2 * n * hq * hd) * b),
        "count both the cached K AND the cached V read": flops / ((c * hkv * hd + 2 * n * hkv * hd
                                                                  + 2 * n * hq * hd) * b),
        "the step also writes the new tokens' K and V, reads Q and writes the output: count those bytes":
            flops / (2 * c * hkv * hd * b),
        "bytes are elements times dtype_bytes": flops / (traffic // b),
    }
    for why, value in guesses.items():
        if math.isclose(got, value, rel_tol=1e-9):
            return why
    return ""


@checker
def check_attention_intensity(fn, seed: int | None = None, *, num_cases: int = 80):
    """attention_intensity(cfg, num_new, num_cached, dtype_bytes) -> FLOPs per byte of that request's attention."""
    rng = random.Random(seed)
    configs = _configs(rng)
    cases = [(PRESETS["llama-3-8b"], 1, 4096, 2), (PRESETS["llama-3-8b"], 512, 4096, 2),
             (PRESETS["llama-2-7b"], 1, 1000, 2)]                 # MHA: 1 FLOP per byte
    for _ in range(num_cases):
        cases.append((rng.choice(configs), rng.choice([1, rng.randint(1, 2048)]), rng.choice([0, rng.randint(0, 8192)]),
                      rng.choice([1, 2, 4])))
    for cfg, n, c, b in cases:
        by_op = step_cost(cfg, [(n, c)], dtype_bytes=b).by_op
        expected = (by_op["attn_scores"][0] + by_op["attn_values"][0]) / (by_op["attn_scores"][1]
                                                                         + by_op["attn_values"][1])
        got = learner_call(fn, cfg, n, c, b, forbidden=_ACCOUNTING,
                           why="count the FLOPs and the bytes from the shapes yourself.")
        if not isinstance(got, (int, float)) or not math.isclose(float(got), expected, rel_tol=1e-6):
            why = _intensity_mistake(float(got), cfg, n, c, b) if isinstance(got, (int, float)) else \
                f"return a number, not {type(got).__name__}"
            _fail(f"{call_text(fn, cfg, n, c, b)} returned {got!r}, expected {expected:.4g} FLOP/byte"
                  f"{': ' + why if why else ''}")
    passed(f"attention_intensity: {len(cases)} requests (decodes to long chunks, MHA and GQA, 1-4 byte dtypes) "
           "agree with the accounting")
