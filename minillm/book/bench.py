"""Benchmarks on the device at hand (`python -m minillm bench ...`).

Speed claims live here, measured as ratios within one run, never as timed
asserts in tests (shared machines are noisy).

  chunk-cost    the steps of a chunked 2048-token prefill against the whole
                prefill (the chunks' attention work adds up to the same), and
                what reading the cached prefix costs
  interference  the articles' scenario on the real engine: streams decoding
                when one long prompt arrives; every policy and a sweep of
                chunk sizes; the long prompt's TTFT and the streams' gaps
  hf            useful output tokens/s against transformers' generate on the
                same weights and requests (batches of 8, left padding)
  hf-real       the same race on a real model (SmolLM2-135M-Instruct) with
                32 chat requests: text, not only tokens, must be identical
  simulator     the cost model's predicted step times against measured ones
  memory        heap growth per request of a long-running engine (bench_memory.py)
  lab           the chapter-7 lab's response: a cached slider move, a new setting
  capacity      Sarathi-Serve's capacity headline reproduced on the simulator
  steps         single steps (decode, prefill, mixed) with glibc's defaults and
                with freed host memory kept (bench_steps.py, host_memory.py)
  compile-probe eager steps against a piecewise torch.compile of the layers
                (attention eager), and the one-token step against the weight
                read (bench_compile.py)
  spec          speculative decoding on SmolLM2: useful tok/s and TPOT for k = 0, 2,
                4, 8 on copy-heavy and free-form chats; a long prompt's TTFT among
                8 speculating streams (bench_spec.py, chapter 12)
"""
from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from .. import metrics
from ..sim import workloads
from ..device import default_device
from ..engine import LLMEngine
from ..kv_cache import gather_kv
from ..config import ModelConfig
from ..request import SamplingParams
from .bench_common import BENCH_SHAPES, REAL_MODEL, _seconds, _table, bench_model
from ..scheduler import SchedulerConfig


# What `python -m minillm bench WHICH` runs (the usage line of __main__.py lists them too).
BENCH_COMMANDS = ("chunk-cost", "interference", "hf", "hf-real", "simulator", "memory", "lab", "capacity",
                  "prefix-cache", "partial-prefills", "steps", "compile-probe", "spec", "invariant", "divergence", "all")


