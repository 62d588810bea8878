"""kernels/triton_attention.py: one Triton launch per layer for a whole packed step.

Without a GPU these run in triton's interpreter on CPU tensors (the module
turns it on before importing triton when there is no CUDA device); on a CUDA
machine, in a process without TRITON_INTERPRET, on the GPU (`make gpu-check`).

Precision: on a GPU the kernel asks tl.dot for input_precision="ieee"
(exact float32 products) rather than the default TF32 (10 mantissa bits,
~1e-3 relative), so one float32 tolerance holds on both: 1e-5 absolute on
outputs of size ~1. The float32 kernel and the float32 reference backend each
round D-term dot products and exps (~1e-7 relative per operation; measured
differences ~1e-6 at head_dim 128); a wrong mask, a wrong block or a lost
rescale moves outputs by ~1e-1, so 1e-5 leaves room for rounding and none
for a bug.
"""
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch

import minillm
from minillm import LLMEngine, SamplingParams, SchedulerConfig
from minillm.attention import AttentionBatch, paged_attention
from minillm.kernels import triton_attention as ta
from minillm.kv_cache import BlockManager

if not ta.triton_available():
    pytest.skip(ta.TRITON_IMPORT_ERROR, allow_module_level=True)
DEVICE = "cpu" if ta.INTERPRETED else "cuda"
if ta.why_unavailable(DEVICE):
    pytest.skip(ta.why_unavailable(DEVICE), allow_module_level=True)
ATOL_FLOAT32 = 1e-5


def _packed_step(query_lens, cached_lens, block_size=16, num_heads=4, num_kv_heads=2, head_dim=32,
                 seed=0, dtype=torch.float32, spare_blocks=2):
    """A packed step over a paged cache whose requests' blocks are interleaved
    (handed out round-robin, so no request's blocks are consecutive), its new
    K/V already written. Returns (q, k_cache, v_cache, batch)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + spare_blocks + 1, block_size)
    manager.allocate("pad", block_size)                    # tables do not start at block 0
    for size in range(block_size, max(seq_lens) + block_size, block_size):
        for b, seq_len in enumerate(seq_lens):
            manager.allocate(b, min(size, seq_len))
    shape = (manager.num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=g).to(dtype)
    slots = [s for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for s in manager.slot_mapping(b, c, c + n)]
    batch = AttentionBatch(query_lens=list(query_lens), cached_lens=list(cached_lens),
                           block_tables=[list(manager.block_tables[b]) for b in range(len(query_lens))],
                           block_size=block_size, slot_mapping=torch.tensor(slots, dtype=torch.long))
    return q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), batch


def _reference(q, k_cache, v_cache, batch):
    """The reference backend's answer on the same cache (its K/V write is a no-op rewrite)."""
    rows = batch.slot_mapping.to(k_cache.device)
    flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    return paged_attention(q, flat_k[rows], flat_v[rows], k_cache.clone(), v_cache.clone(), batch,
                           backend="reference")


