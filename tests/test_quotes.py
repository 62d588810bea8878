"""One home for every number: a number quoted outside its home is checked against it.

THE CONVENTION (for every author of README.md, docs/*.md and the slides' sources)

1. A number lives where it is computed: a chapter prints it (the committed, executed
   notebook holds the output), a bench command writes it to a results file committed
   under data/bench/, or a test asserts it (a module-level constant of the test).
2. Anywhere else it is a QUOTE, written with its source named in the same paragraph,
   table row or list item, or in the heading the quote sits under: "chapter 7 §7",
   "(chapter 5, section 5)", "`data/bench/serve-side-by-side-2026-12-05.json`",
   "`tests/test_triton_float64.py`".
3. Every quote is registered in QUOTES below:
       Quote(doc, text, source, pattern, cite, derive=None)
   - doc: the quoting file, relative to the repository ("README.md", "docs/benchmarks.md");
   - text: the phrase as the doc has it (a line break or a run of spaces counts as one
     space), each quoted number wrapped in braces: "+{18} ms with 4 streams";
   - source: "notebooks/07_the_lab.ipynb#7" (the chapter's saved outputs under its
     "## 7." heading; no "#N": the whole chapter), "data/bench/NAME.json" (a results
     file) or "tests/test_x.py" (the module's text);
   - pattern: a regex over the source (a chapter's outputs joined by newlines, a
     module's text); each match gives its groups as numbers. For a JSON results file,
     pattern is None and derive gets the loaded data;
   - derive: optional, turns the list of all matches (tuples of floats; groups that are
     not numbers are dropped) into the quoted numbers (a ratio, a min-max range, a
     count); by default the first match's groups;
   - within: optional, a string of a table's header: the pattern then reads only that
     cell output, from the header on (two printed tables of the same shape apart);
   - cite: how the doc names the source (checked, ignoring case, to be in the quote's paragraph,
     row or item, in its heading, or in the paragraph that introduces its table or list).
   Each braced number must equal its source's at the precision the doc writes it:
   "+18" quotes a printed "+17.8", "x0.997" must be 0.997 to three decimals.
4. Rows of the README's results table whose source is not committed (a bench run whose
   results file is not in the repository) are listed in UNCHECKED_ROWS with that reason:
   every other row must hold a registered quote. A new row, or a quote edited in its doc,
   fails here until it is registered: update QUOTES (or UNCHECKED_ROWS) with it.

This module only reads committed files; it takes well under a second.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"


@dataclass(frozen=True)
class Quote:
    doc: str
    text: str
    source: str
    pattern: str
    cite: str
    derive: Callable | None = None
    within: str | None = None

    def quoted(self) -> list[str]:
        return re.findall(r"\{([^{}]+)\}", self.text)

    def plain(self) -> str:
        return " ".join(re.sub(r"\{([^{}]+)\}", r"\1", self.text).split())


def _span(matches):
    """(min, max) of the matches' first group."""
    values = [m[0] for m in matches]
    return [min(values), max(values)]


def _spans(matches, *groups):
    """min and max of each named group index, in order: [min g0, max g0, min g1, max g1, ...]."""
    return [f(m[g] for m in matches) for g in groups for f in (min, max)]


SBS = "data/bench/serve-side-by-side-2026-12-05.json"
SERVERS = {"minillm": "minillm --policy prefill_first", "minillm 256": "minillm --max-num-batched-tokens 256",
           "llama.cpp": "llama.cpp -b 2048", "llama.cpp 256": "llama.cpp -b 256"}


def by_round(data, server, key):
    """[the row's value in each round] of a side-by-side results file."""
    return [next(r for r in rnd["rows"] if r["server"] == SERVERS[server])[key] for rnd in data["rounds"]]


def round_ratios(data, top, bottom, key):
    """(min, max) over the rounds of top's value over bottom's, taken within each round."""
    ratios = [a / b for a, b in zip(by_round(data, top, key), by_round(data, bottom, key))]
    return [min(ratios), max(ratios)]


def row_ranges(server, scales=(1, 1e3, 1e3, 1)):
    """A results-table row: (min, max) of ITL p50, ITL p99, TTFT, tokens/s over the rounds."""
    keys = ("itl_p50_ms", "itl_p99_ms", "ttft_ms", "total_token_throughput")
    return lambda d: [f(v / scale for v in by_round(d, server, key))
                      for key, scale in zip(keys, scales) for f in (min, max)]


