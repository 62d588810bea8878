"""Chapter 12's lab: speculative decoding inside the token budget, on the simulator.

Every number here comes from `simulate()` (the engine's own scheduler on a
virtual clock, the cost model's step times) with a SpeculativeConfig: each
stream drafts k tokens per step, each accepted with probability alpha until
the first rejection. What the lab shows:

  expected tokens per verification   (1 - alpha^(k+1)) / (1 - alpha), against k
  the trade-off                      the streams' TPOT falls with k; a long
                                     prompt's TTFT rises, because its chunk gets
                                     budget - n(1 + k) tokens (vLLM V1's order)
  starvation                         n(1 + k) near the budget: the chunk shrinks
                                     to nothing and the prompt waits for the streams

Figures are pure functions of their rows (as in figures.py); `spec_lab()` only
wires sliders to `spec_lab_figure`.
"""
from __future__ import annotations

import functools
import math

import matplotlib.pyplot as plt

from ..scheduler import SchedulerConfig
from ..sim.simulator import simulate
from ..sim.workloads import long_prompt_interference
from ..speculative import DRAFT_BUDGETS, SpeculativeConfig, expected_tokens_per_verification
from ..validation import check_choice, check_int, check_real

LAB_MODEL, LAB_GPU = "llama-3-8b", "H100-SXM"


def _figure(figsize=(7.0, 3.2), ncols: int = 1):
    fig, axes = plt.subplots(1, ncols, figsize=figsize, layout="constrained")
    plt.close(fig)
    return fig, axes


def _axes(ax):
    """(figure, axes): a fresh closed figure, or the one that owns ax."""
    return _figure() if ax is None else (ax.figure, ax)


def _by_budget(rows):
    """(budget, that budget's rows sorted by k), budgets in increasing order."""
    for budget in sorted({r["token_budget"] for r in rows}):
        yield budget, sorted((r for r in rows if r["token_budget"] == budget), key=lambda r: r["k"])


@functools.lru_cache(maxsize=512)
def spec_run(k: int, token_budget: int, alpha: float, num_streams: int = 8, prompt_len: int = 4096,
             draft_budget: str = "drafts_first", model: str = LAB_MODEL, hardware: str = LAB_GPU,
             seed: int = 0, stream_tokens: int | None = None) -> dict:
    """One simulation of the interference scenario with speculation: num_streams
    decoding when a prompt_len prompt arrives; token_budget = chunk_size (as
    `--max-num-batched-tokens` sets both); stream_tokens: each stream's output (None:
    the workload's default, long enough to outlast a prefill in 16-token chunks). The
    long prompt's TTFT and chunk sizes (long_chunks: the steps that gave it a chunk;
    steps_before_first_chunk: the steps after its arrival that gave it none), the
    streams' TPOT and ITL, the acceptance seen."""
    k = check_int("k", k, 0)
    token_budget = check_int("token_budget", token_budget, 1)
    alpha = check_real("alpha", alpha, 0, 1)
    check_choice("draft_budget", draft_budget, DRAFT_BUDGETS)
    workload = long_prompt_interference(prompt_len=prompt_len, num_decoders=num_streams,
                                        decoder_output_len=stream_tokens)
    sched = SchedulerConfig(chunk_size=token_budget, token_budget=token_budget, max_num_seqs=max(num_streams + 1, 2))
    spec = SpeculativeConfig(num_speculative_tokens=k, draft_budget=draft_budget) if k else None
    res = simulate(workload, sched, model=model, hardware=hardware, speculative=spec, acceptance_rate=alpha,
                   spec_seed=seed)
    summary = res.summary()
    long_id = next(o.request_id for o in res.outputs if o.tag == "long")
    long_out = next(o for o in res.outputs if o.tag == "long")
    chunks, steps_before_first_chunk = [], 0
    for record in res.trace:
        n = dict(record.scheduled).get(long_id)
        if n is not None and len(chunks) < 10_000:
            chunks.append(n)
        elif not chunks and record.start >= long_out.metrics.arrival_time:
            steps_before_first_chunk += 1          # arrived, and the budget left it nothing
        if record.end >= long_out.metrics.first_token_time:
            break
    return {"k": k, "token_budget": token_budget, "alpha": alpha, "num_streams": num_streams,
            "prompt_len": prompt_len, "draft_budget": draft_budget,
            "long_ttft_s": summary["long_ttft_s"], "stream_tpot_s": summary["decoder_tpot_mean_s"],
            "stream_itl_p99_s": summary["decoder_itl_p99_s"], "long_chunks": chunks,
            "steps_before_first_chunk": steps_before_first_chunk,
            "draft_tokens_per_step": num_streams * k,
            "tokens_per_verification": summary.get("spec", {}).get("mean_tokens_per_verification", 1.0)}


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------
def plot_expected_tokens(alphas=(0.5, 0.7, 0.9), max_k: int = 10, measured=None, ax=None):
    """(1 - alpha^(k+1)) / (1 - alpha) against k for a few alphas; measured: optional
    [(k, tokens per verification, label)] points from real runs."""
    fig, ax = _axes(ax)
    ks = list(range(0, max_k + 1))
    for alpha in alphas:
        ax.plot(ks, [expected_tokens_per_verification(alpha, k) for k in ks], marker="o", markersize=3,
                label=f"alpha = {alpha:g} (limit {1 / (1 - alpha):.1f})" if alpha < 1 else "alpha = 1")
    for k, tokens, label in measured or ():
        ax.scatter([k], [tokens], marker="x", s=60, zorder=3, color="black")
        ax.annotate(label, (k, tokens), textcoords="offset points", xytext=(5, -10), fontsize="small")
    ax.set_xlabel("draft tokens per step, k")
    ax.set_ylabel("tokens per verification")
    ax.set_title("A verification emits at most 1/(1 - alpha) tokens, however large k")
    ax.legend(fontsize="small")
    return fig


