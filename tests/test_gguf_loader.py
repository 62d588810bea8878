"""gguf_loader.py on small GGUF files written here: every supported type,
llama.cpp's Q/K row order undone, and bad files refused whole."""
import copy

import numpy as np
import pytest
import torch

import minillm
from minillm import gguf_loader
from minillm.prefill import prefill_kv

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from conftest import make_hf_model  # noqa: E402

OUR_TO_GGUF = {v: k for k, v in gguf_loader._LAYER_NAMES.items()}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q and K rows (pairs interleaved)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(ours: str) -> str:
    globals_ = {v: k for k, v in gguf_loader._GLOBAL_NAMES.items()}
    if ours in globals_:
        return globals_[ours]
    _, _, layer, *kind, last = ours.split(".")     # model.layers.{i}.self_attn.q_proj.weight
    return f"blk.{layer}.{OUR_TO_GGUF['.'.join(kind)]}.{last}"


def write_gguf(path, hf, qtype=Q.F32, arch="llama", odd_type_for=None):
    """hf's weights as a llama.cpp-style GGUF; matrices stored as `qtype`."""
    cfg = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    for name, tensor in hf.state_dict().items():
        w = tensor.float().numpy()
        if "q_proj" in name:
            w = llama_cpp_permute(w, cfg.num_attention_heads)
        elif "k_proj" in name:
            w = llama_cpp_permute(w, cfg.num_key_value_heads)
        kind = odd_type_for.get(name, qtype) if odd_type_for else qtype
        if w.ndim == 1 or kind == Q.F32:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(w))
        elif kind == Q.F16:
            writer.add_tensor(gguf_name(name), w.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def round_trip(hf, qtype):
    """hf with every matrix quantized to qtype and back (what the file holds)."""
    hf = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 2 and qtype != Q.F32:
                w = p.numpy()
                stored = w.astype(np.float16).astype(np.float32) if qtype == Q.F16 else \
                    gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
                p.copy_(torch.from_numpy(np.array(stored)))
    return hf


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_a_gguf_file_loads_to_the_same_logits_as_transformers(tmp_path, qtype):
    hf = make_hf_model("llama")
    path = write_gguf(tmp_path / "m.gguf", hf, qtype)
    model = minillm.load_gguf(path, dtype=torch.float32, device="cpu")
    reference = round_trip(hf, qtype)
    ids = torch.arange(3, 40) % hf.config.vocab_size
    _, ours = prefill_kv(model, ids.tolist())
    theirs = reference(ids[None]).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_without_undoing_the_rope_permutation_the_logits_differ(tmp_path, monkeypatch):
    hf = make_hf_model("llama")
    path = write_gguf(tmp_path / "m.gguf", hf)
    monkeypatch.setattr(gguf_loader, "unpermute_rope_rows", lambda w, n: w)
    model = minillm.load_gguf(path, dtype=torch.float32, device="cpu")
    _, ours = prefill_kv(model, list(range(3, 40)))
    theirs = hf(torch.arange(3, 40)[None]).logits[0]
    assert (ours - theirs).abs().max() > 1e-2


def test_unpermute_inverts_llama_cpps_permutation():
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    back = gguf_loader.unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(w, 3)), 3)
    assert torch.equal(back, torch.from_numpy(w))


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ValueError, match=r"weights\.bin.*not a GGUF file"):
        minillm.load_gguf(path)
    with pytest.raises(ValueError, match="no such file"):
        minillm.load_gguf(tmp_path / "missing.gguf")


@pytest.mark.parametrize("keep", [0.3, 0.97])     # cut in the header, cut in the tensors
def test_a_truncated_file_is_refused_by_name(tmp_path, keep):
    data = write_gguf(tmp_path / "m.gguf", make_hf_model("llama")).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"cut\.gguf.*(truncated|unreadable)"):
        minillm.load_gguf(cut)


def test_another_architecture_is_refused_by_name(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", make_hf_model("llama"), arch="gpt2")
    with pytest.raises(ValueError, match=r"m\.gguf.*general\.architecture='gpt2'.*llama"):
        minillm.load_gguf(path)


def test_an_unsupported_quant_type_is_refused_before_anything_is_dequantized(tmp_path, monkeypatch):
    hf = make_hf_model("llama")    # Q5_0: a real llama.cpp type minillm does not dequantize
    path = write_gguf(tmp_path / "m.gguf", hf, odd_type_for={"model.layers.1.mlp.down_proj.weight": Q.Q5_0})
    calls = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda *a: calls.append(a) or real(*a))
    with pytest.raises(ValueError, match=r"m\.gguf.*'blk\.1\.ffn_down\.weight'.*Q5_0.*Q4_1"):
        minillm.load_gguf(path)
    assert calls == []


def test_a_reinstall_removes_the_caches_of_older_installs_only(tmp_path):
    from minillm.pretrained_models import remove_older_caches

    def folder(name):
        (tmp_path / name).mkdir()
        (tmp_path / name / "done").write_text("ok")
        return tmp_path / name

    older = folder("smollm2-135m-instruct-98362432-100-v1")
    current = folder("smollm2-135m-instruct-98362432-200-v1")
    newer = folder("smollm2-135m-instruct-98362432-300-v1")         # another environment, newer install
    other_model = folder("qwen-0.5b-5000-50-v1")
    staging = folder("smollm2-135m-instruct-98362432-150-v1.tmp4242")  # another process writing
    assert remove_older_caches(current) == [older]
    assert not older.exists()
    assert all(p.exists() for p in (current, newer, other_model, staging))


def test_models_and_calibrations_share_one_cache_folder_named_by_one_variable(monkeypatch, tmp_path):
    from minillm.pretrained_models import cache_root
    from minillm.sim import hardware

    monkeypatch.delenv("MINILLM_CACHE", raising=False)
    monkeypatch.setenv("MINILLM_CACHE_DIR", str(tmp_path / "a"))
    assert cache_root() == hardware.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("MINILLM_CACHE_DIR")
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "b"))              # the model cache's older name
    assert cache_root() == hardware.cache_dir() == tmp_path / "b"
