"""Exercises: every learner notebook is the stubbed copy of its solution, and
running it fails only with NotImplementedError, at least once per stub."""
import importlib.util
import os
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))


def _nb_tool():
    spec = importlib.util.spec_from_file_location("minillm_nb_tool", ROOT / "tools" / "nb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paths(src: Path):
    return ROOT / "exercises" / "solutions" / f"{src.stem}.ipynb", ROOT / "exercises" / f"{src.stem}.ipynb"


def _sources(nb):
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def test_there_are_exercises():
    assert SOURCES, "no exercises/solutions/src/*.py found"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_solution_notebook_is_built_from_its_source(src):
    solution, _ = _paths(src)
    assert solution.exists(), f"{solution.relative_to(ROOT)} missing: run tools/nb.py {src.relative_to(ROOT)}"
    built = _nb_tool().parse_percent(src.read_text())
    assert _sources(nbformat.read(solution, as_version=4)) == _sources(built), \
        f"{solution.relative_to(ROOT)} is stale: rebuild it with tools/nb.py"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_learner_notebook_is_the_stubbed_solution(src):
    solution, learner = _paths(src)
    assert learner.exists(), f"{learner.relative_to(ROOT)} missing: run tools/nb.py {src.relative_to(ROOT)}"
    expected = _nb_tool().learner_version(nbformat.read(solution, as_version=4))
    got = nbformat.read(learner, as_version=4)
    assert _sources(got) == _sources(expected)
    assert "### BEGIN SOLUTION" not in "".join(cell.source for cell in got.cells)


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_learner_notebook_fails_only_with_not_implemented_error_at_each_stub(src, monkeypatch):
    from nbclient import NotebookClient

    _, learner = _paths(src)
    assert learner.exists(), f"{learner.relative_to(ROOT)} missing: run tools/nb.py {src.relative_to(ROOT)}"
    nb = nbformat.read(learner, as_version=4)
    num_stubs = sum(cell.source.count("raise NotImplementedError") for cell in nb.cells
                    if cell.cell_type == "code")
    assert num_stubs >= 3, f"{learner.name}: only {num_stubs} stubs; each chapter has at least 3 tasks"
    # The kernel must import this checkout's minillm even without `pip install -e .`.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(learner.parent)}}).execute()
    errors = [(i, out.ename) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.output_type == "error"]
    wrong = [(i, ename) for i, ename in errors if ename != "NotImplementedError"]
    assert not wrong, f"{learner.name}: cells fail with something other than NotImplementedError: {wrong}"
    assert len(errors) >= num_stubs, \
        f"{learner.name}: {num_stubs} stubs but only {len(errors)} NotImplementedError outputs"
    # Each stubbed function must be reached: its name appears in some traceback.
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    tracebacks = [ansi.sub("", "\n".join(out.traceback)) for cell in nb.cells if cell.cell_type == "code"
                  for out in cell.get("outputs", []) if out.output_type == "error"]
    for cell in nb.cells:
        if cell.cell_type != "code" or "raise NotImplementedError" not in cell.source:
            continue
        for name in re.findall(r"^\s*def (\w+)\(", cell.source, re.M):
            body = cell.source.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
            if "raise NotImplementedError" in body:
                assert any(re.search(rf"\bin {name}\b", tb) for tb in tracebacks), \
                    f"{learner.name}: the stub {name}() is never called by a check cell"