# Each case: (query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim, tile_n).
# Together: block sizes 8, 16, 48 (not a power of two), 128 and 256 against key tiles of
# 16, 32 and 64 (a tile holding several blocks, part of one, or straddling two); chunks
# that start mid-block and mid-tile; GQA ratios 1, 2, 3, 4 and 8; head_dim 24 (padded to
# 32), 64 and 128; decode-only, prefill-only and mixed steps. Interpreted, they take
# ~1.5 s together (the whole module ~15 s on this 2-core machine).
CASES = {
    "prefill only, MHA, blocks of 16 = tiles of 16": ([37], [0], 16, 4, 4, 32, 16),
    "blocks of 8 in tiles of 32, mid-tile chunk, MHA, d=24": ([21, 1], [13, 40], 8, 2, 2, 24, 32),
    "blocks of 16, mixed, GQA 2": ([9, 1, 17, 1], [0, 33, 5, 2], 16, 4, 2, 64, 16),
    "blocks of 48 straddled by tiles of 32, GQA 3": ([40, 1, 3], [7, 95, 50], 48, 6, 2, 64, 32),
    "decodes only, GQA 4": ([1, 1, 1], [0, 15, 47], 16, 8, 2, 64, 32),
    "blocks of 128 in tiles of 16, chunk mid-block, GQA 8, d=128": ([20, 1], [130, 200], 128, 8, 1, 128, 16),
    "blocks of 256 in tiles of 64, GQA 4, d=128": ([70, 1], [300, 260], 256, 8, 2, 128, 64),
    "prefix-cached prompt (whole blocks cached), d=24": ([5, 1], [32, 9], 16, 4, 2, 24, 32),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_one_launch_agrees_with_the_reference_backend_in_float32(case):
    query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim, tile_n = case
    q, k_cache, v_cache, batch = _packed_step(query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim)
    expected = _reference(q, k_cache, v_cache, batch)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch, tile_n=tile_n)
    torch.testing.assert_close(out, expected, atol=ATOL_FLOAT32, rtol=0)


def test_block_sizes_below_a_tile_and_not_powers_of_two_are_padded_and_masked():
    for block_size in (3, 4):
        q, k_cache, v_cache, batch = _packed_step([6, 1], [5, 4], block_size, 2, 1, 8)
        torch.testing.assert_close(ta.triton_paged_attention(q, k_cache, v_cache, batch),
                                   _reference(q, k_cache, v_cache, batch), atol=ATOL_FLOAT32, rtol=0)


def test_bfloat16_inputs_are_cast_before_tl_dot():
    """triton #11584: the interpreter's tl.dot on bfloat16 multiplies raw bits
    (~1e10 for inputs near 1). Cast, the output is the float32 answer rounded to
    bfloat16 (8 mantissa bits: ~4e-3 relative)."""
    q, k_cache, v_cache, batch = _packed_step([9, 1], [7, 20], 16, 4, 2, 32, dtype=torch.bfloat16)
    expected = _reference(q.float(), k_cache.float(), v_cache.float(), batch)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=0)


