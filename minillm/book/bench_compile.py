"""`bench compile-probe`: is a step's fixed price eager PyTorch's, or the weight read?

A one-token step of a small model on a CPU costs a few milliseconds whatever
the engine does around the operators. Two readings of that price: the Python
and dispatch overhead of eager PyTorch (some 80 operators a layer launched one
by one), which a compiler removes; or the time to stream every weight from
memory once, which no compiler removes. This probe tests both:

* a piecewise `torch.compile` (inductor) of every decoder layer: the part
  before attention (norm, Q/K/V projections, RoPE) and the part after it
  (output projection, residual, norm, MLP) compiled, attention itself left
  eager, as vLLM's piecewise compilation leaves it; eager and compiled steps
  of 1 to 2048 rows timed in alternation (medians), outputs compared;
* the weight bytes a step reads (every matmul weight and the LM head; not the
  input embedding, of which a step gathers a few rows), the eager one-token
  step on one thread, and this machine's rate of reading a matrix of the
  same size on one thread (a matrix-vector product, memory-bound).

If compiling gains nothing and the one-token step takes about as long as
reading its weights at the machine's rate, the fixed price is the weight read.

Everything runs on one thread and is timed twice: wall clock, and the CPU
time the process used (`time.process_time`). On a shared machine other
processes stretch the wall clock of a step by however long they hold the
core, not its CPU time, so the CPU-time figures are the ones to compare there.
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
from torch import nn

from ..attention import paged_attention
from ..model import apply_rope
from .bench_common import bench_model

DEFAULT_ROWS = (1, 64, 256, 2048)


def _timed(run, repeats: int) -> dict:
    """Median wall and CPU seconds of `run` (each repeat timed both ways at once)."""
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        run()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}


class _PiecewiseLayer(nn.Module):
    """A decoder layer whose two attention-free parts are compiled, attention eager."""

    def __init__(self, layer: nn.Module, backend: str = "inductor"):
        super().__init__()
        self.layer = layer
        self.before = torch.compile(self._before, dynamic=True, backend=backend)
        self.after = torch.compile(self._after, dynamic=True, backend=backend)

    def _before(self, x, cos, sin):
        attn, cfg, T = self.layer.self_attn, self.layer.self_attn.cfg, x.shape[0]
        h = self.layer.input_layernorm(x)
        q = attn.q_proj(h).view(T, cfg.num_heads, cfg.head_dim)            # [T, Hq, D]
        k = attn.k_proj(h).view(T, cfg.num_kv_heads, cfg.head_dim)         # [T, Hkv, D]
        v = attn.v_proj(h).view(T, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _after(self, x, attention_out):
        attn = self.layer.self_attn
        x = x + attn.o_proj(attention_out.reshape(x.shape[0], attn.cfg.q_size))
        return x + self.layer.mlp(self.layer.post_attention_layernorm(x))

    def forward(self, x, cos, sin, batch, k_cache, v_cache, backend, prefixes=None, batch_invariant=False):
        if batch_invariant:     # the compiled pieces run torch's own linear layers, not the mode's tiles
            raise ValueError("batch_invariant=True: the compile probe measures the default step only")
        q, k, v = self.before(x, cos, sin)
        out = paged_attention(q, k, v, k_cache, v_cache, batch, backend, prefixes)   # eager
        return self.after(x, out)


def piecewise_compiled(model, backend: str = "inductor"):
    """A copy of `model` whose layers run compiled around eager attention
    (backend="eager" traces without generating code: a quick check of the split)."""
    compiled = copy.deepcopy(model)
    compiled.model.layers = nn.ModuleList(_PiecewiseLayer(layer, backend) for layer in compiled.model.layers)
    return compiled


def weight_read_bytes(model) -> int:
    """Bytes of the weights one step reads: every parameter but the input
    embedding table (a step gathers one row per token), the LM head included."""
    embedding = model.model.embed_tokens.weight
    head = model.lm_head_weight()
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)
    if head is embedding:                       # tied: the head reads the table in full
        total += head.numel() * head.element_size()
    return total


def weight_stream(num_bytes: int):
    """A zero-argument function that streams a float32 matrix of about
    num_bytes through a matrix-vector product (2 FLOPs per 4-byte element:
    memory-bound): the machine's weight-read rate, with no model around it."""
    cols = 1024
    matrix = torch.randn(max(1, num_bytes // 4 // cols), cols)
    vector = torch.randn(cols)
    torch.mv(matrix, vector)                    # warm-up: pages touched
    return lambda: torch.mv(matrix, vector)


def bench_compile_probe(shape: str = "tiny", rows=DEFAULT_ROWS, repeats: int = 7, device=None) -> dict:
    """Eager against piecewise-compiled steps of `rows` new tokens, and the
    one-token step against the weight read, all on one thread."""
    rows = tuple(int(n) for n in rows)
    if not rows or min(rows) < 1:
        raise ValueError(f"rows={rows!r}: need one or more step sizes of at least 1 token, e.g. (1, 64, 256)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be a positive int (try 7)")
    model = bench_model(shape, device=device)
    compiled = piecewise_compiled(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                    # one thread: CPU time is the step's own work
    try:
        return _probe(model, compiled, shape, rows, repeats)
    finally:
        torch.set_num_threads(threads)


def _probe(model, compiled, shape, rows, repeats) -> dict:
    from ..prefill import prepare_step

    result = {"shape": shape, "device": str(model.device), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "rows": {}}
    t0 = time.perf_counter()
    for n in rows:                              # compile (and check) before timing anything
        with torch.no_grad():
            eager_logits, compiled_logits = prepare_step(model, [(n, 0)])(), prepare_step(compiled, [(n, 0)])()
        result.setdefault("max_abs_logit_diff", 0.0)
        result["max_abs_logit_diff"] = max(result["max_abs_logit_diff"],
                                           (eager_logits - compiled_logits).abs().max().item())
    result["compile_s"] = time.perf_counter() - t0
    for n in rows:
        steps = {"eager": prepare_step(model, [(n, 0)]), "compiled": prepare_step(compiled, [(n, 0)])}
        times = {name: {"wall": [], "cpu": []} for name in steps}
        with torch.no_grad():
            for step in steps.values():
                step()                          # warm-up
            for _ in range(repeats):            # alternate: load hits both sides alike
                for name, step in steps.items():
                    t = _timed(step, 1)
                    times[name]["wall"].append(t["wall_s"])
                    times[name]["cpu"].append(t["cpu_s"])
        med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
        result["rows"][n] = {"eager_s": med["eager"]["wall"], "compiled_s": med["compiled"]["wall"],
                             "eager_cpu_s": med["eager"]["cpu"], "compiled_cpu_s": med["compiled"]["cpu"],
                             "compiled_over_eager": med["compiled"]["wall"] / med["eager"]["wall"],
                             "compiled_over_eager_cpu": med["compiled"]["cpu"] / med["eager"]["cpu"]}
    # The one-token step against the weight read, in alternation.
    weight_bytes = weight_read_bytes(model)
    one_token, read = prepare_step(model, [(1, 0)]), weight_stream(weight_bytes)
    with torch.no_grad():
        one_token()
        step_t, read_t = {"wall_s": [], "cpu_s": []}, {"wall_s": [], "cpu_s": []}
        for _ in range(max(repeats, 9)):
            for target, run in ((step_t, one_token), (read_t, read)):
                t = _timed(run, 5)
                target["wall_s"].append(t["wall_s"])
                target["cpu_s"].append(t["cpu_s"])
    step_s = {k: statistics.median(v) for k, v in step_t.items()}
    read_s = {k: statistics.median(v) for k, v in read_t.items()}
    result.update(weight_bytes=weight_bytes, one_token_s=step_s["wall_s"], one_token_cpu_s=step_s["cpu_s"],
                  weight_read_s=read_s["wall_s"], weight_read_cpu_s=read_s["cpu_s"],
                  read_rate_cpu_bytes_s=weight_bytes / read_s["cpu_s"],
                  one_token_cpu_bytes_s=weight_bytes / step_s["cpu_s"])
    return result


def report(r: dict) -> str:
    lines = [f"eager against piecewise torch.compile (inductor; attention eager), {r['shape']} on {r['device']}, "
             f"{r['threads']} thread, torch {r['torch']} (compiling took {r['compile_s']:.0f} s; logits "
             f"differ by at most {r['max_abs_logit_diff']:.1e}); medians, CPU time (wall clock)"]
    for n, t in r["rows"].items():
        lines.append(f"  {n:5d} rows: eager {t['eager_cpu_s'] * 1e3:8.2f} ms ({t['eager_s'] * 1e3:.2f}), compiled "
                     f"{t['compiled_cpu_s'] * 1e3:8.2f} ms ({t['compiled_s'] * 1e3:.2f}): "
                     f"x{t['compiled_over_eager_cpu']:.2f} (x{t['compiled_over_eager']:.2f})")
    lines.append(f"a one-token step: {r['one_token_cpu_s'] * 1e3:.2f} ms ({r['one_token_s'] * 1e3:.2f}) for "
                 f"{r['weight_bytes'] / 1e6:.1f} MB of weights, {r['one_token_cpu_bytes_s'] / 1e9:.1f} GB/s; "
                 f"a matrix-vector product over as many bytes: {r['weight_read_cpu_s'] * 1e3:.2f} ms "
                 f"({r['weight_read_s'] * 1e3:.2f}), {r['read_rate_cpu_bytes_s'] / 1e9:.1f} GB/s: the weight read "
                 f"is {r['weight_read_cpu_s'] / r['one_token_cpu_s']:.0%} of the step")
    return "\n".join(lines)
