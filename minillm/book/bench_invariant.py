"""Chapter 11's measurements on the real engine, too long for a notebook.

  python -m minillm bench invariant    what batch_invariant=True costs: useful output
                                       tokens/s of the default engine and of the mode,
                                       alternating round by round on one machine, on
                                       SmolLM2's 32 chats and on the interference workload
  python -m minillm bench divergence   how often greedy text changes with the chunk size,
                                       the neighbours and prefix caching: SmolLM2, 32 chats
                                       x 128 tokens, float32 and bfloat16, default engine and
                                       the mode. Its JSON is committed as
                                       data/ch11_divergence.json; chapter 11 loads it and
                                       re-runs a small part of it live.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from .. import kernels
from ..engine import LLMEngine
from ..request import SamplingParams
from ..scheduler import SchedulerConfig
from ..sim import workloads
from .bench_common import bench_model
from .chats import chat_requests

DATA = Path(__file__).resolve().parents[2] / "data"
DIVERGENCE_FILE = DATA / "ch11_divergence.json"         # `bench divergence`'s JSON, committed
COST_FILE = DATA / "ch11_invariant_cost.json"            # `bench invariant`'s JSON, committed

# The configurations the divergence study serves the 32 chats in, against the first:
# (name, chunk_size, max_num_seqs, prefix caching warmed by a first pass). A chunk size of
# 8192 prefills every prompt whole; max_num_seqs=32 puts all 32 chats in every step.
CONFIGURATIONS = (
    ("whole, batch of 32", 8192, 32, False),
    ("chunks of 16, batch of 32", 16, 32, False),
    ("chunks of 64, batch of 32", 64, 32, False),
    ("chunks of 256, batch of 32", 256, 32, False),
    ("whole, batch of 32, prefix cache hit", 8192, 32, True),
)
LONE = "whole, alone"          # the first few chats one at a time: no neighbours at all


def cpu_name() -> str:
    """This CPU's model name (bits depend on it: another CPU runs other kernels)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        import platform
        return platform.processor()


