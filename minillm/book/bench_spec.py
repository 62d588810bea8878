"""Chapter 12's benchmark: `python -m minillm bench spec`.

Speculative decoding (prompt lookup, speculative.py) on SmolLM2-135M-Instruct on
this device, greedy, float32:

  k sweep      8 chats at once, k = 0, 2, 4, 8; a copy-heavy workload (repeat,
               quote, edit a given text: prompt lookup finds the output in the
               prompt) and a free-form one (short questions: it rarely does);
               then one chat at a time (the first 4 prompts of each, served in
               turn), where a decode step is one row and a verification's k
               more rows cost least.
               Useful tokens/s (output tokens / wall time of the whole batch),
               the streams' mean TPOT, the acceptance, and how many of the 8
               texts equal k = 0's (float32: a verification runs GEMMs of
               another row count than a decode, so the last bits may differ and
               greedy text can flip at a near-tie; chapter 4).
  long prompt  8 copy streams decode (k = 4 or 0) when a 2048-token prompt
               arrives; its TTFT at token budgets 256 and 1024 (budget =
               chunk size, as --max-num-batched-tokens sets both).

Each round runs every setting once, in a rotated order, and the ratios to k = 0
are taken within a round: a shared machine's load moves all of them together.
The medians over rounds and the range are reported. Besides the wall clock, each
run records the process's CPU time: with torch on one thread (OMP_NUM_THREADS=1)
that is the work itself, which other processes on a busy machine stretch far
less than they stretch the wall clock; tok/CPU-s and the TTFT in CPU seconds are
reported beside the wall-clock numbers.
"""
from __future__ import annotations

import json
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from ..engine import LLMEngine
from ..request import SamplingParams
from ..scheduler import SchedulerConfig
from ..speculative import SpeculativeConfig, acceptance_stats
from .chats import PASSAGES, QUESTIONS, long_document

MODEL = "smollm2-135m-instruct"
COMMITTED = Path(__file__).resolve().parents[2] / "data" / "measured" / "bench_spec.json"

# Texts to copy, quote or edit: prompt lookup finds the answer's n-grams in them.
COPY_TEXTS = PASSAGES + [
    "Dear team, the meeting on Thursday is moved to Friday at 10 am in room B. Please bring the quarterly "
    "report and your laptop. Lunch will be served after the meeting.",
    "To make tea, boil water, put a tea bag in a cup, pour the hot water over it, wait three minutes, "
    "remove the bag, and add milk or sugar if you like.",
]
COPY_TASKS = [
    "Repeat the following text exactly, word for word:\n\n{text}",
    "Copy this text, replacing every 'the' with 'THE':\n\n{text}",
    "Quote the first two sentences of this text exactly:\n\n{text}",
    "Fix any mistakes in this text and return the whole text:\n\n{text}",
]
LOOKUP = dict(prompt_lookup_min=1, prompt_lookup_max=3)


def copy_prompts(tokenizer, num_requests: int = 8) -> list[list[int]]:
    """Chat prompts that ask for a given text back, whole or edited."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": COPY_TASKS[i % len(COPY_TASKS)].format(
        text=COPY_TEXTS[(i + i // len(COPY_TASKS)) % len(COPY_TEXTS)])}]) for i in range(num_requests)]


def free_prompts(tokenizer, num_requests: int = 8) -> list[list[int]]:
    """Short open questions: nothing in the prompt to copy."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            for i in range(num_requests)]


def speculative(k: int) -> SpeculativeConfig | None:
    return SpeculativeConfig(num_speculative_tokens=k, **LOOKUP) if k else None


