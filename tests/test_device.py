"""The engine on the default device (cuda -> mps -> cpu; MINILLM_DEVICE forces
one). On a CPU-only machine these repeat cheap CPU checks; `make gpu-check`
runs them with MINILLM_DEVICE=cuda, where they are the GPU's correctness proof."""
import pytest
import torch

import minillm
from minillm import SamplingParams, SchedulerConfig
from minillm.attention import flash_available

DEVICE = minillm.default_device()
PROMPT = torch.randint(0, 500, (300,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.fixture(scope="module")
def model32():
    return minillm.build_model("tiny", seed=0, dtype=torch.float32, device=DEVICE)


def test_logits_on_the_device_match_the_cpu(model32):
    cpu = minillm.build_model("tiny", seed=0, dtype=torch.float64, device="cpu")
    _, expected = minillm.prefill_kv(cpu, PROMPT)
    _, got = minillm.prefill_kv(model32, PROMPT, chunk_size=64)
    # TF32 or reduced-precision GEMMs on a GPU stay within this bound
    assert (got.double().cpu() - expected).abs().max() < 2e-2 * expected.abs().max()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_chunked_equals_full_on_the_device(dtype, tolerance):
    if dtype == torch.bfloat16 and DEVICE.type == "mps":
        pytest.skip("bf16 on mps is not supported by every op")
    model = minillm.build_model("tiny", seed=0, dtype=dtype, device=DEVICE)
    kv_full, _ = minillm.prefill_kv(model, PROMPT)
    for chunk_size in (1, 37, 128):
        kv, _ = minillm.prefill_kv(model, PROMPT[:150] if chunk_size == 1 else PROMPT, chunk_size=chunk_size)
        ref = kv_full[:, :, :kv.shape[2]].float()
        assert (kv.float() - ref).abs().max() <= tolerance * ref.abs().max()


def test_engine_serves_a_mixed_batch_on_the_device(model32):
    engine = minillm.LLMEngine(model32, SchedulerConfig(policy="chunked", chunk_size=64))
    prompts = [PROMPT[:n] for n in (5, 90, 300)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert all(len(o.output_token_ids) == 8 for o in outs)
    mixed = [r for r in engine.trace if r.num_prefill_tokens and r.num_decode_tokens]
    assert mixed, "some step should mix a prefill chunk with decodes"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.skipif(not flash_available(), reason="flash-attn is not installed or no CUDA device")
def test_flash_backend_matches_sdpa_on_a_paged_cache():
    model = minillm.build_model("tiny", seed=0, dtype=torch.bfloat16, device="cuda")
    _, ref = minillm.prefill_kv(model, PROMPT, chunk_size=100, block_size=256, backend="sdpa")
    _, got = minillm.prefill_kv(model, PROMPT, chunk_size=100, block_size=256, backend="flash")
    assert (got.float() - ref.float()).abs().max() <= 3e-2 * ref.float().abs().max()
    engine = minillm.LLMEngine(model, SchedulerConfig(chunk_size=128), block_size=256, backend="flash")
    outs = engine.generate([PROMPT[:40], PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))
    assert all(len(o.output_token_ids) == 4 for o in outs)