def plot_tradeoff(rows, ax=None):
    """The long prompt's TTFT against the streams' TPOT, one line per token budget,
    one point per k (labelled)."""
    fig, ax = _axes(ax)
    for budget, line in _by_budget(rows):
        xs = [r["stream_tpot_s"] * 1e3 for r in line]
        ys = [r["long_ttft_s"] * 1e3 for r in line]
        ax.plot(xs, ys, marker="o", label=f"budget {budget}")
        for r, x, y in zip(line, xs, ys):
            ax.annotate(f"k={r['k']}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize="x-small")
    ax.set_xlabel("streams' mean TPOT (ms)")
    ax.set_ylabel("long prompt's TTFT (ms)")
    ax.set_yscale("log")
    r0 = rows[0]
    ax.set_title(f"Drafts buy TPOT and cost the long prompt's TTFT (alpha {r0['alpha']:g}, "
                 f"{r0['num_streams']} streams)", fontsize="medium")
    ax.legend(fontsize="small")
    return fig


def plot_starvation(rows, ax=None):
    """The long prompt's TTFT against the streams' share of the budget, n(1 + k) / budget:
    the chunk gets budget - n(1 + k), so the TTFT climbs as that share nears 1 and jumps
    to 'after the streams' past it."""
    fig, ax = _axes(ax)
    for budget, line in _by_budget(rows):
        shares = [r["num_streams"] * (1 + r["k"]) / budget for r in line]
        ax.plot(shares, [r["long_ttft_s"] * 1e3 for r in line], marker="o", label=f"budget {budget}")
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.text(1.01, 0.5, "n(1+k) = budget:\nno chunk at all", transform=ax.get_xaxis_transform(), fontsize="small")
    ax.set_xlabel("the streams' share of the budget, n(1 + k) / budget")
    ax.set_ylabel("long prompt's TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title("Near n(1+k) = budget the long prompt's chunks shrink to nothing", fontsize="medium")
    ax.legend(fontsize="small")
    return fig


def spec_lab_figure(k: int = 4, token_budget: int = 256, alpha: float = 0.7, num_streams: int = 8,
                    draft_budget: str = "drafts_first"):
    """The lab's view of one setting: the long prompt's chunk per step (left) and the
    TTFT/TPOT of k = 0..8 at this budget, this setting marked (right)."""
    run = spec_run(k, token_budget, alpha, num_streams, draft_budget=draft_budget)
    sweep = [spec_run(kk, token_budget, alpha, num_streams, draft_budget=draft_budget) for kk in (0, 1, 2, 4, 8)]
    fig, (left, right) = _figure((10.0, 3.4), ncols=2)
    chunks = run["long_chunks"]
    left.bar(range(len(chunks)), chunks, color="#d62728", width=1.0)
    left.axhline(token_budget, color="gray", linestyle="--", linewidth=1, label="budget")
    left.set_xlabel("step since the long prompt arrived")
    left.set_ylabel("its tokens in the step")
    share = num_streams * (1 + k)
    left.set_title(f"chunk = {token_budget} - {num_streams} x (1 + {k}) = {max(0, token_budget - share)}: "
                   f"{len(chunks)} steps", fontsize="medium")
    left.legend(fontsize="small")
    plot_tradeoff(sweep, ax=right)
    right.scatter([run["stream_tpot_s"] * 1e3], [run["long_ttft_s"] * 1e3], s=120, facecolors="none",
                  edgecolors="black", zorder=3)
    right.set_title(f"TTFT {run['long_ttft_s'] * 1e3:.0f} ms, TPOT {run['stream_tpot_s'] * 1e3:.2f} ms "
                    f"({run['tokens_per_verification']:.2f} tokens/verification)", fontsize="medium")
    return fig


def spec_lab(k: int = 4, token_budget: int = 256, alpha: float = 0.7, num_streams: int = 8):
    """Sliders for k, the budget, alpha and the streams, wired to spec_lab_figure
    (a widget's callback swallows exceptions: tests call the figure function)."""
    import ipywidgets as w

    controls = {
        "k": w.IntSlider(value=k, min=0, max=8, description="k"),
        "token_budget": w.SelectionSlider(options=[64, 128, 256, 512, 1024, 2048], value=token_budget,
                                          description="budget"),
        "alpha": w.FloatSlider(value=alpha, min=0.0, max=0.95, step=0.05, description="alpha"),
        "num_streams": w.IntSlider(value=num_streams, min=1, max=16, description="streams"),
        "draft_budget": w.ToggleButtons(options=list(DRAFT_BUDGETS), value="drafts_first",
                                        description="drafts"),
    }

    def show(**values):
        from IPython.display import display
        display(spec_lab_figure(**values))
    out = w.interactive_output(show, controls)
    return w.VBox([w.HBox([controls["k"], controls["token_budget"], controls["alpha"]]),
                   w.HBox([controls["num_streams"], controls["draft_budget"]]), out])


def starvation_share(num_streams: int, k: int, token_budget: int) -> float:
    """n(1 + k) / budget: above 1 the long prompt gets no chunk while the streams run."""
    return num_streams * (1 + k) / token_budget