def run_batch(model, prompts, k: int, max_tokens: int, sched: SchedulerConfig | None = None,
              one_at_a_time: bool = False) -> dict:
    """Serve the prompts at once (or one after another); wall time, useful tokens/s,
    TPOT, acceptance, texts."""
    engine = LLMEngine(model, sched or SchedulerConfig(chunk_size=512), speculative=speculative(k))
    params = SamplingParams(max_tokens=max_tokens)
    t0, cpu0 = time.perf_counter(), time.process_time()
    if one_at_a_time:
        outputs = [engine.generate([prompt], params)[0] for prompt in prompts]
    else:
        outputs = engine.generate(prompts, params)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    tokens = sum(len(o.output_token_ids) for o in outputs)
    tpots = [o.metrics.tpot for o in outputs if o.metrics.tpot is not None]
    itls = [g for o in outputs for g in o.metrics.itl]
    return {"k": k, "wall_s": wall_s, "cpu_s": cpu_s, "tokens": tokens, "tok_s": tokens / wall_s,
            "tok_cpu_s": tokens / cpu_s,
            "tpot_mean_s": statistics.mean(tpots), "itl_mean_s": statistics.mean(itls), "steps": len(engine.trace),
            "spec": acceptance_stats(engine.trace), "outputs": [o.output_token_ids for o in outputs]}


def long_prompt_ttft(model, stream_prompts, long_prompt, k: int, budget: int, warmup_tokens: int = 8) -> dict:
    """Streams decode (speculating at k) until each has warmup_tokens tokens, then the long
    prompt arrives: its TTFT, the steps it took and its chunk per step."""
    num_blocks = (len(stream_prompts) * (max(map(len, stream_prompts)) + 320) + len(long_prompt) + 64) // 16 + 8
    engine = LLMEngine(model, SchedulerConfig(chunk_size=budget, token_budget=budget, max_num_seqs=16),
                       num_blocks=num_blocks, speculative=speculative(k))
    streams = [engine.add_request(p, SamplingParams(max_tokens=300, ignore_eos=True)) for p in stream_prompts]
    while not all(len(engine.requests[i].output_token_ids) >= warmup_tokens for i in streams):
        engine.step()
    first_step = len(engine.trace)
    cpu0 = time.process_time()
    long_id = engine.add_request(long_prompt, SamplingParams(max_tokens=1))
    while engine.requests[long_id].metrics.first_token_time is None:
        engine.step()
        if all(engine.requests[i].is_finished for i in streams):
            raise RuntimeError("the streams finished before the long prompt's first token: raise their max_tokens")
    ttft_cpu_s = time.process_time() - cpu0
    steps = engine.trace[first_step:]
    chunks = [dict(r.scheduled).get(long_id, 0) for r in steps]
    for i in streams:
        engine.abort_request(i)
    return {"k": k, "budget": budget, "ttft_s": engine.requests[long_id].metrics.ttft, "ttft_cpu_s": ttft_cpu_s,
            "steps": len(steps),
            "chunks": chunks, "spec": acceptance_stats(steps)}


def _rotated(items, shift: int) -> list:
    items = list(items)
    shift %= len(items)
    return items[shift:] + items[:shift]


