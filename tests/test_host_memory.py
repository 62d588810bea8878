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

# Page faults of allocating, filling and freeing a 24 MB tensor, twice.
PROBE = """
import json, resource, torch
from minillm import host_memory
from minillm.model_runner import ModelRunner
from minillm.kv_cache import BlockManager
from minillm.loader import build_model
from minillm.config import ModelConfig
ModelRunner(build_model(ModelConfig.preset("tiny"), seed=0), BlockManager(4, 16))

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(6 << 20)
    x.fill_(1.0)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(json.dumps({"applied": host_memory.keep_freed_memory(), "faults": [faults(), faults()]}))
"""


def _probe(keep: str) -> dict:
    env = dict(os.environ, MINILLM_KEEP_FREED_MEMORY=keep)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_model_runner_keeps_freed_buffers_so_the_next_step_does_not_fault_them_in():
    kept = _probe("1")
    assert kept["applied"] is True
    first, second = kept["faults"]
    assert first > 4000                 # 24 MB is ~6,000 fresh 4 KiB pages the first time
    assert second < first // 10         # then the freed buffer is reused


def test_glibcs_defaults_fault_the_same_buffer_in_again_which_is_what_the_setting_removes():
    default = _probe("0")
    assert default["applied"] is False
    first, second = default["faults"]
    assert second > first // 2          # unmapped on free, faulted in afresh
