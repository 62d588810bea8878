"""`python -m minillm release --student DIR`: the tree a teacher hands to students.

It holds the chapters, the exercise stubs (exercises/NN_*.ipynb) and their manifest, the
engine and its public checkers, the docs, data, figures and tools, the licences, and the
Makefile (whose `make lab` works there; its teacher-only targets need the tests and the
solutions, so they are absent). It leaves out what holds an answer: exercises/solutions/
(notebooks and sources), minillm/grading/_reference/ (reference answers),
minillm/grading/_hidden/ (the hidden cases), tests/ (whose shortcut tests hold correct
answers), and the CI and GPU-check scripts that run those tests.

The files are this checkout's tracked and untracked ones that git does not ignore (or,
outside git, every file but build outputs). The command refuses to write into a folder
that exists and is not empty, and checks the tree it wrote: no left-out path, no
`### BEGIN SOLUTION` or hidden-tests block anywhere.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
# Paths (relative, POSIX) that never go to students: a folder leaves out everything below it.
LEFT_OUT = ("exercises/solutions", "minillm/grading/_reference", "minillm/grading/_hidden", "tests", ".ci",
            "tools/gpu_check.sh")
# Outside git: build outputs and environments not to copy.
NOT_SOURCES = (".git", ".venv", "node_modules", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".hypothesis",
               "slides", "bench-results", "gpu-results", "build", "minillm/kernels/_build")
ANSWER_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS")
USAGE = "usage: python -m minillm release --student DIR   (DIR: a new or empty folder)"


def left_out(relative: str) -> bool:
    path = PurePosixPath(relative)
    return any(path == PurePosixPath(p) or PurePosixPath(p) in path.parents for p in LEFT_OUT)


def source_files(root: Path = ROOT) -> list[str]:
    """The checkout's files, relative POSIX paths: git's tracked and untracked-but-not-ignored ones."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                                cwd=root, capture_output=True, check=True, timeout=60).stdout
        files = [name for name in listed.decode().split("\0") if name and (root / name).is_file()]
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        files = [f for f in files if not any(f == n or f.startswith(n + "/") or f"/{n}/" in f"/{f}"
                                             for n in NOT_SOURCES) and not f.endswith(".egg-info")]
    return sorted(files)


def release_files(root: Path = ROOT) -> list[str]:
    return [f for f in source_files(root) if not left_out(f)]


def problems(tree: Path) -> list[str]:
    """What would give an answer away in a written tree (empty when it is clean)."""
    found = [f"{p.relative_to(tree).as_posix()}: left-out path" for p in tree.rglob("*")
             if left_out(p.relative_to(tree).as_posix())]
    for path in tree.rglob("*.ipynb"):          # the tools name the markers; a notebook must not hold them
        if path.is_file():
            text = path.read_text(errors="replace")
            found += [f"{path.relative_to(tree).as_posix()}: contains {marker!r}" for marker in ANSWER_MARKERS
                      if marker in text]
    return found


def write_student_release(out: Path, root: Path = ROOT) -> list[str]:
    """Copy the student's files into `out` (new or empty); return them. ValueError when `out`
    is not empty, RuntimeError when the tree written would hold an answer."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty folder; give a new folder for the release")
    if out.resolve() == root.resolve() or root.resolve() in out.resolve().parents:
        raise ValueError(f"{out}: inside the checkout; give a folder outside {root}")
    files = release_files(root)
    for name in files:
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    found = problems(out)
    if found:
        raise RuntimeError(f"{out}: the release would give answers away:\n  " + "\n  ".join(found[:20]))
    return files


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + __doc__.split("\n\n")[1])
        return 0
    if len(argv) != 2 or argv[0] != "--student":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        files = write_student_release(Path(argv[1]))
    except ValueError as exc:
        print(f"{exc}\n{USAGE}", file=sys.stderr)
        return 2
    exercises = sum(1 for f in files if f.startswith("exercises/") and f.endswith(".ipynb"))
    chapters = sum(1 for f in files if f.startswith("notebooks/") and f.endswith(".ipynb"))
    print(f"{argv[1]}: {len(files)} files ({chapters} chapter notebooks, {exercises} exercise notebooks); "
          f"no solutions, reference answers, hidden cases or tests. Students: `make lab` there.")
    return 0