def bench_spec(ks=(0, 2, 4, 8), rounds: int = 3, num_requests: int = 8, max_tokens: int = 96,
               budgets=(256, 1024), long_prompt_len: int = 2048, ttft_ks=(0, 4), model=None, tokenizer=None,
               num_one_at_a_time: int = 4) -> dict:
    """The k sweep on both workloads (all at once, then num_one_at_a_time of them one
    after another) and the long prompt's TTFT (see the module docstring)."""
    if model is None:
        from ..pretrained_models import pretrained
        model, tokenizer = pretrained(MODEL, dtype=torch.float32)
    workloads = {"copy": copy_prompts(tokenizer, num_requests), "free": free_prompts(tokenizer, num_requests)}
    run_batch(model, workloads["free"][:2], 0, 4)                              # warm up
    runs = {name: {k: [] for k in ks} for name in workloads}
    single = {name: {k: [] for k in ks} for name in workloads}
    for r in range(rounds):
        for name, prompts in workloads.items():
            for k in _rotated(ks, r):
                runs[name][k].append(run_batch(model, prompts, k, max_tokens))
                if num_one_at_a_time:
                    single[name][k].append(run_batch(model, prompts[:num_one_at_a_time], k, max_tokens,
                                                     one_at_a_time=True))
    sweep = {name: _sweep_rows(by_k, ks) for name, by_k in runs.items()}
    sweep_one = {name: _sweep_rows(by_k, ks) for name, by_k in single.items()} if num_one_at_a_time else {}
    long_prompt = tokenizer.encode(long_document())[:long_prompt_len]
    ttft = {}
    for r in range(rounds):
        for budget in budgets:
            for k in _rotated(ttft_ks, r):
                ttft.setdefault((budget, k), []).append(
                    long_prompt_ttft(model, workloads["copy"], long_prompt, k, budget))
    ttft_rows = []
    for budget in budgets:
        base = ttft[(budget, ttft_ks[0])]
        for k in ttft_ks:
            runs_k = ttft[(budget, k)]
            ratios = [a["ttft_s"] / b["ttft_s"] for a, b in zip(runs_k, base)]
            cpu_ratios = [a["ttft_cpu_s"] / b["ttft_cpu_s"] for a, b in zip(runs_k, base)]
            ttft_rows.append({"budget": budget, "k": k, "ttft_s": statistics.median(x["ttft_s"] for x in runs_k),
                              "ttft_vs_k0": statistics.median(ratios), "ttft_vs_k0_range": (min(ratios), max(ratios)),
                              "ttft_cpu_s": statistics.median(x["ttft_cpu_s"] for x in runs_k),
                              "ttft_cpu_vs_k0": statistics.median(cpu_ratios),
                              "ttft_cpu_vs_k0_range": (min(cpu_ratios), max(cpu_ratios)),
                              "steps": statistics.median(x["steps"] for x in runs_k),
                              "first_chunks": runs_k[0]["chunks"][:4]})
    return {"command": f"python -m minillm bench spec --spec-rounds {rounds}",
            "model": MODEL, "dtype": "float32", "device": str(model.device), "date": date.today().isoformat(),
            "rounds": rounds, "num_requests": num_requests, "max_tokens": max_tokens, "lookup": LOOKUP,
            "torch_threads": torch.get_num_threads(), "long_prompt_len": len(long_prompt),
            "num_one_at_a_time": num_one_at_a_time, "sweep": sweep, "sweep_one_at_a_time": sweep_one,
            "long_prompt": ttft_rows}


def _sweep_rows(by_k: dict, ks) -> list[dict]:
    rows = []
    base = by_k[ks[0]]
    for k in ks:
        runs = by_k[k]
        speedups = [a["tok_s"] / b["tok_s"] for a, b in zip(runs, base)]
        cpu_speedups = [a["tok_cpu_s"] / b["tok_cpu_s"] for a, b in zip(runs, base)]
        tpot_ratios = [a["tpot_mean_s"] / b["tpot_mean_s"] for a, b in zip(runs, base)]
        spec = runs[0]["spec"]
        rows.append({"k": k, "tok_s": statistics.median(x["tok_s"] for x in runs),
                     "speedup": statistics.median(speedups), "speedup_range": (min(speedups), max(speedups)),
                     "tok_cpu_s": statistics.median(x["tok_cpu_s"] for x in runs),
                     "cpu_speedup": statistics.median(cpu_speedups),
                     "cpu_speedup_range": (min(cpu_speedups), max(cpu_speedups)),
                     "tpot_ms": statistics.median(x["tpot_mean_s"] for x in runs) * 1e3,
                     "tpot_vs_k0": statistics.median(tpot_ratios),
                     "itl_ms": statistics.median(x["itl_mean_s"] for x in runs) * 1e3,
                     "tokens_per_verification": spec["mean_tokens_per_verification"] if k else 1.0,
                     "acceptance_rate": spec["acceptance_rate"] if k else float("nan"),
                     "identical_texts": sum(a == b for a, b in zip(runs[0]["outputs"], base[0]["outputs"])),
                     "num_texts": len(base[0]["outputs"]), "tokens": runs[0]["tokens"],
                     "steps": runs[0]["steps"]})
    return rows


