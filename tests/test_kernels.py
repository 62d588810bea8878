"""The compiled CPU paged-decode kernel (minillm/kernels): against the reference, and in the engine."""
import numpy as np
import pytest
import torch

from minillm import attention, kernels
from minillm.attention import AttentionBatch, paged_attention, reference_attention

needs_kernel = pytest.mark.skipif(not kernels.paged_decode_available(),
                                  reason="the CPU paged-decode kernel is not built (python -m minillm.kernels build)")


def _paged(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
    """Random caches with each request's blocks scattered through the pool."""
    g = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 5
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g, dtype=dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g, dtype=dtype)
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables, start = [], 0
    for w in widths:
        tables.append(order[start:start + w])
        start += w
    q = torch.randn(len(lens), num_heads, head_dim, generator=g, dtype=dtype)
    return q, k_cache, v_cache, tables


def _table_tensor(tables):
    out = torch.zeros(len(tables), max(map(len, tables)), dtype=torch.long)
    for i, t in enumerate(tables):
        out[i, :len(t)] = torch.tensor(t)
    return out


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
# head_dim 16, 32, 64, 80 and 128 in float32 take the AVX-512 scoring where the CPU has it; 8 and
# float64 the plain loop; 32, 64 and 128 the fixed-size value sums; lengths cross 16-token groups.
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim",
                         [(4, 4, 8), (8, 2, 64), (9, 3, 32), (8, 1, 16), (6, 3, 80), (4, 2, 128)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_decode_equals_the_reference_on_scattered_blocks(dtype, tol, num_heads, num_kv_heads, head_dim,
                                                               block_size):
    lens = [1, 5, 16, 17, 40, 3, 301]
    q, k_cache, v_cache, tables = _paged(lens, num_heads, num_kv_heads, head_dim, block_size, dtype)
    out = kernels.paged_decode(q, k_cache, v_cache, _table_tensor(tables), torch.tensor(lens), head_dim ** -0.5)
    for b, n in enumerate(lens):
        k = k_cache[tables[b]].flatten(0, 1)[:n]
        v = v_cache[tables[b]].flatten(0, 1)[:n]
        torch.testing.assert_close(out[b:b + 1], reference_attention(q[b:b + 1], k, v), atol=tol, rtol=0)


@needs_kernel
def test_paged_decode_refuses_a_table_or_length_that_would_read_outside_the_cache():
    q, k_cache, v_cache, tables = _paged([5, 9], 4, 2, 8, 4, torch.float32)
    table = _table_tensor(tables)
    with pytest.raises(RuntimeError, match="seq_lens"):
        kernels.paged_decode(q, k_cache, v_cache, table, torch.tensor([5, 99]), 1.0)
    bad = table.clone()
    bad[1, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="block_tables"):
        kernels.paged_decode(q, k_cache, v_cache, bad, torch.tensor([5, 9]), 1.0)


@needs_kernel
def test_the_engine_sends_cpu_decodes_to_the_kernel_and_nothing_to_the_fused_attention(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "_fused_attention", lambda *a, **k: calls.append(a) or None)
    q, k_cache, v_cache, tables = _paged([6, 11], 4, 2, 8, 4, torch.float64)
    batch = AttentionBatch(query_lens=[1, 1], cached_lens=[5, 10], block_tables=tables, block_size=4,
                           slot_mapping=torch.tensor([tables[0][1] * 4 + 1, tables[1][2] * 4 + 2]))
    k_new, v_new = k_cache.flatten(0, 1)[batch.slot_mapping], v_cache.flatten(0, 1)[batch.slot_mapping]
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, batch, "sdpa")
    assert calls == [] and attention.uses_paged_decode_kernel(q)
    assert not attention.uses_paged_decode_kernel(q.to(torch.bfloat16))     # bf16: the gather path
    for b, n in enumerate([6, 11]):
        k, v = k_cache[tables[b]].flatten(0, 1)[:n], v_cache[tables[b]].flatten(0, 1)[:n]
        torch.testing.assert_close(out[b:b + 1], reference_attention(q[b:b + 1], k, v), atol=1e-10, rtol=0)


@needs_kernel
def test_engine_outputs_are_the_same_with_the_kernel_and_with_the_gather(monkeypatch):
    import minillm
    from minillm.loader import build_model

    model = build_model(minillm.ModelConfig.preset("tiny"), seed=0, dtype=torch.float64)
    prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate([5, 40, 17, 90])]
    params = minillm.SamplingParams(max_tokens=12, ignore_eos=True)

    def run():
        engine = minillm.LLMEngine(model, minillm.SchedulerConfig(policy="chunked", chunk_size=32))
        return [o.output_token_ids for o in engine.generate(prompts, params)]

    with_kernel = run()
    monkeypatch.setattr(kernels, "paged_decode_available", lambda: False)
    assert run() == with_kernel


def test_without_the_built_library_the_engine_gathers(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(kernels, "_loaded", None)
    assert not kernels.paged_decode_available()
    assert not attention.uses_paged_decode_kernel(torch.zeros(1, 2, 4))


def test_the_library_is_named_after_its_source(monkeypatch, tmp_path):
    source = tmp_path / "paged_decode.cpp"
    source.write_text("// one")
    monkeypatch.setattr(kernels, "SOURCE", source)
    first = kernels.library_path()
    source.write_text("// two")
    assert kernels.library_path() != first        # an edited kernel is never loaded from an old build


def test_the_library_is_named_after_its_build_flags_too(monkeypatch):
    first = kernels.library_path()
    monkeypatch.setattr(kernels, "BUILD_ATTEMPTS", [(["-O2"], [])])
    assert kernels.library_path() != first        # other flags, another library


@needs_kernel
def test_loading_the_kernel_leaves_tiny_floats_alone():
    # Compiled with -ffast-math but not linked with it: no flush-to-zero for
    # the rest of the process (numpy, torch, the learner's code).
    assert kernels.paged_decode_available()
    assert (torch.tensor([1e-39], dtype=torch.float32) * 0.5).item() > 0
    assert np.float32(1e-39) * np.float32(0.5) > 0


def test_build_falls_back_to_plain_flags_where_the_compiler_has_no_openmp(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as cpp_extension

    calls = []

    def fake_load(name, sources, extra_cflags, extra_ldflags, build_directory, **_):
        calls.append(extra_cflags)
        if "-fopenmp" in extra_cflags:
            raise RuntimeError("clang: error: unsupported option '-fopenmp'")
        (tmp_path / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    (tmp_path / "minillm_paged_decode_000000000000.so").write_bytes(b"")      # an older build
    path = kernels.build()
    assert calls == [["-O3", "-march=native", "-fopenmp", "-ffast-math"], ["-O3", "-ffast-math"]]
    assert path.exists() and [p.name for p in tmp_path.glob("*.so")] == [path.name]
    assert kernels.build() == path and len(calls) == 2                    # built: nothing to do
