"""Keep freed step buffers in the process instead of handing them back to the OS.

PyTorch allocates CPU tensors with the C library's malloc. glibc serves a
large request (above a threshold that starts at 128 KiB and moves) with a
fresh mmap and unmaps it when the tensor is freed, so the next step's buffer
of the same size faults every 4 KiB page back in, zeroed by the kernel. A
2048-token prefill allocates tens of MB of activations per layer: on a 2-core
CPU it took 11,000-37,000 page faults, up to a quarter of its time
(docs/chunk-cost.md). Small steps (chunks, decodes) reuse what they freed and never pay.

Raising the threshold to glibc's maximum and not trimming the heap lets
freed buffers be reused. vLLM's CPU backend gets the same effect by loading
tcmalloc (LD_PRELOAD, in its CPU installation docs); glibc's own settings
need no extra library. Other C libraries (macOS, musl) are left as they are.
Set MINILLM_KEEP_FREED_MEMORY=0 to leave glibc's defaults (to measure both).
"""
from __future__ import annotations

import ctypes
import os
import platform

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024   # glibc's ceiling on 64-bit: 4 MiB * sizeof(long)
TRIM_THRESHOLD = 1 << 30                # return heap memory only past 1 GiB free

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed buffers up to 32 MiB; True where that took effect.

    Process-wide and idempotent: the model runner calls it once per process.
    """
    global _applied
    if _applied is None:
        _applied = _set_glibc_thresholds()
    return _applied


def _set_glibc_thresholds() -> bool:
    if os.environ.get("MINILLM_KEEP_FREED_MEMORY", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success: both must hold, or the buffers still come and go.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