def report(result: dict | None = None, **kwargs) -> dict:
    """Run (unless given a result) and print the tables."""
    from .bench_common import _table
    r = result if result is not None else bench_spec(**kwargs)
    print(f"\nSpeculative decoding (prompt lookup, n-grams {r['lookup']['prompt_lookup_min']}-"
          f"{r['lookup']['prompt_lookup_max']}) on {r['model']} ({r['dtype']}, {r['device']}, "
          f"{r['torch_threads']} torch threads): {r['num_requests']} chats at once, greedy, "
          f"up to {r['max_tokens']} tokens; medians of {r['rounds']} rounds, ratios to k = 0 within a round")
    tables = [("sweep", name, f"{title}, {r['num_requests']} at once") for name, title in
              (("copy", "copy-heavy (repeat, quote, edit a given text)"), ("free", "free-form questions"))]
    if r.get("sweep_one_at_a_time"):
        tables += [("sweep_one_at_a_time", name, f"{name}, {r['num_one_at_a_time']} chats one at a time")
                   for name in ("copy", "free")]
    for key, name, title in tables:
        print(f"\n  {title}")
        rows = [dict(row, speedup_text=f"x{row['speedup']:.2f} ({row['speedup_range'][0]:.2f}-"
                     f"{row['speedup_range'][1]:.2f})", same=f"{row['identical_texts']}/{row['num_texts']}",
                     cpu_text=f"x{row['cpu_speedup']:.2f} ({row['cpu_speedup_range'][0]:.2f}-"
                     f"{row['cpu_speedup_range'][1]:.2f})")
                for row in r[key][name]]
        print(_table(rows, [("k", "k", "d"), ("tok_s", "useful tok/s", ".1f"), ("speedup_text", "vs k=0", ""),
                            ("tok_cpu_s", "tok/CPU-s", ".1f"), ("cpu_text", "vs k=0 (CPU)", ""),
                            ("tpot_ms", "TPOT ms", ".1f"), ("itl_ms", "ITL ms", ".1f"),
                            ("tokens_per_verification", "tok/verify", ".2f"),
                            ("acceptance_rate", "accept", ".2f"), ("same", "same text", "")]))
    print(f"\n  the long prompt ({r['long_prompt_len']} tokens) arriving among {r['num_requests']} copy streams")
    rows = [dict(row, ratio=f"x{row['ttft_vs_k0']:.2f} ({row['ttft_vs_k0_range'][0]:.2f}-"
                 f"{row['ttft_vs_k0_range'][1]:.2f})", chunks=" ".join(map(str, row["first_chunks"])),
                 cpu_ratio=f"x{row['ttft_cpu_vs_k0']:.2f} ({row['ttft_cpu_vs_k0_range'][0]:.2f}-"
                 f"{row['ttft_cpu_vs_k0_range'][1]:.2f})")
            for row in r["long_prompt"]]
    print(_table(rows, [("budget", "budget", "d"), ("k", "k", "d"), ("ttft_s", "TTFT s", ".2f"),
                        ("ratio", "vs k=0", ""), ("ttft_cpu_s", "TTFT CPU-s", ".2f"), ("cpu_ratio", "vs k=0 (CPU)", ""),
                        ("steps", "steps", ".0f"), ("chunks", "first chunks", "")]))
    return r


def save(result: dict, path: Path) -> Path:
    """Write the result without the texts (the chapter reads this file)."""
    slim = json.loads(json.dumps(result, default=str))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(slim, indent=1) + "\n")
    return path


def load_committed(path: Path = COMMITTED) -> dict:
    """The committed result of `python -m minillm bench spec` (chapter 12 reads it)."""
    return json.loads(Path(path).read_text())
