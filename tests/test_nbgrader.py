"""The nbgrader route, end to end: `tools/nb.py --nbgrader-source` writes a course's source
notebooks (each check cell with a hidden-tests block that runs the teacher's checks, the public
checker then the hidden cases, on the learner's functions), `nbgrader generate_assignment`
makes the student version (no solution, no hidden test), and `nbgrader autograde` scores
submissions: full marks for a solution; nothing for check cells replaced by `pass` with `ex`
rebound, or for the public cases' answers hard-coded. A toy assignment goes the whole way; the
real chapter-1 exercise goes through the first two steps beside it (its hidden cases are the
teacher's, minillm/grading/_hidden/).

Needs nbgrader (requirements-dev.txt; 0.9.6 adds six packages to this environment, about
10 s of pip). Cost: about 30 s on 2 cores (two nbgrader runs, three submissions autograded,
a kernel each); 8 s of it nbgrader's own start-ups.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from _toy_exercise import TOY_MODULES, hard_coded_double, public_cases, write_package

pytest.importorskip("nbgrader", reason="nbgrader is not installed (pip install -r requirements-dev.txt)")

ROOT = Path(__file__).resolve().parents[1]
NBGRADER = [sys.executable, "-m", "nbgrader"]
REAL = ROOT / "exercises" / "solutions" / "src" / "01_causal_attention.py"


def _nb_tool():
    import importlib.util
    spec = importlib.util.spec_from_file_location("minillm_nb_tool_nbgrader", ROOT / "tools" / "nb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(args, course: Path):
    done = subprocess.run(args, cwd=course, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _released(course: Path, assignment: str):
    return nbformat.read(course / "release" / assignment / f"{assignment}.ipynb", as_version=4)


def _submit(course: Path, assignment: str, student: str, change=None) -> None:
    nb = _released(course, assignment)
    if change is not None:
        change(nb.cells)
    out = course / "submitted" / student / assignment / f"{assignment}.ipynb"
    out.parent.mkdir(parents=True)
    nbformat.write(nb, out)


def _solve(cells, name: str, body: str) -> None:
    cell = next(c for c in cells if f"def {name}(" in c.source)
    cell.source = f"def {name}(*args):\n    " + body.replace("\n", "\n    ")


def _scores(course: Path, assignment: str) -> dict:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        return {s.student.id: (s.score, s.max_score) for s in gradebook.assignment_submissions(assignment)}


def test_generate_assignment_then_autograde_runs_the_hidden_tests(tmp_path, monkeypatch):
    toy = tmp_path / "toy"
    source = write_package(toy)
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.course_id = 'minillm'\nc.Execute.timeout = 300\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(toy), str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    # nbgrader runs its database migrations with the `alembic` script installed beside python
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))

    # the course's sources: the toy (checkers in a temporary package) and chapter 1, by the command line
    toy_source = course / "source" / source.stem / f"{source.stem}.ipynb"
    toy_source.parent.mkdir(parents=True)
    nbformat.write(_nb_tool().nbgrader_source(source, TOY_MODULES), toy_source)
    _run([sys.executable, str(ROOT / "tools" / "nb.py"), "--nbgrader-source", str(course), str(REAL)], course)
    real_source = "\n".join(c.source for c in nbformat.read(course / "source" / REAL.stem / f"{REAL.stem}.ipynb",
                                                            as_version=4).cells)
    tasks = json.loads((ROOT / "exercises" / "manifest.json").read_text())["notebooks"][REAL.stem]["tasks"]
    assert real_source.count("### BEGIN HIDDEN TESTS") == len(tasks) and "assert_task(" in real_source

    _run(NBGRADER + ["generate_assignment", "*", "--force"], course)
    toy_released = "\n".join(c.source for c in _released(course, source.stem).cells)
    for answer in ("return 2 * x", "return sum(numbers)", "HIDDEN", "assert_task", "12345"):
        assert answer not in toy_released, f"the student version holds {answer!r}"
    assert toy_released.count("raise NotImplementedError") == 2 and "_minillm_grader.begin(" in toy_released
    # chapter 1's student version is the learner copy (nbgrader writes its stub with parentheses),
    # after the grader's locked set-up cell, and holds no hidden test
    real = _released(course, REAL.stem)
    learner = nbformat.read(ROOT / "exercises" / f"{REAL.stem}.ipynb", as_version=4)
    assert [c.source.replace("NotImplementedError()", "NotImplementedError") for c in real.cells[1:]] == \
        [c.source for c in learner.cells]
    assert real.cells[0].metadata["nbgrader"]["locked"] and "_minillm_grader.begin(" in real.cells[0].source
    assert "HIDDEN" not in "".join(c.source for c in real.cells)

    assignment = source.stem
    _submit(course, assignment, "alice", lambda c: (_solve(c, "double", "return 2 * args[0]"),
                                                    _solve(c, "total", "return sum(args[0])")))
    _submit(course, assignment, "mallory", lambda c: [
        setattr(x, "source", "pass  # points: 9" if "# points:" in x.source else
                x.source.replace("import toygrading.ch99 as ex", "ex = None")) for x in c])
    cases = public_cases(toy)                # the answers of the public cases, and nothing else
    _submit(course, assignment, "hardcoder", lambda c: _solve(c, "double", hard_coded_double(cases)))
    _run(NBGRADER + ["autograde", assignment, "--force"], course)
    scores = _scores(course, assignment)
    assert scores["alice"] == (5.0, 5.0), scores
    assert scores["mallory"] == (0.0, 5.0), scores            # its check cells put back, its stubs graded
    assert scores["hardcoder"] == (0.0, 5.0), scores          # the public case passes, the hidden ones do not