def bench_chunk_cost(shape: str = "tiny", prompt_len: int = 2048, chunk_sizes=(256, 64),
                     num_decodes: int = 8, repeats: int = 5, device=None) -> dict:
    """The chunk steps of one prompt against its whole prefill, ratios per repeat.

    The prompt goes through one ModelRunner and one paged cache, as in the
    engine: the whole prompt in one step, or chunk after chunk, each reading
    what the earlier ones wrote. Each repeat times the whole prefill and every
    chunked run back to back, so a burst of load on a shared machine hits
    both sides of a ratio; the median over repeats is reported.

    The attention and matmul work of the chunks adds up to the whole
    prefill's; what chunking adds is one step's fixed cost per extra step
    (reading every weight once more, launching every operator once more).
    `step_floor_s` measures that cost (a one-token step) and `predicted`
    the ratio it implies: 1 + (steps - 1) * floor / whole.
    With decodes: num_decodes requests with prompt_len cached tokens ride
    along every chunk (prepare_step, seeded random cache).
    `hf_step_floor_s` is transformers' own one-token forward of the same
    weights, timed beside it: the fixed price is eager PyTorch's (operators
    launched one by one from Python, every weight read), not minillm's.
    """
    from ..prefill import prepare_step

    model = bench_model(shape, device)
    tokens = torch.randint(0, model.cfg.vocab_size, (prompt_len,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    runner = _runner(model, prompt_len)
    floor_step = prepare_step(model, [(1, 0)])
    hf_floor_step = _hf_one_token_forward(model)
    c = chunk_sizes[0]
    riders = [(1, prompt_len)] * num_decodes
    with_decodes = [prepare_step(model, [(c, s)] + riders) for s in range(0, prompt_len, c)]
    cases = {f"C={size}": size for size in chunk_sizes}
    for size in (prompt_len, *chunk_sizes):
        _prefill_seconds(runner, tokens, size)                          # warm-up
    [step() for step in with_decodes]
    ratios = {name: [] for name in cases}
    ratios[f"C={c} + {num_decodes} decodes"] = []
    whole_s, floor_s, hf_floor_s = [], [], []
    for _ in range(repeats):
        whole_s.append(_prefill_seconds(runner, tokens, prompt_len))
        for name, size in cases.items():
            ratios[name].append(_prefill_seconds(runner, tokens, size) / whole_s[-1])
        ratios[f"C={c} + {num_decodes} decodes"].append(sum(_seconds(step) for step in with_decodes)
                                                         / whole_s[-1])
        floor_s.append(statistics.median(_seconds(floor_step) for _ in range(5)))
        hf_floor_s.append(statistics.median(_seconds(hf_floor_step) for _ in range(5)))
    whole, floor = statistics.median(whole_s), statistics.median(floor_s)
    matmuls = bench_matmul_rows(model, prompt_len, chunk_sizes)
    return {"shape": shape, "device": str(model.device), "prompt_len": prompt_len,
            "whole_prefill_s": whole, "step_floor_s": floor, "hf_step_floor_s": statistics.median(hf_floor_s),
            "chunks_over_whole": {name: statistics.median(r) for name, r in ratios.items()},
            "predicted": {f"C={size}": 1 + (-(-prompt_len // size) - 1) * floor / whole
                          for size in chunk_sizes},
            "matmuls": matmuls,
            # Fixed price per extra step, plus the matmuls' slower pace on fewer rows.
            "predicted_with_matmuls": {
                f"C={size}": 1 + ((-(-prompt_len // size) - 1) * floor
                                  + matmuls["whole_s"] * (matmuls["chunked_over_whole"][f"C={size}"] - 1)) / whole
                for size in chunk_sizes},
            "spread": {name: (min(r), max(r)) for name, r in ratios.items()},
            "prefix_read": bench_prefix_read(model, prompt_len - chunk_sizes[0]),
            "break_even": bench_break_even(model, c, prompt_len - c)}


def _hf_one_token_forward(model):
    """transformers' forward of one token through the same weights, no cache."""
    hf = to_hf_model(model)
    token = torch.tensor([[0]], device=model.device)

    def forward():
        with torch.inference_mode():
            hf(token, use_cache=False)
    forward()                                                           # warm-up
    return forward


def _runner(model, num_tokens: int, block_size: int = 16):
    from ..kv_cache import BlockManager, blocks_for
    from ..model_runner import ModelRunner

    return ModelRunner(model, BlockManager(blocks_for(num_tokens, block_size), block_size))


def _prefill_seconds(runner, tokens: list[int], chunk_size: int) -> float:
    """Seconds of the steps that prefill `tokens` in chunks of chunk_size (one
    runner, one cache, the engine's path); only the last chunk samples."""
    from ..model_runner import StepChunk

    blocks = runner.block_manager
    blocks.allocate("prompt", len(tokens))
    try:
        total = 0.0
        for start in range(0, len(tokens), chunk_size):
            chunk = StepChunk("prompt", tokens[start:start + chunk_size], start,
                              sample=start + chunk_size >= len(tokens))
            total += _seconds(lambda: runner.execute([chunk]))
        return total
    finally:
        blocks.free("prompt")


def bench_matmul_rows(model, prompt_len: int, chunk_sizes, repeats: int = 5) -> dict:
    """The model's matmuls on a whole prompt's rows against the same rows in chunks.

    Chunking does not change the matmuls' FLOPs, but a BLAS runs a matrix
    product of 64 or 256 rows slower per row than one of 2048: each call
    re-reads (and repacks) the whole weight for fewer rows. Times every
    Linear of one layer (all layers have the same shapes) on prompt_len rows
    and on chunk-sized rows, interleaved; whole_s is the model's matmul time
    for the whole prompt (one layer's x num_layers).
    """
    layer = model.model.layers[0]
    linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    sizes = (prompt_len, *chunk_sizes)
    inputs = {m: {rows: torch.randn(rows, m.in_features, dtype=model.dtype, device=model.device)
                  for rows in sizes} for m in linears}

    def all_linears(rows):
        with torch.inference_mode():
            for m in linears:
                m(inputs[m][rows])

    times = {rows: [] for rows in sizes}
    for rows in sizes:
        all_linears(rows)                                                   # warm-up
    for _ in range(repeats):
        for rows in sizes:
            times[rows].append(_seconds(lambda: all_linears(rows)))
    per_row = {rows: statistics.median(t) / rows for rows, t in times.items()}
    return {"whole_s": per_row[prompt_len] * prompt_len * len(model.model.layers),
            "chunked_over_whole": {f"C={size}": per_row[size] / per_row[prompt_len] for size in chunk_sizes}}


def bench_break_even(model, chunk: int, num_cached: int, repeats: int = 7) -> dict:
    """The break-even length this machine shows (chunk_sizing.py's weight of a
    token's matmuls, in keys) against the FLOP count's.

    Times a one-token step (the fixed part), a chunk with nothing cached and
    the same chunk after num_cached tokens, interleaved, medians; with
    t = fixed + a * prefill_work(start, chunk, K), the two chunks give a and K.
    """
    from ..prefill import prepare_step

    steps = {"floor": prepare_step(model, [(1, 0)]), "first": prepare_step(model, [(chunk, 0)]),
             "late": prepare_step(model, [(chunk, num_cached)])}
    times = {name: [] for name in steps}
    [step() for step in steps.values()]                                   # warm-up
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(_seconds(step))
    t = {name: statistics.median(ts) for name, ts in times.items()}
    per_pair = (t["late"] - t["first"]) / (chunk * num_cached)           # seconds per query-key pair
    measured = ((t["first"] - t["floor"]) / per_pair - chunk * (chunk + 1) / 2) / chunk
    return {"measured": measured, "flops": model.cfg.attention_break_even_len,
            "chunk": chunk, "num_cached": num_cached}


def bench_prefix_read(model, num_cached: int, repeats: int = 20) -> dict:
    """Seconds per step to read one request's cached prefix for every layer.

    view_s: blocks consecutive in the pool, one view for every layer (no copy);
    per_layer_s: blocks scattered, each layer gathers its K and its V (what
    the engine does); one_copy_per_step_s: scattered, every layer's prefix
    copied at once (an earlier design, dropped: slower on deep models).
    """
    cfg, block_size = model.cfg, 16
    num_blocks = 2 * -(-num_cached // block_size)
    pool = torch.randn(cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                       dtype=model.dtype, device=model.device)
    consecutive = list(range(num_blocks // 2))
    scattered = list(range(0, num_blocks, 2))

    def per_layer():
        for layer in pool:
            for cache in layer:
                gather_kv(cache, scattered, num_cached)

    runs = {"view_s": lambda: gather_kv(pool, consecutive, num_cached),
            "per_layer_s": per_layer,
            "one_copy_per_step_s": lambda: gather_kv(pool, scattered, num_cached)}
    return {name: statistics.median(_seconds(run) for _ in range(repeats)) for name, run in runs.items()}


def interference_case(model, policy: str, chunk_size: int | None, workload, chunk_sizing: str = "fixed") -> dict:
    sched = SchedulerConfig(policy=policy, chunk_size=chunk_size or 512, max_num_seqs=64,
                            chunk_sizing=chunk_sizing if policy == "chunked" else "fixed")
    engine = LLMEngine(model, sched)
    gc.collect()              # what earlier cases left is freed now, not in one of this case's steps
    outputs = engine.run_workload(workload)
    long = next(o for o in outputs if o.tag == "long")
    streams = metrics.summarize([o for o in outputs if o.tag == "decoder"])
    everything = metrics.summarize(outputs)
    long_steps = [r.duration for r in engine.trace if dict(r.scheduled).get(long.request_id, 0) > 1]
    return {
        "policy": policy, "chunk_size": chunk_size if policy == "chunked" else "-",
        "sizing": sched.chunk_sizing if policy == "chunked" else "-",
        "long_ttft_s": long.metrics.ttft,
        "tpot_mean_s": streams["tpot"]["mean"],
        "itl_p50_s": streams["itl"]["median"], "itl_p99_s": streams["itl"]["p99"],
        "itl_max_s": streams["itl"]["max"],
        "throughput_tok_s": everything["throughput_tok_s"],
        "steps": len(engine.trace),
        "long_prompt_steps_s": long_steps,      # the long prompt's prefill steps, in order
    }


def bench_interference(prompt_len: int = 2048, num_decoders: int = 8,
                       chunk_sizes=(64, 128, 256, 512, 1024), out_dir: Path | None = None,
                       device=None, progress: bool = True, shape: str = "tiny", rounds: int = 1,
                       chunk_sizings=("fixed",)) -> dict:
    """Returns the table and the headline ratios (chunked 256 vs prefill_first,
    for each chunk sizing: "fixed" tokens or "equal_work", chunk_sizing.py).

    rounds > 1 runs every case that many times, one round after another, and
    reports the median of each number (the headline ratios are taken within
    each round, then their median and range): a stream's worst gap is one
    step, and one slow moment of a shared machine moves it by a fifth.
    """
    from tqdm.auto import tqdm

    _check_rounds(rounds)
    device = device or default_device()
    model = bench_model(shape, device)
    # The streams decode 32 tokens past the long prompt's arrival: enough to
    # outlast a 256-token chunking, and few enough that one stall per stream
    # is more than 1% of all gaps, so p99 ITL sees it.
    workload = workloads.long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders,
                                                  decoder_prompt_len=64, warmup_tokens=8,
                                                  decoder_output_len=40, long_output_len=8)
    # Warm up kernels and allocator once so the first case is not penalised.
    LLMEngine(model, SchedulerConfig()).generate([[1] * 64], SamplingParams(max_tokens=2, ignore_eos=True))
    cases = ([("prefill_first", None, "fixed"), ("decode_first", None, "fixed")]
             + [("chunked", c, sizing) for sizing in chunk_sizings for c in chunk_sizes])
    runs = [[interference_case(model, p, c, workload, sizing) for p, c, sizing in cases]
            for _ in tqdm(range(rounds), desc=f"interference, {len(cases)} cases a round",
                          disable=not progress)]
    result = {
        "device": str(device), "shape": shape, "prompt_len": prompt_len, "num_decoders": num_decoders,
        "rounds": rounds, "rows": [_median_row(case_runs) for case_runs in zip(*runs)], "by_sizing": {},
    }
    headline_chunk = 256 if 256 in chunk_sizes else chunk_sizes[-1]
    for sizing in chunk_sizings:
        headline_runs = [_interference_headline(round_rows, sizing, headline_chunk) for round_rows in runs]
        result["by_sizing"][sizing] = {
            "headline_chunk_size": headline_chunk,
            "chunked256_vs_prefill_first": {key: statistics.median(h[key] for h in headline_runs)
                                            for key in headline_runs[0]},
            "headline_spread": {key: (min(h[key] for h in headline_runs), max(h[key] for h in headline_runs))
                                for key in headline_runs[0]}}
    result.update(result["by_sizing"][chunk_sizings[0]])         # the first sizing's, at the top
    if out_dir is not None:
        name = "interference.png" if shape == "tiny" else f"interference_{shape}.png"
        _save_interference_figure(result["rows"], Path(out_dir) / name, prompt_len, num_decoders)
    return result


def _check_rounds(rounds) -> None:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r}: must be a whole number of rounds, at least 1")


def _interference_headline(rows: list[dict], sizing: str = "fixed", chunk_size: int = 256) -> dict:
    base = rows[0]
    ref = next(r for r in rows if r["sizing"] == sizing and r["chunk_size"] == chunk_size)
    return {"itl_max_reduction": base["itl_max_s"] / ref["itl_max_s"],
            "itl_p99_reduction": base["itl_p99_s"] / ref["itl_p99_s"],
            "long_ttft_growth": ref["long_ttft_s"] / base["long_ttft_s"]}


def _median_row(case_runs) -> dict:
    """One case's rows from several rounds -> the median of each number (of
    each position, for lists of the same length)."""
    def median(key, value):
        if isinstance(value, float):
            return statistics.median(r[key] for r in case_runs)
        if isinstance(value, list) and len({len(r[key]) for r in case_runs}) == 1:
            return [statistics.median(column) for column in zip(*(r[key] for r in case_runs))]
        return value
    return {key: median(key, value) for key, value in case_runs[0].items()}


def _save_interference_figure(rows, path: Path, prompt_len: int, num_decoders: int) -> None:
    from matplotlib.figure import Figure

    base = rows[0]
    fig = Figure(figsize=(8, 3.5), layout="constrained")
    ax_gap, ax_ttft = fig.subplots(1, 2)
    sizings = list(dict.fromkeys(r["sizing"] for r in rows if r["policy"] == "chunked"))
    for i, sizing in enumerate(sizings):
        chunked = [r for r in rows if r["policy"] == "chunked" and r["sizing"] == sizing]
        sizes = [r["chunk_size"] for r in chunked]
        name = "chunked" if sizings == ["fixed"] else f"chunked, {sizing}"
        max_color, p99_color = (("C0", "C1"), ("C2", "C4"))[i % 2]     # C3 (red) is prefill_first's
        ax_gap.plot(sizes, [r["itl_max_s"] * 1e3 for r in chunked], "o-", color=max_color,
                    label=f"{name}: max ITL")
        ax_gap.plot(sizes, [r["itl_p99_s"] * 1e3 for r in chunked], "s--", color=p99_color,
                    label=f"{name}: p99 ITL")
        ax_ttft.plot(sizes, [r["long_ttft_s"] * 1e3 for r in chunked], "o-", color=max_color, label=name)
    ax_gap.axhline(base["itl_max_s"] * 1e3, color="C3", label="prefill_first: max ITL")
    ax_gap.set(xscale="log", xlabel="chunk size (tokens)", ylabel="decoding streams' gap (ms)",
               title="Chunking shrinks the worst token gap")
    ax_gap.legend(fontsize=8)
    ax_ttft.axhline(base["long_ttft_s"] * 1e3, color="C3", label="prefill_first")
    ax_ttft.set(xscale="log", xlabel="chunk size (tokens)", ylabel="long prompt's TTFT (ms)",
                title="...and costs the long prompt a little TTFT")
    ax_ttft.legend(fontsize=8)
    fig.suptitle(f"{prompt_len}-token prompt arriving among {num_decoders} decoding streams (measured)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------
# Against Hugging Face transformers' generate
# ---------------------------------------------------------------------------
def to_hf_model(model):
    """The same weights in transformers' LlamaForCausalLM."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position,
                         rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                         tie_word_embeddings=cfg.tie_word_embeddings, bos_token_id=cfg.bos_token_id,
                         eos_token_id=cfg.eos_token_id, pad_token_id=0)
    hf = LlamaForCausalLM(hf_cfg).to(dtype=model.dtype, device=model.device).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if cfg.tie_word_embeddings:     # the LM head is the embedding: nothing to load
        hf.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise RuntimeError(f"weights do not line up: missing {missing}, unexpected {unexpected}")
    return hf


def hf_generate(hf, prompts, output_lens, batch_size: int = 8, eos_token_id=None):
    """transformers' generate, greedy, in batches with left padding; returns
    each request's first output_len tokens (up to and with its EOS when
    eos_token_id is given) and the wall time."""
    device = next(hf.parameters()).device
    results = []
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        lens = output_lens[start:start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            out = hf.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                              max_new_tokens=max(lens), do_sample=False, pad_token_id=0,
                              eos_token_id=eos_token_id,
                              min_new_tokens=None if eos_token_id is not None else max(lens))
        for i, n in enumerate(lens):
            tokens = out[i, width:width + n].tolist()
            if eos_token_id in tokens:
                tokens = tokens[:tokens.index(eos_token_id) + 1]
            results.append(tokens)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return results, time.perf_counter() - t0


def bench_hf(num_requests: int = 32, device=None, seed: int = 0, shape: str = "tiny",
             rounds: int = 1) -> dict:
    """Useful output tokens/s of the engine against transformers' generate.

    rounds > 1 races them that many times, back to back in each round; the
    speedup is taken within a round, and its median and range are reported.
    """
    _check_rounds(rounds)
    device = device or default_device()
    model = bench_model(shape, device)
    wl = workloads.poisson_mix(num_requests, rate_per_s=float("inf"), prompt_len=(32, 512),
                               output_len=(16, 128), seed=seed)
    prompts = [wl.prompt_ids(i, model.cfg.vocab_size) for i in range(num_requests)]
    output_lens = [r.max_tokens for r in wl.requests]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
    hf = to_hf_model(model)
    hf_generate(hf, prompts[:2], [2, 2])                           # warm-up
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=512, max_num_seqs=64))
    engine.generate([[1] * 16], SamplingParams(max_tokens=2, ignore_eos=True))   # warm-up
    hf_times, our_times = [], []
    for _ in range(rounds):
        gc.collect()
        hf_tokens, hf_s = hf_generate(hf, prompts, output_lens)
        gc.collect()          # each side starts with nothing left for the collector
        first_step = len(engine.trace)
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        hf_times.append(hf_s)
        our_times.append(time.perf_counter() - t0)
        steps = engine.trace[first_step:]        # where this round's time went, by kind of step
    speedups = [h / o for h, o in zip(hf_times, our_times)]
    hf_s, ours_s = statistics.median(hf_times), statistics.median(our_times)
    useful = sum(output_lens)
    same = [o.output_token_ids == h for o, h in zip(outs, hf_tokens)]
    return {
        "device": str(device), "shape": shape, "num_requests": num_requests, "useful_tokens": useful,
        "rounds": rounds, "minillm_s": ours_s, "hf_s": hf_s,
        "minillm_tok_s": useful / ours_s, "hf_tok_s": useful / hf_s,
        "speedup": statistics.median(speedups), "speedup_spread": (min(speedups), max(speedups)),
        "identical_requests": sum(same), "first_mismatch": _first_mismatch(model, prompts, outs, hf_tokens),
        "minillm_steps": _time_by_step_kind(steps, our_times[-1]),
    }


def _time_by_step_kind(steps, wall_s: float) -> dict:
    """Seconds in steps that carry prompt tokens (prefill, decodes riding along) and in
    decode-only steps, from an engine's trace of a run that took wall_s."""
    prefill = [r for r in steps if r.num_prefill_tokens > 0]
    decode = [r for r in steps if r.num_prefill_tokens == 0]
    return {"prefill_steps": len(prefill), "prefill_s": sum(r.end - r.start for r in prefill),
            "prompt_tokens": sum(r.num_prefill_tokens for r in prefill),
            "decode_steps": len(decode), "decode_s": sum(r.end - r.start for r in decode), "wall_s": wall_s}


def bench_hf_real(num_requests: int = 32, device=None, dtype=torch.float32, max_tokens=(16, 96)) -> dict:
    """Useful output tokens/s on SmolLM2-135M-Instruct: chat requests of mixed
    lengths, greedy, each stopping at its end-of-turn token or max_tokens."""
    from ..pretrained_models import pretrained
    from .chats import chat_requests

    device = device or default_device()
    model, tok = pretrained("smollm2-135m-instruct", dtype=dtype, device=device)
    prompts = [tok.apply_chat_template([{"role": "user", "content": m}]) for m in chat_requests(num_requests)]
    low, high = max_tokens
    output_lens = [low + (i * 37) % (high - low + 1) for i in range(num_requests)]
    hf = to_hf_model(model)
    hf_generate(hf, prompts[:2], [2, 2], eos_token_id=tok.eos_token_id)           # warm-up
    hf_tokens, hf_s = hf_generate(hf, prompts, output_lens, eos_token_id=tok.eos_token_id)
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=512, max_num_seqs=64),
                       tokenizer=tok)
    engine.generate(prompts[:1], SamplingParams(max_tokens=2))                       # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [SamplingParams(max_tokens=n) for n in output_lens])
    ours_s = time.perf_counter() - t0
    useful = sum(len(o.output_token_ids) for o in outs)
    same = [o.text == tok.decode(h) and o.output_token_ids == h for o, h in zip(outs, hf_tokens)]
    return {
        "device": str(device), "model": "smollm2-135m-instruct", "dtype": str(dtype).replace("torch.", ""),
        "num_requests": num_requests, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
        "useful_tokens": useful, "minillm_s": ours_s, "hf_s": hf_s,
        "minillm_tok_s": useful / ours_s, "hf_tok_s": useful / hf_s, "speedup": hf_s / ours_s,
        "identical_requests": sum(same), "example": {"prompt": chat_requests(1)[0], "answer": outs[0].text},
        "first_mismatch": _first_mismatch(model, prompts, outs, hf_tokens),
    }


def _first_mismatch(model, prompts, outs, hf_tokens):
    """Where the first differing request diverges, and how close the two
    candidate logits were there (float32 ties flip with reduction order)."""
    from ..prefill import prefill_kv

    for i, (o, h) in enumerate(zip(outs, hf_tokens)):
        if o.output_token_ids != h:
            k = next((j for j, (a, b) in enumerate(zip(o.output_token_ids, h)) if a != b),
                     min(len(o.output_token_ids), len(h)) - 1)   # one stopped earlier
            _, logits = prefill_kv(model, prompts[i] + o.output_token_ids[:k])
            last = logits[-1]
            gap = float(last[o.output_token_ids[k]] - last[h[k]])
            return {"request": i, "position": k, "logit_gap": gap}
    return None


def bench_lab(repeats: int = 2) -> dict:
    """The lab's response times, as a learner meets them (seconds, wall clock).

    new_setting_s: a LabView opened on a fresh load setting (every simulation:
    the chunk sweep and the capacity searches; the lab shows progress meanwhile);
    new_rate_s: the rate slider moved to a rate not seen (the sweep at that rate);
    cached_move_s: median of chunk-size moves over settings already simulated
    (verdict, the marks redrawn over the kept figure, PNG), `repeats` rounds over
    4 chunk sizes; interference: moves back to settings drawn before, and first
    draws of settings simulated but not yet drawn.
    """
    import statistics

    from . import lab, widgets
    lab.LAB.clear()
    settings = lab.LabSettings(workload="chat", rate_per_s=4.0, itl_slo_ms=100.0)
    t0 = time.perf_counter()
    view = widgets.LabView(settings)
    new_setting_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    view.controls["rate_per_s"].value = 8.0
    new_rate_s = time.perf_counter() - t0
    moves = []
    for _ in range(repeats):
        for chunk in (64, 256, 1024, 4096):
            t0 = time.perf_counter()
            view.controls["chunk_size"].value = chunk
            moves.append(time.perf_counter() - t0)
    interference = widgets.LabView(lab.LabSettings())
    interference_moves = []
    for chunk in (64, 256, 1024, 64, 256, 1024):
        t0 = time.perf_counter()
        interference.controls["chunk_size"].value = chunk
        interference_moves.append(time.perf_counter() - t0)
    return {"new_setting_s": new_setting_s, "new_rate_s": new_rate_s,
            "cached_move_s": statistics.median(moves), "cached_moves": moves,
            "interference_move_s": statistics.median(interference_moves[len(interference_moves) // 2:]),
            # the first visits: a simulated run drawn for the first time (a different figure each)
            "interference_first_draw_s": statistics.median(interference_moves[:len(interference_moves) // 2]),
            "targets": {"cached_move_s": 0.25, "new_setting_s": "2 s or progress shown"}}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minillm bench")
    parser.add_argument("which", choices=BENCH_COMMANDS, nargs="?", default="all")
    parser.add_argument("--out", default="bench-results", help="folder for the JSON results and figures")
    parser.add_argument("--shape", choices=sorted(BENCH_SHAPES) + [REAL_MODEL, "all"], default="tiny",
                        help="model shape for chunk-cost, interference, hf, steps and compile-probe ('all': each in turn)")
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--num-decoders", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="chunk-cost and compile-probe: runs per ratio (median)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="interference and hf: rounds of the whole race (medians and ranges reported)")
    parser.add_argument("--processes", type=int, default=3, help="steps: processes per side")
    parser.add_argument("--chunk-sizes", default="64,128,256,512,1024",
                        help="interference: comma-separated chunk sizes (256 is the headline)")
    parser.add_argument("--chunk-sizing", default="fixed,equal_work",
                        help="interference: comma-separated chunk sizings raced in each round "
                             "('fixed' tokens, 'equal_work' chunks; the first gives the top headline)")
    parser.add_argument("--memory-requests", type=int, default=20_000, help="requests served by `memory`")
    parser.add_argument("--spec-rounds", type=int, default=3, help="spec: rounds of every setting (medians, ranges)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = sorted(BENCH_SHAPES) if args.shape == "all" else [args.shape]
    results = {}
    for shape in shapes:
        results[shape] = _run_shape(args, shape, out)
    if args.which in ("hf-real", "all"):
        r = bench_hf_real()
        results["hf_real"] = r
        print(f"\nA real model, {r['model']} ({r['dtype']}), vs transformers.generate on {r['device']}: "
              f"{r['num_requests']} chat requests (prompts of {r['prompt_tokens'][0]}-{r['prompt_tokens'][1]} "
              f"tokens), {r['useful_tokens']} useful output tokens")
        print(f"minillm {r['minillm_tok_s']:.1f} tok/s ({r['minillm_s']:.2f} s), "
              f"transformers {r['hf_tok_s']:.1f} tok/s ({r['hf_s']:.2f} s): {r['speedup']:.2f}x; "
              f"identical text for {r['identical_requests']}/{r['num_requests']} requests"
              + (f"; first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
        print(f"e.g. {r['example']['prompt']!r} -> {r['example']['answer']!r}")
    if args.which in ("simulator", "all"):
        from . import fidelity
        r = fidelity.run_cpu_fidelity()
        results["simulator"] = r
        print(f"\nSimulator fidelity on {r['device']} ({r['model']}, {r['dtype']}): predicted vs measured "
              f"step time over {r['num_evaluation_shapes']} batch shapes (fit on {r['num_calibration_shapes']} "
              f"others): median error {r['median_abs_rel_error']:.1%}, p90 {r['p90_abs_rel_error']:.1%}, "
              f"max {r['max_abs_rel_error']:.1%} (fit and evaluation timed in one round-robin; a roofline "
              f"of a measured matmul and copy: {r['calibrate_median_abs_rel_error']:.0%})")
        check = fidelity.run_calibrate_check(rounds=3)
        results["calibrate_check"] = check
        print("The public path: calibrate() afresh, then the held-out sweep timed right after; "
              "each fit scored on that round's and every later round's sweep:")
        for fit_round, eval_round, error in check["errors"]:
            print(f"  fit of round {fit_round}, sweep of round {eval_round}: median error {error:.1%}")
        for a, b, drift in check["drift"]:
            print(f"  the machine itself, round {a} -> {b}: the same steps moved {drift:.1%} (median)")
    if args.which in ("prefix-cache", "partial-prefills", "all"):
        from .bench_ch8 import report
        results.update(report(args.which))
    if args.which in ("spec", "all"):
        from . import bench_spec
        results["spec"] = bench_spec.report(rounds=args.spec_rounds)
        bench_spec.save(results["spec"], out / "bench_spec.json")
    if args.which in ("invariant", "divergence"):     # chapter 11 (divergence: ~1 h, not in `all`)
        from .bench_invariant import main as invariant_main
        results[args.which] = invariant_main(args.which, out, args.rounds if args.rounds > 1 else 3)
    if args.which in ("memory", "all"):
        from .bench_memory import bench_memory, report
        results["memory"] = bench_memory(args.memory_requests, warmup_requests=args.memory_requests // 4)
        print(f"\nMemory of a long-running engine ({args.memory_requests:,} short requests, "
              "heap growth after a quarter of them)")
        print(report(results["memory"]))
    if args.which in ("lab", "all"):
        r = bench_lab()
        results["lab"] = r
        print(f"\nThe lab: a cached slider move answers in {r['cached_move_s'] * 1e3:.0f} ms (median; "
              f"target 250); interference lab {r['interference_move_s'] * 1e3:.0f} ms back to a setting "
              f"drawn before, {r['interference_first_draw_s'] * 1e3:.0f} ms to draw a simulated one the "
              f"first time; a new load setting "
              f"{r['new_setting_s']:.1f} s (progress shown), a new rate {r['new_rate_s']:.1f} s")
    if args.which in ("capacity", "all"):
        from ..sim.capacity import sarathi_headline
        r = sarathi_headline()
        results["capacity"] = r
        print(f"\nSarathi-Serve's capacity experiment on the simulator (Mistral-7B, A100-80GB profile, "
              f"chat mix; decode step {r['decode_step_ms']:.1f} ms)")
        for name in ("strict", "relaxed"):
            c = r[name]
            paper = f" (paper: {c['paper_ratio']}x)" if c["paper_ratio"] else ""
            print(f"  {name:8s} P99 ITL <= {c['itl_p99_slo_ms']:.0f} ms: " + ", ".join(
                f"{k} {v:.2f} req/s" for k, v in c["capacity_req_s"].items()) + f": {c['ratio']:.1f}x{paper}")
    (out / "bench.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nresults written to {out}/")
    return 0


def _run_shape(args, shape: str, out: Path) -> dict:
    results = {}
    described = f"{shape} model ({_describe(shape)})"
    if args.which in ("chunk-cost", "all"):
        r = bench_chunk_cost(shape, args.prompt_len, repeats=args.repeats)
        results["chunk_cost"] = r
        print(f"\nChunk cost on {r['device']}, {described}: the chunk steps of a {r['prompt_len']}-token "
              f"prompt against its whole prefill ({r['whole_prefill_s'] * 1e3:.0f} ms), median of "
              f"{args.repeats} runs")
        for name, ratio in r["chunks_over_whole"].items():
            low, high = r["spread"][name]
            predicted = (f"; fixed cost predicts x{r['predicted'][name]:.3f}, with the matmuls' pace "
                         f"x{r['predicted_with_matmuls'][name]:.3f}") if name in r["predicted"] else ""
            print(f"  {name:>18}: x{ratio:.3f} the whole prefill (runs {low:.3f}-{high:.3f}){predicted}")
        print(f"  one step's fixed cost (a one-token step: every weight read, every operator launched): "
              f"{r['step_floor_s'] * 1e3:.2f} ms; transformers' one-token forward of the same weights: "
              f"{r['hf_step_floor_s'] * 1e3:.2f} ms")
        m = r["matmuls"]
        print(f"  the model's matmuls alone ({m['whole_s'] * 1e3:.0f} ms for the whole prompt), the same rows "
              f"in chunks: " + ", ".join(f"{name} x{ratio:.2f}" for name, ratio in m["chunked_over_whole"].items()))
        b = r["break_even"]
        print(f"  break-even length (a token's attention over that many keys costs its matmuls), from a "
              f"{b['chunk']}-token chunk after 0 and {b['num_cached']} cached: {b['measured']:.0f} on this "
              f"machine, {b['flops']} by the FLOPs (chunk_sizing='equal_work' weighs by the FLOPs)")
        p = r["prefix_read"]
        print(f"  reading a {args.prompt_len - 256}-token cached prefix, every layer: consecutive blocks "
              f"{p['view_s'] * 1e3:.3f} ms (a view); scattered {p['per_layer_s'] * 1e3:.2f} ms/step (a gather "
              f"per layer; every layer in one copy: {p['one_copy_per_step_s'] * 1e3:.2f} ms)")
    if args.which in ("interference", "all"):
        chunk_sizes = tuple(int(c) for c in args.chunk_sizes.split(","))
        sizings = tuple(args.chunk_sizing.split(","))
        r = bench_interference(args.prompt_len, args.num_decoders, chunk_sizes=chunk_sizes, out_dir=out,
                               shape=shape, rounds=args.rounds, chunk_sizings=sizings)
        results["interference"] = r
        print(f"\nInterference on {r['device']}: a {r['prompt_len']}-token prompt arrives among "
              f"{r['num_decoders']} decoding streams ({described}, seconds"
              + (f", median of {r['rounds']} rounds)" if r["rounds"] > 1 else ")"))
        print(_table(r["rows"], [("policy", "policy", ""), ("chunk_size", "chunk", ""), ("sizing", "sizing", ""),
                                 ("long_ttft_s", "long TTFT", ".3f"), ("tpot_mean_s", "TPOT mean", ".4f"),
                                 ("itl_p50_s", "ITL p50", ".4f"), ("itl_p99_s", "ITL p99", ".4f"),
                                 ("itl_max_s", "ITL max", ".4f"), ("throughput_tok_s", "tok/s", ".1f"),
                                 ("steps", "steps", "d")]))
        for row in r["rows"]:
            if row["policy"] == "chunked" and row["chunk_size"] == 256:
                print(f"  the long prompt's chunk steps, chunked 256 {row['sizing']} (ms): "
                      + " ".join(f"{t * 1e3:.1f}" for t in row["long_prompt_steps_s"]))
        for sizing, headline in r["by_sizing"].items():
            h, spread = headline["chunked256_vs_prefill_first"], headline["headline_spread"]
            ranges = {key: f" ({low:.2f}-{high:.2f})" if r["rounds"] > 1 else ""
                      for key, (low, high) in spread.items()}
            print(f"chunked {headline['headline_chunk_size']} ({sizing}) vs prefill_first: max ITL "
                  f"{h['itl_max_reduction']:.1f}x lower"
                  f"{ranges['itl_max_reduction']}, p99 ITL {h['itl_p99_reduction']:.1f}x lower"
                  f"{ranges['itl_p99_reduction']}, long-prompt TTFT x{h['long_ttft_growth']:.2f}"
                  f"{ranges['long_ttft_growth']}")
    if args.which in ("steps", "all"):
        from .bench_steps import bench_steps, report
        r = bench_steps(shape, processes=args.processes)
        results["steps"] = r
        print(f"\nSingle steps, {described}: glibc's defaults against freed host memory kept "
              f"(host_memory.py), {r['processes']} processes a side, alternating, the fastest of each")
        print(report(r))
    if args.which in ("compile-probe", "all"):
        from .bench_compile import bench_compile_probe, report
        r = bench_compile_probe(shape, repeats=args.repeats)
        results["compile_probe"] = r
        print("\nIs the fixed price eager PyTorch's or the weight read? " + report(r))
    if args.which in ("hf", "all"):
        r = bench_hf(shape=shape, rounds=args.rounds)
        results["hf"] = r
        low, high = r["speedup_spread"]
        print(f"\nThroughput vs transformers.generate on {r['device']}, {described} ({r['num_requests']} "
              f"requests, {r['useful_tokens']} useful output tokens"
              + (f", median of {r['rounds']} rounds)" if r["rounds"] > 1 else ")"))
        print(f"minillm {r['minillm_tok_s']:.1f} tok/s ({r['minillm_s']:.2f} s), "
              f"transformers {r['hf_tok_s']:.1f} tok/s ({r['hf_s']:.2f} s): {r['speedup']:.2f}x"
              + (f" (rounds {low:.2f}-{high:.2f})" if r["rounds"] > 1 else "") + "; "
              f"identical greedy outputs for {r['identical_requests']}/{r['num_requests']} requests"
              + (f"; first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
        k = r["minillm_steps"]
        print(f"minillm's last round: {k['prefill_steps']} steps with prompt tokens {k['prefill_s']:.2f} s "
              f"({k['prompt_tokens']} tokens), {k['decode_steps']} decode-only steps {k['decode_s']:.2f} s")
    return results


def _describe(shape: str) -> str:
    if shape == REAL_MODEL:                             # the GGUF's header only, not its weights
        from ..gguf_loader import gguf_config, read_gguf
        from ..pretrained_models import gguf_path
        path = gguf_path("smollm2-135m-instruct")
        cfg = gguf_config(read_gguf(path), path)
    else:
        cfg = dataclasses.replace(ModelConfig.preset("tiny"), **BENCH_SHAPES[shape])
    return (f"hidden {cfg.hidden_size}, {cfg.num_heads} query heads / {cfg.num_kv_heads} KV heads, "
            f"head_dim {cfg.head_dim}, {cfg.num_layers} layers")
