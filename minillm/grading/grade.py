"""`python -m minillm grade [notebook or folder ...]`: run learner notebooks, print a grade table.

Each notebook is executed top to bottom with nbclient (errors do not stop it),
then every graded cell (nbgrader metadata `grade: true` written by tools/nb.py,
or a code cell carrying `# points: N`) is scored:

    passed           the cell ran without an error: full points
    not attempted    it raised NotImplementedError (a stub left as is): 0
    <first line>     any other error: 0; the first line of the checker's
                     message (or "Name: message" for a crash)

The exit code is 0 whatever the grades (a grade is not a failure of the
command); 2 only when the command is misused (no such path, not a notebook).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

USAGE = "usage: python -m minillm grade [NOTEBOOK.ipynb | FOLDER ...]   (default: exercises/)"
POINTS = re.compile(r"#\s*points:\s*(\d+)")
HEADING = re.compile(r"^##\s+(.+)$", re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class TaskResult:
    notebook: str
    exercise: str          # the task's heading, e.g. "1. The mask of a chunk over a cache"
    grade_id: str
    status: str            # "passed", "not attempted", "failed", "error", "not run"
    message: str           # first line of what went wrong ("" when passed)
    points: int
    max_points: int


def graded_cells(nb) -> list[tuple[int, str, str, int]]:
    """(cell index, exercise title, grade id, points) of every graded cell."""
    cells, title = [], "(before any task)"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            heading = HEADING.search(cell.source)
            title = heading.group(1).strip() if heading else title
            continue
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        found = POINTS.search(cell.source)
        if meta.get("grade") or found:
            points = int(meta.get("points", found.group(1) if found else 1))
            cells.append((i, title, meta.get("grade_id", f"cell-{i}"), points))
    return cells


def _first_error(cell):
    return next((out for out in cell.get("outputs", []) if out.get("output_type") == "error"), None)


def _first_line(text: str) -> str:
    text = ANSI.sub("", text or "").strip()
    line = text.splitlines()[0] if text else ""
    return line.removeprefix("Not yet: ")


def score(nb, name: str, ran: bool = True) -> list[TaskResult]:
    """Score an executed notebook's graded cells."""
    results = []
    for index, title, grade_id, points in graded_cells(nb):
        cell = nb.cells[index]
        error = _first_error(cell)
        if not ran and cell.get("execution_count") is None:
            status, message = "not run", "the notebook stopped before this cell"
        elif error is None:
            status, message = "passed", ""
        elif error.get("ename") == "NotImplementedError":
            status, message = "not attempted", "not attempted (NotImplementedError)"
        elif error.get("ename") in ("AssertionError", "ExerciseFailed"):
            status, message = "failed", _first_line(error.get("evalue", "")) or "an assert failed"
        else:
            status, message = "error", f"{error.get('ename')}: {_first_line(error.get('evalue', ''))}"
        results.append(TaskResult(name, title, grade_id, status, message,
                                  points if status == "passed" else 0, points))
    return results


def grade_notebook(path: Path, timeout_s: int = 600) -> list[TaskResult]:
    """Execute one notebook (in its folder, this checkout's minillm importable) and score it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    root = str(Path(__file__).resolve().parents[2])          # the folder holding minillm/
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, old]))
    ran = True
    try:
        # The kernel's own log (e.g. ipykernel's "Kernel is running over TCP" warning) would land
        # in the middle of the table: the learner's output reaches the notebook, not this stderr.
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute(
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as exc:                                  # a timeout or a dead kernel
        ran = False
        print(f"{path.name}: execution stopped: {type(exc).__name__}: {_first_line(str(exc))}",
              file=sys.stderr)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return score(nb, path.name, ran)


def format_table(results: list[TaskResult], width: int | None = None) -> str:
    """One row per exercise, its title on one line (never wrapped; a long message wraps
    onto the lines below it, in the result column), then the total."""
    if not results:
        return "(no graded cells)"
    width = width or max(100, shutil.get_terminal_size((120, 24)).columns)
    ex_w = max(len("exercise"), *(len(r.exercise) for r in results))
    res_w = max(30, width - ex_w - 12)
    rule = "-" * (ex_w + res_w + 10)
    lines = [f"{'exercise':<{ex_w}}  {'result':<{res_w}}  {'points':>6}", rule]
    for r in results:
        result = textwrap.wrap("passed" if r.status == "passed" else r.message, res_w) or [""]
        for i, middle in enumerate(result):
            left = r.exercise if i == 0 else ""
            right = f"{r.points:>2}/{r.max_points:<3}" if i == 0 else ""
            lines.append(f"{left:<{ex_w}}  {middle:<{res_w}}  {right}".rstrip())
    earned, total = sum(r.points for r in results), sum(r.max_points for r in results)
    lines += [rule, f"{'total':<{ex_w}}  {'':<{res_w}}  {earned:>2}/{total:<3}".rstrip()]
    return "\n".join(lines)


def notebooks_in(paths: list[str]) -> list[Path]:
    """Notebooks named, and those directly inside the folders named; ValueError on a bad path."""
    found = []
    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            found += sorted(p for p in path.glob("*.ipynb") if not p.name.startswith("."))
        elif path.suffix == ".ipynb" and path.is_file():
            found.append(path)
        elif not path.exists():
            raise ValueError(f"{arg!r}: no such notebook or folder")
        else:
            raise ValueError(f"{arg!r}: not a notebook (.ipynb) or a folder of notebooks")
    if not found:
        raise ValueError(f"no notebooks in {', '.join(map(repr, paths))}")
    return found


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    options = [a for a in argv if a.startswith("-")]
    if options:
        print(f"unknown option {options[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        notebooks = notebooks_in(argv or ["exercises"])
    except ValueError as exc:
        print(f"{exc}\n{USAGE}", file=sys.stderr)
        return 2
    everything = []
    for path in notebooks:
        results = grade_notebook(path)
        everything += results
        print(f"\n{path}\n{format_table(results)}")
    if len(notebooks) > 1:
        earned, total = sum(r.points for r in everything), sum(r.max_points for r in everything)
        print(f"\nall {len(notebooks)} notebooks: {earned}/{total} points")
    return 0
