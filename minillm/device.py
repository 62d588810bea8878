"""Which device the engine runs on: cuda -> mps -> cpu, or MINILLM_DEVICE."""
from __future__ import annotations

import os

import torch

ALLOWED = ("cpu", "cuda", "mps")


def _available(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    return True


def default_device() -> torch.device:
    forced = os.environ.get("MINILLM_DEVICE")
    if forced:
        kind = forced.split(":")[0]
        if kind not in ALLOWED:
            raise ValueError(f"MINILLM_DEVICE={forced!r}: must be one of {ALLOWED}")
        if not _available(kind):
            raise ValueError(f"MINILLM_DEVICE={forced!r}: {kind} is not available on this machine")
        try:
            return torch.device(forced)
        except RuntimeError as e:
            raise ValueError(f"MINILLM_DEVICE={forced!r}: not a device; use one of {ALLOWED}") from e
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _available("mps"):
        return torch.device("mps")
    return torch.device("cpu")


def resolve_device(device) -> torch.device:
    """None means the default device; strings are checked and named in errors."""
    if device is None:
        return default_device()
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r}: not a device; use one of {ALLOWED}") from e
    if resolved.type not in ALLOWED:
        raise ValueError(f"device={device!r}: must be one of {ALLOWED}")
    if not _available(resolved.type):
        raise ValueError(f"device={device!r}: {resolved.type} is not available on this machine")
    return resolved


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def free_memory_bytes(device) -> int | None:
    """Memory free on `device` now: the GPU's free memory, or the host's
    available RAM (None where the OS does not say)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_ram_bytes()


def available_ram_bytes() -> int | None:
    """MemAvailable from /proc/meminfo; None where the OS does not say (macOS)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
