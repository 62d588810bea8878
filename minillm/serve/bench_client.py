"""`python -m minillm bench serve`: measure any OpenAI-compatible server from the client.

The quantities are `vllm bench serve`'s (vllm/benchmarks/lib/endpoint_request_func.py
and vllm/benchmarks/serve.py, vLLM 0.33), so numbers compare across servers:
  TTFT  from just before the POST to the first SSE chunk whose `choices` is not
        empty (its text may be "": a token that completes no character yet)
  ITL   every gap between two successive such chunks (a chunk that carries k
        tokens is ONE gap: the k-1 others read as zero-length, vLLM #27485)
  E2EL  from the POST to the last chunk with choices (latency)
  A chunk with choices counts even when it carries no token: llama.cpp's server
  closes a stream with one more chunk, empty, holding the finish_reason, and
  vllm bench serve counts it as a gap and as the end of E2EL
  (async_request_openai_completions, vllm/benchmarks/lib/endpoint_request_func.py at
  commit 02cfb534df5674737558730b10f23d1b7aef9b7c), so this client does too;
  --drop-closing-chunk leaves it out (each record says whether it had one).
  TPOT  per request, (E2EL - TTFT) / (completion_tokens - 1), completion_tokens
        from the final usage chunk (stream_options.include_usage)
  goodput  requests per second that meet every SLO given (--goodput ttft:MS tpot:MS)
guidellm 0.8 names them otherwise: its "ITL" (inter_token_latency_ms) is this
TPOT; its "TPOT" (time_per_output_token_ms) is E2EL / completion_tokens, first
token included (src/guidellm/schemas/request_stats.py).

Arrivals: Poisson at --request-rate, or gamma with --burstiness (shape =
burstiness, mean gap 1/rate: vLLM's), capped by --max-concurrency. Prompts
are fresh words each run (a random first word per request), so no prefix
cache answers them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from ..metrics import distribution

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education").split()


@dataclass
class RequestRecord:
    """One request as the client saw it (seconds on the client's perf_counter)."""
    tag: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    start_time: float = 0.0
    ttft: float | None = None
    latency: float | None = None           # POST to the last chunk with choices
    chunk_times: list[float] = field(default_factory=list)
    success: bool = False
    error: str = ""
    response_id: str = ""
    text: str = ""
    closing_chunk: bool = False            # the stream ended with a chunk that carried no token

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass
class PlannedRequest:
    tag: str
    prompt: str | list[dict]
    max_tokens: int
    delay_s: float = 0.0                   # after the start of the run (timed arrivals)
    after_tokens: int | None = None        # or: once every "stream" has this many chunks


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------
def make_prompt(rng: random.Random, num_words: int) -> str:
    # a random number first: a prefix cache can never answer two prompts of a run
    return f"{rng.randrange(10**9)} " + " ".join(rng.choice(WORDS) for _ in range(max(0, num_words - 1)))


def arrival_gaps_s(rng: random.Random, num: int, rate: float, burstiness: float) -> list[float]:
    """Gaps between arrivals: gamma(shape=burstiness, mean=1/rate); burstiness 1 is Poisson.
    rate=inf: all at once."""
    if math.isinf(rate):
        return [0.0] * num
    theta = 1.0 / (rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(num)]


def plan_workload(args, rng: random.Random) -> tuple[list[PlannedRequest], list[int]]:
    """The requests and their prompt lengths in tokens (a word per token at first;
    run_async fits the words to the server's tokenizer)."""
    if args.workload == "interference":
        lengths = [args.input_len] * args.num_streams + [args.long_prompt_len]
        plan = [PlannedRequest(f"stream-{i}", make_prompt(rng, args.input_len), args.output_len)
                for i in range(args.num_streams)]
        plan.append(PlannedRequest("long", make_prompt(rng, args.long_prompt_len), args.long_output_len,
                                   after_tokens=args.long_after_tokens))
        return plan, lengths
    plan, lengths, t = [], [], 0.0
    gaps = arrival_gaps_s(rng, args.num_prompts, args.request_rate, args.burstiness)
    for i in range(args.num_prompts):
        if args.workload == "chat":
            n_in, n_out = rng.randint(32, args.input_len), rng.randint(16, args.output_len)
        else:
            low = 1 - args.range_ratio
            n_in = rng.randint(max(1, int(args.input_len * low)), args.input_len)
            n_out = rng.randint(max(1, int(args.output_len * low)), args.output_len)
        plan.append(PlannedRequest(f"req-{i}", make_prompt(rng, n_in), n_out, delay_s=t))
        lengths.append(n_in)
        t += gaps[i]
    return plan, lengths


# ---------------------------------------------------------------------------
# One request, streamed
# ---------------------------------------------------------------------------
def payload(args, planned: PlannedRequest) -> dict:
    body = {"model": args.model, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": args.ignore_eos, "temperature": args.temperature}
    if args.endpoint.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": planned.prompt}]
        body["max_completion_tokens"] = planned.max_tokens
        body["max_tokens"] = planned.max_tokens       # servers that know only the old name
    else:
        body["prompt"] = planned.prompt
        body["max_tokens"] = planned.max_tokens
    return body


async def stream_one(client, url: str, body: dict, record: RequestRecord, on_chunk=None,
                     drop_closing_chunk: bool = False) -> RequestRecord:
    record.start_time = start = time.perf_counter()
    last, closing = start, False
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue                          # blank separators, SSE comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = str(chunk["error"])
                    return record
                choice = (chunk.get("choices") or [None])[0]
                if choice is not None:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    closing = not text and choice.get("finish_reason") is not None
                    if record.ttft is None:
                        record.ttft = now - start
                        record.response_id = chunk.get("id", "")
                    record.chunk_times.append(now)
                    last = now
                    record.text += text
                    if on_chunk is not None:
                        on_chunk(record)
                if chunk.get("usage"):                # its own chunk (vLLM, minillm) or the last one (llama.cpp)
                    record.output_tokens = chunk["usage"].get("completion_tokens") or 0
                    record.prompt_tokens = chunk["usage"].get("prompt_tokens") or record.prompt_tokens
        if record.ttft is None:
            record.error = "no chunk with a token"
            return record
        # llama.cpp closes a stream with one more chunk, empty, with the finish_reason (and
        # the usage): the server counted one token fewer than it sent chunks, so that
        # chunk carried none. vllm bench serve counts it (a gap, and the end of E2EL);
        # dropped on request
        record.closing_chunk = closing and len(record.chunk_times) == record.output_tokens + 1 > 1
        if record.closing_chunk and drop_closing_chunk:
            record.chunk_times.pop()
            last = record.chunk_times[-1]
        record.latency = last - start
        if not record.output_tokens:                  # no usage chunk: one token per chunk, as guidellm assumes
            record.output_tokens = len(record.chunk_times)
        record.success = True
    except Exception as e:                            # noqa: BLE001 -- a failed request is counted, not fatal
        record.error = f"{type(e).__name__}: {e}"
    return record


async def _count_tokens(client, base_url: str, model: str, text: str) -> int | None:
    """Tokens in text by the server's /tokenize, None if it has none. vLLM's shape
    ({"prompt"} -> {"count"}) first, then llama.cpp's ({"content"} -> {"tokens"}, its
    tools/server README), so both servers get prompts of the same length in tokens."""
    for body, read in (({"model": model, "prompt": text}, lambda j: j.get("count")),
                       ({"content": text}, lambda j: len(j["tokens"]) if isinstance(j.get("tokens"), list) else None)):
        try:
            r = await client.post(base_url + "/tokenize", json=body, timeout=30)
            count = read(r.json()) if r.status_code == 200 else None
            if count:
                return int(count)
        except Exception:                             # noqa: BLE001 -- not every server has /tokenize
            pass
    return None


async def _fit_prompt(client, base_url: str, model: str, planned: "PlannedRequest", target: int) -> None:
    """Trim or pad a planned prompt's words until the server counts about `target` tokens
    (within 1%, or a few tokens): a few /tokenize calls before the timed run."""
    words = planned.prompt.split(" ")
    rng = random.Random(len(words))
    for _ in range(6):
        count = await _count_tokens(client, base_url, model, " ".join(words))
        if count is None or abs(count - target) <= max(2, target // 100):
            break
        new_len = max(1, round(len(words) * target / count))
        if new_len == len(words):
            new_len += 1 if count < target else -1
        words = words[:new_len] + [rng.choice(WORDS) for _ in range(new_len - len(words))]
    planned.prompt = " ".join(words)


async def run_async(args) -> dict:
    import httpx
    base = args.base_url.rstrip("/")
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)) as client:
        if not args.model:
            r = await client.get(base + "/v1/models", timeout=10)
            args.model = r.json()["data"][0]["id"]
        plan, targets = plan_workload(args, rng)
        # fresh words, then fitted to the lengths asked for (by the server's own tokenizer when it says)
        await asyncio.gather(*(_fit_prompt(client, base, args.model, p, n) for p, n in zip(plan, targets)))
        url = base + args.endpoint
        limit = asyncio.Semaphore(args.max_concurrency or len(plan) or 1)
        records = [RequestRecord(p.tag) for p in plan]
        streams = [r for r, p in zip(records, plan) if p.tag.startswith("stream-")]
        ready = asyncio.Event()

        def on_chunk(_record):
            waiting = [p for p in plan if p.after_tokens is not None]
            if waiting and all(len(s.chunk_times) >= waiting[0].after_tokens for s in streams):
                ready.set()

        async def launch(planned: PlannedRequest, record: RequestRecord):
            if planned.after_tokens is not None:
                await ready.wait()
            else:
                await asyncio.sleep(max(0.0, planned.delay_s - (time.perf_counter() - run_start)))
            async with limit:
                return await stream_one(client, url, payload(args, planned), record, on_chunk,
                                        drop_closing_chunk=args.drop_closing_chunk)

        run_start = time.perf_counter()
        await asyncio.gather(*(launch(p, r) for p, r in zip(plan, records)))
        duration_s = time.perf_counter() - run_start
        engine = None
        if args.compare_engine:
            engine = await _engine_comparison(client, base, records)
    return summarize(records, duration_s, args, engine)


async def _engine_comparison(client, base: str, records) -> dict | None:
    """minillm servers only: the engine's own stamps of the same requests (GET /debug/requests)."""
    try:
        r = await client.get(base + "/debug/requests", timeout=10)
        stamps = {s["id"]: s for s in r.json()["requests"]}
    except Exception:                                 # noqa: BLE001
        return None
    pairs = [(rec, stamps[rec.response_id]) for rec in records if rec.success and rec.response_id in stamps]
    if not pairs:
        return None
    client_ttft = [rec.ttft for rec, _ in pairs]
    engine_ttft = [s["ttft"] for _, s in pairs]
    both_tpot = [(rec.tpot, s["tpot"]) for rec, s in pairs if rec.tpot is not None and s["tpot"]]
    mean = lambda xs: sum(xs) / len(xs)                # noqa: E731
    out = {"num_requests": len(pairs),
           "client_mean_ttft_ms": 1e3 * mean(client_ttft), "engine_mean_ttft_ms": 1e3 * mean(engine_ttft),
           "ttft_ratio": mean(client_ttft) / mean(engine_ttft)}
    if both_tpot:
        out.update(client_mean_tpot_ms=1e3 * mean([c for c, _ in both_tpot]),
                   engine_mean_tpot_ms=1e3 * mean([e for _, e in both_tpot]),
                   tpot_ratio=mean([c for c, _ in both_tpot]) / mean([e for _, e in both_tpot]))
    # every gap between two chunks against every gap between two of the engine's token stamps
    client_itl = [g for rec, _ in pairs for g in rec.itl]
    engine_itl = [b - a for _, s in pairs for a, b in zip(s["token_times"], s["token_times"][1:])]
    if client_itl and engine_itl and mean(engine_itl) > 0:
        out.update(client_mean_itl_ms=1e3 * mean(client_itl), engine_mean_itl_ms=1e3 * mean(engine_itl),
                   itl_ratio=mean(client_itl) / mean(engine_itl))
    return out


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------
def _ms(values) -> dict:
    return {k: 1e3 * v for k, v in distribution(values).items()}


def group_metrics(records, duration_s: float, slo_ms: dict | None = None) -> dict:
    ok = [r for r in records if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    result = {
        "completed": len(ok), "failed": len(records) - len(ok),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration_s, "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "ttft_ms": _ms(r.ttft for r in ok), "tpot_ms": _ms(r.tpot for r in ok if r.tpot is not None),
        "itl_ms": _ms(g for r in ok for g in r.itl), "e2el_ms": _ms(r.latency for r in ok),
    }
    if slo_ms:
        good = [r for r in ok if meets_slo_ms(r, slo_ms)]
        result["goodput"] = len(good) / duration_s
        result["slo_attainment"] = len(good) / max(1, len(records))
    return result


def meets_slo_ms(record: RequestRecord, slo_ms: dict) -> bool:
    """vLLM's --goodput test: every SLO given holds (TPOT holds vacuously for one token)."""
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.latency}
    return all(values[k] is None and k == "tpot" or (values[k] is not None and 1e3 * values[k] <= limit)
               for k, limit in slo_ms.items())


def summarize(records, duration_s: float, args, engine_comparison=None) -> dict:
    slo = parse_goodput(args.goodput)
    result = {"base_url": args.base_url, "endpoint": args.endpoint, "model": args.model, "workload": args.workload,
              "request_rate": args.request_rate, "burstiness": args.burstiness,
              "max_concurrency": args.max_concurrency, "duration_s": duration_s,
              **group_metrics(records, duration_s, slo)}
    groups = sorted({r.tag.split("-")[0] for r in records})
    if len(groups) > 1:
        result["groups"] = {g: group_metrics([r for r in records if r.tag.split("-")[0] == g], duration_s, slo)
                            for g in groups}
    if engine_comparison is not None:
        result["engine_comparison"] = engine_comparison
    # llama.cpp's token-less closing chunks: counted as vLLM counts them, or dropped
    result["closing_chunks"] = {"seen": sum(r.closing_chunk for r in records),
                                "dropped": bool(getattr(args, "drop_closing_chunk", False))}
    result["errors"] = sorted({r.error for r in records if r.error})[:5]
    result["requests"] = [dict(asdict(r), itl=r.itl, tpot=r.tpot) for r in records]
    return result


def parse_goodput(items) -> dict:
    slo = {}
    for item in items or ():
        key, _, value = item.partition(":")
        if key not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"--goodput {item!r}: keys are ttft, tpot, e2el (e.g. ttft:2000 tpot:100, in ms)")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: the value must be milliseconds, e.g. {key}:500") from None
        if slo[key] <= 0:
            raise ValueError(f"--goodput {item!r}: the value must be positive milliseconds")
    return slo