def _poisoned_step(module=ta):
    """A step whose every byte the kernel must not read is NaN: the unused blocks,
    each request's slots past its end, q's and out's rows past the step. Returns
    (out, out buffer past the step) after one launch of module's kernel."""
    q, k_cache, v_cache, batch = _packed_step([5, 1, 3], [11, 6, 0], 16, 4, 2, 32, spare_blocks=3)
    clean = _reference(q, k_cache, v_cache, batch)
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for table, seq_len in zip(batch.block_tables, batch.seq_lens):
        for p in range(seq_len):
            used[table[p // 16], p % 16] = True
    k_cache[~used.to(DEVICE)] = float("nan")
    v_cache[~used.to(DEVICE)] = float("nan")
    q_buffer = torch.full((q.shape[0] + 64, *q.shape[1:]), float("nan"), device=DEVICE)
    q_buffer[:q.shape[0]] = q
    out_buffer = torch.full_like(q_buffer, 7.0)
    module.triton_paged_attention(q_buffer[:q.shape[0]], k_cache, v_cache, batch, out=out_buffer[:q.shape[0]])
    return out_buffer[:q.shape[0]], out_buffer[q.shape[0]:], clean


def test_every_load_and_store_is_masked_nothing_past_an_end_is_read_or_written():
    """The interpreter does not check bounds: an unmasked load reads whatever lies
    past the end. Here that is NaN, so it would show in the output."""
    out, past_the_end, clean = _poisoned_step()
    torch.testing.assert_close(out, clean, atol=ATOL_FLOAT32, rtol=0)
    assert bool((past_the_end == 7.0).all()), "the kernel wrote rows past the step's end"


@pytest.mark.skipif(not ta.INTERPRETED, reason="mutates the kernel's source: interpreter only (cheap, no compile)")
def test_the_poisoned_step_catches_a_kernel_with_a_load_mask_removed(tmp_path):
    """The test above would fail if the V load had lost its mask: a copy of the
    module with that one mask removed puts NaN in the output."""
    source = Path(ta.__file__).read_text()
    unmasked = "v = tl.load(v_cache_ptr + v_offsets + dims[None, :], mask=kv_mask, other=0.0)"
    assert unmasked in source
    path = tmp_path / "triton_attention_unmasked.py"
    path.write_text(source.replace(unmasked, unmasked.replace(", mask=kv_mask, other=0.0", "")))
    spec = importlib.util.spec_from_file_location("triton_attention_unmasked", path)
    mutant = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutant
    try:
        spec.loader.exec_module(mutant)
        out, _, _ = _poisoned_step(mutant)
    finally:
        del sys.modules[spec.name]
    assert bool(out.isnan().any()), "a V load without its mask went unnoticed"


@pytest.mark.parametrize("tile_n", ta.TILE_N_CHOICES)
def test_key_tiles_skips_past_the_diagonal_and_masks_only_diagonal_tiles(tile_n):
    """ta.key_tiles is the kernel's tile arithmetic in Python: checked against the mask itself."""
    for cached in (0, 5, 16, 40, 70):
        for n in (1, 7, 16, 33):
            for first_row in range(0, n, 8):
                rows = min(8, n - first_row)
                unmasked, total = ta.key_tiles(cached, first_row, rows, tile_n)
                positions = range(cached + first_row, cached + first_row + rows)
                for j in range(-(-(cached + n) // tile_n)):
                    keys = [k for k in range(j * tile_n, (j + 1) * tile_n) if k < cached + n]
                    seen = [[k <= p for k in keys] for p in positions]
                    full = all(map(all, seen)) and len(keys) == tile_n
                    if j < unmasked:
                        assert full, (cached, n, first_row, j)                      # needs no mask
                    elif j < total:
                        assert not full and any(map(any, seen))                    # the diagonal
                    else:
                        assert not any(map(any, seen))                              # skipped


@pytest.mark.skipif(not ta.INTERPRETED, reason="counts the interpreter's operations")
@pytest.mark.parametrize("cached, n, tile_n", [(40, 9, 16), (13, 21, 32), (0, 37, 16), (64, 1, 32)])
def test_the_kernel_visits_the_tiles_key_tiles_names_and_masks_only_the_diagonal_ones(cached, n, tile_n,
                                                                                     monkeypatch):
    """One program (a single query tile): it runs two tl.dots per key tile it visits, and
    one tl.where per tile (the guard of a row with no key yet) plus one per masked tile."""
    from triton.runtime import interpreter
    counts = {"dot": 0, "select": 0}
    for op, name in (("dot", "create_dot"), ("select", "create_select")):
        original = getattr(interpreter.InterpreterBuilder, name)

        def counting(self, *args, _op=op, _original=original, **kwargs):
            counts[_op] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(interpreter.InterpreterBuilder, name, counting)
    q, k_cache, v_cache, batch = _packed_step([n], [cached], 16, 2, 2, 16)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch, tile_n=tile_n, num_kv_splits=1)
    unmasked, total = ta.key_tiles(cached, 0, n, tile_n)
    num_programs = 2                                       # one query tile x 2 KV heads
    assert counts["dot"] == num_programs * 2 * total
    assert counts["select"] == num_programs * (total + (total - unmasked))
    monkeypatch.undo()
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, batch), atol=ATOL_FLOAT32, rtol=0)


def test_plan_tiles_gives_a_decode_one_tile_and_a_chunk_as_many_as_its_rows_need():
    requests, first_rows = ta.plan_tiles([1, 40, 1, 16], group=4, block_m=64)
    assert requests == [0, 1, 1, 1, 2, 3]
    assert first_rows == [0, 0, 16, 32, 0, 0]


# ---- split-KV ------------------------------------------------------------------
def test_the_split_rule_splits_only_a_decode_only_step_with_fewer_programs_than_sms():
    plan = lambda query_lens, cached_lens, programs, **kw: ta.plan_segments(  # noqa: E731
        query_lens, cached_lens, 8, 32, num_programs=programs, num_sms=132, **kw)
    # 4 decodes x 8 KV heads = 32 programs on 132 SMs: ceil(132 / 32) = 5 segments.
    num_segments, per_segment = plan([1] * 4, [4095] * 4, 32)
    assert num_segments == 5 and per_segment == [26] * 4          # 128 tiles of 32 keys, shared by 5
    assert plan([1] * 4, [4095, 100, 0, 3000], 32) == (5, [26, 1, 1, 19])
    assert plan([1] * 4, [300] * 4, 32)[0] == 1                    # 301 keys: one 256-key segment at most
    assert plan([1] * 4, [600] * 4, 32)[0] == 2
    assert plan([1] * 32, [4095] * 32, 256)[0] == 1                # programs >= SMs: no split
    assert plan([512, 1], [0, 4095], 40)[0] == 1                  # a chunk in the step: no split
    assert plan([1], [10**6], 8)[0] == 17                          # ceil(132 / 8)
    assert plan([1], [10**6], 1)[0] == ta.MAX_SEGMENTS
    # Forced: a count (even sharing) or a fixed size in tokens, any step.
    assert plan([512, 1], [0, 4095], 40, num_kv_splits=4) == (4, [4, 32])
    assert plan([512, 1], [0, 4095], 40, kv_split_size=1024) == (4, [32, 32])


# (query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim, tile_n, split)
SPLIT_CASES = {
    # Segments of 2 tiles of 16 = 32 keys end mid-block (blocks of 48); the short decode's
    # last segments hold no key at all.
    "decodes, segments ending mid-block, empty segments": ([1, 1, 1], [150, 7, 60], 48, 4, 2, 64,
                                                           16, dict(num_kv_splits=5)),
    "decodes, a fixed split size of 64 tokens, GQA 8, d=128": ([1, 1], [200, 30], 16, 8, 1, 128,
                                                               32, dict(kv_split_size=64)),
    # A fixed size splits chunks too: a chunk's early rows see no key in the segments
    # past their position (a row with m = -inf inside a program that computes).
    "mixed step with a fixed split size, d=24": ([40, 1], [20, 90], 8, 4, 2, 24, 16, dict(kv_split_size=32)),
}


@pytest.mark.parametrize("case", SPLIT_CASES.values(), ids=SPLIT_CASES.keys())
def test_split_kv_and_its_merge_agree_with_the_reference_backend(case):
    query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim, tile_n, split = case
    q, k_cache, v_cache, batch = _packed_step(query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch, tile_n=tile_n, **split)
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, batch), atol=ATOL_FLOAT32, rtol=0)


