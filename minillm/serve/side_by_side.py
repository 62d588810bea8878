"""One workload against several servers, each started in turn: the book's engine beside llama.cpp's.

    python -m minillm bench serve --server "minillm --policy prefill_first" \\
        --server "minillm --max-num-batched-tokens 256" --server "llama.cpp -b 256" \\
        --workload interference --num-streams 8 --long-prompt-len 2048 --seed 0

A server spec is `minillm FLAGS` (flags of `python -m minillm serve`; the model
defaults to smollm2-135m-instruct, the GGUF file llama.cpp serves too) or
`llama.cpp [-b N] [-ub N] [-t N]` (llama-server from `make peer`, on that GGUF).
Each server runs alone: started on a free port, measured by the same client with
the same seed (the same prompts, fitted to the same token counts through each
server's /tokenize), then stopped before the next starts. Nothing else shares the
machine with it but the client.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .bench_client import benchmark, build_parser, check_args
from .launch import ServerProcess, free_port
from .peer import llama_server_command, llama_server_env

DEFAULT_MODEL = "smollm2-135m-instruct"
KINDS = ("minillm", "llama.cpp")


def parse_server_spec(spec: str) -> tuple[str, list[str]]:
    """'minillm --max-num-batched-tokens 256' -> ("minillm", [...]); ValueError naming the spec."""
    words = shlex.split(spec)
    if not words or words[0] not in KINDS:
        raise ValueError(f"--server {spec!r}: must start with one of {KINDS}, e.g. "
                         "'minillm --max-num-batched-tokens 256' or 'llama.cpp -b 256'")
    return words[0], words[1:]


class LlamaServer:
    """llama-server on the book's GGUF, as a context manager (SIGTERM on exit)."""

    def __init__(self, flags: list[str], startup_timeout_s: float = 120.0):
        p = argparse.ArgumentParser(prog="llama.cpp", add_help=False, exit_on_error=False)
        p.add_argument("-b", "--batch-size", type=int, default=2048)
        p.add_argument("-ub", "--ubatch-size", type=int, default=None)
        p.add_argument("-np", "--parallel", type=int, default=9)
        p.add_argument("-t", "--threads", type=int, default=None)
        try:
            args, unknown = p.parse_known_args(flags)
        except argparse.ArgumentError as e:
            raise ValueError(f"llama.cpp flags {flags}: {e}") from None
        if unknown:
            raise ValueError(f"llama.cpp flags {unknown}: not known here; use -b, -ub, -np, -t")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = llama_server_command(self.port, args.batch_size, args.ubatch_size, args.parallel,
                                            threads=args.threads)
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self):
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        env=llama_server_env(Path(self.command[0])))
        start = time.perf_counter()
        while time.perf_counter() - start < self.startup_timeout_s:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"llama-server exited with {self.process.returncode}:\n{err}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:                # 503 while the model loads
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise TimeoutError(f"llama-server did not answer /health within {self.startup_timeout_s} s")

    def __exit__(self, *exc):
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(spec: str):
    kind, flags = parse_server_spec(spec)
    if kind == "llama.cpp":
        return LlamaServer(flags)
    if "--model" not in flags:
        flags = ["--model", DEFAULT_MODEL, *flags]
    return ServerProcess(flags, startup_timeout_s=300)


def headline(spec: str, result: dict) -> dict:
    """The row of the side-by-side table: streams' ITL and the long prompt's TTFT for the
    interference workload, the whole run's otherwise; throughput always."""
    groups = result.get("groups", {})
    streams, long = groups.get("stream", result), groups.get("long", result)
    return {"server": spec, "completed": result["completed"], "failed": result["failed"],
            "itl_p50_ms": streams["itl_ms"]["median"], "itl_p99_ms": streams["itl_ms"]["p99"],
            "itl_max_ms": streams["itl_ms"]["max"], "tpot_mean_ms": streams["tpot_ms"]["mean"],
            "ttft_ms": long["ttft_ms"]["max"] if "long" in groups else result["ttft_ms"]["median"],
            "output_throughput": result["output_throughput"],
            "total_token_throughput": result["total_token_throughput"], "duration_s": result["duration_s"]}


def run_side_by_side(servers, progress=None, **options) -> list[dict]:
    """Start each server spec in turn, run `benchmark(url, **options)` against it, stop it.
    Returns one headline row per server (the full result under "result")."""
    rows = []
    for spec in servers:
        parse_server_spec(spec)                               # every spec checked before any runs
    for spec in servers:
        if progress:
            progress(f"{spec}: starting")
        with start_server(spec) as server:
            result = benchmark(server.url, **options)
        rows.append({**headline(spec, result), "result": result})
    return rows


def table(rows) -> str:
    head = (f"{'server':50s} {'ITL p50':>9s} {'ITL p99':>9s} {'ITL max':>9s} {'TPOT':>8s} "
            f"{'TTFT':>9s} {'out tok/s':>9s} {'tok/s':>8s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['server'][:50]:50s} {r['itl_p50_ms']:9.1f} {r['itl_p99_ms']:9.1f} {r['itl_max_ms']:9.1f} "
                     f"{r['tpot_mean_ms']:8.1f} {r['ttft_ms']:9.1f} {r['output_throughput']:9.1f} "
                     f"{r['total_token_throughput']:8.1f}")
    lines.append("(ms; ITL and TPOT: the streams'; TTFT: the long prompt's (interference), else the median; "
                 "tok/s: prompt + output)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`bench serve --server SPEC [--server SPEC ...] [bench serve's workload flags]`."""
    servers, rest, it = [], [], iter(argv)
    for word in it:
        if word == "--server":
            servers.append(next(it, ""))
        elif word.startswith("--server="):
            servers.append(word.split("=", 1)[1])
        else:
            rest.append(word)
    args = build_parser().parse_args(["--base-url", "side-by-side", *rest])
    try:
        check_args(args)
        for spec in servers:
            parse_server_spec(spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = {k: v for k, v in vars(args).items() if k not in ("base_url", "result_file", "quiet")}
    rows = run_side_by_side(servers, progress=lambda m: print(m, file=sys.stderr, flush=True), **options)
    print(table(rows))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["completed"] for r in rows) else 1
