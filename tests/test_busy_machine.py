"""`make test` on a busy machine: the timing tests again, a busy loop on every core beside them.

A learner runs the suite on a laptop with a browser open, a class on one shared
machine. The tests marked `timing` (pyproject.toml) are the ones that read a
clock: each compares times measured in alternation within one loop, by a margin
load cannot close, or accepts a fit only with the profile's own word that the
machine was quiet (calibration.timing_spread). With them run the chapters that
assert on measured times and take seconds (0 and 3; chapter 6, a minute of real
runs, is checked under load by running the whole suite so, as docs/benchmarks.md
records). Here they run in a child pytest while one `while True: pass` process
per core competes with them; they must still pass. The busy processes are this
test's own, killed when it ends.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY_LOOP = "while True: pass"
# The child run's limit: a machine far busier than a loop per core fails here by
# timing out, not by a wrong number.
TIMEOUT_S = 420
# Chapters whose cells assert on wall-clock ratios (each timed in turns, medians of rounds).
TIMING_NOTEBOOKS = ("notebooks/00_roadmap.ipynb", "notebooks/03_kv_cache.ipynb")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                    # macOS, Windows
        return os.cpu_count() or 1


def timing_test_files() -> list[Path]:
    """The test modules that hold a `timing` test (this one excepted: it would start itself)."""
    here = Path(__file__).resolve()
    return sorted(p for p in (ROOT / "tests").glob("test_*.py")
                  if p.resolve() != here and "pytest.mark.timing" in p.read_text())


def test_the_timing_tests_are_found():
    names = {p.name for p in timing_test_files()}
    assert {"test_calibration.py", "test_serve.py", "test_lab.py", "test_loader_adversarial.py"} <= names
    assert all((ROOT / nb).is_file() for nb in TIMING_NOTEBOOKS)


def test_the_timing_tests_pass_with_a_busy_loop_on_every_core(tmp_path):
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(_cores())]
    try:
        # a calibration made under this load is not this machine's profile: its own cache
        # and the OpenMP wait policy minillm picks on a busy machine (the load average
        # would take a minute to show these loops)
        env = dict(os.environ, MINILLM_CACHE_DIR=str(tmp_path / "cache"), OMP_WAIT_POLICY="PASSIVE")
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "timing", "-p", "no:cacheprovider",
                                *map(str, timing_test_files())],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        chapters = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval-lax", "-p", "no:cacheprovider",
                                   *TIMING_NOTEBOOKS],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        still_busy = [p.poll() is None for p in busy]
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    assert all(still_busy), "a busy loop ended early: the timing tests ran on a quieter machine"
    for run in (tests, chapters):
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert " passed" in run.stdout and " failed" not in run.stdout