def test_a_decode_only_step_of_few_long_decodes_splits_by_itself_and_merges(monkeypatch):
    launches = []

    class Counting:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            launches.append((self.name, grid))
            return self.kernel[grid]

    monkeypatch.setattr(ta, "attention_tile_kernel", Counting(ta.attention_tile_kernel, "tiles"))
    monkeypatch.setattr(ta, "merge_segments_kernel", Counting(ta.merge_segments_kernel, "merge"))
    q, k_cache, v_cache, batch = _packed_step([1, 1], [700, 520], 16, 4, 2, 32)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch)
    # 2 decodes x 2 KV heads = 4 programs < 132 SMs; 701 keys hold two 256-key segments.
    assert launches == [("tiles", (2, 2, 2)), ("merge", (2, 4))]
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, batch), atol=ATOL_FLOAT32, rtol=0)
    launches.clear()
    ta.triton_paged_attention(q, k_cache, v_cache, batch, num_sms=4)     # as many programs as SMs: no split
    assert launches == [("tiles", (2, 2, 1))]


# ---- refused before launch ---------------------------------------------------------
@pytest.fixture
def no_launch(monkeypatch):
    """Any launch fails the test: what is refused must be refused before the kernel runs."""
    class Refuse:
        def __getitem__(self, grid):
            raise AssertionError(f"a kernel was launched (grid {grid}) for arguments that should be refused")
    monkeypatch.setattr(ta, "attention_tile_kernel", Refuse())
    monkeypatch.setattr(ta, "merge_segments_kernel", Refuse())