def print_report(result: dict, file=sys.stdout) -> None:
    def block(title, metrics, indent=""):
        print(f"{indent}{title}: {metrics['completed']} ok, {metrics['failed']} failed; "
              f"{metrics['output_throughput']:.1f} output tok/s", file=file)
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            d = metrics[name]
            print(f"{indent}  {name[:-3].upper():5s} ms  mean {d['mean']:8.1f}  median {d['median']:8.1f}  "
                  f"p99 {d['p99']:8.1f}  max {d['max']:8.1f}", file=file)
        if "goodput" in metrics:
            print(f"{indent}  goodput {metrics['goodput']:.2f} req/s ({100 * metrics['slo_attainment']:.0f}% met the SLOs)",
                  file=file)
    print(f"{result['workload']} against {result['base_url']}{result['endpoint']} ({result['model']}), "
          f"{result['duration_s']:.1f} s", file=file)
    block("all", result)
    for name, metrics in result.get("groups", {}).items():
        block(name, metrics, "  ")
    if result.get("closing_chunks", {}).get("seen"):
        c = result["closing_chunks"]
        print(f"  {c['seen']} streams closed with a chunk that carried no token: "
              f"{'dropped' if c['dropped'] else 'counted as a gap, as vllm bench serve does'}", file=file)
    if "engine_comparison" in result:
        print("  client / engine:", {k: round(v, 3) for k, v in result["engine_comparison"].items()}, file=file)
    for error in result["errors"]:
        print("  error:", error[:200], file=file)


