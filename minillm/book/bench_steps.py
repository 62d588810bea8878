"""`bench steps`: what single engine steps cost, with freed host memory kept or not.

The steps are the ones the before/after tables of docs/chunk-cost.md use: decode-only,
prefill-only, and a chunk with decodes riding along (`prepare_step`). The
allocator setting (host_memory.py) is process-wide, so each side runs in
processes of its own, alternating (and alternating which goes first); each
process runs the steps in turn `repeats` times, timing each (median) and
counting its page faults. A side's figure for a step is its fastest
process, so a burst of load on a shared machine spoils one process, not the
comparison.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys

STEPS = {
    "decode 32 x 512 cached": [(1, 512)] * 32,
    "decode 8 x 2048 cached": [(1, 2048)] * 8,
    "prefill 2048": [(2048, 0)],
    "prefill 256": [(256, 0)],
    "chunk 256 over 1792 + 8 decodes over 2048": [(256, 1792)] + [(1, 2048)] * 8,
}
SIDES = {"glibc defaults": "0", "freed memory kept": "1"}


def time_steps(shape: str, repeats: int = 5, steps: dict | None = None) -> dict:
    """In this process: {step: {"s": median seconds, "page_faults": median}}.

    The steps take turns, as in an engine where a big prefill follows decodes
    and chunks: repeating one step alone lets glibc's moving threshold settle
    on its sizes, which a serving engine never sees.
    """
    from ..prefill import prepare_step
    from .bench_common import _seconds, bench_model

    model = bench_model(shape)
    steps = {name: prepare_step(model, spec) for name, spec in (steps or STEPS).items()}
    for step in steps.values():
        step()                                                   # warm-up
    seconds = {name: [] for name in steps}
    faults = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            seconds[name].append(_seconds(step))
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {name: {"s": statistics.median(seconds[name]), "page_faults": statistics.median(faults[name])}
            for name in steps}


def bench_steps(shape: str = "tiny", processes: int = 3, repeats: int = 5, steps: dict | None = None) -> dict:
    """Both sides, `processes` processes each, alternating; the fastest process per step."""
    if processes < 1:
        raise ValueError(f"processes={processes}: need at least 1")
    steps = steps or STEPS
    runs = {side: [] for side in SIDES}
    for i in range(processes):
        order = list(SIDES.items()) if i % 2 == 0 else list(SIDES.items())[::-1]   # neither side always first
        for side, keep in order:
            env = dict(os.environ, MINILLM_KEEP_FREED_MEMORY=keep)
            code = f"import json; from minillm.book.bench_steps import time_steps; " \
                   f"print(json.dumps(time_steps({shape!r}, {repeats}, json.loads({json.dumps(steps)!r}))))"
            out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for name in steps:
        best = {side: min(runs[side], key=lambda r: r[name]["s"])[name] for side in SIDES}
        before, after = best["glibc defaults"], best["freed memory kept"]
        rows.append({"step": name, "before_s": before["s"], "after_s": after["s"],
                     "after_over_before": after["s"] / before["s"],
                     "page_faults_before": before["page_faults"], "page_faults_after": after["page_faults"]})
    return {"shape": shape, "processes": processes, "repeats": repeats, "rows": rows}


def report(result: dict) -> str:
    from .bench_common import _table

    rows = [dict(r, before_ms=r["before_s"] * 1e3, after_ms=r["after_s"] * 1e3) for r in result["rows"]]
    return _table(rows, [("step", "step", ""), ("before_ms", "glibc defaults (ms)", ".1f"),
                         ("after_ms", "kept (ms)", ".1f"), ("after_over_before", "kept/defaults", ".2f"),
                         ("page_faults_before", "faults defaults", ".0f"),
                         ("page_faults_after", "faults kept", ".0f")])
