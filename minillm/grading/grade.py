"""`python -m minillm grade`: grade exercise notebooks against the teacher's manifest and checks.

    python -m minillm grade [NOTEBOOK.ipynb | FOLDER ...]     (default: exercises/)
    python -m minillm grade --class SUBMISSIONS               one subfolder per student
    options: --csv FILE  --timeout S  --jobs N  --manifest FILE

What a notebook must hold comes from exercises/manifest.json (written by tools/nb.py from
the solution sources): its tasks, the function(s) each task's check takes, the checker,
the points. A notebook is matched to its entry by its name (`01_causal_attention.ipynb`,
or any name starting `01_`, else by the nbgrader task ids its cells carry, `ex01_*`). In one kernel the grader runs its own set-up cell, then the
learner's cells (their check calls left out), then, for each task, the public checker and
the hidden cases (minillm/grading/_hidden/, teacher only) on the function the learner
defined: never the learner's check cells or their `ex`. A task whose function is missing
scores 0 of its points; what the notebook rebound in the checkers, torch or the standard
library is put back before the checks and named in a note (minillm/grading/_harness.py).

    passed          every check passed: full points
    not attempted   the stub is left as is (NotImplementedError): 0
    failed          a check failed: 0, and the first line of its message
    missing         the notebook defines no such function (a task deleted or renamed): 0
    error           a crash (its first line), or the task's checks timed out: 0

The exit code is 0 whatever the grades (a grade is not a failure of the command); 2 only
when the command is misused (no such path, not a notebook, no manifest entry).
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]             # the folder holding minillm/
MANIFEST = ROOT / "exercises" / "manifest.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MARKER = "\x1eminillm-grade-result "                    # _harness.MARKER (not imported: it pulls in torch)
SETUP_TIMEOUT_S = 300                                   # the grader's own set-up cell
CSV_COLUMNS = ("student", "notebook", "task", "points", "max", "message")
# Lines worth a teacher's reading: code that reaches for the grader, the interpreter's
# internals or a module's attributes. Reported, never scored.
SUSPICIOUS = [
    (re.compile(r"_harness|_hidden|_reference|_graded_function|_minillm_grader"), "names the grader's internals"),
    (re.compile(r"\bget_ipython\(\)\.(input_transformers|events|register|ast_transformers)"), "hooks the kernel"),
    (re.compile(r"\bsys\.modules\b|\bgc\.(get_objects|get_referrers)|\bimportlib\.reload\b"), "reaches past imports"),
    (re.compile(r"__code__|__globals__|__builtins__|__wrapped__|\bbuiltins\b"), "edits the interpreter's objects"),
    (re.compile(r"\b(setattr|delattr)\s*\("), "rebinds attributes"),
    (re.compile(r"^\s*(ex|minillm|torch|np|numpy|math|F|nn)(\.\w+)+\s*=(?!=)", re.M), "rebinds a library's name"),
]


@dataclass
class TaskResult:
    notebook: str
    exercise: str          # the task's heading, e.g. "1. The mask of a chunk over a cache"
    grade_id: str
    status: str            # "passed", "not attempted", "failed", "missing", "error"
    message: str           # first line of what went wrong ("" when passed)
    points: int
    max_points: int
    student: str = ""


@dataclass
class NotebookGrade:
    student: str
    path: Path
    results: list[TaskResult]
    notes: list[str] = field(default_factory=list)     # rebound names, lines to read, a stopped kernel

    @property
    def earned(self) -> int:
        return sum(r.points for r in self.results)

    @property
    def total(self) -> int:
        return sum(r.max_points for r in self.results)


# ---------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------
def load_manifest(path: Path = MANIFEST) -> dict:
    try:
        manifest = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest (tools/nb.py --manifest writes exercises/manifest.json)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a manifest ({err})") from None
    if not isinstance(manifest.get("notebooks"), dict):
        raise ValueError(f"{path}: not a manifest (no \"notebooks\")")
    return manifest


def manifest_entry(path: Path, manifest: dict) -> tuple[str, dict]:
    """The notebook's entry: by its name, else by its number (`01_causal_attention (1).ipynb`),
    else by the nbgrader ids its cells carry (`ex01_check_causal_mask`: a copy renamed `mine.ipynb`)."""
    notebooks = manifest["notebooks"]
    if path.stem in notebooks:
        return path.stem, notebooks[path.stem]
    number = re.match(r"(\d\d)_", path.name)
    matches = [name for name in notebooks if number and name.startswith(number.group(0))]
    if not matches:
        ids = _grade_ids(path)
        matches = [name for name, entry in notebooks.items() if ids & {task["id"] for task in entry["tasks"]}]
    if len(matches) == 1:
        return matches[0], notebooks[matches[0]]
    raise ValueError(f"{path}: no exercise of that name in the manifest, and its cells carry no task id of one "
                     f"(known: {', '.join(notebooks)})")


def _grade_ids(path: Path) -> set[str]:
    """The nbgrader grade_ids of a notebook's cells (none when it cannot be read)."""
    try:
        cells = json.loads(Path(path).read_text()).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")) for cell in cells
            if isinstance(cell, dict) and isinstance(cell.get("metadata"), dict)} - {"None"}


