"""tools/gpu_check.sh (make gpu-check), proven before its first GPU: its dry run takes
every stage on the CPU (the kernel in Triton's interpreter, tiny shapes) and writes
every result file. Costs ~25 s of CPU (four Python processes, two of them pytest)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULT_FILES = ("nvidia-smi.txt", "device.txt", "tests.txt", "triton-tests.txt", "triton-bench.txt",
                "triton-bench.json", "bench.txt", "bench.json", "summary.txt", "dry-run.txt")


def _run(*args, out: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MINILLM_DEVICE")}
    env["PY"] = sys.executable
    return subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), *args, str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_dry_run_takes_every_stage_and_writes_every_result_file(tmp_path):
    done = _run("--dry-run", out=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in RESULT_FILES:
        assert (tmp_path / name).is_file() and (tmp_path / name).stat().st_size > 0, f"{name} missing or empty"
    summary = (tmp_path / "summary.txt").read_text()
    assert re.fullmatch(r"tests rc=0 triton tests rc=0 triton bench rc=0 bench rc=0 dry run=1\n", summary)
    for name in ("tests.txt", "triton-tests.txt"):       # tests ran (a selection that matched nothing would not)
        passed = re.search(r"(\d+) passed", (tmp_path / name).read_text())
        assert passed and int(passed.group(1)) >= 1, f"{name}: no test passed"
    bench = json.loads((tmp_path / "triton-bench.json").read_text())
    assert bench["dry_run"] is True and bench["device"].startswith("cpu")
    assert len(bench["steps"]) == 2
    for row in bench["steps"].values():
        assert row["triton vs reference, max |error|"] < 2e-2
        assert {"triton tile_n=16 (block 16) ms", "triton, split-KV off (block 16) ms",
                "sdpa (block 16) ms"} <= set(row)
    assert "DRY RUN" in (tmp_path / "dry-run.txt").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the real run would start")
def test_without_a_gpu_the_real_run_stops_at_once_and_says_how_to_dry_run(tmp_path):
    done = _run(out=tmp_path)
    assert done.returncode == 1
    assert "no CUDA device here" in done.stderr and "--dry-run" in done.stderr
    assert not (tmp_path / "tests.txt").exists()
