"""Every checker passes a correct answer and fails every shortcut with a helpful message.

For each exercise, a correct function and a list of shortcut attempts: the
engine's own function, skipping the method, a hard-coded value for the default
inputs, and wrong-but-close variants. Each attempt must fail with "Not yet"
and a message that names the likely mistake (the `says` fragment).
"""
import functools
import math
import re
import statistics

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minillm
import minillm.grading as ex
from minillm import kernels
from minillm.attention import AttentionBatch, causal_mask, merge_attention, reference_attention
from minillm.config import ModelConfig
from minillm.kv_cache import BlockManager, PagedKVCache, blocks_for, blocks_that_fit
from minillm.model import MLP, RMSNorm, apply_rope, rope_cos_sin
from minillm.request import RequestMetrics


# ---- correct answers (the tests' own; the notebooks have theirs) --------------------------
def mask(q_len, k_len):
    return torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)


def attention(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask(q.shape[0], k.shape[0]), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


def merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None], lse


def merge_parts(parts):
    lse = torch.logsumexp(torch.stack([l for _, l in parts]), 0)
    out = torch.zeros_like(parts[0][0])
    for o, l in parts:
        w = (l - lse).exp()[..., None]
        out = out + torch.where(w > 0, o * w, torch.zeros_like(o))
    return out, lse


def _chunk_fractions(num_tokens, chunk_size):
    return [(n * (n - 1) / 2) / (n * (s + n)) for s in range(0, num_tokens, chunk_size)
            for n in [min(chunk_size, num_tokens - s)]]


def masked_fraction(num_tokens, chunk_size):
    masked = computed = 0
    for s in range(0, num_tokens, chunk_size):
        n = min(chunk_size, num_tokens - s)
        masked, computed = masked + n * (n - 1) // 2, computed + n * (s + n)
    return masked / computed


def _fraction_from_masks(num_tokens, chunk_size):
    masks = [causal_mask(min(chunk_size, num_tokens - s), min(s + chunk_size, num_tokens))
             for s in range(0, num_tokens, chunk_size)]
    return sum(int((~m).sum()) for m in masks) / sum(m.numel() for m in masks)


def rms_norm(x, weight, eps):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _float32_rope(x, positions, theta):
    """Hugging Face's frequencies, float32 as torch makes them by default."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, x.shape[-1], 2) / x.shape[-1]))
    half = x.shape[-1] // 2
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _all_float32_rope(x, positions, theta):
    """What a hint without a word on dtype gave: torch's default float32 for frequencies and angles."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half) * 2 / x.shape[-1])
    angles = positions[:, None] * inv_freq
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _chapter_rope(x, positions, theta):
    """Chapter 2's printed RoPE (apply_rope over rope_cos_sin's angles), transcribed as a learner would
    (calling the engine's is refused): the chapter's code applied to the stored keys at the new positions."""
    return rope(x, positions, theta)


def move_rope(k, old, new, theta):
    return rope(k, new - old, theta)


def num_parameters(cfg):
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size + 2 * d \
        + (q + 2 * kv if cfg.attention_bias else 0) + (2 * cfg.head_dim if cfg.qk_norm else 0)
    return cfg.num_layers * layer + cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2) + d