# ---------------------------------------------------------------------------
# The notebook the grader runs
# ---------------------------------------------------------------------------
def without_check_calls(source: str) -> str:
    """The learner's cell with its top-level `<anything>.check_*(...)` calls turned into `pass`:
    the grader runs the checks itself (and need not run them twice)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:                 # IPython syntax (magics): run as written
        return source
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.startswith("check_"):
            lines[node.lineno - 1:node.end_lineno] = [" " * node.col_offset + "pass\n"]
    return "".join(lines)


def grading_notebook(learner, entry: dict):
    """Set-up cell, the learner's code cells (check calls left out), one grading cell per task."""
    import nbformat
    modules = tuple(sorted({task["module"] for task in entry["tasks"]}))
    cells = [nbformat.v4.new_code_cell(
        f"import minillm.grading._harness as _minillm_grader\n_minillm_grader.begin({modules!r})\n"
        f"del _minillm_grader", metadata={"minillm": "grader set-up"})]
    cells += [nbformat.v4.new_code_cell(without_check_calls(cell.source)) for cell in learner.cells
              if cell.cell_type == "code" and cell.source.strip()]
    cells += [nbformat.v4.new_code_cell(
        f"__import__('minillm.grading._harness', fromlist=['_']).grade_task({task!r})") for task in entry["tasks"]]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                         "display_name": "Python 3"}})


def suspicious_lines(learner) -> list[str]:
    found = []
    for index, cell in enumerate(learner.cells):
        if cell.cell_type != "code":
            continue
        for number, line in enumerate(cell.source.splitlines(), start=1):
            for pattern, why in SUSPICIOUS:
                if pattern.search(line):
                    found.append(f"cell {index} line {number} {why}: {line.strip()[:80]}")
                    break
    return found


def _first_line(text: str) -> str:
    text = ANSI.sub("", text or "").strip()
    return text.splitlines()[0] if text else ""


def _task_outcome(cell, timeout_s: float) -> dict | None:
    text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    results = [line[len(MARKER):] for line in text.split("\n") if line.startswith(MARKER)]   # not splitlines: \x1e
    if results:
        return json.loads(results[-1])
    error = next((out for out in cell.get("outputs", []) if out.get("output_type") == "error"), None)
    if error is not None and error.get("ename") == "KeyboardInterrupt":
        return {"status": "error", "message": f"the checks took longer than {timeout_s:g} s (--timeout)"}
    if error is not None:
        return {"status": "error", "message": f"the grader failed: {error.get('ename')}: "
                                              f"{_first_line(error.get('evalue', ''))}"}
    return None


