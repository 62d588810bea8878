"""minillm: a small, real LLM inference engine built to teach chunked prefill.

Three layers, and the folders show them (arrows point down only):
    minillm/        the engine core: config, attention, model, kv_cache,
                    model_runner, prefill, request, sampler, scheduler, engine,
                    speculative, metrics, loader, gguf_loader, pretrained_models,
                    tokenizer, detokenizer. Needs torch, never matplotlib.
    minillm/sim/    the simulator: accounting, hardware, cost_model,
                    simulator, workloads. Runs the core's scheduler on a
                    virtual clock.
    minillm/book/   the book's tools: figures, the lab, widgets, source
                    rendering, benchmarks, fidelity studies.
    minillm/grading/  the exercise checkers and the grade command.

`import minillm` loads the core only; `minillm.simulator`, `minillm.widgets`
and the other heavier names load their layer on first use.
"""
import importlib
import os

# OpenMP's idle threads: spin (fast) on a quiet machine, sleep on a busy one. Measured
# on 2 cores with a busy loop on each: 8 streams decoding took 7.5 s with spinning
# threads against 2.9 s with sleeping ones; on the quiet machine, 1.5 s against 2.4 s.
# So sleep only when other processes already fill every core as minillm loads. Read
# once, when torch loads its OpenMP library: it holds when minillm is imported before torch.
def _runnable_elsewhere(loadavg_text: str) -> int:
    """Processes runnable right now besides this one, from /proc/loadavg's text
    ("0.52 0.61 0.70 3/241 1234": the fourth field is runnable/total, this process
    included). Not the load average itself: that is a minute's mean, and it counts
    this program's own past work (a test suite's kernels would read as "busy")."""
    return max(int(loadavg_text.split()[3].split("/")[0]) - 1, 0)


def _sleep_idle_threads_if_busy(samples: int = 5) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE (unless set) when, in every one of `samples`
    looks 2 ms apart, other runnable processes are at least as many as our cores.
    Returns whether the machine read as busy. Linux only (elsewhere: never busy)."""
    import time
    try:
        cores = len(os.sched_getaffinity(0))
        looks = []
        for _ in range(samples):
            with open("/proc/loadavg") as f:
                looks.append(_runnable_elsewhere(f.read()))
            time.sleep(0.002)
    except (AttributeError, OSError, ValueError, IndexError):   # no /proc (macOS, Windows)
        return False
    busy = min(looks) >= cores
    if busy:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return busy


_sleep_idle_threads_if_busy()

from . import (attention, config,  # noqa: E402
               device, engine, kv_cache, loader, metrics, model, model_runner, prefill,
               request, sampler, scheduler, speculative, tokenizer)
from .config import ModelConfig
from .device import default_device
from .engine import LLMEngine
from .gguf_loader import load_gguf
from .loader import build_model, load_hf_model
from .prefill import prefill_kv
from .pretrained_models import pretrained
from .request import RequestOutput, SamplingParams
from .scheduler import SchedulerConfig
from .speculative import SpeculativeConfig

# Names of the outer layers, loaded on first use so that the core stays light.
_LAZY_MODULES = {
    "accounting": "minillm.sim.accounting", "hardware": "minillm.sim.hardware",
    "cost_model": "minillm.sim.cost_model", "simulator": "minillm.sim.simulator",
    "workloads": "minillm.sim.workloads", "sim": "minillm.sim",
    "figures": "minillm.book.figures", "widgets": "minillm.book.widgets",
    "show": "minillm.book.show", "bench": "minillm.book.bench", "fidelity": "minillm.book.fidelity",
    "book": "minillm.book", "grading": "minillm.grading",
}
_LAZY_ATTRS = {"simulate": ("minillm.sim.simulator", "simulate")}


def __getattr__(name):
    if name in _LAZY_MODULES:
        module = importlib.import_module(_LAZY_MODULES[name])
    elif name in _LAZY_ATTRS:
        module_name, attr = _LAZY_ATTRS[name]
        module = getattr(importlib.import_module(module_name), attr)
    else:
        raise AttributeError(f"module 'minillm' has no attribute {name!r}")
    globals()[name] = module
    return module


def __dir__():
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_ATTRS))


__all__ = ["ModelConfig", "build_model", "load_hf_model", "load_gguf", "pretrained", "prefill_kv", "default_device",
           "LLMEngine", "SchedulerConfig", "SamplingParams", "RequestOutput", "SpeculativeConfig", "simulate"]
