"""A compiled paged-attention kernel for decodes on the CPU (optional).

Torch's own attention kernels take one contiguous tensor of keys, so a paged
cache has to be gathered into one first: every decode step copies each
request's whole cache, every layer. A paged kernel reads the blocks where
they are, through the block table, as vLLM's kernels do (flash-attn's
block_table on a GPU). `paged_decode.cpp` is such a kernel for the CPU,
small enough to read in one sitting.

It is compiled once, by `python -m minillm.kernels build` (`make` runs it; a
C++ compiler is needed), into a library named after the source's hash;
`paged_decode_available()` loads it if it is there and never compiles, so a
notebook never waits for a compiler. Without it, the engine gathers.
"""
from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("paged_decode.cpp")
BUILD_DIR = Path(os.environ.get("MINILLM_KERNEL_DIR", Path(__file__).with_name("_build")))
_loaded: bool | None = None
# (compile flags, link flags), tried in turn: vectorised for this CPU and
# threaded with OpenMP where the compiler can; plain -O3 (one thread per call)
# where it cannot, as Apple's clang. -ffast-math at compile time only: it lets
# the softmax call the C library's vector exp; at link time GCC before 13
# would add crtfastmath.o, which flushes tiny floats to zero process-wide.
BUILD_ATTEMPTS = [(["-O3", "-march=native", "-fopenmp", "-ffast-math"], ["-fopenmp"]),
                  (["-O3", "-ffast-math"], [])]


def library_path() -> Path:
    """Where the compiled kernel of the current source lives.

    Named after the source, the build flags, the torch version and this CPU's
    instruction sets: a library built from an older source or other flags, for
    another torch (another ABI) or with instructions this CPU lacks
    (-march=native) is never loaded.
    """
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__} {platform.machine()} {_cpu_flags()} {BUILD_ATTEMPTS}".encode())
    return BUILD_DIR / f"minillm_paged_decode_{digest.hexdigest()[:12]}.so"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def paged_decode_available() -> bool:
    """Whether the compiled kernel is there (loaded on the first call)."""
    global _loaded
    if _loaded is None:
        path = library_path()
        _loaded = False
        if path.exists() and os.environ.get("MINILLM_PAGED_KERNEL", "1") != "0":
            try:
                torch.ops.load_library(str(path))
                _loaded = True
            except (OSError, RuntimeError):
                pass                            # built for another torch: the engine gathers
    return _loaded


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale: float):
    """Attention of one new token per request over its paged cache.

    q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] (one
    layer); block_tables: [B, width] int64; seq_lens: [B] int64 (the new
    token included: write it into the cache first) -> [B, Hq, D].
    """
    return torch.ops.minillm.paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale)


def build(verbose: bool = False) -> Path:
    """Compile the kernel (about a minute) unless the current source is built."""
    from torch.utils.cpp_extension import load

    path = library_path()
    if path.exists():
        return path
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    for i, (cflags, ldflags) in enumerate(BUILD_ATTEMPTS):
        try:
            load(name=path.stem, sources=[str(SOURCE)], extra_cflags=cflags, extra_ldflags=ldflags,
                 build_directory=str(BUILD_DIR), is_python_module=False, verbose=verbose)
            break
        except Exception:
            if i == len(BUILD_ATTEMPTS) - 1:
                raise
    for old in BUILD_DIR.glob("minillm_paged_decode_*.so"):
        if old != path:
            old.unlink()                        # built from an older source or another torch
    return path


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python -m minillm.kernels build")
        return 2
    try:
        path = build()
    except Exception as e:                      # no compiler, no OpenMP: the engine still works
        print(f"minillm: the CPU paged-decode kernel was not built ({type(e).__name__}: {e}); "
              "decodes will gather their cache instead")
        return 0
    print(f"minillm: CPU paged-decode kernel ready at {path}")
    return 0
