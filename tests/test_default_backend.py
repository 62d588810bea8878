"""attention.default_backend: no code path that has never run on the device is the default.

The rule (README, GPU notes): on CUDA "flash" where flash-attn imports, the dtype is
16-bit and the blocks are flash-attn's (multiples of 256), else "sdpa"; on a CPU "sdpa";
"triton" is opt-in until `make gpu-check` has passed on a GPU. No GPU is needed here:
a torch.device("cuda") is only a name, and flash-attn's import is faked both ways.
"""
import inspect
import re
from pathlib import Path

import pytest
import torch

from minillm import attention
from minillm.attention import AttentionBatch, default_backend, paged_attention
from minillm.kv_cache import BlockManager

ROOT = Path(__file__).resolve().parents[1]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@pytest.fixture(params=[True, False], ids=["flash-attn imports", "no flash-attn"])
def flash_imports(request, monkeypatch):
    monkeypatch.setattr(attention, "_flash_attn_imports", lambda: request.param)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)     # CUDA, faked
    return request.param


def test_on_cuda_flash_only_where_it_imports_with_16_bit_dtypes_and_its_block_sizes(flash_imports):
    for dtype in DTYPES:
        for block_size in (16, 48, 256, 512, None):
            got = default_backend("cuda", dtype, block_size)
            takes_flash = (flash_imports and dtype in (torch.float16, torch.bfloat16)
                           and block_size is not None and block_size % 256 == 0)
            assert got == ("flash" if takes_flash else "sdpa"), (dtype, block_size)
    assert default_backend(torch.device("cuda", 0), torch.bfloat16, 256) == ("flash" if flash_imports else "sdpa")


def test_triton_is_never_the_default_and_a_cpu_always_gets_sdpa(flash_imports):
    for device in ("cpu", "cuda", "meta"):
        for dtype in DTYPES:
            for block_size in (16, 256):
                backend = default_backend(device, dtype, block_size)
                assert backend != "triton"
                if device != "cuda":
                    assert backend == "sdpa"


def test_paged_attention_defaults_to_default_backend_of_its_step(monkeypatch):
    """paged_attention's own default is None (its docstring's), resolved from q's device and
    dtype and the step's block size."""
    assert inspect.signature(paged_attention).parameters["backend"].default is None
    calls = []

    def recording(device, dtype=None, block_size=None):
        calls.append((torch.device(device).type, dtype, block_size))
        return "reference"
    monkeypatch.setattr(attention, "default_backend", recording)
    manager = BlockManager(4, 8)
    manager.allocate(0, 5)
    batch = AttentionBatch([5], [0], [manager.block_tables[0]], 8, torch.tensor(manager.slot_mapping(0, 0, 5)))
    q = torch.randn(5, 2, 4, dtype=torch.float64)
    k_new, v_new = torch.randn(5, 1, 4, dtype=torch.float64), torch.randn(5, 1, 4, dtype=torch.float64)
    cache = torch.zeros(4, 8, 1, 4, dtype=torch.float64)
    out = paged_attention(q, k_new, v_new, cache, cache.clone(), batch)
    assert calls == [("cpu", torch.float64, 8)]
    assert out.shape == q.shape


def test_the_rule_is_written_where_a_reader_looks():
    """README's GPU notes, the model's backend comment and the docstrings say the same."""
    readme = (ROOT / "README.md").read_text()
    gpu_notes = readme.split("## GPU notes", 1)[1].split("\n## ", 1)[0]
    assert "opt-in" in gpu_notes and "make gpu-check" in gpu_notes
    assert re.search(r'"flash".*flash-attn imports.*16-bit.*256.*"sdpa"', " ".join(gpu_notes.split()))
    model_source = (ROOT / "minillm" / "model.py").read_text()
    assert "opt-in until `make gpu-check`" in " ".join(line.strip("# ") for line in model_source.splitlines())
    assert "never picked" in default_backend.__doc__ and "None (the default)" in paged_attention.__doc__
