"""host_memory: freed step buffers are reused instead of faulted in again.

Each case runs in a fresh process: the setting is process-wide, and glibc's
moving threshold depends on everything the process allocated before.
"""
import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc's; other C libraries are left alone")

# Page faults of a step-like cycle, six times: allocate two 24 MB buffers, fill
# them, free them. "applied" is read before the probe could apply anything itself.
PROBE = """
import json, resource, torch
from minillm import host_memory
from minillm.model_runner import ModelRunner
from minillm.kv_cache import BlockManager
from minillm.loader import build_model
from minillm.config import ModelConfig
ModelRunner(build_model(ModelConfig.preset("tiny"), seed=0), BlockManager(4, 16))
applied_by_the_runner = host_memory._applied

def cycle():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x, y = torch.empty(6 << 20), torch.empty(6 << 20)
    x.fill_(1.0)
    y.fill_(1.0)
    del x, y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(json.dumps({"applied": applied_by_the_runner, "faults": [cycle() for _ in range(6)]}))
"""


FRESH_PAGES = (48 << 20) // 4096        # the two buffers of a cycle, in 4 KiB pages


def _probe(keep: str) -> dict:
    env = dict(os.environ, MINILLM_KEEP_FREED_MEMORY=keep)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_model_runner_keeps_freed_buffers_so_later_steps_do_not_fault_them_in():
    kept = _probe("1")
    assert kept["applied"] is True                # the runner set it, not the probe
    # The first cycles fault the buffers in: 48 MB is 12,288 fresh 4 KiB pages, less what
    # the heap already held free from building the model (that varies, so the first cycle
    # alone can fault in only half: 6,528 then 6,144 in one run). After the heap has grown
    # to hold them, the same buffers are reused.
    assert sum(kept["faults"][:3]) > 8000, kept
    assert all(n < FRESH_PAGES // 100 for n in kept["faults"][3:]), kept


def test_glibcs_defaults_fault_the_buffers_in_again_which_is_what_the_setting_removes():
    default = _probe("0")
    assert default["applied"] is False
    first, second = default["faults"][:2]
    assert second > first // 2                    # unmapped on free, faulted in afresh
