"""What every benchmark shares: the model shapes it runs on, a timer that waits
for the device, and the table printer (bench.py and the chapter benches use them).
"""
from __future__ import annotations

import dataclasses
import time

import torch

from ..config import ModelConfig
from ..device import default_device
from ..loader import build_model


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """columns: (key, header, format). Each column is as wide as its widest
    cell; text is aligned left, numbers right."""
    cells = [[value if isinstance(value, str) else format(value, fmt)
              for value, fmt in ((row[key], fmt) for key, _, fmt in columns)] for row in rows]
    widths = [max([len(h), 9] + [len(line[i]) for line in cells]) for i, (_, h, _) in enumerate(columns)]
    text = [all(isinstance(row[key], str) for row in rows) for key, _, _ in columns]
    align = ["<" if is_text else ">" for is_text in text]
    header = " ".join(f"{h:{a}{w}}" for (_, h, _), a, w in zip(columns, align, widths))
    lines = [header, "-" * len(header)]
    lines += [" ".join(f"{c:{a}{w}}" for c, a, w in zip(line, align, widths)) for line in cells]
    return "\n".join(lines)


# The speed targets hold on every Llama shape, not one preset: the built-in
# tiny model (8 query heads sharing 2 KV heads, head_dim 64) and two others
# with other head counts and GQA ratios.
BENCH_SHAPES = {
    "tiny": {},
    "gqa2": dict(hidden_size=256, intermediate_size=768, num_heads=8, num_kv_heads=4, head_dim=32),
    "mha": dict(hidden_size=384, intermediate_size=1024, num_heads=6, num_kv_heads=6, head_dim=64),
}


# A real model too, for what chunking costs at its size (not in --shape all:
# 30 layers make every race ~10x longer).
REAL_MODEL = "smollm2"


def bench_model(shape: str = "tiny", device=None):
    """A seeded float32 model of one of BENCH_SHAPES, or SmolLM2-135M ("smollm2")."""
    if shape == REAL_MODEL:
        from .. import pretrained
        return pretrained("smollm2-135m-instruct", dtype=torch.float32, device=device)[0]
    if shape not in BENCH_SHAPES:
        raise ValueError(f"shape={shape!r}: must be one of {sorted(BENCH_SHAPES) + [REAL_MODEL]}")
    cfg = dataclasses.replace(ModelConfig.preset("tiny"), name=shape, **BENCH_SHAPES[shape])
    return build_model(cfg, seed=0, dtype=torch.float32, device=device or default_device())


def _seconds(run) -> float:
    t0 = time.perf_counter()
    run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0