def test_float64_and_every_unsupported_dtype_are_refused_by_name_before_launch(no_launch):
    q, k_cache, v_cache, batch = _packed_step([2], [3])
    with pytest.raises(ValueError, match=r"q\.dtype=torch\.float64.*backend='reference'"):
        ta.triton_paged_attention(q.double(), k_cache.double(), v_cache.double(), batch)
    with pytest.raises(ValueError, match=r"k_cache\.dtype=torch\.int8"):
        ta.triton_paged_attention(q, k_cache.to(torch.int8), v_cache, batch)
    with pytest.raises(ValueError, match=r"v_cache\.dtype=torch\.float8_e4m3fn"):
        ta.triton_paged_attention(q, k_cache, v_cache.to(torch.float8_e4m3fn), batch)
    with pytest.raises(ValueError, match="share a dtype.*torch.bfloat16"):
        ta.triton_paged_attention(q, k_cache.bfloat16(), v_cache, batch)
    with pytest.raises(ValueError, match="precision='fast'"):
        ta.triton_paged_attention(q, k_cache, v_cache, batch, precision="fast")


@pytest.mark.parametrize("block_m", [8, 24, 100, 0, -16, 32.0, True])
def test_block_m_must_be_a_power_of_two_of_at_least_16(block_m, no_launch):
    q, k_cache, v_cache, batch = _packed_step([2], [3])
    with pytest.raises(ValueError, match=rf"block_m={block_m!r}: must be a power of two >= 16"):
        ta.triton_paged_attention(q, k_cache, v_cache, batch, block_m=block_m)


@pytest.mark.parametrize("kwargs, says", [
    (dict(tile_n=8), "tile_n=8: must be one of (16, 32, 64)"),
    (dict(tile_n=128), "tile_n=128"),
    (dict(kv_split_size=48), "kv_split_size=48: must be a positive multiple of tile_n=32"),
    (dict(kv_split_size=0), "kv_split_size=0"),
    (dict(num_kv_splits=0), r"num_kv_splits=0: must be an integer in \[1, 64\]"),
    (dict(num_kv_splits=2, kv_split_size=64), "a count or a size, not both"),
])
def test_tile_and_split_arguments_are_checked_by_name(kwargs, says, no_launch):
    q, k_cache, v_cache, batch = _packed_step([2], [3])
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        ta.triton_paged_attention(q, k_cache, v_cache, batch, **kwargs)


def test_every_token_offset_is_an_int64_product():
    """q's, out's, the block table's and the split scratch's offsets are a row index times a
    stride: past 2^31 on long steps. They all go through _offsets, which multiplies in int64
    (in the interpreter as on a GPU an int32 product wraps: 2^20 x 2^12 gives 0)."""
    bodies = "".join(inspect.getsource(f).split('"""', 2)[2]            # the code after the docstring
                     for f in (ta._attention_tile_program, ta._merge_segments_program))
    for stride in ("stride_q_token", "stride_o_token", "stride_table", "num_heads"):
        uses = len(re.findall(rf"\b{stride}\b", bodies))
        through_offsets = len(re.findall(rf"_offsets\([^\n]*?, {stride}\)", bodies))
        assert uses and uses == through_offsets, f"{stride}: {uses} uses, {through_offsets} through _offsets"
    if ta.INTERPRETED:
        @ta.triton.jit
        def probe(index_ptr, out_ptr, stride):
            index = ta.tl.load(index_ptr + ta.tl.arange(0, 2))
            ta.tl.store(out_ptr + ta.tl.arange(0, 2), ta._offsets(index, stride))
        out = torch.zeros(2, dtype=torch.int64)
        probe[(1,)](torch.tensor([1 << 20, 3], dtype=torch.int32), out, 1 << 12)
        assert out.tolist() == [1 << 32, 3 << 12]