def grade_notebook(path: Path, manifest: dict | None = None, timeout_s: float = 600,
                   student: str = "") -> NotebookGrade:
    """Run one learner notebook (in its folder, this checkout's minillm importable) under the grader."""
    import nbformat
    from nbclient import NotebookClient

    manifest = load_manifest() if manifest is None else manifest
    name, entry = manifest_entry(path, manifest)
    learner = nbformat.read(path, as_version=4)
    nb = grading_notebook(learner, entry)
    notes = [f"read by hand: {line}" for line in suspicious_lines(learner)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MPLBACKEND", None)
    stopped = ""
    try:
        # The kernel's own log (e.g. ipykernel's "Kernel is running over TCP" warning) would land
        # in the middle of the table: the learner's output reaches the notebook, not this stderr.
        # --timeout is for the learner's cells and each task's checks; the set-up (importing
        # torch and the checkers) may take longer on a busy machine.
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                       timeout_func=lambda cell: max(timeout_s, SETUP_TIMEOUT_S) if cell.metadata.get("minillm")
                       else timeout_s, resources={"metadata": {"path": str(path.parent)}}).execute(
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as exc:                                  # a dead kernel
        stopped = f"{type(exc).__name__}: {_first_line(str(exc))}"
        notes.append(f"the kernel stopped: {stopped}")
    task_cells = nb.cells[len(nb.cells) - len(entry["tasks"]):]
    results, rebound = [], []
    for task, cell in zip(entry["tasks"], task_cells):
        outcome = _task_outcome(cell, timeout_s) or {
            "status": "error", "message": f"not graded: the kernel stopped before this task ({stopped or 'no result'})"}
        rebound += [n for n in outcome.get("tampered", []) if n not in rebound]
        status = outcome["status"]
        results.append(TaskResult(path.name, task["heading"], task["id"], status, outcome.get("message", ""),
                                  task["points"] if status == "passed" else 0, task["points"], student))
    if rebound:
        notes.insert(0, f"the notebook rebound {', '.join(rebound[:6])}{' ...' if len(rebound) > 6 else ''} "
                        f"(put back before each check)")
    return NotebookGrade(student, path, results, notes)


# ---------------------------------------------------------------------------
# What to grade
# ---------------------------------------------------------------------------
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


def submissions_in(folder: str) -> list[tuple[str, Path]]:
    """(student, notebook) for a class: each subfolder one student, their notebooks anywhere
    below it (nbgrader's submitted/<student>/<assignment>/ too), checkpoints left out."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"--class {folder!r}: not a folder (expected one subfolder per student)")
    found = [(student.name, nb) for student in sorted(p for p in root.iterdir() if p.is_dir()
                                                      and not p.name.startswith("."))
             for nb in sorted(student.rglob("*.ipynb"))
             if not any(part.startswith(".") for part in nb.relative_to(root).parts)]
    if not found:
        raise ValueError(f"--class {folder!r}: no notebooks in its subfolders (one subfolder per student)")
    return found


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------
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


def write_csv(grades: list[NotebookGrade], path: Path) -> None:
    """One row per task (and one per note, task "(note)", 0 of 0 points)."""
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for grade in grades:
            for r in grade.results:
                writer.writerow([grade.student, grade.path.name, r.exercise, r.points, r.max_points,
                                 "passed" if r.status == "passed" else r.message])
            for note in grade.notes:
                writer.writerow([grade.student, grade.path.name, "(note)", 0, 0, note])


def _report(grade: NotebookGrade) -> str:
    who = f"{grade.student}: " if grade.student else ""
    notes = "".join(f"\nnote: {note}" for note in grade.notes)
    return f"\n{who}{grade.path}\n{format_table(grade.results)}{notes}"


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minillm grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="notebooks, or folders of notebooks (default: exercises/)")
    parser.add_argument("--class", dest="class_dir", metavar="FOLDER",
                        help="a class's submissions: one subfolder per student (its name is the student's)")
    parser.add_argument("--csv", metavar="FILE", help="also write every task's grade: " + ", ".join(CSV_COLUMNS))
    parser.add_argument("--timeout", type=float, default=600, metavar="S",
                        help="seconds one cell (or one task's checks) may run (default 600)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="notebooks graded at once (default 1)")
    parser.add_argument("--manifest", default=str(MANIFEST), metavar="FILE",
                        help="the tasks and points of each notebook (default exercises/manifest.json)")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:                 # --help (0) or a bad option (2)
        return int(exit_.code or 0)
    try:
        if args.timeout <= 0:
            raise ValueError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
        if args.jobs < 1:
            raise ValueError(f"--jobs {args.jobs}: must be 1 or more")
        if args.class_dir and args.paths:
            raise ValueError("give either --class FOLDER or notebooks and folders, not both")
        work = submissions_in(args.class_dir) if args.class_dir else \
            [("", p) for p in notebooks_in(args.paths or ["exercises"])]
        manifest = load_manifest(Path(args.manifest))
        for _, path in work:
            manifest_entry(path, manifest)      # every notebook known before any runs
    except ValueError as exc:
        print(f"{exc}\n{parser.format_usage()}", file=sys.stderr, end="")
        return 2

    def one(item):
        student, path = item
        return grade_notebook(path, manifest, args.timeout, student)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:   # each notebook runs in its own kernel process
        grades = list(pool.map(one, work))
    for grade in grades:
        print(_report(grade))
    if len(grades) > 1:
        print("\nsummary")
        for grade in grades:
            print(f"  {grade.student + '  ' if grade.student else ''}{grade.path.name}: {grade.earned}/{grade.total}")
        print(f"all {len(grades)} notebooks: {sum(g.earned for g in grades)}/{sum(g.total for g in grades)} points")
    if args.csv:
        write_csv(grades, Path(args.csv))
        print(f"\n{args.csv}: {sum(len(g.results) for g in grades)} tasks")
    return 0
