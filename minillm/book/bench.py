"""Benchmarks on the device at hand (`python -m minillm bench ...`).

Speed claims live here, measured as ratios within one run, never as timed
asserts in tests (shared machines are noisy).

  interference  the articles' scenario on the real engine: streams decoding
                when one long prompt arrives; every policy and a sweep of
                chunk sizes; the long prompt's TTFT and the streams' gaps
  hf            useful output tokens/s against transformers' generate on the
                same weights and requests (batches of 8, left padding)
  hf-real       the same race on a real model (SmolLM2-135M-Instruct) with
                32 chat requests: text, not only tokens, must be identical
  simulator     the cost model's predicted step times against measured ones
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .. import metrics
from ..sim import workloads
from ..device import default_device
from ..engine import LLMEngine
from ..loader import build_model
from ..request import SamplingParams
from ..scheduler import SchedulerConfig


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """columns: (key, header, format)."""
    header = " ".join(f"{h:>{max(len(h), 9)}}" for _, h, _ in columns)
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = []
        for key, h, fmt in columns:
            value = row[key]
            cells.append(f"{format(value, fmt) if not isinstance(value, str) else value:>{max(len(h), 9)}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def interference_case(model, policy: str, chunk_size: int | None, workload) -> dict:
    sched = SchedulerConfig(policy=policy, chunk_size=chunk_size or 512, max_num_seqs=64)
    engine = LLMEngine(model, sched)
    outputs = engine.run_workload(workload)
    long = next(o for o in outputs if o.tag == "long")
    streams = metrics.summarize([o for o in outputs if o.tag == "decoder"])
    everything = metrics.summarize(outputs)
    return {
        "policy": policy, "chunk_size": chunk_size if policy == "chunked" else "-",
        "long_ttft_s": long.metrics.ttft,
        "tpot_mean_s": streams["tpot"]["mean"],
        "itl_p50_s": streams["itl"]["median"], "itl_p99_s": streams["itl"]["p99"],
        "itl_max_s": streams["itl"]["max"],
        "throughput_tok_s": everything["throughput_tok_s"],
        "steps": len(engine.trace),
    }


def bench_interference(prompt_len: int = 2048, num_decoders: int = 8,
                       chunk_sizes=(64, 128, 256, 512, 1024), out_dir: Path | None = None,
                       device=None, progress: bool = True) -> dict:
    """Returns the table and the headline ratios (chunked 256 vs prefill_first)."""
    from tqdm.auto import tqdm

    device = device or default_device()
    model = build_model("tiny", seed=0, dtype=torch.float32, device=device)
    # The streams decode 32 tokens past the long prompt's arrival: enough to
    # outlast a 256-token chunking, and few enough that one stall per stream
    # is more than 1% of all gaps, so p99 ITL sees it.
    workload = workloads.long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders,
                                                  decoder_prompt_len=64, warmup_tokens=8,
                                                  decoder_output_len=40, long_output_len=8)
    # Warm up kernels and allocator once so the first case is not penalised.
    LLMEngine(model, SchedulerConfig()).generate([[1] * 64], SamplingParams(max_tokens=2, ignore_eos=True))
    cases = [("prefill_first", None), ("decode_first", None)] + [("chunked", c) for c in chunk_sizes]
    rows = [interference_case(model, p, c, workload)
            for p, c in tqdm(cases, desc="interference", disable=not progress)]
    base = rows[0]
    ref = next((r for r in rows if r["chunk_size"] == 256), rows[-1])
    result = {
        "device": str(device), "prompt_len": prompt_len, "num_decoders": num_decoders, "rows": rows,
        "chunked256_vs_prefill_first": {
            "itl_max_reduction": base["itl_max_s"] / ref["itl_max_s"],
            "itl_p99_reduction": base["itl_p99_s"] / ref["itl_p99_s"],
            "long_ttft_growth": ref["long_ttft_s"] / base["long_ttft_s"],
        },
    }
    if out_dir is not None:
        _save_interference_figure(rows, Path(out_dir) / "interference.png", prompt_len, num_decoders)
    return result


def _save_interference_figure(rows, path: Path, prompt_len: int, num_decoders: int) -> None:
    from matplotlib.figure import Figure

    chunked = [r for r in rows if r["policy"] == "chunked"]
    base = rows[0]
    fig = Figure(figsize=(8, 3.5), layout="constrained")
    ax_gap, ax_ttft = fig.subplots(1, 2)
    sizes = [r["chunk_size"] for r in chunked]
    ax_gap.plot(sizes, [r["itl_max_s"] * 1e3 for r in chunked], "o-", label="chunked: max ITL")
    ax_gap.plot(sizes, [r["itl_p99_s"] * 1e3 for r in chunked], "s--", label="chunked: p99 ITL")
    ax_gap.axhline(base["itl_max_s"] * 1e3, color="C3", label="prefill_first: max ITL")
    ax_gap.set(xscale="log", xlabel="chunk size (tokens)", ylabel="decoding streams' gap (ms)",
               title="Chunking shrinks the worst token gap")
    ax_gap.legend(fontsize=8)
    ax_ttft.plot(sizes, [r["long_ttft_s"] * 1e3 for r in chunked], "o-", label="chunked")
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


def bench_hf(num_requests: int = 32, device=None, seed: int = 0) -> dict:
    device = device or default_device()
    model = build_model("tiny", seed=0, dtype=torch.float32, device=device)
    wl = workloads.poisson_mix(num_requests, rate_per_s=float("inf"), prompt_len=(32, 512),
                               output_len=(16, 128), seed=seed)
    prompts = [wl.prompt_ids(i, model.cfg.vocab_size) for i in range(num_requests)]
    output_lens = [r.max_tokens for r in wl.requests]
    hf = to_hf_model(model)
    hf_generate(hf, prompts[:2], [2, 2])                           # warm-up
    hf_tokens, hf_s = hf_generate(hf, prompts, output_lens)
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=512, max_num_seqs=64))
    engine.generate([[1] * 16], SamplingParams(max_tokens=2, ignore_eos=True))   # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens])
    ours_s = time.perf_counter() - t0
    useful = sum(output_lens)
    same = [o.output_token_ids == h for o, h in zip(outs, hf_tokens)]
    return {
        "device": str(device), "num_requests": num_requests, "useful_tokens": useful,
        "minillm_s": ours_s, "hf_s": hf_s,
        "minillm_tok_s": useful / ours_s, "hf_tok_s": useful / hf_s,
        "speedup": hf_s / ours_s,
        "identical_requests": sum(same), "first_mismatch": _first_mismatch(model, prompts, outs, hf_tokens),
    }


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
    from ..model_runner import prefill_kv

    for i, (o, h) in enumerate(zip(outs, hf_tokens)):
        if o.output_token_ids != h:
            k = next((j for j, (a, b) in enumerate(zip(o.output_token_ids, h)) if a != b),
                     min(len(o.output_token_ids), len(h)) - 1)   # one stopped earlier
            _, logits = prefill_kv(model, prompts[i] + o.output_token_ids[:k])
            last = logits[-1]
            gap = float(last[o.output_token_ids[k]] - last[h[k]])
            return {"request": i, "position": k, "logit_gap": gap}
    return None


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minillm bench")
    parser.add_argument("which", choices=["interference", "hf", "hf-real", "simulator", "all"], nargs="?",
                        default="all")
    parser.add_argument("--out", default="bench-results", help="folder for the JSON results and figures")
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--num-decoders", type=int, default=8)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    if args.which in ("interference", "all"):
        r = bench_interference(args.prompt_len, args.num_decoders, out_dir=out)
        results["interference"] = r
        print(f"\nInterference on {r['device']}: a {r['prompt_len']}-token prompt arrives among "
              f"{r['num_decoders']} decoding streams (tiny model, seconds)")
        print(_table(r["rows"], [("policy", "policy", ""), ("chunk_size", "chunk", ""),
                                 ("long_ttft_s", "long TTFT", ".3f"), ("tpot_mean_s", "TPOT mean", ".4f"),
                                 ("itl_p50_s", "ITL p50", ".4f"), ("itl_p99_s", "ITL p99", ".4f"),
                                 ("itl_max_s", "ITL max", ".4f"), ("throughput_tok_s", "tok/s", ".1f"),
                                 ("steps", "steps", "d")]))
        h = r["chunked256_vs_prefill_first"]
        print(f"chunked 256 vs prefill_first: max ITL {h['itl_max_reduction']:.1f}x lower, "
              f"p99 ITL {h['itl_p99_reduction']:.1f}x lower, long-prompt TTFT x{h['long_ttft_growth']:.2f}")
    if args.which in ("hf", "all"):
        r = bench_hf()
        results["hf"] = r
        print(f"\nThroughput vs transformers.generate on {r['device']} ({r['num_requests']} requests, "
              f"{r['useful_tokens']} useful output tokens)")
        print(f"minillm {r['minillm_tok_s']:.1f} tok/s ({r['minillm_s']:.2f} s), "
              f"transformers {r['hf_tok_s']:.1f} tok/s ({r['hf_s']:.2f} s): {r['speedup']:.2f}x; "
              f"identical greedy outputs for {r['identical_requests']}/{r['num_requests']} requests"
              + (f"; first difference {r['first_mismatch']}" if r["first_mismatch"] else ""))
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
              f"max {r['max_abs_rel_error']:.1%} (an uncalibrated roofline from calibrate(): "
              f"{r['calibrate_median_abs_rel_error']:.0%})")
    (out / "bench.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nresults written to {out}/")
    return 0
