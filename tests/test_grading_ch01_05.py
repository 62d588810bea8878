"""Chapters 1-5's checkers (issue 39): a correct answer passes, every shortcut fails with a
message that names the mistake, and a learner who pastes the chapter's printed code, lifts an
engine function or transcribes the statement earns at most 20% of a chapter's points.

For each checker, a correct function (the tests' own; the notebooks have theirs) and
shortcut attempts: the engine's own function, skipping the method, a hard-coded value, the
usual wrong-but-close variants, and the chapter's printed code adapted to the task. Then, per
chapter: which tasks the printed code passes (their points are counted), a predict-then-
measure task and a debug or design task, the teacher-only hidden cases, and the message
fixes issue 39 lists, each with its own test.
"""
from __future__ import annotations

import ast
import functools
import inspect
import math
import random
import re
import statistics
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minillm
import minillm.grading as ex
from minillm.attention import AttentionBatch, causal_mask, merge_attention, reference_attention
from minillm.config import ModelConfig, PRESETS
from minillm.grading import ch01, ch02, ch03, ch04, ch05
from minillm.grading._hidden import ch01 as hid01, ch02 as hid02, ch03 as hid03, ch04 as hid04, ch05 as hid05
from minillm.grading._reference import ch01 as ref01, ch02 as ref02, ch03 as ref03, ch04 as ref04, ch05 as ref05
from minillm.kv_cache import BlockManager, PagedKVCache, blocks_for, blocks_that_fit
from minillm.model import apply_rope, rope_cos_sin

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"01": ch01, "02": ch02, "03": ch03, "04": ch04, "05": ch05}
HIDDEN = {"01": hid01, "02": hid02, "03": hid03, "04": hid04, "05": hid05}


# ---- chapter 1: the tests' own answers and the mistakes ------------------------------------
def mask(q_len, k_len):
    return torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)


def window_mask(q_len, k_len, window, offset=None):
    query = torch.arange(q_len)[:, None] + (k_len - q_len if offset is None else offset)
    key = torch.arange(k_len)[None, :]
    return (key <= query) & (key > query - window)


def attention(q, k, v, dim=-1, expand=True, scale=None):
    group = q.shape[1] // k.shape[1]
    if expand:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) * (scale or 1 / math.sqrt(q.shape[-1]))
    visible = mask(q.shape[0], k.shape[0])
    return torch.einsum("hnm,mhd->nhd", scores.masked_fill(~visible, float("-inf")).softmax(dim).nan_to_num(), v)


def merge(out_a, lse_a, out_b, lse_b):
    return merge_parts([(out_a, lse_a), (out_b, lse_b)])


def merge_parts(parts):
    lse = torch.logsumexp(torch.stack([l for _, l in parts]), 0)
    out = torch.zeros_like(parts[0][0])
    for o, l in parts:
        w = (l - lse).exp()[..., None]
        out = out + torch.where(w > 0, o * w, torch.zeros_like(o))
    return out, lse