# ---------------------------------------------------------------------------
# Command line and a notebook-friendly entry point
# ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minillm bench serve",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions"))
    p.add_argument("--model", default="", help="default: the first of GET /v1/models")
    p.add_argument("--workload", default="random", choices=("random", "chat", "interference"),
                   help="random: fixed lengths; chat: a mix of lengths; interference: --num-streams decode "
                        "while one --long-prompt-len prompt arrives")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (random), the most (chat)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens (random), the most (chat)")
    p.add_argument("--range-ratio", type=float, default=0.0, help="random: lengths drawn in [(1-r) x len, len]")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s; inf: all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 is Poisson, <1 burstier")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--num-streams", type=int, default=8, help="interference: the decoding streams")
    p.add_argument("--long-prompt-len", type=int, default=2048, help="interference: the long prompt's tokens")
    p.add_argument("--long-output-len", type=int, default=4)
    p.add_argument("--long-after-tokens", type=int, default=16,
                   help="interference: the long prompt is sent once every stream has this many chunks")
    p.add_argument("--goodput", nargs="*", default=None, metavar="KEY:MS", help="SLOs, e.g. ttft:2000 tpot:100")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                   help="send ignore_eos, so every request makes the tokens asked for (our default; "
                        "vllm bench serve's --ignore-eos is off by default: pass it there to compare)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop at EOS (vllm bench serve's default)")
    p.add_argument("--drop-closing-chunk", action="store_true",
                   help="leave out a closing chunk that carries no token (llama.cpp's) from ITL and E2EL; "
                        "vllm bench serve counts it, and so does this client by default")
    p.add_argument("--seed", type=int, default=None, help="lengths and arrivals (default: fresh each run)")
    p.add_argument("--compare-engine", action="store_true",
                   help="minillm servers: fetch the engine's own stamps of the same requests and print the ratios")
    p.add_argument("--result-file", default=None, help="write the results (JSON) here")
    p.add_argument("--quiet", action="store_true")
    return p


