"""Build the chapters and exercises from their reviewable sources.

Sources are Python files in the "percent" format (`# %%` starts a code cell,
`# %% [markdown]` a markdown cell whose lines start with `# `):

    notebooks/src/NN_topic.py            -> notebooks/NN_topic.ipynb (executed)
    exercises/solutions/src/NN_topic.py  -> exercises/solutions/NN_topic.ipynb (executed)
                                         -> exercises/NN_topic.ipynb (learner, stubs)

In a solution, the code between `### BEGIN SOLUTION` and `### END SOLUTION`
becomes `raise NotImplementedError` in the learner's notebook. Exercise cells
also get nbgrader metadata (`grade_cells`): a solution cell is graded by the
check cell after it, which carries `# points: N`.

    python tools/nb.py all             # every source
    python tools/nb.py notebooks/src/04_chunked_prefill_is_exact.py ...
    python tools/nb.py --no-execute ...   # convert only
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def parse_percent(text: str) -> nbformat.NotebookNode:
    cells, kind, lines = [], None, []

    def flush():
        if kind is None:
            return
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in lines)
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif lines:
            cells.append(nbformat.v4.new_code_cell("\n".join(lines)))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    number_cells(nb)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def number_cells(nb: nbformat.NotebookNode) -> None:
    """Stable cell ids (nbformat makes random ones), so rebuilds diff cleanly."""
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:03d}"


POINTS = re.compile(r"#\s*points:\s*(\d+)")


def grade_cells(nb: nbformat.NotebookNode, prefix: str) -> None:
    """nbgrader metadata: solution cells (autograded answers) and check cells (tests, with points).

    grade_id: "<prefix>_<function>" for a solution cell, "<prefix>_check_<task>" for the
    cell that grades it (named after the check it calls, else after the function it tests).
    """
    last_function = None
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if BEGIN in cell.source:
            last_function = (re.findall(r"^def (\w+)\(", cell.source, re.M) or [f"cell{cell.id}"])[0]
            cell.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                         "grade_id": f"{prefix}_{last_function}", "schema_version": 3}
        elif POINTS.search(cell.source):
            check = re.search(r"\bex\.(check_\w+)\(", cell.source)
            name = check.group(1) if check else f"check_{last_function}"
            cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                         "points": int(POINTS.search(cell.source).group(1)),
                                         "grade_id": f"{prefix}_{name}", "schema_version": 3}


def learner_version(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Replace every solution block by a stub; keep everything else."""
    nb = nbformat.v4.new_notebook(metadata=solution.metadata)
    pattern = re.compile(r"^([ \t]*)" + re.escape(BEGIN) + r".*?^[ \t]*" + re.escape(END) + r"[^\n]*",
                         re.S | re.M)
    for cell in solution.cells:
        if cell.cell_type == "code":
            source = pattern.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError",
                                 cell.source)
            nb.cells.append(nbformat.v4.new_code_cell(source, metadata=dict(cell.metadata)))
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell(cell.source, metadata=dict(cell.metadata)))
    number_cells(nb)
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600) -> float:
    import os

    from nbclient import NotebookClient
    # A kernel started with MPLBACKEND=Agg draws no inline figures: the
    # notebook would ship without its pictures.
    os.environ.pop("MPLBACKEND", None)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return time.perf_counter() - t0


def build(src: Path, run: bool = True) -> None:
    src = src.resolve()
    nb = parse_percent(src.read_text())
    out = src.parent.parent / (src.stem + ".ipynb")
    if src.parent.parent.name == "solutions":
        grade_cells(nb, "ex" + src.stem[:2])
    if run:
        seconds = execute(nb, out.parent)
        print(f"{out.relative_to(ROOT)}: executed in {seconds:.1f} s")
    nbformat.write(nb, out)
    if src.parent.parent.name == "solutions":
        learner = src.parent.parent.parent / (src.stem + ".ipynb")
        nbformat.write(learner_version(nb), learner)
        print(f"{learner.relative_to(ROOT)}: learner version written")


def all_sources() -> list[Path]:
    return sorted((ROOT / "notebooks" / "src").glob("*.py")) + \
        sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))


if __name__ == "__main__":
    args = sys.argv[1:]
    run = "--no-execute" not in args
    args = [a for a in args if a != "--no-execute"]
    sources = all_sources() if args in ([], ["all"]) else [Path(a) for a in args]
    for path in sources:
        build(path, run=run)