def load_range(data):
    loads = [float(rnd[k].split()[0]) for rnd in data["rounds"] for k in ("loadavg_before", "loadavg_after")]
    return [min(loads), max(loads)]


SPEC = "data/measured/bench_spec.json"


def spec_speedups(data, sweep, workload, k):
    """(CPU-time, wall-clock) useful tok/s of k drafts over k = 0, as bench spec records them."""
    row = next(r for r in data[sweep][workload] if r["k"] == k)
    return [row["cpu_speedup"], row["speedup"]]


def spec_span(data, sweep, workload):
    """(min, max) over k > 0 of the CPU-time speed-ups of one workload."""
    values = [r["cpu_speedup"] for r in data[sweep][workload] if r["k"] > 0]
    return [min(values), max(values)]


INVARIANT = "data/ch11_invariant_cost.json"


def invariant_slowdowns(data, *names):
    """The median slowdown (default tok/s over batch_invariant's) of each workload."""
    return [data[name]["slowdown"] for name in names]


CH0, CH5, CH7, CH10 = ("notebooks/00_roadmap.ipynb", "notebooks/05_flops_and_io.ipynb",
                       "notebooks/07_the_lab.ipynb", "notebooks/10_serving_from_the_client.ipynb")
LINEAR_PRINT = r"{gpu}: measured 4 x 512 = ({n}) ms vs 1 x 2048 = ({n}) ms \(x({n})\); cost model ({n}) vs ({n}) \(x({n})\)"
HELD_OUT_ROW = r"{file}\s+({n})%\s+({n})%\s+({n})%\s+({n})%\s+\d other file"
ALONE_ROW = r"(h100_\S+\.csv)\s+({n})%\s+({n})%\s+({n})%\s+({n})%"
A100_FILES = r"a100_\S+\.csv"
H100_FILES = r"h100_\S+\.csv"

