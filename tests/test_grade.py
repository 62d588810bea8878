"""`python -m minillm grade`: a solution notebook gets full marks, a learner copy none
("not attempted", not a crash), a partly done copy the points of what it got right and
the first line of the checker's message where it went wrong; exit code 0 throughout."""
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minillm.grading import grade

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_causal_attention.ipynb"       # a fast exercise notebook: no model to run
SOURCES = sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))


@pytest.fixture(scope="module")
def kernel_env():
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))
    yield
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def _partly_done(tmp_path: Path) -> Path:
    """The learner copy with task 1 solved, task 2 wrong-but-close (scores divided by D), the rest left."""
    solution = nbformat.read(ROOT / "exercises" / "solutions" / NOTEBOOK, as_version=4)
    learner = nbformat.read(ROOT / "exercises" / NOTEBOOK, as_version=4)
    for mine, theirs in zip(learner.cells, solution.cells):
        if "def causal_mask(" in mine.source:
            mine.source = theirs.source
        if "def attention(" in mine.source:
            assert "/ math.sqrt(head_dim)" in theirs.source
            mine.source = theirs.source.replace("/ math.sqrt(head_dim)", "/ head_dim")
    path = tmp_path / NOTEBOOK
    nbformat.write(learner, path)
    return path


def test_grade_a_solution_a_learner_copy_and_a_partly_done_copy(tmp_path, kernel_env):
    solved = grade.grade_notebook(ROOT / "exercises" / "solutions" / NOTEBOOK)
    num_tasks, total = len(solved), sum(r.max_points for r in solved)
    assert num_tasks >= 5 and [r.status for r in solved] == ["passed"] * num_tasks
    assert sum(r.points for r in solved) == total

    untouched = grade.grade_notebook(ROOT / "exercises" / NOTEBOOK)
    assert [r.status for r in untouched] == ["not attempted"] * num_tasks
    assert sum(r.points for r in untouched) == 0

    partly = grade.grade_notebook(_partly_done(tmp_path))
    assert [r.status for r in partly] == ["passed", "failed"] + ["not attempted"] * (num_tasks - 2)
    assert [r.points for r in partly] == [1] + [0] * (num_tasks - 1)
    assert "you divide the scores by D" in partly[1].message and "\n" not in partly[1].message
    assert partly[1].message.startswith("attention(<tensor [")          # the learner's function, by name
    table = grade.format_table(partly)
    assert "1. The mask of a chunk over a cache" in table and "not attempted" in table
    assert re.search(rf"total\s+1/{total}", table)


def test_grade_command_exits_0_on_a_failing_notebook_and_2_when_misused(tmp_path):
    # the table is as wide as the terminal says (COLUMNS): pinned, so the wrap below is the same under any runner
    env = {**os.environ, "COLUMNS": "120",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = lambda *args: subprocess.run([sys.executable, "-m", "minillm", "grade", *args], cwd=ROOT, env=env,
                                       capture_output=True, text=True, timeout=600)
    # a four-task notebook: one passes, one is a stub, one fails a checker, one crashes in the learner's code
    # (the real ones are graded above); the longest title is past the old 44-character column
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## 1. Warm-up"), nbformat.v4.new_code_cell("assert 1 + 1 == 2  # points: 1"),
        nbformat.v4.new_markdown_cell("## 2. Left to do"),
        nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError\nf()  # points: 2"),
        nbformat.v4.new_markdown_cell("## 3. The mask of a chunk over a cache, bottom-right aligned"),
        nbformat.v4.new_code_cell("import torch\nimport minillm.grading as ex\n"
                                  "def my_mask(q, k):\n    return torch.ones(q, k).tril().bool()\n"
                                  "ex.check_causal_mask(my_mask)  # points: 1"),
        nbformat.v4.new_markdown_cell("## 4. Merge"),
        nbformat.v4.new_code_cell("def my_merge(oa, la, ob, lb):\n    return oa + 'x'\n"
                                  "ex.check_merge_attention(my_merge)  # points: 1")])
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    done = run(str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "1. Warm-up" in done.stdout and "not attempted" in done.stdout
    assert re.search(r"total\s+1/5$", done.stdout, re.M), done.stdout          # nothing else on the total line
    # one clean table: no kernel log, no traceback, every title on its row's first line, unwrapped
    for noise in ("Kernel is running over TCP", "WARNING", "Traceback", "File \""):
        assert noise not in done.stdout + done.stderr, (noise, done.stdout, done.stderr)
    rows = {line.split("  ")[0]: line for line in done.stdout.splitlines()}
    assert "3. The mask of a chunk over a cache, bottom-right aligned" in rows
    assert "my_mask(1, 7) is wrong: that is the TOP-LEFT mask" in rows["3. The mask of a chunk over a cache, "
                                                                         "bottom-right aligned"]
    assert "my_merge(" in done.stdout and "raised TypeError" in done.stdout
    (tmp_path / "tiny.ipynb").unlink()
    # misuse, in process (each `python -m minillm` start imports torch)
    assert grade.main([str(tmp_path / "missing.ipynb")]) == 2
    assert grade.main([str(ROOT / "README.md")]) == 2
    assert grade.main([str(tmp_path)]) == 2                # a folder without notebooks
    assert grade.main(["--frobnicate"]) == 2
    assert grade.main(["--help"]) == 0


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
        assert [c for c in grade.graded_cells(nb)] and len(grade.graded_cells(nb)) == len(tests)


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_every_task_has_a_collapsed_hint_and_the_notebook_imports_no_answers(src):
    text = src.read_text()
    tasks = re.findall(r"^# ## \d+\.", text, re.M)
    assert len(tasks) >= 3
    assert text.count("<details><summary>Hint</summary>") >= len(tasks), f"{src.name}: a task has no hint"
    imports = "\n".join(line for line in text.splitlines() if re.match(r"\s*(import|from) ", line))
    for forbidden in ("minillm.book", "_reference", "minillm.sim.accounting", "figures", "plots"):
        assert forbidden not in imports, f"{src.name} imports {forbidden}: the exercise's answer lives there"


def test_a_check_cell_shows_one_pass_line_or_one_clean_failure(kernel_env):
    """In a kernel: a passing check cell prints its pass line and echoes no `True`; a failing one shows
    "Not yet: ..." once, with no traceback through the checker's source, and still fails (an error output)."""
    from nbclient import NotebookClient
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