def _chapter_merge(out_a, lse_a, out_b, lse_b):
    """Chapter 1's printed merge_attention, transcribed."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None], lse


def _chunks(num_tokens, chunk_size):
    return [(s, min(chunk_size, num_tokens - s)) for s in range(0, num_tokens, chunk_size)]


def masked_fraction(num_tokens, chunk_size, masked=lambda n: n * (n - 1) // 2, drop_last=False, as_full=False):
    chunks = _chunks(num_tokens, chunk_size)
    if drop_last and len(chunks) > 1 and chunks[-1][1] < chunk_size:
        chunks = chunks[:-1]
    if as_full:
        chunks = [(s, chunk_size) for s, _ in chunks]
    return sum(masked(n) for _, n in chunks) / sum(n * (s + n) for s, n in chunks)


def _fraction_from_masks(num_tokens, chunk_size):
    masks = [causal_mask(n, s + n) for s, n in _chunks(num_tokens, chunk_size)]
    return sum(int((~m).sum()) for m in masks) / sum(m.numel() for m in masks)


# ---- chapter 2 ----------------------------------------------------------------------------
def rope(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _rope_cfg(x, theta):
    heads, head_dim = x.shape[1], x.shape[2]
    return ModelConfig(name="t", vocab_size=8, hidden_size=heads * head_dim, intermediate_size=8, num_layers=1,
                       num_heads=heads, num_kv_heads=heads, head_dim=head_dim, rope_theta=theta)


def _interleaved_rope(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def _all_float32_rope(x, positions, theta):
    half = x.shape[-1] // 2
    angles = positions[:, None] * theta ** (-torch.arange(half) * 2 / x.shape[-1])
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def grouped_scores(q, k):
    group = q.shape[1] // k.shape[1]
    return torch.stack([q[:, h] @ k[:, h // group].T for h in range(q.shape[1])]) / math.sqrt(q.shape[-1])


def broken_grouped_scores(q, k, scale=None):
    """The exercise's broken fold: [n, group, Hkv, D] pairs query head h with KV head h % Hkv."""
    n, num_heads, head_dim = q.shape
    q_rows = q.reshape(n, num_heads // k.shape[1], k.shape[1], head_dim)
    scores = torch.einsum("ngkd,mkd->kgnm", q_rows, k) * (scale or 1 / head_dim)
    return scores.reshape(num_heads, n, k.shape[0])


def move_rope(k, old, new, theta):
    return rope(k, new - old, theta)


def parameter_counts(cfg):
    d, layers, q, kv = cfg.hidden_size, cfg.num_layers, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    bias = cfg.attention_bias
    counts = {"embed_tokens": cfg.vocab_size * d, "norm": d, "input_layernorm": layers * d,
              "post_attention_layernorm": layers * d, "q_proj": layers * (d * q + bias * q),
              "k_proj": layers * (d * kv + bias * kv), "v_proj": layers * (d * kv + bias * kv), "o_proj": layers * q * d,
              **{m: layers * d * cfg.intermediate_size for m in ("gate_proj", "up_proj", "down_proj")}}
    if cfg.qk_norm:
        counts.update(q_norm=layers * cfg.head_dim, k_norm=layers * cfg.head_dim)
    if not cfg.tie_word_embeddings:
        counts["lm_head"] = cfg.vocab_size * d
    return counts


def _counts_with(**changes):
    """parameter_counts with some modules' counts changed by functions of (cfg, right count)."""
    def counts(cfg):
        right = parameter_counts(cfg)
        return {**right, **{m: f(cfg, right.get(m, 0)) for m, f in changes.items()}}
    return counts


# ---- chapter 3 ----------------------------------------------------------------------------
def blocks_needed(num_tokens, block_size):
    return -(-num_tokens // block_size)


def requests_that_fit(cfg, num_bytes, block_size, dtype_bytes, prompt_lens, pooled=False, skip=False, kv_scale=1.0):
    per_token = int(2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes * kv_scale)
    left = num_bytes // (block_size * per_token) * (block_size if pooled else 1)
    admitted = 0
    for n in prompt_lens:
        need = n if pooled else blocks_needed(n, block_size)
        if need > left:
            if skip:
                continue
            break
        left, admitted = left - need, admitted + 1
    return admitted


def append_slot(table, n, refs, free, block_size):
    table, offset = list(table), n % block_size
    if offset == 0:
        block = free.pop(0)
        refs[block] = 1
        return table + [block], block * block_size, None
    last = table[-1]
    if refs[last] == 1:
        return table, last * block_size + offset, None
    block = free.pop(0)
    refs[block], refs[last] = 1, refs[last] - 1
    table[-1] = block
    return table, block * block_size + offset, (last, block)


def _append_no_copy(table, n, refs, free, block_size):
    """Chapter 3's printed allocate + slot_mapping, transcribed: no reference counts, no copy."""
    table = list(table)
    if n % block_size == 0:
        block = free.pop(0)
        refs[block] = 1
        table.append(block)
    return table, table[n // block_size] * block_size + n % block_size, None


def _append_always_copy(table, n, refs, free, block_size):
    if n % block_size == 0:
        return append_slot(table, n, refs, free, block_size)
    table, last, block = list(table), table[-1], free.pop(0)
    refs[block], refs[last] = 1, refs[last] - 1
    table[-1] = block
    return table, block * block_size + n % block_size, (last, block)


def _append_keeps_count(table, n, refs, free, block_size):
    before = list(refs)
    out = append_slot(table, n, refs, free, block_size)
    if out[2] is not None:
        refs[out[2][0]] = before[out[2][0]]
    return out


def _append_new_block(table, n, refs, free, block_size):
    block = free.pop(0)
    refs[block] = 1
    return list(table) + [block], block * block_size + n % block_size, None


def _append_back_of_free(table, n, refs, free, block_size):
    free.reverse()
    try:
        return append_slot(table, n, refs, free, block_size)
    finally:
        free.reverse()


def _append_copy_reversed(table, n, refs, free, block_size):
    new_table, slot, copy = append_slot(table, n, refs, free, block_size)
    return new_table, slot, None if copy is None else copy[::-1]


def forward_tokens(prompt_len, num_output_tokens, preempted_after=None):
    n = num_output_tokens
    recompute = 0 if preempted_after is None else prompt_len + preempted_after - 1
    return n * prompt_len + n * (n - 1) // 2, prompt_len + n - 1 + recompute


def _forward_with(extra):
    """forward_tokens whose recompute after a preemption is extra(prompt_len, k) instead."""
    def predict(p, n, k=None):
        return forward_tokens(p, n)[0], p + n - 1 + (0 if k is None else extra(p, k))
    return predict


# ---- chapter 4 ----------------------------------------------------------------------------
def step_mask(query_lens, cached_lens):
    return torch.block_diag(*(mask(q, c + q) for q, c in zip(query_lens, cached_lens)))


def locate_bug(prefill_fn, model, token_ids, chunk_size, tolerance=1e-9, first=True):
    error = (prefill_fn(model, token_ids, chunk_size) - minillm.prefill_kv(model, token_ids)[0]).abs()
    layers = range(error.shape[0]) if first else reversed(range(error.shape[0]))
    for layer in layers:
        k_wrong = ~(error[layer, 0].amax(dim=(1, 2)) <= tolerance)           # NaN differs too
        v_wrong = ~(error[layer, 1].amax(dim=(1, 2)) <= tolerance)
        if k_wrong.any() or v_wrong.any():
            which = "both" if k_wrong.any() and v_wrong.any() else "K" if k_wrong.any() else "V"
            return layer, which, int((k_wrong | v_wrong).nonzero()[0])
    return None


def _chapter_kv_error_check(prefill_fn, model, token_ids, chunk_size):
    """Chapter 4's printed check (max |KV - full|), adapted: it says wrong, not where."""
    error = (prefill_fn(model, token_ids, chunk_size) - minillm.prefill_kv(model, token_ids)[0]).abs().max()
    return None if error < 1e-9 else (0, "both", 0)


def chunked_prefill(model, token_ids, chunk_size, block_size=16):
    """Chapter 4's my_chunked_prefill."""
    T = len(token_ids)
    blocks = BlockManager(-(-T // block_size), block_size)
    table = blocks.allocate("p", T)
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    for start, n in _chunks(T, chunk_size):
        batch = AttentionBatch([n], [start], [table], block_size, torch.tensor(blocks.slot_mapping("p", start, start + n)))
        model(torch.tensor(token_ids[start:start + n]), torch.arange(start, start + n), batch, cache, backend="reference")
    return cache.gather(table, T)


def packed(model, prompts, chunk_size, block_size=16, global_positions=False, first_table_only=False,
           local_slots=False):
    blocks = BlockManager(sum(-(-len(p) // block_size) for p in prompts), block_size)
    tables = [blocks.allocate(r, len(p)) for r, p in enumerate(prompts)]
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        rows = [r for r, p in enumerate(prompts) if done[r] < len(p)]
        ends = {r: min(done[r] + chunk_size, len(prompts[r])) for r in rows}
        first = lambda r: 0 if local_slots else done[r]      # a chunk written to the slots of positions 0..n-1
        batch = AttentionBatch([ends[r] - done[r] for r in rows], [done[r] for r in rows],
                               [tables[rows[0] if first_table_only else r] for r in rows], block_size,
                               torch.tensor(sum((blocks.slot_mapping(r, first(r), first(r) + ends[r] - done[r])
                                                 for r in rows), [])))
        tokens = torch.tensor(sum((prompts[r][done[r]:ends[r]] for r in rows), []))
        positions = torch.arange(len(tokens)) if global_positions else \
            torch.cat([torch.arange(done[r], ends[r]) for r in rows])
        model(tokens, positions, batch, cache, backend="reference")
        done = [ends.get(r, d) for r, d in enumerate(done)]
    return [cache.gather(tables[r], len(p)) for r, p in enumerate(prompts)]


def work(num_tokens, chunk_size):
    return num_tokens * (num_tokens + 1) // 2, sum(s for s, _ in _chunks(num_tokens, chunk_size))


def _engine_reads(num_tokens, chunk_size):
    from minillm.grading._common import record_forward
    model = minillm.build_model(ModelConfig(name="w", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                                            num_heads=1, num_kv_heads=1), seed=0)
    with record_forward(model) as record:
        minillm.prefill_kv(model, [1] * num_tokens, chunk_size=chunk_size)
    return sum(c for call in record.calls for c in call.cached_lens)


# ---- chapter 5 ----------------------------------------------------------------------------
def layer_flops(cfg, n, c, window=None, heads=None, mac=2):
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = mac * (n * d * (q + 2 * kv) + n * q * d + 2 * n * d * inter + n * inter * d)
    pairs = sum(p + 1 if window is None else min(p + 1, window) for p in range(c, c + n))
    return gemm + 2 * mac * pairs * cfg.head_dim * (heads(cfg) if heads else cfg.num_heads)


def _layer_weights(cfg):
    return cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size \
        + 3 * cfg.hidden_size * cfg.intermediate_size


def decodes_to_ridge(cfg, context_len, ridge_point, dtype_bytes=2, kv_read=True, lm_head=True, largest=None,
                     embedding=False):
    from fractions import Fraction
    weights = (cfg.num_layers * _layer_weights(cfg) + (lm_head + embedding) * cfg.hidden_size * cfg.vocab_size) \
        * dtype_bytes
    flops = cfg.num_layers * layer_flops(cfg, 1, context_len) + lm_head * 2 * cfg.hidden_size * cfg.vocab_size
    per_decode = (context_len * kv_read + 1) * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    ridge = Fraction(ridge_point)
    if flops <= ridge * per_decode:
        return None
    batch = max(1, math.ceil(ridge * weights / (flops - ridge * per_decode)))
    return None if largest is not None and batch > largest else batch


def _lifted_step_cost_search(cfg, context_len, ridge_point, dtype_bytes=2):
    """step_cost's printed code, lifted (exec'd from its source, not the engine's object), searched over
    batches up to a million by bisection: what a learner who copies the chapter's accounting gets."""
    lifted = _lifted_accounting().step_cost
    full = cfg if isinstance(cfg, ModelConfig) else ModelConfig(
        name=cfg.name, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)

    def intensity(batch):             # affine in the batch: two small steps give it exactly
        one, two = (lifted(full, [(1, context_len)] * b, dtype_bytes) for b in (1, 2))
        by = lambda s: s.bytes_weights + s.bytes_kv_read + s.bytes_kv_write
        per = by(two) - by(one)
        return one.flops * batch / (by(one) - per + per * batch)
    low, high = 1, 10**6
    if intensity(high) < ridge_point:
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if intensity(middle) < ridge_point else (low, middle)
    return low


@functools.lru_cache(maxsize=None)
def _lifted_accounting():
    """A second copy of minillm/sim/accounting.py (loaded from its file, not the engine's module), with
    its one helper from the core copied in too: the code a learner lifts."""
    import importlib.util
    import sys
    from minillm import chunk_sizing
    from minillm.sim import accounting
    spec = importlib.util.spec_from_file_location("minillm.sim.lifted_accounting", accounting.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    exec(textwrap.dedent(inspect.getsource(chunk_sizing.causal_pairs)), vars(module))
    return module


_lifted_accounting()          # before any check switches the engine's accounting off


def chunk_for_tiles(num_decodes, chunk_size, tile_rows):
    best = max(range(1, chunk_size + 1),
               key=lambda c: (c / -(-(c + num_decodes) // tile_rows), c))
    return best


def _tile_aligned(num_decodes, chunk_size, tile_rows):
    """Chapter 5's takeaway 3, transcribed: the budget (chunk + decodes) a whole number of tiles."""
    return (num_decodes + chunk_size) // tile_rows * tile_rows - num_decodes


# ---- the table: checker, correct answer, shortcuts (name, function, what the message says) --
CASES = {
    # chapter 1
    "check_causal_mask": (mask, [
        ("engine", lambda q, k: causal_mask(q, k), "engine's own answer"),
        ("top_left", lambda q, k: torch.ones(q, k).tril().bool(), "TOP-LEFT"),
        ("strict", lambda q, k: torch.arange(k)[None] < torch.arange(q)[:, None] + (k - q), "diagonal"),
        ("inverted", lambda q, k: ~mask(q, k), "inverted"),
        ("hard_coded", lambda q, k: torch.ones(1, 1, dtype=torch.bool), "shape"),
    ]),
    "check_window_mask": (window_mask, [
        ("engine", lambda q, k, w: causal_mask(q, k) & window_mask(q, k, w), "engine's own answer"),
        ("no_window", lambda q, k, w: mask(q, k), "plain causal mask"),
        ("one_too_many", lambda q, k, w: window_mask(q, k, w + 1), "one key too many"),
        ("one_too_few", lambda q, k, w: window_mask(q, k, max(w - 1, 1)), "one key too few"),
        # the statement read literally, without chapter 1's alignment: query i at position i
        ("statement_top_left", lambda q, k, w: window_mask(q, k, w, offset=0), "TOP-LEFT"),
        ("inverted", lambda q, k, w: ~window_mask(q, k, w), "inverted"),
        ("own_key_out", lambda q, k, w: window_mask(q, k, w) & (torch.arange(k)[None] < torch.arange(q)[:, None] + k - q),
         "its own key"),
    ]),
    "check_attention": (attention, [
        ("engine", lambda q, k, v: reference_attention(q, k, v), "engine's own answer"),
        ("sdpa_is_causal", lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(0, 1),
            v.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(0, 1), is_causal=True).transpose(0, 1), "TOP-LEFT"),
        ("no_scale", lambda q, k, v: attention(q, k, v, scale=1.0), "sqrt(head_dim)"),
        ("one_over_d", lambda q, k, v: attention(q, k, v, scale=1 / q.shape[-1]), "divide the scores by D"),
        ("softmax_over_queries", lambda q, k, v: attention(q, k, v, dim=1), "over the QUERIES"),
        ("no_gqa_expansion", lambda q, k, v: attention(q, k, v, expand=False), "expand K and V"),
        ("tiled_heads", lambda q, k, v: attention(q, k.repeat(1, q.shape[1] // k.shape[1], 1),
                                                          v.repeat(1, q.shape[1] // k.shape[1], 1)), "repeat_interleave"),
    ]),
    "check_merge_attention": (merge, [
        ("engine", lambda *a: merge_attention(*a), "engine's own answer"),
        ("chapter_merge", _chapter_merge, "NaN"),
        ("average", lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)), "average"),
        ("max_lse", lambda oa, la, ob, lb: (merge(oa, la, ob, lb)[0], torch.maximum(la, lb)), "max(lse_a, lse_b)"),
        ("naive_lse", lambda oa, la, ob, lb: (merge(oa, la, ob, lb)[0], torch.log(la.exp() + lb.exp())), "overflows"),
    ]),
    "check_merge_parts": (merge_parts, [
        ("engine_fold", lambda parts: functools.reduce(lambda a, b: merge_attention(*a, *b), parts),
         "engine's own answer"),
        ("chapter_fold", lambda parts: functools.reduce(lambda a, b: _chapter_merge(*a, *b), parts), "NaN"),
        ("first_two", lambda parts: merge_parts(parts[:2]), "first two"),
        ("average", lambda parts: (sum(o.nan_to_num() for o, _ in parts) / len(parts),
                                   torch.logsumexp(torch.stack([l for _, l in parts]), 0)), "out wrong"),
    ]),
    "check_masked_fraction": (masked_fraction, [
        ("one_square", lambda t, c: (t - 1) / (2 * t), "ONE full prefill"),
        ("builds_masks", lambda t, c: _fraction_from_masks(t, c), "engine's own answer"),
        ("mean_of_chunks", lambda t, c: statistics.mean(masked_fraction(n + s, n) if s == 0 else
                                                        (n * (n - 1) / 2) / (n * (s + n)) for s, n in _chunks(t, c)),
         "AVERAGE"),
        ("half_square", lambda t, c: masked_fraction(t, c, masked=lambda n: n * n / 2), "n^2/2"),
        ("drops_remainder", lambda t, c: masked_fraction(t, c, drop_last=True), "leave out the last chunk"),
        ("remainder_as_full", lambda t, c: masked_fraction(t, c, as_full=True), "treat every chunk as"),
        ("chapter_number", lambda t, c: 0.06, "off"),
    ]),
    # chapter 2
    "check_rope": (rope, [
        ("engine", lambda x, p, theta: apply_rope(x, *rope_cos_sin(_rope_cfg(x, theta), p, torch.float64)),
         "engine's own answer"),
        ("interleaved", _interleaved_rope, "rotate half"),
        ("unrotated", lambda x, p, theta: x, "unrotated"),
        ("minus_angle", lambda x, p, theta: rope(x, -p, theta), "-angle"),
        ("float32_everything", _all_float32_rope, "float32"),
        ("positions_ignored", lambda x, p, theta: rope(x, torch.arange(len(p)), theta), "ignore `positions`"),
    ]),
    "check_grouped_scores": (grouped_scores, [
        ("engine", lambda q, k: torch.einsum("nhd,mhd->hnm", q, minillm.attention._expand_kv_heads(k, q.shape[1]))
         / math.sqrt(q.shape[-1]), "engine's own answer"),
        ("the_broken_code", broken_grouped_scores, "tiled 0,1,0,1"),
        ("only_scale_fixed", lambda q, k: broken_grouped_scores(q, k, scale=1 / math.sqrt(q.shape[-1])), "h % "),
        ("only_pairing_fixed", lambda q, k: grouped_scores(q, k) * math.sqrt(q.shape[-1]) / q.shape[-1], "divide by D"),
        ("no_scale", lambda q, k: grouped_scores(q, k) * math.sqrt(q.shape[-1]), "not divided by sqrt(D)"),
        ("copies_k", lambda q, k: torch.einsum("nhd,mhd->hnm", q, k.repeat_interleave(q.shape[1] // k.shape[1], 1))
         / math.sqrt(q.shape[-1]), "copies K"),
        ("query_major", lambda q, k: grouped_scores(q, k).transpose(0, 1), "[n, Hq, m]"),
    ]),
    "check_move_rope": (move_rope, [
        ("engine", lambda k, o, n, theta: apply_rope(k, *rope_cos_sin(_rope_cfg(k, theta), n - o, torch.float64)),
         "engine's own answer"),
        # the chapter's RoPE applied at the new positions: rotated twice
        ("chapter_rope_at_new", lambda k, o, n, theta: rope(k, n, theta), "NEW positions' full angle"),
        ("wrong_direction", lambda k, o, n, theta: rope(k, o - n, theta), "opposite direction"),
        ("unchanged", lambda k, o, n, theta: k.clone(), "unchanged"),
    ]),
    "check_parameter_counts": (parameter_counts, [
        ("engine", lambda cfg: {"total": cfg.num_parameters()}, "engine's own answer"),
        ("builds_the_model", lambda cfg: {"embed_tokens": sum(p.numel() for p in minillm.build_model(cfg).parameters())},
         "engine's own answer"),
        ("qk_norm_per_head", _counts_with(q_norm=lambda cfg, n: n * cfg.num_heads, k_norm=lambda cfg, n: n * cfg.num_kv_heads),
         "ONE weight per head dimension"),
        ("kv_as_query_heads", _counts_with(k_proj=lambda cfg, n: parameter_counts(cfg)["q_proj"]), "grouped-query"),
        ("tied_head_counted", _counts_with(lm_head=lambda cfg, n: cfg.vocab_size * cfg.hidden_size),
         "IS the embedding matrix"),
        ("untied_head_missing", _counts_with(lm_head=lambda cfg, n: 0), "its own"),
        ("derived_head_dim", lambda cfg: {**parameter_counts(cfg), "q_proj": parameter_counts(
            cfg.replace(head_dim=cfg.hidden_size // cfg.num_heads))["q_proj"]}, "head_dim is"),
        ("one_layer", _counts_with(input_layernorm=lambda cfg, n: cfg.hidden_size), "one layer's count"),
        ("o_proj_bias", _counts_with(o_proj=lambda cfg, n: n + cfg.num_layers * cfg.hidden_size * cfg.attention_bias),
         "o_proj has no bias"),
        ("bias_forgotten", _counts_with(v_proj=lambda cfg, n: parameter_counts(cfg.replace(attention_bias=False))["v_proj"]),
         "has a bias"),
        ("total_only", lambda cfg: sum(parameter_counts(cfg).values()), "return a dict"),
        ("unknown_module", lambda cfg: {**parameter_counts(cfg), "attention": 1}, "not a module"),
    ]),
    # chapter 3
    "check_blocks_needed": (blocks_needed, [
        ("engine", lambda n, b: blocks_for(n, b), "engine's own answer"),
        ("float_ceil", lambda n, b: math.ceil(n / b), "integer arithmetic"),
        ("floor", lambda n, b: n // b, "floor"),
    ]),
    "check_requests_that_fit": (requests_that_fit, [
        ("engine_blocks", lambda cfg, n, b, d, lens: requests_that_fit(cfg, n, b, d, lens) + 0 * blocks_that_fit(cfg, n, b, d),
         "engine's own answer"),
        ("kv_bytes_per_token", lambda cfg, n, b, d, lens: cfg.kv_bytes_per_token(d) and 0, "engine's own answer"),
        # the chapter's section 2 cell, adapted: the budget's tokens, pooled
        ("chapter_tokens_pooled", lambda cfg, n, b, d, lens: requests_that_fit(cfg, n, b, d, lens, pooled=True),
         "pool the tokens"),
        ("k_only", lambda cfg, n, b, d, lens: requests_that_fit(cfg, n, b, d, lens, kv_scale=0.5), "K only"),
        ("query_heads", lambda cfg, n, b, d, lens: requests_that_fit(cfg.replace(num_kv_heads=cfg.num_heads), n, b, d, lens),
         "query heads"),
        ("skips_big_requests", lambda cfg, n, b, d, lens: requests_that_fit(cfg, n, b, d, lens, skip=True),
         "first come, first served"),
        ("one_too_many", lambda cfg, n, b, d, lens: requests_that_fit(cfg, n, b, d, lens) + 1, "does NOT fit"),
    ]),
    "check_append_slot": (append_slot, [
        ("chapter_no_copy", _append_no_copy, "Copy it to a fresh block"),
        ("always_copy", _append_always_copy, "no copy is needed"),
        ("keeps_old_count", _append_keeps_count, "ref count must drop"),
        ("new_block_every_token", _append_new_block, "replaces the shared one"),
        ("copy_reversed", _append_copy_reversed, "the shared block, the fresh one"),
        ("back_of_the_free_list", _append_back_of_free, "FRONT of free_blocks"),
    ]),
    "check_forward_tokens": (forward_tokens, [
        ("one_pass_per_output_with_cache", lambda p, n, k=None: (forward_tokens(p, n)[0], p + n), "prefill's pass"),
        ("last_token_fed_back", lambda p, n, k=None: (forward_tokens(p, n + 1)[0], p + n - 1), "never fed back"),
        ("first_pass_not_the_prompt", lambda p, n, k=None: (forward_tokens(p, n)[0] + n, p + n - 1), "prompt alone"),
        # the chapter's printed counts, section 1: no preemption in them
        ("chapter_counts", _forward_with(lambda p, k: 0), "freed the request's blocks"),
        ("recompute_prompt_only", _forward_with(lambda p, k: p), "generated tokens were freed too"),
        ("recompute_pass_not_counted_as_a_decode", _forward_with(lambda p, k: p + k), "produces token"),
        ("hard_coded", lambda p, n, k=None: (10, 5), "you predicted"),
    ]),
    # chapter 4
    "check_step_mask": (step_mask, [
        ("engine", lambda qs, cs: torch.block_diag(*(causal_mask(q, c + q) for q, c in zip(qs, cs))),
         "engine's own answer"),
        ("top_left", lambda qs, cs: torch.block_diag(*(torch.ones(q, c + q).tril().bool() for q, c in zip(qs, cs))),
         "TOP-LEFT"),
        ("one_mask", lambda qs, cs: mask(sum(qs), sum(qs) + sum(cs)), "own request's keys"),
        ("no_cache", lambda qs, cs: step_mask(qs, [0] * len(qs)), "cached AND new"),
        ("int_mask", lambda qs, cs: step_mask(qs, cs).int(), "torch.bool"),
        ("inverted", lambda qs, cs: ~step_mask(qs, cs), "swapped"),
        ("grader_helper", lambda qs, cs: ch04._packed(qs, cs), "engine's own answer"),
    ]),
    "check_locate_bug": (locate_bug, [
        ("exact_equality", lambda *a: locate_bug(*a, tolerance=0.0), "tolerance"),
        ("k_always", lambda *a: (lambda g: g and (g[0], "K", g[2]))(locate_bug(*a)), "which of them"),
        ("last_layer_first", lambda *a: locate_bug(*a, first=False), "earlier layer"),
        ("position_zero", lambda *a: (lambda g: g and (g[0], g[1], 0))(locate_bug(*a)), "first position"),
        ("never_a_bug", lambda *a: None, "not exact"),
        ("chapter_check", _chapter_kv_error_check, "expected"),
    ]),
    "check_packed_chunked_prefill": (packed, [
        # the chapter's my_chunked_prefill, once per prompt: right KV, but one pass per request and chunk
        ("chapter_per_prompt", lambda m, ps, c: [chunked_prefill(m, p, c) for p in ps], "PACK them"),
        ("engine", lambda m, ps, c: [minillm.prefill_kv(m, p)[0] for p in ps], "engine's own answer"),
        ("positions_packed_from_zero", lambda m, ps, c: packed(m, ps, c, global_positions=True), "ITS OWN absolute"),
        ("shared_table", lambda m, ps, c: packed(m, ps, c, first_table_only=True), "its own block table"),
    ]),
    "check_chunked_prefill_work": (work, [
        ("rectangles", lambda t, c: (sum(n * (s + n) for s, n in _chunks(t, c)), work(t, c)[1]),
         "whole [n, s + n] rectangle"),
        ("own_key_left_out", lambda t, c: (work(t, c)[0] - t, work(t, c)[1]), "its own key"),
        # the statement read as "every key a pass reads": each chunk's own keys too
        ("reads_every_chunk_end", lambda t, c: (work(t, c)[0], sum(s + n for s, n in _chunks(t, c))),
         "each chunk's own keys"),
        ("engine", lambda t, c: (t * (t + 1) // 2, _engine_reads(t, c)), "engine's own answer"),
        ("hard_coded", lambda t, c: (2080, 0), "you predicted"),
    ]),
    # chapter 5
    "check_layer_flops": (layer_flops, [
        ("engine", lambda cfg, n, c, w=None: minillm.sim.accounting.step_cost(cfg, [(n, c, False)]).flops
         // cfg.num_layers, "engine's own answer"),
        ("chapter_sketch", lambda cfg, n, c, w=None: _printed("05", "layer_flops_sketch")["layer_flops_sketch"](cfg, n, c),
         "without the window"),
        ("same_keys_per_query", lambda cfg, n, c, w=None: layer_flops(cfg, n, c) if w is None else
         layer_flops(cfg, n, c) - 4 * cfg.head_dim * cfg.num_heads * (sum(p + 1 for p in range(c, c + n))
                                                                       - n * min(w, c + n)), "same number of keys"),
        ("window_off_by_one", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, None if w is None else w + 1),
         "INCLUDING its own"),
        ("window_on_cache_only", lambda cfg, n, c, w=None: layer_flops(cfg, n, c) if w is None else
         layer_flops(cfg, n, 0) + 4 * n * min(c, w) * cfg.head_dim * cfg.num_heads, "cached or new"),
        ("one_flop_per_mac", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, w, mac=1), "2*M*N*K"),
        ("kv_heads_in_attention", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, w, heads=lambda cfg: cfg.num_kv_heads),
         "QUERY head"),
        ("k_and_v_projected_to_q_size", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, w)
         + 4 * n * cfg.hidden_size * (cfg.q_size - cfg.kv_size), "kv_size"),
    ]),
    "check_decodes_to_ridge": (decodes_to_ridge, [
        ("engine_search", lambda cfg, c, r, d=2: next(b for b in range(1, 10**4) if minillm.sim.accounting.step_cost(
            cfg, [(1, c)] * b, d).intensity >= r), "engine's own answer"),
        ("lifted_step_cost", _lifted_step_cost_search, "decodes reach it"),
        ("no_kv_read", lambda cfg, c, r, d=2: decodes_to_ridge(cfg, c, r, d, kv_read=False), "KV cache each decode reads"),
        ("no_lm_head", lambda cfg, c, r, d=2: decodes_to_ridge(cfg, c, r, d, lm_head=False), "LM head"),
        ("embedding_streamed", lambda cfg, c, r, d=2: decodes_to_ridge(cfg, c, r, d, embedding=True), "input embedding"),
        ("query_heads", lambda cfg, c, r, d=2: decodes_to_ridge(ModelConfig(
            name=cfg.name, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_heads, head_dim=cfg.head_dim), c, r, d),
         "query heads"),
        ("always_a_batch", lambda cfg, c, r, d=2: decodes_to_ridge(cfg, c, r, d) or 10**6, "no batch reaches it"),
    ]),
    "check_chunk_for_tiles": (chunk_for_tiles, [
        ("untrimmed", lambda n, c, t: c, "keep the whole chunk"),
        ("every_decode_out", lambda n, c, t: c - n, "only the rows that spill"),
        ("rounded_up", lambda n, c, t: -(-(n + c) // t) * t - n, "over chunk_size"),
        # chapter 5's takeaway 3, transcribed: right on the measured steps, wrong on a nearly full tile
        ("chapter_rule", _tile_aligned, "nearly full"),
    ]),
}

SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


def test_every_chapter_1_to_5_checker_is_tested_here():
    assert set(CASES) == {name for module in MODULES.values() for name in module.__all__}


@pytest.mark.parametrize("checker", sorted(CASES))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CASES[checker][0], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, name, fn, says, capsys):
    with pytest.raises(AssertionError) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


# ---- the chapter's printed code, an engine function lifted, the statement transcribed ---------
CHAPTERS = ROOT / "notebooks" / "src"
EXERCISES = ROOT / "exercises" / "solutions" / "src"


@functools.lru_cache(maxsize=None)
def _printed_cached(chapter: str, names: tuple) -> dict:
    """Functions the chapter prints, as a learner would copy them: the chapter's own `def`s taken from
    notebooks/src/NN_*.py, and the engine functions it shows with show_source, transcribed (exec'd
    from their source, so they are the same code but not the engine's object)."""
    source = next(CHAPTERS.glob(f"{chapter}_*.py")).read_text()
    tree = ast.parse(source)
    namespace = {"torch": torch, "math": math, "F": F, **vars(minillm.attention), **vars(minillm.kv_cache)}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.Module([node], []), f"<chapter {chapter}>", "exec"), namespace)
            found[node.name] = namespace[node.name]
    shown = {ast.unparse(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "show_source" and n.args}
    for name in names:
        if name not in found and any(s.split(".")[-1] == name for s in shown):
            engine = namespace.get(name) or getattr(minillm.model, name, None) or getattr(minillm.sim.accounting, name)
            source = textwrap.dedent(inspect.getsource(engine))
            for helper in sorted({n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)
                                  and n.id.startswith("_") and callable(namespace.get(n.id))}):
                exec(textwrap.dedent(inspect.getsource(namespace[helper])), namespace)   # its private helpers too
            exec(source, namespace)
            found[name] = namespace[name]
            assert found[name] is not engine
    missing = set(names) - set(found)
    assert not missing, f"chapter {chapter} no longer prints {missing}: update this test"
    return found


def _printed(chapter: str, *names: str) -> dict:
    return _printed_cached(chapter, names)


# Transcribed now, before any check runs: inside a check the engine's functions are switched
# off, and a transcription taken then would copy the switch, not the function.
for _chapter, _name in (("01", "causal_mask"), ("01", "merge_attention"), ("01", "reference_attention"),
                        ("02", "apply_rope"), ("03", "kv_bytes_per_token"), ("04", "my_chunked_prefill"),
                        ("05", "layer_flops_sketch")):
    _printed(_chapter, _name)


def _points(chapter: str) -> dict:
    text = next(EXERCISES.glob(f"{chapter}_*.py")).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*\)\s*#\s*points:\s*(\d+)", text)}


def _fails(checker, fn) -> bool:
    try:
        checker(fn)
    except AssertionError:
        return True
    return False


def _apply_rope_at_new(k, old, new, theta):
    """Chapter 2's printed apply_rope with the keys' new positions' angles: the keys end up rotated twice."""
    half = k.shape[-1] // 2
    angles = new.to(torch.float64)[:, None] * theta ** (-torch.arange(half, dtype=torch.float64) * 2 / k.shape[-1])
    angles = torch.cat([angles, angles], dim=-1)
    return _printed("02", "apply_rope")["apply_rope"](k, angles.cos(), angles.sin())


def _chapter_scores(q, k):
    """Chapter 1's printed reference_attention's scores: K expanded to the query heads (copied)."""
    expand = _printed("01", "reference_attention")["reference_attention"].__globals__["_expand_kv_heads"]
    assert expand is not minillm.attention._expand_kv_heads                      # the transcription, not the engine's
    return torch.einsum("nhd,mhd->hnm", q, expand(k, q.shape[1])) / math.sqrt(q.shape[-1])


def _lifted_num_parameters(cfg):
    """ModelConfig.num_parameters, lifted from config.py (exec'd from its source)."""
    namespace = {}
    exec(textwrap.dedent(inspect.getsource(ModelConfig.num_parameters)), namespace)
    return namespace["num_parameters"](cfg)


def _chapter_budget_tokens(cfg, num_bytes, block_size, dtype_bytes, prompt_lens):
    """Chapter 3, section 2's cell: the tokens a budget holds (budget // bytes per token), pooled."""
    per_token = _printed("03", "kv_bytes_per_token")["kv_bytes_per_token"](cfg, dtype_bytes)
    tokens, admitted = num_bytes // per_token, 0
    for n in prompt_lens:
        if n > tokens:
            break
        tokens, admitted = tokens - n, admitted + 1
    return admitted


def _count_with_chapter_masks(num_tokens, chunk_size):
    chapter_mask = _printed("01", "causal_mask")["causal_mask"]
    masks = [chapter_mask(n, s + n) for s, n in _chunks(num_tokens, chunk_size)]
    return sum(int((~m).sum()) for m in masks) / sum(m.numel() for m in masks)


# Per chapter: attempts that paste the chapter's printed code, lift an engine function or
# transcribe the statement, on the tasks that are NOT counted as copyable; each must fail.
NOT_COPYABLE = {
    "01": [("check_window_mask", lambda q, k, w: _printed("01", "causal_mask")["causal_mask"](q, k)),
           ("check_window_mask", lambda q, k, w: window_mask(q, k, w, offset=0)),          # the statement, literally
           ("check_merge_attention", lambda *a: _printed("01", "merge_attention")["merge_attention"](*a)),
           ("check_merge_parts", lambda parts: functools.reduce(
               lambda a, b: _printed("01", "merge_attention")["merge_attention"](*a, *b), parts)),
           ("check_masked_fraction", _count_with_chapter_masks)],
    "02": [("check_grouped_scores", _chapter_scores),
           ("check_move_rope", _apply_rope_at_new),
           ("check_parameter_counts", _lifted_num_parameters)],
    "03": [("check_requests_that_fit", _chapter_budget_tokens),
           ("check_append_slot", _append_no_copy),
           ("check_forward_tokens", _forward_with(lambda p, k: 0))],                       # the chapter's P + N - 1
    "04": [("check_step_mask", lambda qs, cs: _printed("01", "causal_mask")["causal_mask"](sum(qs), sum(qs) + sum(cs))),
           ("check_locate_bug", _chapter_kv_error_check),
           ("check_packed_chunked_prefill", lambda m, ps, c: [
               _printed("04", "my_chunked_prefill")["my_chunked_prefill"](m, p, c) for p in ps]),
           ("check_chunked_prefill_work", lambda t, c: (sum(n * (s + n) for s, n in _chunks(t, c)),
                                                        sum(s + n for s, n in _chunks(t, c))))],
    "05": [("check_layer_flops", lambda cfg, n, c, w=None: _printed("05", "layer_flops_sketch")["layer_flops_sketch"](
               cfg, n, c)),
           ("check_decodes_to_ridge", _lifted_step_cost_search),
           ("check_chunk_for_tiles", _tile_aligned)],
}
# The tasks a learner can pass by pasting or lightly adapting what the chapter prints.
COPYABLE = {"01": {"check_causal_mask", "check_attention"}, "02": {"check_rope"}, "03": {"check_blocks_needed"},
            "04": set(), "05": set()}
PREDICT = {"01": "check_masked_fraction", "02": "check_parameter_counts", "03": "check_forward_tokens",
           "04": "check_chunked_prefill_work", "05": "check_decodes_to_ridge"}
DEBUG_OR_DESIGN = {"01": {"check_merge_attention", "check_merge_parts"}, "02": {"check_grouped_scores", "check_move_rope"},
                   "03": {"check_requests_that_fit", "check_append_slot"}, "04": {"check_locate_bug"},
                   "05": {"check_chunk_for_tiles"}}
ATTEMPTS = [(chapter, checker, fn) for chapter, attempts in NOT_COPYABLE.items() for checker, fn in attempts]


@pytest.mark.parametrize("chapter, checker, fn", ATTEMPTS, ids=[f"{c}-{k}-{i}" for i, (c, k, _) in enumerate(ATTEMPTS)])
def test_the_chapters_printed_code_does_not_pass_the_other_tasks(chapter, checker, fn):
    assert _fails(getattr(ex, checker), fn)


@pytest.mark.parametrize("chapter", sorted(MODULES))
def test_copying_the_chapter_earns_at_most_a_fifth_of_the_points(chapter):
    points = _points(chapter)
    assert set(points) == set(MODULES[chapter].__all__), "every checker is a graded task of its notebook"
    assert not COPYABLE[chapter] & {c for c, _ in NOT_COPYABLE[chapter]}
    assert set(points) - COPYABLE[chapter] <= {c for c, _ in NOT_COPYABLE[chapter]}, \
        "every task not counted as copyable has an attempt with the printed code that fails"
    assert sum(points[c] for c in COPYABLE[chapter]) * 5 <= sum(points.values())


def test_the_copyable_tasks_really_pass_with_the_printed_code():
    """The accounting above is honest: what it counts as copyable does pass with the chapter's code."""
    assert not _fails(ex.check_causal_mask, lambda q, k: _printed("01", "causal_mask")["causal_mask"](q, k))
    chapter_attention = _printed("01", "reference_attention")["reference_attention"]
    assert not _fails(ex.check_attention, lambda q, k, v: chapter_attention(q, k, v))
    assert not _fails(ex.check_rope, lambda x, p, theta: _apply_rope_at_new(x, torch.zeros_like(p), p, theta))


@pytest.mark.parametrize("chapter", sorted(MODULES))
def test_each_chapter_has_a_predict_task_and_a_debug_or_design_task(chapter):
    points = _points(chapter)
    assert PREDICT[chapter] in points and PREDICT[chapter] not in COPYABLE[chapter]
    assert DEBUG_OR_DESIGN[chapter] <= set(points) and not DEBUG_OR_DESIGN[chapter] & COPYABLE[chapter]
    # the predict task says so in its heading, and asks for a number and a reason before the code
    source = next(EXERCISES.glob(f"{chapter}_*.py")).read_text()
    before = source[:source.index(f"ex.{PREDICT[chapter]}(")]
    heading = re.findall(r"^# ## (.*)$", before, re.M)[-1]
    statement = before[before.rindex(heading):]
    assert "Predict, then measure" in heading and re.search(r"why|reason", statement), heading


# ---- the teacher's hidden cases --------------------------------------------------------------
HIDDEN_RUNS = [(chapter, name, kwargs) for chapter, module in HIDDEN.items()
               for name, runs in module.HIDDEN.items() for kwargs in runs]


@pytest.mark.parametrize("chapter, checker, kwargs", HIDDEN_RUNS, ids=[f"{c}-{n}-{k}" for c, n, k in HIDDEN_RUNS])
def test_the_hidden_cases_pass_a_correct_answer(chapter, checker, kwargs, capsys):
    assert checker in MODULES[chapter].__all__
    getattr(ex, checker)(CASES[checker][0], **kwargs)
    hidden = getattr(HIDDEN[chapter], f"hidden_{checker}", None)
    if hidden is not None:
        hidden(CASES[checker][0])


def test_every_hidden_check_belongs_to_a_public_checker():
    for chapter, module in HIDDEN.items():
        extra = [name for name in vars(module) if name.startswith("hidden_check_")]
        assert {name.removeprefix("hidden_") for name in extra} <= set(module.HIDDEN) <= set(MODULES[chapter].__all__)


@pytest.mark.parametrize("hidden, fn", [
    (hid01.hidden_check_masked_fraction, lambda t, c: 0.25),      # passes the public bound, not the value
    (hid01.hidden_check_window_mask, lambda q, k, w: window_mask(q, k, w) if k < 200 else mask(q, k)),
    (hid02.hidden_check_parameter_counts, _counts_with(q_norm=lambda cfg, n: n * cfg.num_heads)),
    (hid03.hidden_check_forward_tokens, lambda p, n, k=None: (1, 1) if p > 50_000 else forward_tokens(p, n, k)),
    (hid04.hidden_check_chunked_prefill_work, lambda t, c: (1, 1) if t > 10**5 else work(t, c)),
    (hid05.hidden_check_chunk_for_tiles, _tile_aligned),
], ids=["01-fraction", "01-window", "02-counts", "03-forward", "04-work", "05-tiles"])
def test_the_hidden_checks_catch_what_the_public_ones_cannot(hidden, fn):
    with pytest.raises(AssertionError):
        hidden(fn)


def test_the_hidden_locator_cases_are_bugs_the_public_check_never_shows():
    hid04.hidden_check_locate_bug(locate_bug)
    with pytest.raises(AssertionError):        # a locator that only knows the public bugs' answers
        hid04.hidden_check_locate_bug(lambda pf, m, t, c: (0, "K", c))


# ---- the layout: public checkers hold no answer ------------------------------------------------
@pytest.mark.parametrize("chapter", sorted(MODULES))
def test_the_public_checkers_import_no_answers(chapter):
    tree = ast.parse(Path(MODULES[chapter].__file__).read_text())
    imported = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not [line for line in imported if "_reference" in line or "_hidden" in line], imported


def test_chapter_4s_old_multiple_choice_answer_is_gone_from_the_public_checker():
    source = Path(ch04.__file__).read_text()
    assert '"neither"' not in source and "_LAYER0" not in source


# ---- the messages issue 39 found misleading or silent, one test each --------------------------
def _message(checker, fn, **kwargs) -> str:
    with pytest.raises(AssertionError) as failure:
        checker(fn, **kwargs)
    return str(failure.value).splitlines()[0]


def test_chapter_1s_three_wrong_predictions_get_three_messages():
    messages = [_message(ex.check_masked_fraction, fn) for fn in (
        lambda t, c: statistics.mean((n * (n - 1) / 2) / (n * (s + n)) for s, n in _chunks(t, c)),   # average
        lambda t, c: masked_fraction(t, c, masked=lambda n: n * n / 2),                              # n^2 / 2
        lambda t, c: masked_fraction(t, c, drop_last=True))]                                         # no remainder
    reasons = [m.split(": ", 2)[-1] for m in messages]
    assert len(set(reasons)) == 3, reasons
    assert "AVERAGE" in reasons[0] and "n^2/2" in reasons[1] and "last chunk" in reasons[2]


def test_chapter_1s_inverted_mask_is_called_inverted_not_a_missing_diagonal():
    message = _message(ex.check_causal_mask, lambda q, k: ~mask(q, k))
    assert "inverted" in message and "diagonal" not in message
    strict = _message(ex.check_causal_mask, lambda q, k: torch.arange(k)[None] < torch.arange(q)[:, None] + (k - q))
    assert "diagonal" in strict and "inverted" not in strict       # the 1 x 1 case where they coincide


def test_chapter_2s_qk_norm_per_head_is_not_blamed_on_head_dim():
    message = _message(ex.check_parameter_counts, _counts_with(q_norm=lambda cfg, n: n * cfg.num_heads,
                                                               k_norm=lambda cfg, n: n * cfg.num_kv_heads))
    assert "per head dimension" in message and "head_dim is" not in message


def test_chapter_4s_positions_message_shows_where_the_rows_differ():
    message = _message(ex.check_packed_chunked_prefill, lambda m, ps, c: packed(m, ps, c, global_positions=True))
    got, want = re.search(r"hold (\[.*?\]), expected (\[.*?\])", message).groups()
    assert got != want, message


def test_chapter_4s_prediction_of_a_zero_count_is_not_a_division_by_zero():
    message = _message(ex.check_chunked_prefill_work, lambda t, c: (work(t, c)[0], 1 if c >= t else work(t, c)[1]))
    assert "the engine counts 0" in message and "1 too many" in message and "%" not in message


@pytest.mark.parametrize("mistake, says", [("kv_heads_in_attention", "QUERY head"),
                                            ("k_and_v_projected_to_q_size", "kv_size")])
def test_chapter_5s_grouped_query_mistakes_are_named_on_a_window_case_too(mistake, says):
    fn = dict((name, fn) for name, fn, _ in CASES["check_layer_flops"][1])[mistake]
    message = _message(ex.check_layer_flops, fn)
    assert ", 4096)" in message and says in message          # the first case: Mistral-7B's window of 4096


def test_the_grade_counts_say_how_far_off_without_a_percentage():
    from minillm.grading._common import grade_count
    grade_count("x", 5, 5)
    with pytest.raises(AssertionError, match=r"you predicted 3, the engine counts 0 \(3 too many\): why"):
        grade_count("x", 3, 0, "why")
    with pytest.raises(AssertionError, match="expected a whole number"):
        grade_count("x", "3", 0)


def test_watch_copies_sees_a_repeated_k_and_not_a_folded_q():
    from minillm.grading._common import watch_copies
    q, k = torch.randn(3, 4, 8), torch.randn(5, 2, 8)
    with watch_copies(k) as found:
        grouped_scores(q, k)
        torch.einsum("nkgd,mkd->kgnm", q.reshape(3, 2, 2, 8), k)
    assert found == []
    with watch_copies(k) as found:
        k.unsqueeze(2).expand(5, 2, 2, 8).reshape(5, 4, 8)
        k[:, [0, 0, 1, 1]]
    assert [name for name, _, _ in found] == ["expand", "__getitem__"]


# ---- the references and the measurements the checkers rest on --------------------------------
def test_the_references_agree_with_the_engine_measurements():
    rng = random.Random(0)
    for cfg, n, c, window in ch05._flops_cases(rng):
        assert ref05.window_layer_flops(cfg, n, c, window) == ch05.expected_layer_flops(cfg, n, c, window)
    for cfg, context_len, ridge, dtype_bytes in ch05._ridge_cases(rng):
        assert ref05.decodes_to_ridge(cfg, context_len, ridge, dtype_bytes) == \
            ch05.smallest_batch(ch05.decode_batch_terms(cfg, context_len, dtype_bytes), ridge)
    for _ in range(200):
        n, c, t = rng.randint(0, 300), rng.randint(16, 600), rng.choice([16, 32, 64, 128])
        assert ref05.chunk_for_tiles(n, c, t) == chunk_for_tiles(n, c, t)
    from minillm.sim.accounting import step_cost
    for cfg in ch05._random_configs(rng, 6):
        n, c = rng.randint(1, 600), rng.randint(0, 3000)
        assert ref05.layer_flops(cfg, n, c) == step_cost(cfg, [(n, c, False)]).flops // cfg.num_layers
    for cfg in ch02._random_shapes(rng) + [PRESETS["qwen3-0.6b"]]:
        assert {m: v for m, v in ref02.parameter_counts(cfg).items() if v} == \
            {m: v for m, v in ch02.measured_parameter_counts(cfg).items() if v}


def test_the_window_pairs_match_a_brute_force_count():
    rng = random.Random(0)
    for _ in range(200):
        n, c = rng.randint(1, 40), rng.randint(0, 60)
        window = rng.choice([None, rng.randint(1, 100)])
        brute = sum(1 for q in range(c, c + n) for k in range(q + 1) if window is None or q - k < window)
        assert ref05.window_pairs(n, c, window) == brute == ch05.window_pairs_counted(n, c, window)


def test_each_bug_the_locator_is_tried_on_shows_where_its_construction_says():
    rng = random.Random(1)
    model = ch04._check_model(rng)
    tokens = [rng.randrange(model.cfg.vocab_size) for _ in range(50)]
    for chunk_size in (8, 20):
        for name, (prefill, where_it_shows) in ch04.bug_cases(chunk_size).items():
            assert ref04.locate_bug(prefill, model, tokens, chunk_size) == where_it_shows(chunk_size, len(tokens)), name


def test_the_a100_profiles_show_the_128_row_tile_the_statement_quotes():
    tables = ch05._a100_linear_ms()
    assert len(tables) == 4
    llama3 = tables["Meta-Llama-3-8B"]
    assert round(llama3[128], 3) == 0.377 and round(llama3[136], 3) == 0.529     # quoted in the statement
    for ms in tables.values():                                                    # every A100 file jumps there
        for boundary in (128, 256, 384, 512):
            assert ms[boundary + 8] > 1.1 * ms[boundary]


def test_the_preemption_the_checker_forces_is_the_engines_recompute(monkeypatch):
    """measured_forward_tokens preempts through the scheduler: the request is recomputed, prompt and outputs."""
    model = minillm.build_model(ModelConfig(name="c", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                                            num_heads=2, num_kv_heads=1, max_position=256), seed=0)
    preempted = []
    original = minillm.scheduler.Scheduler._preempt
    monkeypatch.setattr(minillm.scheduler.Scheduler, "_preempt",
                        lambda self, request, step: preempted.append(request.num_tokens) or original(self, request, step))
    assert ch03.measured_forward_tokens(model, 6, 5, random.Random(0), preempted_after=2) == forward_tokens(6, 5, 2)
    assert preempted == [6 + 2]                   # once, holding its prompt and 2 outputs


# ---- the learner trial of exercises 1-5 (notes/trial_1_5.md): each finding, one test ----------
# The wrong answers below are the trial's own (its scratch scripts), each of which passed, or got a
# message that blamed another mistake, before the fix.
def _hidden_fails(chapter, checker, fn) -> str:
    """The first hidden case (other seeds, then hidden_check_*) that fails, as the grader reports it."""
    for kwargs in HIDDEN[chapter].HIDDEN.get(checker, []):
        if _fails(lambda f: getattr(ex, checker)(f, **kwargs), fn):
            return f"seed {kwargs}"
    extra = getattr(HIDDEN[chapter], f"hidden_{checker}", None)
    return "hidden check" if extra is not None and _fails(extra, fn) else ""


def test_trial_1_a_float_quotient_fails_on_the_counts_the_statement_promises():
    float_floor = lambda n, b: int(n / b) + (n % b > 0)            # passed the check and the hidden cases
    message = _message(ex.check_blocks_needed, float_floor)
    assert "10000000000000001" in message and "integer arithmetic" in message and "53 bits" in message, message
    assert _hidden_fails("03", "check_blocks_needed", float_floor)
    # the counts the check now asks about, each off through a float
    for num_tokens, block_size in ((10**18 + 100, 16), (10**18, 7), (10**18 + 15, 3)):
        assert float_floor(num_tokens, block_size) != blocks_needed(num_tokens, block_size)


def _one_head_per_query_head(q, k, v):
    """Chapter 1's attention_one_head (a square mask from the number of queries), once per query head,
    with the right KV head h // group: it crashes on a chunk over a cache, not on the heads."""
    group = q.shape[1] // k.shape[1]

    def one_head(q, k, v):
        scores = q @ k.T / math.sqrt(q.shape[-1])
        future = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
    return torch.stack([one_head(q[:, h], k[:, h // group], v[:, h // group]) for h in range(q.shape[1])], dim=1)


def test_trial_2_a_square_mask_crash_is_not_blamed_on_grouped_heads():
    message = _message(ex.check_attention, _one_head_per_query_head)
    assert "n=4 queries over m=9 keys" in message and "runs when the keys are as many" in message, message
    assert "heads but k and v" not in message
    # a real grouped-query crash still gets the grouped-query diagnosis
    no_expansion = lambda q, k, v: attention(q, k, v, expand=False)
    assert "heads but k and v" in _message(ex.check_attention, no_expansion)


def _lse_sum(parts):
    """Right outputs, but lse the sum of the parts' lse (the trial's merge_parts)."""
    lses = torch.stack([l for _, l in parts])
    return merge_parts(parts)[0], lses.sum(0)


def test_trial_3_an_lse_summed_over_the_parts_is_not_called_an_overflow():
    message = _message(ex.check_merge_parts, _lse_sum)
    assert "SUM of the parts' lse" in message and "overflow" not in message, message
    two = _message(ex.check_merge_attention, lambda oa, la, ob, lb: (merge(oa, la, ob, lb)[0], la + lb))
    assert "SUM of the parts' lse" in two and "overflow" not in two, two
    # a real overflow (exp of scores near 800) is still named as one
    naive = lambda parts: (merge_parts(parts)[0], torch.log(torch.stack([l for _, l in parts]).exp().sum(0)))
    assert "overflows" in _message(ex.check_merge_parts, naive)


def test_trial_4_a_strict_step_mask_is_a_missing_diagonal_not_a_swapped_one():
    strict = lambda qs, cs: torch.block_diag(*(torch.arange(c + q)[None] < torch.arange(q)[:, None] + c
                                               for q, c in zip(qs, cs)))
    message = _message(ex.check_step_mask, strict)
    assert "diagonal" in message and "swapped" not in message, message
    assert "swapped" in _message(ex.check_step_mask, lambda qs, cs: ~step_mask(qs, cs))   # the 1 x 1 case too


@pytest.mark.parametrize("locator, says", [
    (lambda *a: locate_bug(*a, tolerance=1e-2), "tolerance lets a real bug through"),            # loose tolerance
    (lambda pf, m, t, c: _nan_blind_locator(pf, m, t, c), "NaN compared with anything"),          # NaN-blind
    (lambda pf, m, t, c: _first_position_anywhere(pf, m, t, c), "first that differs in ANY layer"),
], ids=["loose_tolerance", "nan_blind", "position_over_all_layers"])
def test_trial_5_a_sloppy_locator_fails_the_public_check_with_its_mistake_named(locator, says):
    message = _message(ex.check_locate_bug, locator)
    assert says in message, message


def _nan_blind_locator(prefill_fn, model, token_ids, chunk_size):
    """The trial's locator: `difference > tolerance`, which is False for NaN."""
    error = (prefill_fn(model, token_ids, chunk_size) - minillm.prefill_kv(model, token_ids)[0]).abs()
    for layer in range(error.shape[0]):
        wrong = error[layer].amax(dim=(2, 3)) > 1e-9
        if wrong.any():
            which = "both" if wrong.any(1).all() else "KV"[int(wrong.any(1).nonzero()[0])]
            return layer, which, int(wrong.any(0).nonzero()[0])
    return None


def _first_position_anywhere(prefill_fn, model, token_ids, chunk_size):
    """Right layer and tensors, but the first position over ALL layers (the trial's locator)."""
    found = locate_bug(prefill_fn, model, token_ids, chunk_size)
    if found is None:
        return None
    error = (prefill_fn(model, token_ids, chunk_size) - minillm.prefill_kv(model, token_ids)[0]).abs()
    wrong = ~(error <= 1e-9)
    return found[0], found[1], int(wrong.transpose(0, 2).flatten(1).any(1).nonzero()[0])


def _position_from_k_when_k_differs(prefill_fn, model, token_ids, chunk_size):
    """The trial's locator that takes the layer's first position from K alone whenever K differs."""
    found = locate_bug(prefill_fn, model, token_ids, chunk_size)
    if found is None or found[1] != "both":
        return found
    error = (prefill_fn(model, token_ids, chunk_size) - minillm.prefill_kv(model, token_ids)[0]).abs()
    return found[0], found[1], int((~(error[found[0], 0].amax(dim=(1, 2)) <= 1e-9)).nonzero()[0])


@pytest.mark.parametrize("locator", [lambda *a: locate_bug(*a, tolerance=1e-2), _nan_blind_locator,
                                     _first_position_anywhere, _position_from_k_when_k_differs],
                         ids=["loose_tolerance", "nan_blind", "position_over_all_layers", "position_from_k"])
def test_trial_5_the_hidden_locator_cases_catch_every_sloppy_locator_too(locator):
    with pytest.raises(AssertionError):
        hid04.hidden_check_locate_bug(locator)


def _ridge_with(cfg, context_len, ridge_point, dtype_bytes=2, pairs=1, kv_write=True, heads=None, rounding=math.ceil):
    """decodes_to_ridge in floats, as a learner writes it, with one term changeable: the keys a decode attends
    (context_len + pairs), its K and V written or not, the heads that score, floor or ceil."""
    d, L, b = cfg.hidden_size, cfg.num_layers, dtype_bytes
    weights = (L * _layer_weights(cfg) + d * cfg.vocab_size) * b
    attention = 4 * cfg.head_dim * (heads(cfg) if heads else cfg.num_heads) * (context_len + pairs)
    flops = L * (layer_flops(cfg, 1, context_len) - 4 * cfg.head_dim * cfg.num_heads * (context_len + 1) + attention) \
        + 2 * d * cfg.vocab_size
    per_decode = L * 2 * cfg.kv_size * b * (context_len + kv_write)
    if flops <= ridge_point * per_decode:
        return None
    return max(1, rounding(ridge_point * weights / (flops - ridge_point * per_decode)))


def test_trial_6_the_knife_edge_ridge_case_names_the_term_and_both_limits():
    message = _message(ex.check_decodes_to_ridge, lambda *a: _ridge_with(*a, pairs=0))
    assert "767, 153.1)" in message and "you predicted None" in message, message
    assert "AND its own, 768 keys" in message
    yours, engine = re.search(r"limit is ([\d.,]+) FLOP/byte, not ([\d.,]+)", message).groups()
    assert yours != engine and float(yours) < 153.1 < float(engine.replace(",", ""))
    no_write = _message(ex.check_decodes_to_ridge, lambda *a: _ridge_with(*a, kv_write=False))
    assert "each decode writes" in no_write and "approaches" in no_write, no_write


def test_trial_6_one_decode_short_of_the_ridge_fails_the_public_check():
    message = _message(ex.check_decodes_to_ridge, lambda *a: _ridge_with(*a, rounding=math.floor))
    assert "still under the ridge point" in message, message
    assert _hidden_fails("05", "check_decodes_to_ridge", lambda *a: _ridge_with(*a, rounding=math.floor))
    # the statement promises a number that reaches the ridge point
    assert "never fewer" in next(EXERCISES.glob("05_*.py")).read_text()


def test_trial_7_chunk_local_slots_are_named_as_slots_not_as_cross_request_attention():
    local_slots = lambda m, ps, c: packed(m, ps, c, local_slots=True)       # the trial's packed prefill
    message = _message(ex.check_packed_chunked_prefill, local_slots)
    assert "step 1 writes prompt 0's tokens 8.. to the slots of its positions 0.." in message, message
    assert "own keys" not in message


def test_trial_8_the_move_rope_refusal_points_at_task_1():
    message = _message(ex.check_move_rope, lambda k, o, n, theta: apply_rope(
        k, *rope_cos_sin(_rope_cfg(k, theta), n - o, torch.float64)))
    assert "your own rope from task 1" in message, message
    assert "## 1. Warm-up: RoPE" in next(EXERCISES.glob("02_*.py")).read_text()


@pytest.mark.parametrize("checker, fn, remedy", [
    ("check_grouped_scores", broken_grouped_scores, "[n, Hkv, group, D]"),
    ("check_blocks_needed", lambda n, b: math.ceil(n / b), "-(-"),
    ("check_merge_attention", _chapter_merge, "NaN times 0"),
    ("check_merge_parts", lambda parts: functools.reduce(lambda a, b: _chapter_merge(*a, *b), parts), "weigh nothing"),
], ids=["grouped_scores", "blocks_needed", "merge", "merge_parts"])
def test_trial_9_messages_name_the_symptom_without_handing_over_the_fix(checker, fn, remedy):
    message = _message(getattr(ex, checker), fn)
    assert remedy not in message, message
    assert {"check_grouped_scores": "tiled 0,1,0,1", "check_blocks_needed": "53 bits",
            "check_merge_attention": "follow that row", "check_merge_parts": "follow that row"}[checker] in message


def _rope_freq_without_2(x, positions, theta):
    half = x.shape[-1] // 2
    angles = positions.to(torch.float64)[:, None] * theta ** (-torch.arange(half, dtype=torch.float64) / x.shape[-1])
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _layer_flops_restarting(cfg, n, c, window=None):
    """The chunk's queries counted from position 0 (the trial's positions restarting in the chunk)."""
    return layer_flops(cfg, n, 0, window)


def _merge_through_exp(out_a, lse_a, out_b, lse_b):
    """The trial's merge: weights exp(lse_a) / (exp(lse_a) + exp(lse_b)), which overflow near 800."""
    sum_a, sum_b = lse_a.exp(), lse_b.exp()
    total = sum_a + sum_b
    return (out_a.nan_to_num() * (sum_a / total)[..., None] + out_b.nan_to_num() * (sum_b / total)[..., None],
            total.log())


def _heads_in_group_order(q, k):
    """Each query head meets its right KV head, but the heads come out group by group."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    return grouped_scores(q, k).reshape(k.shape[1], group, n, k.shape[0]).transpose(0, 1).reshape(heads, n, -1)


@pytest.mark.parametrize("checker, fn, says", [
    ("check_attention", lambda q, k, v: attention(q.float(), k.float(), v.float()), "you return float32"),
    ("check_attention", lambda q, k, v: attention(q.float(), k.float(), v.float()).double(), "float32's rounding"),
    ("check_layer_flops", _layer_flops_restarting, "positions c to c + n - 1"),
    ("check_layer_flops", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, w) + 2 * n * cfg.hidden_size * cfg.vocab_size,
     "without the LM head"),
    ("check_chunked_prefill_work", lambda t, c: (work(t, c)[0], sum(s for s, n in _chunks(t, c) if n == c)),
     "leave out the last, shorter chunk"),
    ("check_rope", _rope_freq_without_2, "theta^(-i/D)"),
    ("check_causal_mask", lambda q, k: mask(q, k + 1)[:, :k], "one key too far"),
    ("check_causal_mask", lambda q, k: mask(q, k).T if q == k else mask(q, k), "transposed"),
    ("check_causal_mask", lambda q, k: mask(q, k) if q == k else mask(q, k).T, "rows are the queries"),
    ("check_window_mask", lambda q, k, w: mask(q, k) & (torch.arange(k)[None] > torch.arange(q)[:, None] - w),
     "counts back from the row index"),
    ("check_move_rope", lambda k, o, n, theta: rope(k, n + o, theta), "old + new"),
    ("check_move_rope", lambda k, o, n, theta: rope(k.float(), (n - o).float(), theta).double(), "float32"),
    ("check_decodes_to_ridge", lambda *a: (lambda b: b and b + 2)(_ridge_with(*a)), "not the smallest"),
    ("check_decodes_to_ridge", lambda *a: _ridge_with(*a, heads=lambda cfg: cfg.num_kv_heads), "QUERY head scores"),
    ("check_grouped_scores", _heads_in_group_order, "another order"),
    ("check_merge_attention", _merge_through_exp, "inf/inf"),
    ("check_masked_fraction", lambda t, c: masked_fraction(t, c, masked=lambda n: n * (n + 1) // 2), "diagonal as masked"),
], ids=["attention_float32_out", "attention_float32_inside", "flops_positions_restart", "flops_lm_head",
        "work_last_chunk", "rope_frequency", "mask_offset_plus_one", "mask_transposed_square", "mask_transposed",
        "window_from_row_index", "move_rope_new_plus_old", "move_rope_float32", "ridge_off_by_two",
        "ridge_kv_heads", "scores_heads_reordered", "merge_overflow_nan", "fraction_diagonal_masked"])
def test_trial_10_generic_messages_now_name_the_mistake(checker, fn, says):
    message = _message(getattr(ex, checker), fn)
    assert says in message, message


def test_trial_11_the_preemption_message_says_which_k_and_v_were_lost():
    message = _message(ex.check_forward_tokens, _forward_with(lambda p, k: 0))
    assert "f(5, 4, 2), with a cache" in message or "(5, 4, 2), with a cache" in message, message
    assert "the K and V of its prompt and of the first output token" in message
    assert "output token 2 had not been fed back" in message and "2 tokens it generated" not in message


def test_trial_11_no_merge_row_sees_nothing_of_both_parts_as_the_statement_says():
    statement = next(EXERCISES.glob("01_*.py")).read_text()
    assert "never of both: every query sees its own key" in statement
    rng = random.Random(0)
    for trial in range(40):                # the check's own construction of the split parts
        n, cached = rng.randrange(2, 7), rng.randrange(0, 8)
        window = None if trial % 2 else rng.randrange(1, n + 1)
        cut = rng.randrange(1, cached + 1) if window is not None and cached else rng.randrange(cached + 1, cached + n)
        parts, _ = ch01._parts_case(rng, n, cached, [cut], window)
        empty = torch.isinf(parts[0][1]) & torch.isinf(parts[1][1])
        assert not empty.any()