# ---- the engine with backend="triton" -------------------------------------------
def _greedy(model, prompts, backend, max_tokens, chunk_size=24, **engine_kwargs):
    # A small pool: the interpreter copies the whole pool's storage back after every launch.
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=chunk_size, max_num_seqs=4),
                       block_size=16, num_blocks=16, backend=backend, **engine_kwargs)
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return [o.output_token_ids for o in outs], engine


def test_engine_greedy_tokens_equal_the_reference_backends_on_tiny_with_one_launch_per_layer(monkeypatch):
    model = minillm.build_model("tiny", seed=0, dtype=torch.float32, device=DEVICE)
    rng = torch.Generator().manual_seed(1)
    system = torch.randint(0, 512, (35,), generator=rng).tolist()
    # chunk_size 24 with blocks of 16: chunks start mid-block; the shared system
    # prompt is served from the prefix cache (whole cached blocks, then a chunk).
    prompts = [system + [7, 8, 9], torch.randint(0, 512, (5,), generator=rng).tolist(), system + [1, 2]]
    expected, _ = _greedy(model, prompts, "reference", 4, enable_prefix_caching=True)
    launches = []
    kernel = ta.attention_tile_kernel

    class CountingKernel:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(ta, "attention_tile_kernel", CountingKernel())
    got, engine = _greedy(model, prompts, "triton", 4, enable_prefix_caching=True)
    assert got == expected
    assert len(launches) == model.cfg.num_layers * len(engine.trace)      # one launch per layer per step
    steps = [[n for _, n in step.scheduled] for step in engine.trace]
    assert any(1 in lens and max(lens) > 1 for lens in steps), f"no step mixed a chunk with decodes: {steps}"


def test_engine_greedy_tokens_equal_the_reference_backends_on_smollm2():
    try:
        model, tok = minillm.pretrained("smollm2-135m-instruct", device=DEVICE)
    except (FileNotFoundError, ImportError, ValueError) as e:
        pytest.skip(f"SmolLM2-135M is not installed here ({e})")
    prompts = [tok.encode("The capital of France is")]
    # Short, as the interpreter is slow (30 layers x 3 steps = 90 launches): chunks of 3
    # tokens, so the second chunk starts mid-block over a cache, then one decode.
    expected, _ = _greedy(model, prompts, "reference", 2, chunk_size=3)
    got, engine = _greedy(model, prompts, "triton", 2, chunk_size=3)
    assert got == expected
    assert [step.scheduled[0][1] for step in engine.trace] == [3, 2, 1]


def test_without_triton_or_with_the_wrong_mode_the_backend_refuses_and_says_why(monkeypatch):
    q, k_cache, v_cache, batch = _packed_step([2], [3])
    monkeypatch.setattr(ta, "INTERPRETED", DEVICE == "cuda")     # the other mode than this process's
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        ta.triton_paged_attention(q, k_cache, v_cache, batch)
    monkeypatch.setattr(ta, "triton", None)
    monkeypatch.setattr(ta, "TRITON_IMPORT_ERROR", "triton is not importable here (no wheel)")
    assert not ta.triton_available()
    with pytest.raises(ValueError, match="backend='triton': triton is not importable here"):
        paged_attention(q, q[:, :2], q[:, :2], k_cache, v_cache, batch, backend="triton")
