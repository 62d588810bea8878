"""Command line: `python -m minillm bench ...`, `figures`, `grade`, `release`, `serve`."""
from __future__ import annotations

import sys

USAGE = """usage: python -m minillm COMMAND [options]

commands:
  bench [chunk-cost|interference|hf|hf-real|simulator|memory|lab|capacity|prefix-cache|partial-prefills|steps|compile-probe|spec|invariant|divergence|all]
        [--out DIR]                                    benchmarks on this device
  bench serve --base-url URL [...]                     measure any OpenAI-compatible server from
                                                       the client, as `vllm bench serve` does
  bench serve --server "minillm FLAGS" --server "llama.cpp -b N" [...]
                                                       start each server in turn, same workload,
                                                       one table (minillm beside llama.cpp)
  serve [--model tiny|smollm2-135m-instruct|FILE.gguf] [--port 8000] [--policy chunked]
        [--max-num-batched-tokens N] [--long-prefill-token-threshold N] [--max-num-seqs N]
        [--max-waiting N]                              an OpenAI-compatible server (see serve --help)
  figures [--out DIR]                                  regenerate the README's figures
  grade [NOTEBOOK.ipynb | FOLDER ... | --class FOLDER] [--csv FILE] [--timeout S] [--jobs N]
                                                       grade exercise notebooks against the manifest
                                                       and the teacher's checks (grade --help)
  release --student DIR                                a tree to hand to students: no solutions,
                                                       reference answers, hidden cases or tests
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from .serve.cli import main as serve_main
        return serve_main(rest)
    if command == "bench" and rest[:1] == ["serve"]:     # before the book's benchmarks
        if any(word == "--server" or word.startswith("--server=") for word in rest):
            from .serve.side_by_side import main as side_by_side_main
            return side_by_side_main(rest[1:])
        from .serve.bench_client import main as bench_serve_main
        return bench_serve_main(rest[1:])
    if command == "bench":
        from .book.bench import main as bench_main
        return bench_main(rest)
    if command == "grade":
        from .grading.grade import main as grade_main
        return grade_main(rest)
    if command == "release":
        from .grading.release import main as release_main
        return release_main(rest)
    if command == "figures":
        import argparse

        from .book.lab import save_readme_figures
        args = argparse.ArgumentParser(prog="python -m minillm figures")
        args.add_argument("--out", default="figures")
        out = args.parse_args(rest).out
        for path in save_readme_figures(out) or ():
            print(path)
        return 0
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