QUOTES = [
    # ---- README: the results table ------------------------------------------------------
    Quote("README.md", "4 x 512 rows against 1 x 2048 of Llama-2-7B's linear ops: x{0.997} on an A100, x{1.213} on "
          "an H100 (the model: x{1.052}, x{1.144}",
          CH5 + "#5", r"(a100|h100): measured 4 x 512 .*?\(x(" + NUMBER + r")\); cost model .*?\(x(" + NUMBER + r")\)",
          "chapter 5 §5", lambda m: [m[0][0], m[1][0], m[0][1], m[1][1]]),
    Quote("README.md", "A100 median {2.7}-{4.8}%, p90 {7.9}-{11.8}%", CH5 + "#5",
          HELD_OUT_ROW.format(file=A100_FILES, n=NUMBER), "chapter 5 §5", lambda m: _spans(m, 2, 3)),
    Quote("README.md", "H100 {3.4}-{7.5}%, p90 {14.5}-{17.1}%", CH5 + "#5",
          HELD_OUT_ROW.format(file=H100_FILES, n=NUMBER), "chapter 5 §5", lambda m: _spans(m, 2, 3)),
    Quote("README.md", "even fitted to its own p90, leave {11.0}-{14.9}%", CH5 + "#5", ALONE_ROW.format(n=NUMBER),
          "chapter 5 §5", lambda m: _spans(m, 2), within="fitted to its p90"),
    Quote("README.md", "differs by a median {2.0}-{2.4}%", CH5 + "#5", r"median \|difference\| (" + NUMBER + r")%",
          "chapter 5 §5", _span),
    Quote("README.md", "stall-free chunking {3.4}x prefill-first's capacity under the strict SLO, {1.4}x under the "
          "relaxed one", CH7 + "#3", r"(?:strict|relaxed) .*: ours (" + NUMBER + r")x", "chapter 7 §3.3",
          lambda m: [m[0][0], m[1][0]]),
    Quote("README.md", "within {1e-6} of float64 on two packed steps", "tests/test_triton_float64.py",
          r"WITHIN_OF_FLOAT64 = (" + NUMBER + ")", "tests/test_triton_float64.py"),
    Quote("README.md", "chunking cuts the streams' p99 ITL {4.5}-{13.0}x on minillm (budget 256) and {3.7}-{9.2}x on "
          "llama.cpp's", SBS, None, "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "minillm", "minillm 256", "itl_p99_ms") +
          round_ratios(d, "llama.cpp", "llama.cpp 256", "itl_p99_ms")),
    Quote("README.md", "minillm's chunked p99 stays below llama.cpp's, by {1.8}-{9.5}x", SBS, None,
          "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "llama.cpp 256", "minillm 256", "itl_p99_ms")),
    Quote("README.md", "9 rounds on 2026-12-05 at load average {4}-{9}", SBS, None,
          "data/bench/serve-side-by-side-2026-12-05.json", load_range),
    Quote("README.md", "copy-heavy chats one at a time: x{1.96} useful tok/s in CPU time, x{2.00} wall clock at k = "
          "8 (x{1.66} / x{1.75} at k = 4); 8 at once: x{1.41} CPU, x{1.57} wall at k = 8", SPEC, None, "bench spec",
          lambda d: [*spec_speedups(d, "sweep_one_at_a_time", "copy", 8), *spec_speedups(d, "sweep_one_at_a_time", "copy", 4),
                     *spec_speedups(d, "sweep", "copy", 8)]),
    Quote("README.md", "free-form questions, CPU time: x{0.75}-{0.87} at once (a cost), x{0.95}-{1.00} one at a time",
          SPEC, None,
          "bench spec", lambda d: spec_span(d, "sweep", "free") + spec_span(d, "sweep_one_at_a_time", "free")),
    Quote("README.md", "TTFT x{1.22} at budget 256, x{1.02} at 1024", SPEC, None, "bench spec",
          lambda d: [r["ttft_cpu_vs_k0"] for r in d["long_prompt"] if r["k"] == 4]),
    Quote("README.md", "float32 texts identical to k = 0 in {72}/{72} runs", SPEC, None, "bench spec",
          lambda d: [sum(r["identical_texts"] for w in ("sweep", "sweep_one_at_a_time") for rows in d[w].values()
                         for r in rows if r["k"] > 0),
                     sum(r["num_texts"] for w in ("sweep", "sweep_one_at_a_time") for rows in d[w].values()
                         for r in rows if r["k"] > 0)]),
    Quote("README.md", "useful tok/s x{1.14} slower on SmolLM2's 32 chats; the interference workload x{1.23} "
          "(`tiny`), x{1.22} (`gqa2`), x{1.43} (`mha`)", INVARIANT, None, "data/ch11_invariant_cost.json",
          lambda d: invariant_slowdowns(d, "chats", "interference", "interference_gqa2", "interference_mha")),
    Quote("README.md", "load average {0.7}-{1.8}", INVARIANT, None, "data/ch11_invariant_cost.json",
          lambda d: [float(d["loadavg_before"].split()[0]), float(d["loadavg_after"].split()[0])]),
    Quote("docs/benchmarks.md", "load average {0.72} before and {1.75} after", INVARIANT, None,
          "data/ch11_invariant_cost.json",
          lambda d: [float(d["loadavg_before"].split()[0]), float(d["loadavg_after"].split()[0])]),
    # ---- docs/articles.md: where the articles go wrong -------------------------------------------
    Quote("docs/articles.md", "needs about {6}x longer for its FLOPs than for its bytes on an A100", CH0 + "#3",
          r"2048-token prefill: " + NUMBER + r" TFLOP -> (" + NUMBER + r") ms .* -> (" + NUMBER + r") ms",
          "chapter 0, section 3", lambda m: [m[0][0] / m[0][1]]),
    Quote("docs/articles.md", "cost what 1 x 2048 do on an A100 (x{0.997}, chapter 5 §5) and {21}% more on an H100 "
          "(chapter 7 §7)", CH7 + "#7", r"GEMM penalty, measured: A100 (" + NUMBER + r")%, H100 (" + NUMBER + r")%",
          "chapter 7 §7", lambda m: [1 + m[0][0] / 100, m[0][1]]),
    Quote("docs/articles.md", "+{18} ms with 4 streams, +{20} ms with 16, on the simulated A100", CH7 + "#7",
          r"(\d+) streams decoding: .*: \+(" + NUMBER + r") ms;", "chapter 7 §7", lambda m: [m[1][1], m[2][1]]),
    # ---- docs/benchmarks.md ---------------------------------------------------------------
    Quote("docs/benchmarks.md", "| A100 | {3.812} | {3.824} | x{0.997} | {3.850} | {3.660} | x{1.052} |", CH5 + "#5",
          LINEAR_PRINT.format(gpu="a100", n=NUMBER), "chapter 5 §5",
          lambda m: [m[0][0], m[0][1], m[0][2], m[0][3], m[0][4], m[0][5]]),
    Quote("docs/benchmarks.md", "| H100 | {1.314} | {1.084} | x{1.213} | {1.380} | {1.206} | x{1.144} |", CH5 + "#5",
          LINEAR_PRINT.format(gpu="h100", n=NUMBER), "chapter 5 §5",
          lambda m: [m[0][0], m[0][1], m[0][2], m[0][3], m[0][4], m[0][5]]),
    Quote("docs/benchmarks.md", "the simulator gives +{7}, +{18} and +{20} ms on the A100 with 0, 4 and 16 streams",
          CH7 + "#7", r"(\d+) streams decoding: .*: \+(" + NUMBER + r") ms;", "chapter 7 §7",
          lambda m: [m[0][1], m[1][1], m[2][1]]),
    Quote("docs/benchmarks.md", "priced like a decode step ({10.6} ms; {12.8} ms), and the decodes riding in the "
          "four big steps add +{0.5} ms", CH7 + "#7",
          r"(\d+) streams: .* four steps \+(" + NUMBER + r") \+ a fifth step .*, (" + NUMBER + r") ms \(",
          "chapter 7 §7", lambda m: [m[0][2], m[1][2], m[0][1]]),
    Quote("docs/benchmarks.md", "and ran eagerly ({40.5} ms against {34.3} for the 512-row piecewise step)", CH7 + "#7",
          r"no budget, 4 streams: .*eager, (" + NUMBER + r") ms a step|4 rows <= 512.*\n.*step at\s+\S+ ms,\s+(" +
          NUMBER + r") ms: mixed step", "chapter 7 §7",
          lambda m: [next(x[0] for x in m if x[0] is not None), next(x[1] for x in m if x[1] is not None)]),
    Quote("docs/benchmarks.md", "differ by a median {2.4}%, p90 {4.9}%; CodeLlama-34B's and Qwen-72B's on the H100 "
          "([M, 8192] x [8192, 8192]) by {2.0}% / {4.8}%", CH5 + "#5",
          r"median \|difference\| (" + NUMBER + r")%, p90 (" + NUMBER + r")%", "chapter 5 §5",
          lambda m: [m[0][0], m[0][1], m[1][0], m[1][1]]),
    Quote("docs/benchmarks.md", "p90 {13.1}% (CodeLlama-34B), {11.9}% (Llama-2-7B), {15.9}% (Qwen-72B) with the fit's "
          "robust loss", CH5 + "#5", ALONE_ROW.format(n=NUMBER), "chapter 5 §5", lambda m: [x[1] for x in m],
          within="fitted to its p90"),
    Quote("docs/benchmarks.md", "and {12.6}%, {11.0}%, {14.9}% with a search that minimises each file's p90 itself",
          CH5 + "#5", ALONE_ROW.format(n=NUMBER), "chapter 5 §5", lambda m: [x[2] for x in m],
          within="fitted to its p90"),
    Quote("docs/benchmarks.md", "chunks of 504 and 520 rows already differ by {5}% (A100) and {11}% (H100)", CH5 + "#5",
          r"chunks of 520 rows against 504: \+(" + NUMBER + r")%", "chapter 5 §5", lambda m: [m[0][0], m[1][0]]),
    Quote("docs/benchmarks.md", "over chunks 384-696 the measured ratio spans {0.95}-{1.21} on the A100 and "
          "{1.17}-{1.47} on the H100", CH5 + "#5", r"measured ratio (" + NUMBER + r")-(" + NUMBER + r") over chunks",
          "chapter 5 §5", lambda m: [m[0][0], m[0][1], m[1][0], m[1][1]]),
    Quote("docs/benchmarks.md", "sustains {4.00} req/s against {1.19} for prefill-first under the strict SLO, "
          "**{3.4}x**", CH7 + "#3",
          r"strict .*prefill_first (" + NUMBER + r") req/s, chunked 512 (" + NUMBER + r") req/s: ours (" + NUMBER + ")x",
          "chapter 7 §3.3", lambda m: [m[0][1], m[0][0], m[0][2]]),
    Quote("docs/benchmarks.md", "under the relaxed SLO (budget 2048) {4.00} against {2.83}, {1.4}x", CH7 + "#3",
          r"relaxed .*prefill_first (" + NUMBER + r") req/s, chunked 2048 (" + NUMBER + r") req/s: ours (" + NUMBER +
          ")x", "chapter 7 §3.3", lambda m: [m[0][1], m[0][0], m[0][2]]),
    Quote("docs/benchmarks.md", "({108} / {538} ms on our cost model, chapter 7 §3.3", CH7 + "#3",
          r"(?:strict|relaxed)\s+P99 ITL <=\s+(\d+) ms", "chapter 7 §3.3", lambda m: [m[0][0], m[1][0]]),
    Quote("docs/benchmarks.md", "asserted within {1e-6} and within 4x the float32 reference backend's own distance",
          "tests/test_triton_float64.py", r"WITHIN_OF_FLOAT64 = (" + NUMBER + ")", "tests/test_triton_float64.py"),
    Quote("docs/benchmarks.md", "measured {0.377} ms at 128 rows and {0.509} ms at 160 (+{35}% time for +25% rows); "
          "the model gives {0.358} and {0.504} (+{41}%)", CH5 + "#4",
          r"^\s+(128|160)\s+(" + NUMBER + r")\s+" + NUMBER + r"\s+(" + NUMBER + r")$", "chapter 5 §4",
          lambda m: [m[0][1], m[1][1], 100 * (m[1][1] / m[0][1] - 1), m[0][2], m[1][2], 100 * (m[1][2] / m[0][2] - 1)]),
    Quote("docs/benchmarks.md", "the load average was {3.7}-{9.2} at the rounds' starts and ends", SBS, None,
          "data/bench/serve-side-by-side-2026-12-05.json", load_range),
    *[Quote("docs/benchmarks.md", f"| {label} | {{{a}}}-{{{b}}} ms | {p99} | {{{e}}}-{{{f}}} s | {{{g}}}-{{{h}}} |",
            SBS, None, "data/bench/serve-side-by-side-2026-12-05.json", row_ranges(server))
      for label, server, (a, b), p99, (e, f), (g, h) in (
          ("minillm `--policy prefill_first`", "minillm", (160, 408), "{11.7}-{26.0} s", (11.7, 26.1), (54, 119)),
          ("minillm `--max-num-batched-tokens 256`", "minillm 256", (155, 421), "**{1.2}-{3.4} s**", (8.8, 23.2),
           (63, 130)),
          ("llama.cpp `-b 2048` (its default)", "llama.cpp", (72, 165), "{23.9}-{53.5} s", (24.4, 54.4), (46, 89)),
          ("llama.cpp `-b 256`", "llama.cpp 256", (70, 240), "**{3.9}-{11.6} s**", (26.2, 70.2), (37, 87)))],
    Quote("docs/benchmarks.md", "chunking cut the streams' p99 ITL {4.5}-{13.0}x on minillm and {3.7}-{9.2}x on "
          "llama.cpp", SBS, None, "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "minillm", "minillm 256", "itl_p99_ms") +
          round_ratios(d, "llama.cpp", "llama.cpp 256", "itl_p99_ms")),
    Quote("docs/benchmarks.md", "below llama.cpp's with `-b 256` in every round, by {1.8}-{9.5}x; minillm served more "
          "tokens per second in eight rounds of nine (x{0.92}-{2.80})", SBS, None,
          "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "llama.cpp 256", "minillm 256", "itl_p99_ms") +
          round_ratios(d, "minillm 256", "llama.cpp 256", "total_token_throughput")),
    Quote("docs/benchmarks.md", "x{0.42}-{1.51} on minillm (lower in five rounds), x{0.64}-{1.76} on llama.cpp", SBS,
          None, "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "minillm 256", "minillm", "ttft_ms") +
          round_ratios(d, "llama.cpp 256", "llama.cpp", "ttft_ms")),
    Quote("docs/articles.md", "the ratio scatters both ways (x{0.42}-{1.51} in nine rounds", SBS, None,
          "benchmarks.md#13", lambda d: round_ratios(d, "minillm 256", "minillm", "ttft_ms")),
    Quote("docs/serving.md", "chunking cut the streams' p99 ITL {4.5}-{13.0}x on minillm and {3.7}-{9.2}x on llama.cpp",
          SBS, None, "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "minillm", "minillm 256", "itl_p99_ms") +
          round_ratios(d, "llama.cpp", "llama.cpp 256", "itl_p99_ms")),
    Quote("docs/serving.md", "`--max-num-batched-tokens 256` stayed below llama.cpp's with `-b 256`, by {1.8}-{9.5}x",
          SBS, None, "data/bench/serve-side-by-side-2026-12-05.json",
          lambda d: round_ratios(d, "llama.cpp 256", "minillm 256", "itl_p99_ms")),
    # ---- docs/teaching.md --------------------------------------------------------------------
    Quote("docs/teaching.md", "measured {0.377} ms against {0.51} ms per Llama-3-8B layer, +{35}% for +25%", CH5 + "#4",
          r"^\s+(128|160)\s+(" + NUMBER + r")\s+" + NUMBER + r"\s+" + NUMBER + r"$", "chapter 5",
          lambda m: [m[0][1], m[1][1], 100 * (m[1][1] / m[0][1] - 1)]),
    Quote("docs/teaching.md", "jumps {5}% (A100) and {11}% (H100) between chunks of 504 and 520 (chapter 5, section 5)",
          CH5 + "#5", r"chunks of 520 rows against 504: \+(" + NUMBER + r")%", "chapter 5, section 5",
          lambda m: [m[0][0], m[1][0]]),
    Quote("docs/teaching.md", "about +{18} ms in all on the simulated A100 (chapter 7, section 7)", CH7 + "#7",
          r"(\d+) streams decoding: .*: \+(" + NUMBER + r") ms;", "chapter 7, section 7", lambda m: [m[1][1]]),
    Quote("docs/teaching.md", "a fifth, light step for its last {16} tokens", CH7 + "#7",
          r"4 streams decoding: .*tokens per step \[.*, (\d+)\]", "chapter 7, section 7"),
]

# Rows of the README's results table whose source is a bench run with no results file in
# the repository: checked by nobody but their authors. Key: the row's first cell, up to "(".
UNCHECKED_ROWS = {
    "the stall and its cure": "bench interference --rounds 5, 2026-12-01: results not committed",
    "what a chunked prefill costs on this CPU": "bench chunk-cost, 2026-12-01/02: results not committed",
    "is the fixed price eager PyTorch's?": "bench compile-probe, 2026-12-02: results not committed",
    "against transformers' `generate`, same weights, identical greedy tokens 32/32": "bench hf: results not committed",
    "a real model against transformers": "bench hf-real, 2026-12-02: results not committed",
    "the simulator against this machine": "bench simulator, 2026-11-29: results not committed",
    "the lab": "bench lab, 2026-11-29: results not committed",
    "prefix caching": "bench prefix-cache, 2026-11-29: results not committed",
    "short prompts behind a long one": "bench partial-prefills, 2026-11-29: results not committed",
    "memory of a long-running engine": "bench memory, 2026-11-29: results not committed",
}


# ---- reading the sources -------------------------------------------------------------------
@lru_cache(maxsize=None)
def source_text(source: str) -> str:
    path, _, section = source.partition("#")
    file = ROOT / path
    assert file.exists(), f"{path} does not exist"
    if not path.endswith(".ipynb"):
        return file.read_text()
    outputs, current = [], None
    for cell in json.loads(file.read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = re.search(r"^## (\d+)\.", text, re.M)
            current = heading.group(1) if heading else current
            continue
        if section and current != section:
            continue
        for out in cell.get("outputs", []):
            outputs.append("".join(out.get("text", "")) or "".join(out.get("data", {}).get("text/plain", "")))
        outputs.append("\x00")                 # a cell's outputs end here (`within` stops at it)
    assert outputs, f"{source}: no saved outputs there"
    return "\n".join(outputs)


def blocks(doc_text: str) -> list[tuple[str, str]]:
    """(its context, the block) for every paragraph, table row and list item of a Markdown
    text, whitespace collapsed. The context is the heading above it and, for a table row or
    a list item, the paragraph that introduces the table or the list."""
    out, heading, lead, current = [], "", "", []

    def flush(kind):
        nonlocal lead
        if current:
            text = " ".join(" ".join(current).split())
            out.append((heading + " " + (lead if kind == "item" else ""), text))
            if kind == "paragraph":
                lead = text
            current.clear()

    kind = "paragraph"
    for line in doc_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            flush(kind)
            heading, lead, kind = stripped, "", "paragraph"
        elif not stripped:
            flush(kind)
            kind = "paragraph"
        elif stripped.startswith("|") or re.match(r"[-*] |\d+\. ", stripped):
            flush(kind)
            kind = "item"
            current.append(stripped)
            if stripped.startswith("|"):
                flush(kind)
        else:
            current.append(stripped)
    flush(kind)
    return out


def as_number(text: str) -> float:
    return float(text.replace(",", "").lstrip("+").rstrip("%"))


def decimals(text: str) -> int:
    mantissa = text.split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def source_numbers(quote: Quote) -> list[float]:
    if quote.source.endswith(".json"):
        return list(quote.derive(json.loads(source_text(quote.source))))
    text = source_text(quote.source)
    if quote.within:
        assert quote.within in text, f"{quote.source}: no output holds {quote.within!r}"
        text = text[text.index(quote.within):].split("\n\x00", 1)[0]
    matches = [m if isinstance(m, tuple) else (m,) for m in re.findall(quote.pattern, text, re.M)]
    assert matches, f"{quote.source}: no match for {quote.pattern!r}"
    matches = [tuple(None if g == "" else as_number(g) if re.fullmatch(NUMBER, g) else g for g in m) for m in matches]
    matches = [tuple(g for g in m if not isinstance(g, str)) for m in matches]
    return list(quote.derive(matches) if quote.derive else matches[0])


# ---- the tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.doc}: {q.plain()[:50]}")
def test_every_quote_is_still_in_its_doc_with_its_source_named(quote):
    found = [(context, block) for context, block in blocks((ROOT / quote.doc).read_text()) if quote.plain() in block]
    assert found, f"{quote.doc} no longer says {quote.plain()!r}: update QUOTES with the new wording (and number)"
    assert any(quote.cite.lower() in (context + " " + block).lower() for context, block in found), \
        f"{quote.doc}: the quote {quote.plain()!r} does not name its source ({quote.cite!r}) in its paragraph"


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.doc}: {q.plain()[:50]}")
def test_every_quoted_number_matches_its_source(quote):
    quoted, actual = quote.quoted(), source_numbers(quote)
    assert len(quoted) == len(actual), f"{quote.text!r}: {len(quoted)} quoted numbers, the source gives {actual}"
    for text, value in zip(quoted, actual):
        assert round(value, decimals(text)) == round(as_number(text), decimals(text)), \
            f"{quote.doc} quotes {text} where {quote.source} gives {value}: {quote.plain()!r}"


def test_every_row_of_the_readme_results_table_is_checked_or_says_why_not():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| what | result", "|---"))]
    assert rows, "the README has no results table"
    registered = [" ".join(q.plain().split()) for q in QUOTES if q.doc == "README.md"]
    for row in rows:
        flat = " ".join(row.split())
        key = row.split("|")[1].split("(")[0].strip()
        assert key in UNCHECKED_ROWS or any(text in flat for text in registered), \
            f"README results row {key!r} holds no registered quote: register its numbers in QUOTES, or name " \
            "in UNCHECKED_ROWS why its source is not committed"
    stale = set(UNCHECKED_ROWS) - {row.split("|")[1].split("(")[0].strip() for row in rows}
    assert not stale, f"UNCHECKED_ROWS names rows the README no longer has: {sorted(stale)}"


def test_a_drifted_copy_fails():
    """The check can fail: the same quote with a number that is not the source's."""
    quote = QUOTES[0]
    drifted = Quote(quote.doc, quote.text.replace("{0.997}", "{0.990}"), quote.source, quote.pattern, quote.cite,
                    quote.derive)
    with pytest.raises(AssertionError, match="quotes 0.990"):
        test_every_quoted_number_matches_its_source(drifted)
    with pytest.raises(AssertionError, match="no longer says"):
        test_every_quote_is_still_in_its_doc_with_its_source_named(drifted)
