"""Teacher-only cases for chapter 5's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker. hidden_check_*: the reference answers
(_reference/ch05.py) on shapes and GPUs the public checkers do not try.
"""
from __future__ import annotations

from ...config import ModelConfig, PRESETS
from .._common import call_text, fail, learner_call
from .._reference import ch05 as ref
from ..ch05 import _ACCOUNTING, _close_enough

HIDDEN = {
    "check_layer_flops": [dict(seed=39_501), dict(seed=39_502)],
    "check_decodes_to_ridge": [dict(seed=39_511), dict(seed=39_512)],
    "check_chunk_for_tiles": [dict(seed=39_521)],
}

_QWEN_1_5B = ModelConfig(name="qwen2.5-1.5b", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_layers=28, num_heads=12, num_kv_heads=2, tie_word_embeddings=True)


def hidden_check_layer_flops(fn) -> None:
    """Long contexts with Mistral's and Gemma-like windows, a head_dim apart from hidden / heads."""
    for cfg, n, c, window in ((PRESETS["mistral-7b"], 2048, 30_000, 4096), (_QWEN_1_5B, 1, 100_000, 1024),
                              (PRESETS["qwen3-0.6b"], 4096, 0, 512), (PRESETS["llama-3-8b"], 3000, 500, None)):
        args = (cfg, n, c) + (() if window is None else (window,))
        got = learner_call(fn, *args, forbidden=_ACCOUNTING)
        want = ref.window_layer_flops(cfg, n, c, window)
        if got != want:
            fail(f"{call_text(fn, *args)} returned {got!r}, expected {want:,}")


def hidden_check_decodes_to_ridge(fn) -> None:
    """Other models, contexts and ridge points (an H200, a CPU), fp8 and fp32 caches."""
    for cfg, context_len, ridge, dtype_bytes in ((_QWEN_1_5B, 256, 206.04, 2), (PRESETS["llama-3-8b"], 700, 153.0, 2),
                                                 (PRESETS["llama-3-8b"], 2048, 60.0, 1), (PRESETS["tiny"], 64, 8.5, 4)):
        got = learner_call(fn, cfg, context_len, ridge, dtype_bytes, forbidden=_ACCOUNTING)
        want = ref.decodes_to_ridge(cfg, context_len, ridge, dtype_bytes)
        if not _close_enough(got, want):
            fail(f"{call_text(fn, cfg, context_len, ridge, dtype_bytes)} returned {got!r}, expected {want!r}")


def hidden_check_chunk_for_tiles(fn) -> None:
    """Large chunks and tiles, nearly full last tiles."""
    for args in ((16, 8190, 256), (255, 8192, 256), (1, 127, 64), (60, 4000, 128), (3, 4093, 128)):
        got = learner_call(fn, *args, forbidden=_ACCOUNTING)
        if got != ref.chunk_for_tiles(*args):
            fail(f"{call_text(fn, *args)} returned {got!r}, expected {ref.chunk_for_tiles(*args)}")
