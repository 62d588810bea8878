"""The student release (`python -m minillm release --student DIR`): it holds the chapters, the
exercise stubs, the engine and its public checkers, and no answer: no solution notebook or
source, no reference or hidden module, no tests, no solution block and no answer constant in
any file; its public checkers import nothing it leaves out; its exercise notebooks run, from
the release's own minillm, to their stubs (NotImplementedError, never an ImportError).

Cost: writing the tree and the static checks take about 2 s; the notebooks run in ONE kernel,
one after the other (`%reset -f` between them), about 30-70 s on 2 cores.
"""
import ast
import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import nbformat
import pytest

from minillm.grading import release

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))
CHECKERS = sorted((ROOT / "minillm" / "grading").glob("ch*.py"))
@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("student-release")
    release.write_student_release(out)
    return out


def _normalised(text: str) -> list[str]:
    """Code lines without comments or repeated spaces, blank lines dropped."""
    lines = []
    for line in text.splitlines():
        code = re.sub(r"\s+#.*$|^\s*#.*$", "", line) if line.count('"') % 2 == 0 and "'" not in line else line
        code = re.sub(r"\s+", " ", code).strip()
        if code:
            lines.append(code)
    return lines


def _solution_blocks(src: Path) -> list[list[str]]:
    return [lines for block in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", src.read_text(), re.S)
            if len(lines := _normalised(block)) >= 2]


def _text_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    return path.read_text(errors="replace")


def _released_texts(tree: Path) -> dict[str, str]:
    return {p.relative_to(tree).as_posix(): _text_of(p) for p in tree.rglob("*")
            if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".json", ".txt", ".j2")}


def test_the_release_holds_the_course_and_leaves_out_solutions_references_hidden_cases_and_tests(tree):
    for left_out in release.LEFT_OUT:
        assert not (tree / left_out).exists(), f"{left_out} is in the student release"
    assert sorted(p.name for p in (tree / "exercises").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
    assert sorted(p.name for p in (tree / "notebooks").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    for needed in ("exercises/manifest.json", "minillm/engine.py", "minillm/grading/__init__.py", "minillm/grading/ch01.py",
                   "Makefile", "requirements.txt", "pyproject.toml", "LICENSE", "LICENSE-CC-BY-4.0", "NOTICE.md",
                   "data/gpu-op-profiles/LICENSE"):
        assert (tree / needed).is_file(), f"{needed} is missing from the student release"
    for name, text in _released_texts(tree).items():
        if name.endswith(".ipynb"):
            assert "### BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text, name
    assert not list(tree.rglob("_reference")) and not list(tree.rglob("_hidden")) and not list(tree.rglob("test_*.py"))
    with pytest.raises(ValueError, match="not an empty folder"):
        release.write_student_release(tree)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_lab_resolves_in_the_release_and_the_teacher_targets_say_why_they_are_absent(tree):
    dry = subprocess.run(["make", "-n", "lab"], cwd=tree, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "pip install --quiet --no-compile -r requirements.txt" in dry.stdout and "jupyter lab" in dry.stdout
    refused = subprocess.run(["make", "test"], cwd=tree, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "student release" in refused.stderr


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_no_released_file_holds_a_solution_block(tree, src):
    blocks = _solution_blocks(src)
    assert blocks, f"{src.name}: no solution block of two lines or more"
    texts = {name: "\n".join(_normalised(text)) for name, text in _released_texts(tree).items()}
    for block in blocks:
        joined = "\n".join(block)
        found = [name for name, text in texts.items() if joined in text]
        assert not found, f"{src.stem}'s solution ({block[0]} ...) is in the release: {found}"


def _literal_answers(src: Path) -> list:
    """The answers that are constants: a solution block that is `return <literal>`."""
    answers = []
    for block in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", src.read_text(), re.S):
        try:
            statement = ast.parse(textwrap.dedent(block)).body
            if len(statement) == 1 and isinstance(statement[0], ast.Return) and statement[0].value is not None:
                answers.append(ast.literal_eval(statement[0].value))
        except (SyntaxError, ValueError):
            continue
    return answers


def _literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.Constant)):
            try:
                yield ast.literal_eval(node)
            except ValueError:
                continue


CONSTANT_ANSWERS = [src for src in SOURCES if _literal_answers(src)]


@pytest.mark.parametrize("src", CONSTANT_ANSWERS, ids=lambda p: p.stem)
def test_no_released_module_holds_an_answer_constant(tree, src):
    answers = _literal_answers(src)
    for path in sorted(tree.rglob("*.py")):
        held = [value for value in _literals(path) if any(value == answer for answer in answers)]
        assert not held, f"{path.relative_to(tree)} holds {src.stem}'s answer {held[0]!r}"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports too), relative ones resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda p: p.stem)
def test_a_public_checker_imports_nothing_the_release_leaves_out(checker):
    bad = sorted(m for m in _imports(checker) if "._reference" in m or "._hidden" in m)
    assert not bad, f"{checker.name} imports {bad}: a student release has neither"


def test_the_release_exercise_notebooks_run_from_the_release_to_their_stubs(tree):
    from nbclient import NotebookClient

    notebooks = sorted((tree / "exercises").glob("*.ipynb"))
    cells, sections = [nbformat.v4.new_code_cell("import minillm\nprint(minillm.__file__)")], []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        checks = sum(1 for c in nb.cells if c.cell_type == "code" and "# points:" in c.source)
        start = len(cells)
        cells += [nbformat.v4.new_code_cell(source) for source in
                  ["%reset -f", *(c.source for c in nb.cells if c.cell_type == "code")]]
        sections.append((path.name, start, len(cells), checks))
    together = nbformat.v4.new_notebook(cells=cells)
    env = {"PYTHONPATH": str(tree)}                    # the release's minillm, not this checkout's
    NotebookClient(together, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tree / "exercises")}}).execute(
        env={**__import__("os").environ, **env})
    where = "".join(o.get("text", "") for o in together.cells[0].outputs)
    assert where.strip().startswith(str(tree)), f"the kernel imported minillm from {where.strip()}, not the release"
    for name, start, end, checks in sections:
        errors = [o for c in together.cells[start:end] for o in c.get("outputs", []) if o.output_type == "error"]
        wrong = [f"{o.ename}: {o.evalue}"[:200] for o in errors if o.ename != "NotImplementedError"]
        assert not wrong, f"{name} in the release fails with something other than its stubs: {wrong[:3]}"
        assert len(errors) >= checks, f"{name}: {checks} checks but {len(errors)} stubs reached"


def test_the_release_command_line(tmp_path, capsys):
    import os
    import sys
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "minillm", "release", "--student", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no solutions, reference answers, hidden cases or tests" in done.stdout
    assert json.loads((tmp_path / "out" / "exercises" / "manifest.json").read_text())["notebooks"]
    # misuse, in process (each `python -m minillm` start imports torch)
    assert release.main(["--student", str(tmp_path / "out")]) == 2           # not empty any more
    assert "not an empty folder" in capsys.readouterr().err
    assert release.main([]) == 2 and release.main(["--teacher", "x"]) == 2
    assert release.main(["--student", str(ROOT / "release-inside")]) == 2    # inside the checkout
    assert release.main(["--help"]) == 0