def repeat_kv(k, num_heads):
    return k.repeat_interleave(num_heads // k.shape[1], dim=1)


def swiglu(x, gate_w, up_w, down_w):
    return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


def step_mask(query_lens, cached_lens):
    return torch.block_diag(*(mask(q, c + q) for q, c in zip(query_lens, cached_lens)))


def blocks_needed(num_tokens, block_size):
    return -(-num_tokens // block_size)


def slot_mapping(table, start, end, block_size):
    return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def gather_kv(k_cache, table, num_tokens):
    return k_cache[torch.as_tensor(table)].reshape(-1, *k_cache.shape[2:])[:num_tokens]


def fit(cfg, num_bytes, block_size, dtype_bytes):
    return num_bytes // (block_size * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes)


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


def forward_tokens(prompt_len, num_output_tokens):
    n = num_output_tokens
    return n * prompt_len + n * (n - 1) // 2, prompt_len + n - 1


def bounds(num_tokens, chunk_size):
    return [(s, min(s + chunk_size, num_tokens)) for s in range(0, num_tokens, chunk_size)]


def chunked_prefill(model, token_ids, chunk_size, block_size=16, positions_from_zero=False, cached=True,
                    chunk_blocks_only=False):
    T = len(token_ids)
    blocks = BlockManager(-(-T // block_size), block_size)
    table = blocks.allocate("p", T)
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    for start, end in bounds(T, chunk_size):
        mine = table[start // block_size:-(-end // block_size)] if chunk_blocks_only else table
        batch = AttentionBatch([end - start], [start if cached else 0], [mine], block_size,
                               torch.tensor(blocks.slot_mapping("p", start, end)))
        positions = torch.arange(0, end - start) if positions_from_zero else torch.arange(start, end)
        model(torch.tensor(token_ids[start:end]), positions, batch, cache, backend="reference")
    return cache.gather(table, T)


def _with_top_left_mask(prefill, model, token_ids, chunk_size):
    """The chapter's bug 1: the reference attention's mask aligned top-left, inside the learner's run."""
    from unittest import mock
    original = minillm.attention.reference_attention
    with mock.patch.object(minillm.attention, "reference_attention",
                           lambda q, k, v, *a, **kw: original(q, k, v, align="top_left")):
        return prefill(model, token_ids, chunk_size)


def packed(model, prompts, chunk_size, block_size=16, global_positions=False, first_table_only=False):
    blocks = BlockManager(sum(-(-len(p) // block_size) for p in prompts), block_size)
    tables = [blocks.allocate(r, len(p)) for r, p in enumerate(prompts)]
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        rows = [r for r, p in enumerate(prompts) if done[r] < len(p)]
        ends = {r: min(done[r] + chunk_size, len(prompts[r])) for r in rows}
        batch = AttentionBatch([ends[r] - done[r] for r in rows], [done[r] for r in rows],
                               [tables[rows[0] if first_table_only else r] for r in rows], block_size,
                               torch.tensor(sum((blocks.slot_mapping(r, done[r], ends[r]) for r in rows), [])))
        tokens = torch.tensor(sum((prompts[r][done[r]:ends[r]] for r in rows), []))
        positions = torch.arange(len(tokens)) if global_positions else \
            torch.cat([torch.arange(done[r], ends[r]) for r in rows])
        model(tokens, positions, batch, cache, backend="reference")
        done = [ends.get(r, d) for r, d in enumerate(done)]
    return [cache.gather(tables[r], len(p)) for r, p in enumerate(prompts)]


def work(num_tokens, chunk_size):
    return num_tokens * (num_tokens + 1) // 2, sum(range(0, num_tokens, chunk_size))


def _engine_reads(num_tokens, chunk_size):
    from minillm.grading._common import record_forward
    model = minillm.build_model(ModelConfig(name="w", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                                            num_heads=1, num_kv_heads=1), seed=0)
    with record_forward(model) as record:
        minillm.prefill_kv(model, [1] * num_tokens, chunk_size=chunk_size)
    return sum(c for call in record.calls for c in call.cached_lens)


def _layer_errors(model, token_ids, kv):
    full = minillm.prefill_kv(model, token_ids)[0]
    return [(kv[layer] - full[layer]).abs().max().item() for layer in range(model.cfg.num_layers)]


def position_bug_errors(model, token_ids, chunk_size):
    return _layer_errors(model, token_ids, chunked_prefill(model, token_ids, chunk_size, positions_from_zero=True))


def choose(rows, slo_ms):
    ok = [r for r in rows if r["itl_max_s"] * 1e3 <= slo_ms]
    size = lambda r: math.inf if r["chunk_size"] == "off" else r["chunk_size"]
    return min(ok, key=lambda r: (r["long_ttft_s"], size(r)))["chunk_size"] if ok else None


def _engine_metrics(arrival, times):
    m = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=list(times), finish_time=times[-1])
    return {"ttft": m.ttft, "tpot": m.tpot, "itl": m.itl}


# ---- the table: checker, correct answer, shortcuts (name, function, what the message says) --
CASES = {
    "check_causal_mask": (mask, [
        ("engine", lambda q, k: causal_mask(q, k), "engine's own answer"),
        ("top_left", lambda q, k: causal_mask(q, k, align="top_left") if False else torch.ones(q, k).tril().bool(),
         "TOP-LEFT"),
        ("strict", lambda q, k: torch.arange(k)[None] < torch.arange(q)[:, None] + (k - q), "diagonal"),
        ("hard_coded", lambda q, k: torch.ones(1, 1, dtype=torch.bool), "shape"),
    ]),
    "check_attention": (attention, [
        ("engine", lambda q, k, v: reference_attention(q, k, v), "engine's own answer"),
        ("sdpa_is_causal", lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(0, 1), repeat_kv(k, q.shape[1]).transpose(0, 1), repeat_kv(v, q.shape[1]).transpose(0, 1),
            is_causal=True).transpose(0, 1), "TOP-LEFT"),
        ("no_scale", lambda q, k, v: attention(q * math.sqrt(q.shape[-1]), k, v), "sqrt(head_dim)"),
        ("one_over_d", lambda q, k, v: attention(q / math.sqrt(q.shape[-1]), k, v), "divide the scores by D"),
        ("softmax_over_queries", lambda q, k, v: _attention_softmax_dim(q, k, v, 1), "over the QUERIES"),
        ("no_gqa_expansion", lambda q, k, v: _attention_no_expansion(q, k, v), "expand K and V"),
        ("strict_mask", lambda q, k, v: _strict_mask_attention(q, k, v), "NaN"),
        ("top_left", lambda q, k, v: reference_attention(q.clone(), k, v, align="top_left") if False else
         _top_left_attention(q, k, v), "TOP-LEFT"),
        ("tiled_heads", lambda q, k, v: attention(q, k.repeat(1, q.shape[1] // k.shape[1], 1),
                                                  v.repeat(1, q.shape[1] // k.shape[1], 1)), "repeat_interleave"),
        *([("paged_kernel", lambda q, k, v: _paged_kernel_attention(q, k, v, via_ops=False), "engine's own answer"),
           ("paged_kernel_op", lambda q, k, v: _paged_kernel_attention(q, k, v, via_ops=True),
            "engine's own answer")] if kernels.paged_decode_available() else []),
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
        ("mean_of_chunks", lambda t, c: statistics.mean(_chunk_fractions(t, c)), "off"),
        ("chapter_number", lambda t, c: 0.06, "off"),
    ]),
    "check_merge_attention": (merge, [
        ("engine", lambda *a: merge_attention(*a), "engine's own answer"),
        ("average", lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)), "average"),
        ("max_lse", lambda oa, la, ob, lb: (merge(oa, la, ob, lb)[0], torch.maximum(la, lb)), "max(lse_a, lse_b)"),
        ("naive_lse", lambda oa, la, ob, lb: _naive_merge(oa, la, ob, lb), "overflows"),
    ]),
    "check_rms_norm": (rms_norm, [
        ("engine", lambda x, w, eps: _engine_rms(x, w, eps), "engine's own answer"),
        ("torch", lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps), "engine's own answer"),
        ("eps_outside", lambda x, w, eps: w * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps), "INSIDE"),
        ("layer_norm", lambda x, w, eps: rms_norm(x - x.mean(-1, keepdim=True), w, eps), "LayerNorm"),
    ]),
    "check_rope": (rope, [
        ("engine", lambda x, p, theta: apply_rope(x, *rope_cos_sin(_rope_cfg(x, theta), p, torch.float64)),
         "engine's own answer"),
        ("interleaved", lambda x, p, theta: _interleaved_rope(x, p, theta), "rotate half"),
        ("unrotated", lambda x, p, theta: x, "unrotated"),
        ("minus_angle", lambda x, p, theta: rope(x, -p, theta), "-angle"),
        ("float32_freq", lambda x, p, theta: _float32_rope(x, p, theta), "float32"),
        ("float32_everything", lambda x, p, theta: _all_float32_rope(x, p, theta), "float32"),
        ("positions_ignored", lambda x, p, theta: rope(x, torch.arange(len(p)), theta), "ignore `positions`"),
    ]),
    "check_move_rope": (move_rope, [
        ("engine", lambda k, o, n, theta: apply_rope(k, *rope_cos_sin(_rope_cfg(k, theta), n - o, torch.float64)),
         "engine's own answer"),
        # the chapter's printed apply_rope, applied at the new positions: rotated twice
        ("chapter_rope_at_new", lambda k, o, n, theta: _chapter_rope(k, n, theta), "NEW positions' full angle"),
        ("wrong_direction", lambda k, o, n, theta: rope(k, o - n, theta), "opposite direction"),
        ("unchanged", lambda k, o, n, theta: k.clone(), "unchanged"),
    ]),
    "check_num_parameters": (num_parameters, [
        ("engine", lambda cfg: cfg.num_parameters(), "engine's own answer"),
        ("builds_the_model", lambda cfg: sum(p.numel() for p in minillm.build_model(cfg).parameters()),
         "engine's own answer"),
        ("always_untied", lambda cfg: num_parameters(cfg) + (cfg.vocab_size * cfg.hidden_size
                                                             if cfg.tie_word_embeddings else 0), "counted once"),
        ("no_gqa", lambda cfg: num_parameters(cfg.replace(num_kv_heads=cfg.num_heads)), "GQA"),
        ("no_norms", lambda cfg: num_parameters(cfg) - cfg.num_layers * 2 * cfg.hidden_size - cfg.hidden_size,
         "two norms"),
        ("hard_coded", lambda cfg: 8_030_261_248, "you predicted"),
    ]),
    "check_repeat_kv": (repeat_kv, [
        ("engine", lambda k, h: minillm.attention._expand_kv_heads(k, h), "engine's own answer"),
        ("tiled", lambda k, h: k.repeat(1, h // k.shape[1], 1), "tiled (0,1,0,1)"),
    ]),
    "check_swiglu": (swiglu, [
        ("engine", lambda x, g, u, d: _engine_mlp(x, g, u, d), "engine's own answer"),
        ("silu_on_up", lambda x, g, u, d: swiglu(x, u, g, d), "gate projection"),
        ("gelu", lambda x, g, u, d: (F.gelu(x @ g.T) * (x @ u.T)) @ d.T, "GeGLU"),
    ]),
    "check_blocks_needed": (blocks_needed, [
        ("engine", lambda n, b: blocks_for(n, b), "engine's own answer"),
        ("float_ceil", lambda n, b: math.ceil(n / b), "integer arithmetic"),
        ("floor", lambda n, b: n // b, "floor"),
    ]),
    "check_slot_mapping": (slot_mapping, [
        ("engine", lambda t, s, e, b: _engine_slots(t, s, e, b), "engine's own answer"),
        ("ignores_table", lambda t, s, e, b: list(range(s, e)), "block_table[p // block_size]"),
        ("one_too_many", lambda t, s, e, b: slot_mapping(t, s, e, b) + [0], "end is excluded"),
        ("off_by_one", lambda t, s, e, b: slot_mapping(t, s, e + 1, b) if e < len(t) * b else slot_mapping(t, s, e, b)[:-1],
         "one per position"),
    ]),
    "check_gather_kv": (gather_kv, [
        ("engine", lambda c, t, n: _engine_gather(c, t, n), "engine's own answer"),
        ("sorted_table", lambda c, t, n: gather_kv(c, sorted(t), n), "table order"),
        ("no_cut", lambda c, t, n: c[torch.as_tensor(t)].reshape(-1, *c.shape[2:]), "shape"),
    ]),
    "check_blocks_that_fit": (fit, [
        ("engine", lambda cfg, n, b, d: blocks_that_fit(cfg, n, b, d), "engine's own answer"),
        # chapter 3 teaches cfg.kv_bytes_per_token: refused by name, never an AttributeError
        ("kv_bytes_per_token", lambda cfg, n, b, d: n // (b * cfg.kv_bytes_per_token(d)), "engine's own answer"),
        ("k_only", lambda cfg, n, b, d: fit(cfg, 2 * n, b, d), "K only"),
        ("query_heads", lambda cfg, n, b, d: n // (b * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * d),
         "query heads"),
        ("derived_head_dim", lambda cfg, n, b, d: n // (b * 2 * cfg.num_layers * cfg.num_kv_heads
                                                        * (cfg.hidden_size // cfg.num_heads) * d), "head_dim"),
    ]),
    "check_append_slot": (append_slot, [
        # the chapter's printed allocate + slot_mapping: a new block when full, else write in place
        ("chapter_no_copy", lambda t, n, r, f, b: _append_no_copy(t, n, r, f, b), "Copy it to a fresh block"),
        ("always_copy", lambda t, n, r, f, b: _append_always_copy(t, n, r, f, b), "no copy is needed"),
        ("keeps_old_count", lambda t, n, r, f, b: _append_keeps_count(t, n, r, f, b), "ref count must drop"),
        ("new_block_every_token", lambda t, n, r, f, b: _append_new_block(t, n, r, f, b), "only a full last"),
    ]),
    "check_forward_tokens": (forward_tokens, [
        ("one_pass_per_output_with_cache", lambda p, n: (forward_tokens(p, n)[0], p + n), "prefill's pass"),
        ("last_token_fed_back", lambda p, n: (forward_tokens(p, n + 1)[0], p + n - 1), "never fed back"),
        ("hard_coded", lambda p, n: (10, 5), "you predicted"),
    ]),
    "check_step_mask": (step_mask, [
        ("engine", lambda qs, cs: torch.block_diag(*(causal_mask(q, c + q) for q, c in zip(qs, cs))),
         "engine's own answer"),
        ("top_left", lambda qs, cs: torch.block_diag(*(torch.ones(q, c + q).tril().bool() for q, c in zip(qs, cs))),
         "TOP-LEFT"),
        ("one_mask", lambda qs, cs: mask(sum(qs), sum(qs) + sum(cs)), "own request's keys"),
        ("no_cache", lambda qs, cs: step_mask(qs, [0] * len(qs)), "cached AND new"),
        ("int_mask", lambda qs, cs: step_mask(qs, cs).int(), "torch.bool"),
        ("grader_helper", lambda qs, cs: minillm.grading.ch04._packed(qs, cs), "engine's own answer"),
    ]),
    "check_chunk_bounds": (bounds, [
        ("lists", lambda n, c: [[s, e] for s, e in bounds(n, c)], "TUPLES"),
        ("overruns", lambda n, c: [(s, s + c) for s in range(0, n, c)], "past num_tokens"),
        ("drops_last", lambda n, c: [(s, s + c) for s in range(0, n - c + 1, c)], "short last one"),
        ("hard_coded", lambda n, c: [(0, 4), (4, 8), (8, 10)], "expected"),
    ]),
    "check_chunked_prefill": (chunked_prefill, [
        ("engine_full", lambda m, t, c: minillm.prefill_kv(m, t)[0], "engine's own answer"),
        ("engine_chunked", lambda m, t, c: minillm.prefill.prefill_kv(m, t, chunk_size=c)[0],
         "engine's own answer"),
        ("one_pass", lambda m, t, c: chunked_prefill(m, t, len(t)), "forward pass"),
        ("positions_from_zero", lambda m, t, c: chunked_prefill(m, t, c, positions_from_zero=True), "absolute"),
        ("no_cache", lambda m, t, c: chunked_prefill(m, t, c, cached=False), "cached_lens"),
        ("chunk_blocks_only", lambda m, t, c: chunked_prefill(m, t, c, chunk_blocks_only=True),
         "block table that does not cover the keys"),
        ("top_left_mask", lambda m, t, c: _with_top_left_mask(chunked_prefill, m, t, c), "TOP-LEFT"),
    ]),
    "check_layer0_question": ({"positions restart": "K", "top-left mask": "neither"}, [
        ("both_both", {"positions restart": "both", "top-left mask": "both"}, "RoPE"),
        ("mask_touches_k", {"positions restart": "K", "top-left mask": "K"}, "the mask"),
        ("not_a_choice", {"positions restart": "keys", "top-left mask": "neither"}, "choose one of"),
        ("missing_key", {"positions restart": "K"}, "exactly the keys"),
    ]),
    "check_packed_chunked_prefill": (packed, [
        # the chapter's my_chunked_prefill, once per prompt: right KV, but one pass per request and chunk
        ("chapter_per_prompt", lambda m, ps, c: [chunked_prefill(m, p, c) for p in ps], "PACK them"),
        ("engine", lambda m, ps, c: [minillm.prefill_kv(m, p)[0] for p in ps], "engine's own answer"),
        ("positions_packed_from_zero", lambda m, ps, c: packed(m, ps, c, global_positions=True), "ITS OWN absolute"),
        ("shared_table", lambda m, ps, c: packed(m, ps, c, first_table_only=True), "its own block table"),
    ]),
    "check_chunked_prefill_work": (work, [
        ("rectangles", lambda t, c: (sum(min(c, t - s) * min(s + c, t) for s in range(0, t, c)), work(t, c)[1]),
         "whole [n, s + n] rectangle"),
        ("reads_every_chunk_end", lambda t, c: (work(t, c)[0], sum(min(s + c, t) for s in range(0, t, c))),
         "cached keys read"),
        ("engine", lambda t, c: (t * (t + 1) // 2, _engine_reads(t, c)), "engine's own answer"),
        ("hard_coded", lambda t, c: (2080, 0), "you predicted"),
    ]),
    "check_position_bug_errors": (position_bug_errors, [
        ("hard_coded", lambda m, t, c: [1.0, 1.0] if c < len(t) else [0.0, 0.0], "restarting at 0"),
        ("grader_reference", lambda m, t, c: _ref04().position_bug_errors(m, t, c), "engine's own answer"),
        ("one_max", lambda m, t, c: [max(position_bug_errors(m, t, c))], "one error per layer"),
        ("no_bug", lambda m, t, c: _layer_errors(m, t, chunked_prefill(m, t, c)), "restarting at 0"),
        ("engine_full", lambda m, t, c: _layer_errors(m, t, minillm.prefill_kv(m, t)[0]), "restarting at 0"),
    ]),
    # chapters 5-8: tests/test_grading_ch05_08.py
}


def _chapter_merge(out_a, lse_a, out_b, lse_b):
    """Chapter 1's printed merge_attention, transcribed."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None], lse


def _attention_softmax_dim(q, k, v, dim):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask(q.shape[0], k.shape[0]), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(dim).nan_to_num(), v)


def _attention_no_expansion(q, k, v):
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask(q.shape[0], k.shape[0]), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


def _naive_merge(out_a, lse_a, out_b, lse_b):
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    return out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None], lse


def _strict_mask_attention(q, k, v):
    """A query may not see its own key (< instead of <=): the first row sees nothing."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    strict = torch.arange(k.shape[0])[None, :] < torch.arange(q.shape[0])[:, None] + (k.shape[0] - q.shape[0])
    scores = scores.masked_fill(~strict, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


def _top_left_attention(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.ones(q.shape[0], k.shape[0]).tril().bool(), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


def _paged_kernel_attention(q, k, v, via_ops):
    """Each query row as a decode over its visible keys, through the engine's paged kernel."""
    n, m = q.shape[0], k.shape[0]
    kernel = torch.ops.minillm.paged_decode if via_ops else kernels.paged_decode
    rows = []
    for i in range(n):
        visible = m - n + i + 1
        rows.append(kernel(q[i:i + 1].contiguous(), k[None, :visible].contiguous(), v[None, :visible].contiguous(),
                           torch.zeros(1, 1, dtype=torch.long), torch.tensor([visible]), q.shape[-1] ** -0.5))
    return torch.cat(rows)


def _engine_rms(x, w, eps):
    norm = RMSNorm(x.shape[-1], eps).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        return norm(x)


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


def _engine_mlp(x, gate_w, up_w, down_w):
    cfg = ModelConfig(name="t", vocab_size=8, hidden_size=x.shape[1], intermediate_size=gate_w.shape[0],
                      num_layers=1, num_heads=1, num_kv_heads=1)
    mlp = MLP(cfg).to(x.dtype)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(gate_w), mlp.up_proj.weight.copy_(up_w), mlp.down_proj.weight.copy_(down_w)
        return mlp(x)


def _engine_slots(table, start, end, block_size):
    manager = BlockManager(max(table) + 1, block_size)
    manager.block_tables["r"] = list(table)
    return manager.slot_mapping("r", start, end)


def _engine_gather(k_cache, table, num_tokens):
    cache = PagedKVCache(1, k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], k_cache.shape[3],
                         dtype=k_cache.dtype)
    cache.data[0, 0].copy_(k_cache)
    return cache.gather(table, num_tokens)[0, 0]


def _ref04():
    from minillm.grading._reference import ch04
    return ch04


def test_the_package_exports_only_checkers_and_every_one_is_tested():
    assert all(name.startswith("check_") for name in ex.__all__)
    assert not [name for name in dir(ex) if not name.startswith("_") and callable(getattr(ex, name))
                and not name.startswith("check_")]
    # Chapters 5-8's checkers have their own file of correct answers and shortcuts.
    from test_grading_ch05_08 import CASES as CH05_08
    # chapters 9 and later: each checker is named in some test file of its own
    later = "\n".join(path.read_text() for path in Path(__file__).parent.glob("test_*.py"))
    untested = [name for name in ex.__all__ if name not in CASES and name not in CH05_08 and name not in later]
    assert not untested, f"checkers no test calls: {untested}"
    assert set(CASES) <= set(ex.__all__) and set(CH05_08) <= set(ex.__all__)


@pytest.mark.parametrize("checker", sorted(CASES))
def test_a_correct_answer_passes(checker, capsys):
    result = getattr(ex, checker)(CASES[checker][0], seed=3)
    assert result is None or result is True           # chapters 1-4 return None: nothing echoed
    assert capsys.readouterr().out.startswith("✓")


def test_sdpa_with_the_right_mask_is_accepted_where_the_task_is_the_mask():
    def sdpa(q, k, v):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
            v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask(q.shape[0], k.shape[0])).transpose(0, 1)
    assert ex.check_attention(sdpa) is None


SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


# ---- the shared machinery (minillm/grading/_common.py) --------------------------------------
def test_seed_none_gives_the_same_failing_case_every_run():
    """seed=None is a fixed seed per checker: the case a learner debugs does not move."""
    def wrong(q_len, k_len):
        return torch.ones(q_len, k_len, dtype=torch.bool) if q_len > 4 else mask(q_len, k_len)
    messages = []
    for _ in range(2):
        with pytest.raises(AssertionError) as failure:
            ex.check_causal_mask(wrong)
        messages.append(str(failure.value))
    assert messages[0] == messages[1]
    # and another checker gets another seed
    from minillm.grading._common import stable_seed
    assert stable_seed("check_causal_mask") != stable_seed("check_attention")


def test_the_failing_case_is_a_call_with_the_learners_function_name():
    def my_causal_mask(q_len, k_len):
        return torch.ones(q_len, k_len).tril().bool()
    with pytest.raises(AssertionError) as failure:
        ex.check_causal_mask(my_causal_mask)
    assert str(failure.value).startswith("my_causal_mask(1, 7) is wrong: that is the TOP-LEFT mask")
    assert "fn(" not in str(failure.value)


def test_a_failure_renders_once_without_the_checkers_traceback(capsys):
    """In IPython an exception with _render_traceback_ is shown through it: one "Not yet" message, no frames
    of the checker's source; nothing printed besides (the message used to appear twice)."""
    with pytest.raises(AssertionError) as failure:
        ex.check_merge_attention(lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)))
    rendered = failure.value._render_traceback_()
    assert rendered[0].startswith("Not yet: your function(")                 # a lambda has no name
    assert not any("File " in line or "_common.py" in line or "ch01.py" in line for line in rendered)
    assert capsys.readouterr().out == ""


def test_a_crash_in_the_learners_code_is_one_message_with_only_the_learners_frames():
    def my_attention(q, k, v):
        return torch.einsum("nhd,mhd->hnm", q, k)          # no GQA expansion: einsum fails on 4 vs 2 heads
    with pytest.raises(AssertionError) as failure:
        ex.check_attention(my_attention)
    message = str(failure.value)
    assert message.startswith("my_attention(<tensor [") and " crashed: q has 4 heads" in message
    assert "expand K and V to 4 heads" in message and "RuntimeError" in message
    rendered = failure.value._render_traceback_()
    frames = [line for line in rendered if line.strip().startswith("File ")]
    assert frames and all("test_grading_shortcuts.py" in line for line in frames)   # the learner's code only


def test_a_passing_check_returns_none_so_a_cell_echoes_nothing(capsys):
    assert ex.check_causal_mask(mask) is None
    assert capsys.readouterr().out.count("\n") == 1        # one plain pass line


def test_grade_prediction_states_both_numbers_and_the_tolerance():
    from minillm.grading._common import grade_prediction
    assert grade_prediction("x", 101, 100, 0.02) == pytest.approx(0.01)
    with pytest.raises(AssertionError, match=r"you predicted 110, the engine measures 100, 10% off \(allowed: 2%\)"):
        grade_prediction("x", 110, 100, 0.02)
    with pytest.raises(AssertionError, match="expected a number"):
        grade_prediction("x", "110", 100, 0.02)


# ---- copying the chapter's printed code earns at most half of each chapter's points ----------
CHAPTERS = Path(__file__).resolve().parents[1] / "notebooks" / "src"
EXERCISES = Path(__file__).resolve().parents[1] / "exercises" / "solutions" / "src"


def _printed(chapter: str, *names: str) -> dict:
    """Functions the chapter prints, as a learner would copy them: the chapter's own `def`s taken from
    notebooks/src/NN_*.py, and the engine functions it shows with show_source, transcribed (exec'd
    from their source, so they are the same code but not the engine's object)."""
    import ast
    import inspect
    import textwrap
    source = next(CHAPTERS.glob(f"{chapter}_*.py")).read_text()
    tree = ast.parse(source)
    namespace = {"torch": torch, "math": math, "F": F, **vars(minillm.attention), **vars(minillm.kv_cache)}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.Module([node], []), f"<chapter {chapter}>", "exec"), namespace)
            found[node.name] = namespace[node.name]
    shown = {n.args[0].id for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
             "show_source" and n.args and isinstance(n.args[0], ast.Name)}
    for name in names:
        if name not in found and name in shown:
            engine = namespace.get(name) or getattr(minillm.model, name)
            exec(textwrap.dedent(inspect.getsource(engine)), namespace)
            found[name] = namespace[name]
            assert found[name] is not engine
    missing = set(names) - set(found)
    assert not missing, f"chapter {chapter} no longer prints {missing}: update this test"
    return found


def _points(chapter: str) -> dict:
    text = next(EXERCISES.glob(f"{chapter}_*.py")).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*\)\s*#\s*points:\s*(\d+)", text)}


def _fails(checker, fn) -> bool:
    try:
        checker(fn)
    except AssertionError:
        return True
    return False


def test_chapter_1s_printed_code_earns_at_most_half():
    printed = _printed("01", "merge_attention", "causal_mask")
    merge2, chapter_mask = printed["merge_attention"], printed["causal_mask"]
    fold = lambda parts: functools.reduce(lambda a, b: merge2(*a, *b), parts)
    assert _fails(ex.check_merge_parts, fold)

    def count_masks(num_tokens, chunk_size):            # measuring with the chapter's mask is not predicting
        masks = [chapter_mask(min(chunk_size, num_tokens - s), min(s + chunk_size, num_tokens))
                 for s in range(0, num_tokens, chunk_size)]
        return sum(int((~m).sum()) for m in masks) / sum(m.numel() for m in masks)
    assert _fails(ex.check_masked_fraction, count_masks)
    points = _points("01")
    assert points["check_merge_parts"] + points["check_masked_fraction"] >= sum(points.values()) / 2


def test_chapter_2s_printed_code_earns_at_most_half():
    printed = _printed("02", "apply_rope")
    def at_new_positions(k, old, new, theta):             # the chapter's RoPE, applied where the keys must go
        cos, sin = _cos_sin(k, new, theta)
        return printed["apply_rope"](k, cos, sin)
    assert _fails(ex.check_move_rope, at_new_positions)
    points = _points("02")
    assert points["check_move_rope"] + points["check_num_parameters"] >= sum(points.values()) / 2


def _cos_sin(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def test_chapter_3s_printed_code_earns_at_most_half():
    # the chapter prints BlockManager.allocate and slot_mapping (methods): _append_no_copy transcribes them
    assert _fails(ex.check_append_slot, _append_no_copy)
    points = _points("03")
    assert points["check_append_slot"] + points["check_forward_tokens"] >= sum(points.values()) / 2


def test_chapter_4s_printed_code_earns_at_most_half():
    printed = _printed("04", "my_chunked_prefill", "prefill_positions_restart")
    mine = printed["my_chunked_prefill"]
    ex.check_chunked_prefill(lambda m, t, c: mine(m, t, c))                      # copyable: passes
    assert _fails(ex.check_packed_chunked_prefill, lambda m, ps, c: [mine(m, p, c) for p in ps])
    points = _points("04")
    transfer = ("check_step_mask", "check_layer0_question", "check_packed_chunked_prefill", "check_chunked_prefill_work")
    assert sum(points[name] for name in transfer) >= sum(points.values()) / 2


@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, name, fn, says, capsys):
    with pytest.raises(AssertionError) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    # shown once, as "Not yet: ...", without a traceback through the checker
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


def test_forbidden_functions_are_restored_after_a_check():
    before = (minillm.attention.causal_mask, minillm.prefill_kv, minillm.request.RequestMetrics.__dict__["tpot"])
    with pytest.raises(AssertionError):
        ex.check_causal_mask(lambda q, k: causal_mask(q, k), seed=0)
    with pytest.raises(AssertionError):
        ex.check_chunked_prefill(lambda m, t, c: minillm.prefill_kv(m, t)[0], seed=0)
    with pytest.raises(AssertionError):
        ex.check_stream_metrics(_engine_metrics, seed=0)
    assert before == (minillm.attention.causal_mask, minillm.prefill_kv,
                      minillm.request.RequestMetrics.__dict__["tpot"])
    assert causal_mask(2, 3).shape == (2, 3)


def test_the_engines_function_is_refused_however_it_is_handed_in():
    def default_arg(q_len, k_len, _answer=causal_mask):
        return _answer(q_len, k_len)
    answer = causal_mask
    closure = lambda q_len, k_len: answer(q_len, k_len)
    for fn in (causal_mask, default_arg, closure, lambda q, k: minillm.attention.causal_mask(q, k)):
        with pytest.raises(AssertionError, match="engine's own answer"):
            ex.check_causal_mask(fn, seed=0)
    assert default_arg.__defaults__[0] is causal_mask and answer is causal_mask
