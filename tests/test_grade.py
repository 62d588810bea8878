"""`python -m minillm grade`: it grades against the manifest with the teacher's checks, so the
tricks a notebook can play score nothing for what was not solved; CSV, class folders, timeouts.

Most tests run tiny synthetic exercises (a toy checker package written to a temporary folder,
with hidden cases) so that a kernel's work is importing the grader; one test grades the real
chapter-1 notebooks. Cost on 2 busy cores: about 60 s in all (two graded runs of 8 and 3
kernels, two workers each), the rest under a second.
"""
import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from _toy_exercise import TOY_MODULES, TOY_SOURCE, hard_coded_double, public_cases, write_package
from minillm.grading import grade

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_causal_attention.ipynb"       # a fast exercise notebook: no model to run
SOURCES = sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))


def _nb_tool():
    spec = importlib.util.spec_from_file_location("minillm_nb_tool_grade", ROOT / "tools" / "nb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nb_tool = _nb_tool()


# ---------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------
def test_manifest_is_in_sync_with_the_solution_sources():
    assert json.loads((ROOT / "exercises" / "manifest.json").read_text()) == nb_tool.build_manifest(), \
        "exercises/manifest.json is stale: run `python tools/nb.py --manifest`"
    assert (ROOT / "exercises" / "manifest.json").read_text() == nb_tool.manifest_text(nb_tool.build_manifest())


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_each_manifest_task_is_a_check_cell_of_the_learner_copy_with_its_stub(src):
    entry = grade.load_manifest()["notebooks"][src.stem]
    learner = nbformat.read(ROOT / "exercises" / f"{src.stem}.ipynb", as_version=4)
    checks = [c.metadata["nbgrader"] for c in learner.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [(t["id"], t["points"]) for t in entry["tasks"]] == [(m["grade_id"], m["points"]) for m in checks]
    stubs = "\n".join(c.source for c in learner.cells if "raise NotImplementedError" in c.source)
    for task in entry["tasks"]:
        assert all(re.search(rf"^def {name}\(", stubs, re.M) for name in task["functions"]), task
    assert entry["points"] == sum(t["points"] for t in entry["tasks"]) >= 5


def test_a_check_line_the_manifest_cannot_read_is_refused_by_name():
    source = "# %% [markdown]\n# ## 1. T\n\n# %%\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n\n"
    for line, named in [("ex.check_f(g)  # points: 1", "defines above it"),
                        ("ex.check_f(f, seed=3)  # points: 1", "first line must be"),
                        ("ex.check_nope(f)  # points: 1", "no minillm/grading/ch")]:
        nb = nb_tool.parse_percent(source + f"# %%\n{line}\n")
        with pytest.raises(ValueError, match=re.escape(named)):
            nb_tool.manifest_entry(nb, "ex99", {"check_f": "toy.ch99"}, "toy.py: ")


def test_the_grader_leaves_the_learners_check_calls_out():
    cell = "x = 1\nex.check_f(f)  # points: 2\nif x:\n    fake.check_g(\n        f)\nprint(x)\n"
    assert grade.without_check_calls(cell) == "x = 1\npass\nif x:\n    fake.check_g(\n        f)\nprint(x)\n"
    assert grade.without_check_calls("%time ex.check_f(f)") == "%time ex.check_f(f)"     # magics: as written


# ---------------------------------------------------------------------------
# A toy exercise: its checkers, its hidden cases, its solution, and the tricks
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy package (importable by the kernels), its manifest, and a function that writes
    a notebook: the solution, the learner copy, or either with cells changed."""
    folder = tmp_path_factory.mktemp("toy")
    source = write_package(folder)
    manifest = nb_tool.build_manifest([source], TOY_MODULES)
    (folder / "manifest.json").write_text(nb_tool.manifest_text(manifest))
    solution = nb_tool.parse_percent(TOY_SOURCE)
    nb_tool.grade_cells(solution, "ex99")
    stubs = nb_tool.learner_version(solution)

    def write(path: Path, solved: bool = False, change=None) -> Path:
        nb = nbformat.from_dict(json.loads(json.dumps(solution if solved else stubs)))
        if change is not None:
            change(nb.cells)
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        return path

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), str(ROOT), old]))
    yield folder, manifest, write
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def _cell(cells, text):
    return next(c for c in cells if text in c.source)


def _solve(cells, name, body):
    _cell(cells, f"def {name}(").source = f"def {name}(*args):\n" + textwrap.indent(textwrap.dedent(body), "    ")


TRICKS = {
    # the trial's three tricks: check cells replaced by `pass  # points: N` and `ex` rebound to a
    # do-nothing object (no code written), and the cells of an unsolved task deleted
    "no_code": lambda c: (
        [setattr(x, "source", re.sub(r"^ex\.check_\w+\(.*\)", "pass", x.source)) for x in c if "# points:" in x.source],
        setattr(_cell(c, "import toygrading"), "source", "class Nothing:\n    def __getattr__(self, name):\n"
                                                            "        return lambda *a, **k: None\nex = Nothing()")),
    "deleted": lambda c: [(c.remove(x)) for x in [x for x in c if "total" in x.source or "Add them up" in x.source]],
    # and the ones a grader that runs in the learner's process must expect: the checker, `fail`
    # and a builtin rebound from a cell; the public cases' answers hard-coded; a value equal to
    # anything (task 1) and a function that rebinds `fail` while it is checked (task 2)
    "patched": lambda c: c.append(nbformat.v4.new_code_cell(
        "import toygrading.ch99, minillm.grading._common as common, builtins\n"
        "toygrading.ch99.check_double = lambda *a, **k: None\ntoygrading.ch99.fail = lambda *a, **k: None\n"
        "common.fail = lambda *a, **k: None\nbuiltins.sum = lambda numbers: 0\n"
        "def double(x):\n    return 0\ndef total(numbers):\n    return 0")),
    "hard_coded": None,                      # filled in by the test: the public cases' answers, and nothing else
    "sly": lambda c: (_solve(c, "double", "class Anything:\n    def __eq__(self, other):\n        return True\n"
                                          "    __ne__ = lambda self, other: False\nreturn Anything()"),
                      _solve(c, "total", "import toygrading.ch99\ntoygrading.ch99.fail = lambda *a, **k: None\n"
                                         "return 0")),
    # a cell that never ends, and a task whose function never returns: --timeout stops each
    "slow": lambda c: (_solve(c, "double", "import time\nwhile True:\n    time.sleep(1)"),
                       c.insert(2, nbformat.v4.new_code_cell("while True:\n    pass"))),
}
SOLVED = ("deleted", "slow")                 # these start from the solution, the others from the stubs


def test_a_class_folder_graded_in_one_run_scores_each_trick_zero_and_writes_the_csv(toy, tmp_path):
    folder, manifest, write = toy
    public = public_cases(folder)
    TRICKS["hard_coded"] = lambda c: _solve(c, "double", hard_coded_double(public))
    submissions = tmp_path / "submissions"
    write(submissions / "alice" / "99_toy.ipynb", solved=True)
    write(submissions / "bob" / "nested" / "99_toy (1).ipynb")                       # a stub, renamed by a browser
    for student, trick in TRICKS.items():
        write(submissions / student / "99_toy.ipynb", solved=student in SOLVED, change=trick)
    grades_csv = tmp_path / "grades.csv"
    code = grade.main(["--class", str(submissions), "--csv", str(grades_csv), "--jobs", "2", "--timeout", "8",
                       "--manifest", str(folder / "manifest.json")])
    assert code == 0
    rows = list(csv.DictReader(grades_csv.open()))
    assert list(rows[0]) == ["student", "notebook", "task", "points", "max", "message"]
    points, notes = {}, {}
    for row in rows:
        if row["task"] == "(note)":
            notes[row["student"]] = notes.get(row["student"], "") + row["message"] + "\n"
        else:
            points.setdefault(row["student"], []).append((row["task"], int(row["points"]), int(row["max"]),
                                                          row["message"]))
    assert sorted(points) == sorted(["alice", "bob", *TRICKS])
    tasks = ["1. Double it", "2. Add them up"]
    assert points["alice"] == [(tasks[0], 2, 2, "passed"), (tasks[1], 3, 3, "passed")]
    assert [p[:3] for p in points["bob"]] == [(tasks[0], 0, 2), (tasks[1], 0, 3)]
    assert all("not attempted" in p[3] for p in points["bob"])
    # check cells ignored and `ex` unused: the stubs themselves are graded
    assert [p[1:3] for p in points["no_code"]] == [(0, 2), (0, 3)]
    assert all("not attempted" in p[3] for p in points["no_code"]), points["no_code"]
    # deleting the unsolved task's cells: its points still count, as 0
    assert points["deleted"] == [(tasks[0], 2, 2, "passed"), (tasks[1], 0, 3, points["deleted"][1][3])]
    assert "defines no total" in points["deleted"][1][3]
    # rebinding the checker, `fail` and sum: put back, graded by the genuine checks, and named in a note
    assert [p[1] for p in points["patched"]] == [0, 0]
    assert "returned 0, expected 2" in points["patched"][0][3]
    assert all(name in notes["patched"] for name in ("toygrading.ch99.check_double", "toygrading.ch99.fail",
                                                       "minillm.grading._common.fail", "builtins.sum"))
    assert "read by hand" in notes["patched"]
    # the public cases hard-coded: they pass, the hidden ones do not
    assert points["hard_coded"][0][1] == 0 and points["hard_coded"][0][3].startswith("hidden case {'seed': 12345}")
    assert [p[1] for p in points["sly"]] == [0, 0]
    assert "which the notebook itself defines" in points["sly"][0][3]
    assert "rebinds toygrading.ch99.fail while it is checked" in points["sly"][1][3]
    # --timeout: the endless cell is stopped, the endless task scores 0, the other task is graded
    assert [p[1:] for p in points["slow"]] == [(0, 2, "the checks took longer than 8 s (--timeout)"), (3, 3, "passed")]
    # honest notebooks carry no note
    assert "alice" not in notes and "bob" not in notes


# ---------------------------------------------------------------------------
# The real chapter-1 exercises
# ---------------------------------------------------------------------------
def _partly_done(path: Path) -> Path:
    """The learner copy with task 1 solved, task 2 wrong-but-close (scores divided by D), the rest left."""
    solution = nbformat.read(ROOT / "exercises" / "solutions" / NOTEBOOK, as_version=4)
    learner = nbformat.read(ROOT / "exercises" / NOTEBOOK, as_version=4)
    for mine, theirs in zip(learner.cells, solution.cells):
        if "def causal_mask(" in mine.source:
            mine.source = theirs.source
        if "def attention(" in mine.source:
            assert "/ math.sqrt(head_dim)" in theirs.source
            mine.source = theirs.source.replace("/ math.sqrt(head_dim)", "/ head_dim")
    path.parent.mkdir(parents=True)
    nbformat.write(learner, path)
    return path


def test_grade_a_solution_a_learner_copy_and_a_partly_done_copy(tmp_path):
    """`python -m minillm grade` on the real chapter-1 notebooks, in a subprocess as a teacher runs it."""
    # the table is as wide as the terminal says (COLUMNS): pinned, so the wrap below is the same under any runner
    env = {**os.environ, "COLUMNS": "120",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    partly = _partly_done(tmp_path / "partly" / NOTEBOOK)
    done = subprocess.run([sys.executable, "-m", "minillm", "grade", str(ROOT / "exercises" / "solutions" / NOTEBOOK),
                           str(ROOT / "exercises" / NOTEBOOK), str(partly), "--jobs", "2",
                           "--csv", str(tmp_path / "g.csv")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = list(csv.DictReader((tmp_path / "g.csv").open()))
    tasks = grade.load_manifest()["notebooks"]["01_causal_attention"]["tasks"]
    solved, untouched, part = rows[:len(tasks)], rows[len(tasks):2 * len(tasks)], rows[2 * len(tasks):]
    assert [r["message"] for r in solved] == ["passed"] * len(tasks)
    assert sum(int(r["points"]) for r in solved) == sum(t["points"] for t in tasks)
    assert all("not attempted" in r["message"] and r["points"] == "0" for r in untouched)
    assert [int(r["points"]) for r in part] == [1] + [0] * (len(tasks) - 1)
    assert "you divide the scores by D" in part[1]["message"] and part[1]["message"].startswith("attention(<tensor [")
    assert "1. The mask of a chunk over a cache" in out and re.search(rf"total\s+1/{sum(t['points'] for t in tasks)}$",
                                                                      out, re.M)
    for noise in ("Kernel is running over TCP", "WARNING", "Traceback", "note:"):
        assert noise not in out + done.stderr, noise
    # a row's title on its first line, unwrapped; the long message wraps under the result column
    assert re.search(r"^2\. Causal attention with grouped-query heads\s+attention\(<tensor", out, re.M)


def test_grade_command_exits_2_when_misused(tmp_path):
    (tmp_path / "scratch.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    assert grade.main([str(tmp_path / "missing.ipynb")]) == 2
    assert grade.main([str(ROOT / "README.md")]) == 2
    (tmp_path / "empty").mkdir()
    assert grade.main([str(tmp_path / "empty")]) == 2       # a folder without notebooks
    assert grade.main([str(tmp_path)]) == 2                # a notebook the manifest does not know
    assert grade.main(["--class", str(tmp_path / "scratch.ipynb")]) == 2
    assert grade.main(["--timeout", "0", str(ROOT / "exercises" / NOTEBOOK)]) == 2
    assert grade.main(["--jobs", "0", str(ROOT / "exercises" / NOTEBOOK)]) == 2
    assert grade.main(["--frobnicate"]) == 2
    assert grade.main(["--help"]) == 0


def test_a_renamed_copy_is_matched_by_the_task_ids_its_cells_carry(tmp_path):
    """A copy named without its chapter's number (`executed_11.ipynb`, `mine.ipynb`) is still graded:
    its cells' nbgrader ids name the manifest's tasks. Costs no kernel: only the matching runs."""
    manifest = grade.load_manifest()
    for name in manifest["notebooks"]:
        copy = tmp_path / f"my copy of {name[3:]}.ipynb"
        copy.write_text((ROOT / "exercises" / f"{name}.ipynb").read_text())
        assert grade.manifest_entry(copy, manifest)[0] == name
    (tmp_path / "scratch.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    with pytest.raises(ValueError, match="carry no task id"):
        grade.manifest_entry(tmp_path / "scratch.ipynb", manifest)


# ---------------------------------------------------------------------------
# The notebooks' own conventions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_every_task_is_graded_with_nbgrader_metadata(src):
    """Each solution cell has a graded cell after it; grade ids are unique; the learner copy keeps them."""
    for path in (ROOT / "exercises" / "solutions" / f"{src.stem}.ipynb", ROOT / "exercises" / f"{src.stem}.ipynb"):
        nb = nbformat.read(path, as_version=4)
        metas = [c.metadata.get("nbgrader") for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader")]
        solutions = [m for m in metas if m["solution"]]
        tests = [m for m in metas if m["grade"]]
        assert len(solutions) >= 3 and len(tests) == len(solutions), f"{path.name}: {len(solutions)} tasks, {len(tests)} graded"
        ids = [m["grade_id"] for m in metas]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate grade ids {ids}"
        assert all(m["points"] >= 1 for m in tests)


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_every_task_has_a_collapsed_hint_and_the_notebook_imports_no_answers(src):
    text = src.read_text()
    tasks = re.findall(r"^# ## \d+\.", text, re.M)
    assert len(tasks) >= 3
    assert text.count("<details><summary>Hint</summary>") >= len(tasks), f"{src.name}: a task has no hint"
    imports = "\n".join(line for line in text.splitlines() if re.match(r"\s*(import|from) ", line))
    for forbidden in ("minillm.book", "_reference", "_hidden", "minillm.sim.accounting", "figures", "plots"):
        assert forbidden not in imports, f"{src.name} imports {forbidden}: the exercise's answer lives there"


def test_a_check_cell_shows_one_pass_line_or_one_clean_failure(monkeypatch):
    """In a kernel: a passing check cell prints its pass line and echoes no `True`; a failing one shows
    "Not yet: ..." once, with no traceback through the checker's source, and still fails (an error output)."""
    from nbclient import NotebookClient
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\nimport minillm.grading as ex\n"
                                  "def good(q, k):\n    return torch.arange(k)[None] <= torch.arange(q)[:, None] + (k - q)\n"
                                  "ex.check_causal_mask(good)"),
        nbformat.v4.new_code_cell("def bad(q, k):\n    return torch.ones(q, k).tril().bool()\nex.check_causal_mask(bad)")])
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
    good, bad = nb.cells[0].outputs, nb.cells[1].outputs
    assert [o.output_type for o in good] == ["stream"] and good[0].text.startswith("✓ ")
    assert good[0].text.count("\n") == 1
    assert [o.output_type for o in bad] == ["error"] and bad[0].ename == "ExerciseFailed"
    assert bad[0].traceback[0].startswith("Not yet: bad(1, 7) is wrong: that is the TOP-LEFT mask")
    assert not any("File " in line or "_common" in line for line in bad[0].traceback)