def check_args(args) -> None:
    for name in ("num_prompts", "input_len", "output_len", "num_streams", "long_prompt_len", "long_output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)}: must be at least 1")
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate={args.request_rate}: must be > 0 (inf: all at once)")
    if not args.burstiness > 0:
        raise ValueError(f"--burstiness={args.burstiness}: must be > 0 (1 is Poisson)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency={args.max_concurrency}: must be at least 1")
    if not 0 <= args.range_ratio < 1:
        raise ValueError(f"--range-ratio={args.range_ratio}: must be in [0, 1)")
    parse_goodput(args.goodput)


def benchmark(base_url: str, **options) -> dict:
    """The benchmark from Python: options are the flags' names with underscores,
    e.g. benchmark(url, workload="interference", num_streams=8). Works inside
    Jupyter's running event loop (runs in a thread of its own)."""
    argv = ["--base-url", base_url]
    args = build_parser().parse_args(argv)
    for key, value in options.items():
        if not hasattr(args, key):
            raise ValueError(f"{key}={value!r}: not an option of bench serve (see --help)")
        setattr(args, key, value)
    check_args(args)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_async(args))
    box = {}

    def target():
        try:
            box["result"] = asyncio.run(run_async(args))
        except BaseException as e:                # noqa: BLE001 -- re-raised in the caller's thread
            box["error"] = e
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = asyncio.run(run_async(args))
    if not args.quiet:
        print_report(result)
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["completed"] else 1