def cpu_identity() -> dict:
    """What decides this CPU's float kernels: its model name (on a VM often just "AMD
    EPYC", every generation alike), torch's vector level (DEFAULT, AVX2, AVX512...) and a
    hash of the instruction flags; plus whether the compiled paged kernel is built (without
    it decodes and the mode's attention take other code paths, with other bits)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:12],
            "paged_kernel": kernels.paged_decode_available()}


def chat_prompts(tokenizer, num_chats: int = 32) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": m}]) for m in chat_requests(num_chats)]


def serve(model, prompts, params, chunk_size: int, max_num_seqs: int, prefix_cache: bool = False,
          batch_invariant: bool = False):
    """Greedy outputs (token ids, logprobs) of the prompts under one configuration; with
    prefix_cache, a first pass fills the cache and the second is returned."""
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=chunk_size, max_num_seqs=max_num_seqs),
                       enable_prefix_caching=prefix_cache, batch_invariant=batch_invariant)
    if prefix_cache:
        engine.generate(prompts, params)
    outs = engine.generate(prompts, params)
    return [(o.output_token_ids, o.logprobs) for o in outs], engine.block_manager.num_hit_tokens if prefix_cache else 0


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None: identical)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def compare(reference, outputs) -> dict:
    """How many texts differ from the reference, where each first differs, and how many
    output-token logprobs differ in their bits while the text is still the same."""
    splits = [first_difference(r[0], o[0]) for r, o in zip(reference, outputs)]
    same_prefix_logprobs = [(r[1][i], o[1][i]) for r, o, s in zip(reference, outputs, splits)
                            for i in range(len(r[0]) if s is None else s)]
    return {"texts_differ": sum(s is not None for s in splits), "num_texts": len(splits),
            "first_difference": splits,
            "logprobs_differ": sum(a != b for a, b in same_prefix_logprobs),
            "logprobs_compared": len(same_prefix_logprobs)}


def bench_divergence(num_chats: int = 32, max_tokens: int = 128, lone: int = 8,
                     dtypes=(torch.float32, torch.bfloat16), progress: bool = True) -> dict:
    """The default engine and batch_invariant=True, each dtype, every configuration."""
    from ..pretrained_models import pretrained

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    result = {"model": "smollm2-135m-instruct", "num_chats": num_chats, "max_tokens": max_tokens,
              "lone_chats": lone, "ignore_eos": True, "torch": torch.__version__, **cpu_identity(),
              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"), "runs": []}
    for dtype in dtypes:
        model, tok = pretrained("smollm2-135m-instruct", dtype=dtype)
        prompts = chat_prompts(tok, num_chats)
        for invariant in (False, True):
            t0 = time.perf_counter()
            reference, _ = serve(model, prompts, params, *CONFIGURATIONS[0][1:], batch_invariant=invariant)
            run = {"dtype": str(dtype).removeprefix("torch."), "batch_invariant": invariant, "configurations": {},
                   "reference_tokens": [tokens for tokens, _ in reference]}
            for name, chunk_size, max_num_seqs, cache in CONFIGURATIONS[1:]:
                outputs, hits = serve(model, prompts, params, chunk_size, max_num_seqs, cache, invariant)
                run["configurations"][name] = {**compare(reference, outputs), "prefix_hit_tokens": hits}
            lone_outputs, _ = serve(model, prompts[:lone], params, 8192, 1, batch_invariant=invariant)
            run["configurations"][LONE] = compare(reference[:lone], lone_outputs)
            run["lone_tokens"] = [tokens for tokens, _ in lone_outputs]
            run["seconds"] = time.perf_counter() - t0
            result["runs"].append(run)
            if progress:
                print(f"{run['dtype']:>8} batch_invariant={invariant}: " + ", ".join(
                    f"{name}: {c['texts_differ']}/{c['num_texts']}" for name, c in run["configurations"].items())
                    + f" ({run['seconds']:.0f} s)", flush=True)
    return result


# ---------------------------------------------------------------------------
# What the mode costs
# ---------------------------------------------------------------------------
def _timed(run) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, useful output tokens) of one run. On a
    shared machine the CPU time moves far less with the others' load than the wall clock."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    outputs = run()
    return time.perf_counter() - t0, time.process_time() - c0, sum(len(o.output_token_ids) for o in outputs)


def bench_invariant_cost(rounds: int = 3, num_chats: int = 32, max_tokens: int = 128,
                         interference_shapes=("tiny", "gqa2", "mha"), prompt_len: int = 2048,
                         num_decoders: int = 8, progress: bool = True) -> dict:
    """Useful output tokens/s, default engine vs batch_invariant=True, one after the other
    in each round (a shared machine's load hits both sides of a ratio alike); the ratio
    per round, its median and range.

    chats: SmolLM2-135M-Instruct, float32, the 32 chat requests, greedy, each stopping at
    its end-of-turn token or max_tokens, chunked prefill of 512 (as `bench hf-real`).
    interference: the articles' scenario (`bench interference`): num_decoders streams
    decoding when a prompt_len-token prompt arrives, chunked 256, on each of the bench's
    model shapes ("interference" is tiny's, "interference_gqa2" gqa2's...): a target met on
    one preset only would not count.
    """
    from ..pretrained_models import pretrained

    smollm2, tok = pretrained("smollm2-135m-instruct", dtype=torch.float32)
    prompts = chat_prompts(tok, num_chats)
    shape_models = {shape: bench_model(shape) for shape in interference_shapes}
    workload = workloads.long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders,
                                                  decoder_prompt_len=64, warmup_tokens=8,
                                                  decoder_output_len=40, long_output_len=8)

    def chats(invariant):
        engine = LLMEngine(smollm2, SchedulerConfig(policy="chunked", chunk_size=512, max_num_seqs=64),
                           batch_invariant=invariant)
        return lambda: engine.generate(prompts, SamplingParams(max_tokens=max_tokens))

    def interference(shape_model):
        def make(invariant):
            engine = LLMEngine(shape_model, SchedulerConfig(policy="chunked", chunk_size=256, max_num_seqs=64),
                               batch_invariant=invariant)
            return lambda: engine.run_workload(workload)
        return make

    cases = {"chats": chats, **{interference_key(shape): interference(model) for shape, model in shape_models.items()}}
    for invariant in (False, True):                  # warm-up: kernels, allocator, first calls
        for model, first in ((smollm2, prompts[0]), *((m, [1] * 64) for m in shape_models.values())):
            LLMEngine(model, batch_invariant=invariant).generate([first], SamplingParams(max_tokens=2))
    result = {"rounds": rounds, "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"),
              "torch": torch.__version__, "cpu": cpu_name(), "chats": {"model": "smollm2-135m-instruct", "dtype": "float32",
                                                     "num_chats": num_chats, "max_tokens": max_tokens},
              "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
              **{interference_key(shape): {"shape": shape, "prompt_len": prompt_len,
                                           "num_decoders": num_decoders, "chunk_size": 256}
                 for shape in interference_shapes}}
    for name, make in cases.items():
        rows = []
        for r in range(rounds):
            # Which mode runs first alternates, so a load that rises during a round is shared.
            order = (False, True) if r % 2 == 0 else (True, False)
            timings = {invariant: _timed(make(invariant)) for invariant in order}
            (wall_d, cpu_d, tokens_d), (wall_i, cpu_i, tokens_i) = timings[False], timings[True]
            row = {"default_tok_s": tokens_d / wall_d, "invariant_tok_s": tokens_i / wall_i,
                   "default_cpu_s": cpu_d, "invariant_cpu_s": cpu_i,
                   "default_tokens": tokens_d, "invariant_tokens": tokens_i}
            row["slowdown"] = row["default_tok_s"] / row["invariant_tok_s"]
            row["cpu_slowdown"] = (cpu_i / tokens_i) / (cpu_d / tokens_d)
            rows.append(row)
            if progress:
                print(f"{name}, round {r + 1}/{rounds}: default {row['default_tok_s']:.1f} tok/s, invariant "
                      f"{row['invariant_tok_s']:.1f} tok/s: x{row['slowdown']:.2f} slower (CPU time per token "
                      f"x{row['cpu_slowdown']:.2f})", flush=True)
        for key in ("slowdown", "cpu_slowdown"):
            values = [row[key] for row in rows]
            result[name][key] = statistics.median(values)
            result[name][key + "_range"] = (min(values), max(values))
        result[name]["rounds"] = rows
    result["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return result


def interference_key(shape: str) -> str:
    return "interference" if shape == "tiny" else f"interference_{shape}"


def report(result: dict) -> str:
    lines = []
    for name in [key for key in result if key == "chats" or key.startswith("interference")]:
        r = result[name]
        low, high = r["slowdown_range"]
        what = (f"SmolLM2-135M float32, {r['num_chats']} chats" if name == "chats" else
                f"{r['shape']} model, {r['num_decoders']} streams + a {r['prompt_len']}-token prompt, chunks of 256")
        cpu_low, cpu_high = r["cpu_slowdown_range"]
        lines.append(f"  {what}: default {statistics.median(x['default_tok_s'] for x in r['rounds']):.1f} tok/s, "
                     f"batch_invariant {statistics.median(x['invariant_tok_s'] for x in r['rounds']):.1f} tok/s: "
                     f"x{r['slowdown']:.2f} slower (rounds {low:.2f}-{high:.2f}); CPU time per token "
                     f"x{r['cpu_slowdown']:.2f} ({cpu_low:.2f}-{cpu_high:.2f})")
    return "\n".join(lines)


def main(which: str, out: Path, rounds: int) -> dict:
    if which == "divergence":
        result = bench_divergence()
        (out / DIVERGENCE_FILE.name).write_text(json.dumps(result, indent=1))
        print(f"written to {out / DIVERGENCE_FILE.name} (chapter 11 reads {DIVERGENCE_FILE})")
        return result
    result = bench_invariant_cost(rounds=rounds)
    print(f"\nWhat batch_invariant=True costs ({result['threads']} torch threads, median of {rounds} rounds):")
    print(report(result))
    (out / COST_FILE.name).write_text(json.dumps(result, indent=1))
    print(f"written to {out / COST_FILE.name} (chapter 11 reads {COST_FILE})")
    return result
