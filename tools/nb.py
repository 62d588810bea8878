"""Build the chapters and exercises from their reviewable sources.

Sources are Python files in the "percent" format (`# %%` starts a code cell,
`# %% [markdown]` a markdown cell whose lines start with `# `). A header may
carry the cell's metadata as jupytext writes it, `key=JSON` pairs after the
marker, e.g. the slide metadata that `make slides` (tools/slides.py) reads:

    # %% [markdown] slideshow={"slide_type": "slide"}
    # %% slideshow={"slide_type": "skip"}
    # %% slideshow={"slide_type": "fragment"} tags=["slides-hide-output"]

    notebooks/src/NN_topic.py            -> notebooks/NN_topic.ipynb (executed)
    notebooks/lecture/src/demos.py       -> notebooks/lecture/demos.ipynb (executed)
    exercises/solutions/src/NN_topic.py  -> exercises/solutions/NN_topic.ipynb (executed)
                                         -> exercises/NN_topic.ipynb (learner, stubs)

In a solution, the code between `### BEGIN SOLUTION` and `### END SOLUTION`
becomes `raise NotImplementedError` in the learner's notebook, and a block between
`### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` is dropped from it. Exercise cells
also get nbgrader metadata (`grade_cells`): a solution cell is graded by the
check cell after it, which carries `# points: N`. Building a solution also rewrites
exercises/manifest.json: each notebook's tasks (heading, the functions the check takes,
checker, points), which `python -m minillm grade` grades against.

    python tools/nb.py all             # every source
    python tools/nb.py notebooks/src/04_chunked_prefill_is_exact.py ...
    python tools/nb.py --no-execute ...   # convert only
    python tools/nb.py --metadata-only ...  # copy the sources' cell metadata onto the
                                            # executed notebooks, without re-running them
    python tools/nb.py --manifest           # rewrite exercises/manifest.json only
    python tools/nb.py --nbgrader-source COURSE [SOLUTION_SOURCES ...]
        # an nbgrader course's source/<NN_topic>/<NN_topic>.ipynb for each exercise, each
        # check cell with a hidden-tests block that runs the teacher's checks (public and
        # minillm/grading/_hidden/ cases) on the learner's functions (docs/teaching.md)
"""
from __future__ import annotations

import ast
import copy
import json
import re
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
MANIFEST = ROOT / "exercises" / "manifest.json"
SLIDE_TYPES = ("slide", "subslide", "fragment", "skip", "notes", "-")
# Keys that building a notebook writes into a cell's metadata (running it, or
# deriving nbgrader's from the code); every other key comes from the source header.
EXECUTION_KEYS = ("execution", "nbgrader")


def parse_header(line: str, where: str = "") -> tuple[str, dict]:
    """`# %% [markdown] slideshow={...} tags=[...]` -> ("markdown", {"slideshow": ..., "tags": ...})."""
    rest = line[len("# %%"):].strip()
    kind = "code"
    if rest.startswith("[markdown]"):
        kind, rest = "markdown", rest[len("[markdown]"):].strip()
    metadata, decoder = {}, json.JSONDecoder()
    while rest:
        key = re.match(r"(\w+)=", rest)
        if key is None:
            raise ValueError(f"{where}cell header {line!r}: expected key=JSON pairs after the marker, "
                             f"e.g. slideshow={{\"slide_type\": \"slide\"}}, got {rest!r}")
        try:
            value, end = decoder.raw_decode(rest, key.end())
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}cell header {line!r}: the value of {key.group(1)} is not JSON "
                             f"({err.msg})") from None
        metadata[key.group(1)] = value
        rest = rest[end:].strip()
    check_metadata(metadata, f"{where}cell header {line!r}: ")
    return kind, metadata


def check_metadata(metadata: dict, where: str) -> None:
    slideshow = metadata.get("slideshow", {})
    if not isinstance(slideshow, dict) or slideshow.get("slide_type", "-") not in SLIDE_TYPES:
        raise ValueError(f"{where}slideshow={slideshow!r}: must be {{\"slide_type\": T}} "
                         f"with T one of {', '.join(SLIDE_TYPES)}")
    tags = metadata.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise ValueError(f"{where}tags={tags!r}: must be a list of strings, e.g. [\"slides-hide-output\"]")


def parse_percent(text: str, where: str = "") -> nbformat.NotebookNode:
    cells, kind, metadata, lines = [], None, {}, []

    def flush():
        if kind is None:
            return
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in lines)
            cells.append(nbformat.v4.new_markdown_cell(body, metadata=metadata))
        elif lines:
            cells.append(nbformat.v4.new_code_cell("\n".join(lines), metadata=metadata))

    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("# %%"):
            flush()
            (kind, metadata), lines = parse_header(line, f"{where}line {number}: "), []
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


def _block(begin: str, end: str) -> re.Pattern:
    return re.compile(r"^([ \t]*)" + re.escape(begin) + r".*?^[ \t]*" + re.escape(end) + r"[^\n]*", re.S | re.M)


def learner_version(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Replace every solution block by a stub and drop every hidden-tests block (with the
    blank lines it leaves at the end of its cell); keep everything else."""
    nb = nbformat.v4.new_notebook(metadata=solution.metadata)
    pattern, hidden = _block(BEGIN, END), _block(HIDDEN_BEGIN, HIDDEN_END)
    for cell in solution.cells:
        if cell.cell_type == "code":
            source = pattern.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError",
                                 cell.source)
            if HIDDEN_BEGIN in source:
                source = hidden.sub("", source).rstrip()
            if HIDDEN_BEGIN in source or HIDDEN_END in source:
                raise ValueError(f"cell {cell.get('id')}: an unmatched {HIDDEN_BEGIN!r} or {HIDDEN_END!r}: "
                                 f"the learner's copy would show the hidden tests")
            nb.cells.append(nbformat.v4.new_code_cell(source, metadata=dict(cell.metadata)))
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell(cell.source, metadata=dict(cell.metadata)))
    number_cells(nb)
    return nb


# ---------------------------------------------------------------------------
# The manifest: what `python -m minillm grade` expects of each exercise notebook
# ---------------------------------------------------------------------------
HEADING = re.compile(r"^##\s+(.+)$", re.M)


def checker_modules(grading: Path = ROOT / "minillm" / "grading", package: str = "minillm.grading") -> dict:
    """check_* name -> the module that defines it, read from the files (nothing imported)."""
    found = {}
    for path in sorted(grading.glob("ch*.py")):
        for name in re.findall(r"^def (check_\w+)\(", path.read_text(), re.M):
            found[name] = f"{package}.{path.stem}"
    return found


def _check_call(line: str, where: str) -> tuple[str, str, list[str]]:
    """`ex.check_x(expr)  # points: P` -> ("check_x", "expr", [names expr uses])."""
    try:
        call = ast.parse(line.strip()).body[0].value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr.startswith("check_") and len(call.args) == 1 and not call.keywords):
            raise ValueError
    except (SyntaxError, ValueError, IndexError, AttributeError):
        raise ValueError(f"{where}: a check cell's first line must be `ex.check_<task>(<function or call>)  "
                         f"# points: P`, got {line.strip()!r}") from None
    argument = ast.get_source_segment(line.strip(), call.args[0])
    names = [node.id for node in ast.walk(call.args[0]) if isinstance(node, ast.Name)]
    return call.func.attr, argument, names


def manifest_entry(nb: nbformat.NotebookNode, prefix: str, modules: dict, where: str = "") -> dict:
    """The notebook's tasks, in order: heading, the functions its check takes (defined in a
    solution cell), the checker and its module, the argument expression, the points."""
    tasks, heading, defined = [], None, set()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found = HEADING.search(cell.source)
            heading = found.group(1).strip() if found else heading
            continue
        if cell.cell_type != "code":
            continue
        if BEGIN in cell.source:
            defined.update(re.findall(r"^def (\w+)\(", cell.source, re.M))
        elif POINTS.search(cell.source):
            first = cell.source.lstrip().splitlines()[0]
            checker, argument, names = _check_call(POINTS.sub("", first), f"{where}{cell.get('id')}")
            unknown = [name for name in names if name not in defined]
            if unknown or not names:
                raise ValueError(f"{where}{first.strip()!r}: its argument must use functions that a solution cell "
                                 f"(### BEGIN SOLUTION) defines above it; {unknown or 'none'} is not one")
            if checker not in modules:
                raise ValueError(f"{where}{checker}: no minillm/grading/ch*.py defines it")
            tasks.append({"id": f"{prefix}_{checker}", "heading": heading or "(before any heading)",
                          "functions": list(dict.fromkeys(names)), "checker": checker,
                          "module": modules[checker], "argument": argument,
                          "points": int(POINTS.search(first).group(1))})
    return {"points": sum(task["points"] for task in tasks), "tasks": tasks}


def build_manifest(sources: list[Path] | None = None, modules: dict | None = None) -> dict:
    sources = sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py")) if sources is None else sources
    modules = checker_modules() if modules is None else modules
    notebooks = {src.stem: manifest_entry(parse_percent(src.read_text(), f"{src.name}: "), "ex" + src.stem[:2],
                                          modules, f"{src.name}: ") for src in sources}
    return {"about": "What `python -m minillm grade` expects of each exercise notebook: written by "
                     "tools/nb.py from exercises/solutions/src (do not edit by hand).",
            "notebooks": notebooks}


def manifest_text(manifest: dict) -> str:
    """JSON with one line per task, so a change to a task is a one-line diff."""
    lines = ["{", f' "about": {json.dumps(manifest["about"])},', ' "notebooks": {']
    names = list(manifest["notebooks"])
    for i, name in enumerate(names):
        entry = manifest["notebooks"][name]
        lines += [f"  {json.dumps(name)}: {{", f'   "points": {entry["points"]},', '   "tasks": [']
        lines += [f"    {json.dumps(task, ensure_ascii=False)}" + ("," if j < len(entry["tasks"]) - 1 else "")
                  for j, task in enumerate(entry["tasks"])]
        lines += ["   ]", "  }" + ("," if i < len(names) - 1 else "")]
    return "\n".join(lines + [" }", "}"]) + "\n"


def write_manifest() -> None:
    MANIFEST.write_text(manifest_text(build_manifest()))
    print(f"{MANIFEST.relative_to(ROOT)}: {len(json.loads(MANIFEST.read_text())['notebooks'])} notebooks")


# ---------------------------------------------------------------------------
# nbgrader's source notebooks, with the teacher's checks as hidden tests
# ---------------------------------------------------------------------------
GRADER_SETUP = ("# The grader's set-up (nbgrader): it must run before your cells. Leave it as it is.\n"
                "import minillm.grading._harness as _minillm_grader\n"
                "_minillm_grader.begin({modules!r})\n")


def nbgrader_source(src: Path, modules: dict | None = None) -> nbformat.NotebookNode:
    """The solution notebook as nbgrader's source: a locked first cell that sets the grader up,
    and after each check cell's line a hidden-tests block that runs the teacher's checks
    (the public checker, then minillm/grading/_hidden/ cases) on the learner's functions."""
    modules = checker_modules() if modules is None else modules
    nb = parse_percent(src.read_text(), f"{src.name}: ")
    prefix = "ex" + src.stem[:2]
    entry = manifest_entry(nb, prefix, modules, f"{src.name}: ")
    grade_cells(nb, prefix)
    tasks = iter(entry["tasks"])
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            task = next(tasks)
            cell.source += (f"\n{HIDDEN_BEGIN}\n"
                            f"__import__('minillm.grading._harness', fromlist=['_']).assert_task({task!r})\n"
                            f"{HIDDEN_END}")
    setup = nbformat.v4.new_code_cell(GRADER_SETUP.format(modules=tuple(sorted({t["module"] for t in entry["tasks"]}))))
    setup.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True,
                                  "grade_id": f"{prefix}_grader_setup", "schema_version": 3}
    nb.cells.insert(0, setup)
    number_cells(nb)
    return nb


def write_nbgrader_sources(course: Path, sources: list[Path]) -> None:
    for src in sources:
        out = course / "source" / src.stem / f"{src.stem}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbgrader_source(src), out)
        print(f"{out}: nbgrader source with hidden tests")


def source_metadata(cell: nbformat.NotebookNode) -> dict:
    """The part of a cell's metadata that its source header set (not what running it added)."""
    return {key: copy.deepcopy(value) for key, value in cell.metadata.items() if key not in EXECUTION_KEYS}


def copy_metadata(source: nbformat.NotebookNode, executed: nbformat.NotebookNode, name: str) -> int:
    """Give each executed cell its source cell's metadata, keeping the outputs.

    The code cells must match their sources (else the outputs would be stale);
    a markdown cell has no outputs, so it takes its source's text as well.
    Returns the number of cells that changed."""
    got = [(cell.cell_type, cell.source if cell.cell_type == "code" else "") for cell in executed.cells]
    want = [(cell.cell_type, cell.source if cell.cell_type == "code" else "") for cell in source.cells]
    if got != want:
        index = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        raise ValueError(f"{name}: cell {index} differs from its source ({len(got)} executed cells, "
                         f"{len(want)} in the source; code must match exactly): the outputs are stale, "
                         f"rebuild it with tools/nb.py (without --metadata-only)")
    changed = 0
    for cell, new in zip(executed.cells, source.cells):
        metadata = {**source_metadata(new),
                    **{key: cell.metadata[key] for key in EXECUTION_KEYS if key in cell.metadata}}
        changed += metadata != cell.metadata or cell.source != new.source
        cell.metadata, cell.source = nbformat.from_dict(metadata), new.source
    return changed


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
        write_manifest()


def update_metadata(src: Path) -> None:
    """--metadata-only: the source's cell metadata (and markdown) onto the executed notebook."""
    src = src.resolve()
    out = src.parent.parent / (src.stem + ".ipynb")
    executed = nbformat.read(out, as_version=4)
    changed = copy_metadata(parse_percent(src.read_text(), f"{src.name}: "), executed,
                            str(out.relative_to(ROOT)))
    nbformat.write(executed, out)
    print(f"{out.relative_to(ROOT)}: {changed} cells given their source's metadata (and markdown), outputs kept")
    if src.parent.parent.name == "solutions":
        learner = src.parent.parent.parent / (src.stem + ".ipynb")
        nbformat.write(learner_version(executed), learner)


def all_sources() -> list[Path]:
    return sorted((ROOT / "notebooks" / "src").glob("*.py")) + \
        sorted((ROOT / "notebooks" / "lecture" / "src").glob("*.py")) + \
        sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--manifest"]:
        write_manifest()
        sys.exit(0)
    if args[:1] == ["--nbgrader-source"]:
        if len(args) < 2:
            sys.exit("usage: python tools/nb.py --nbgrader-source COURSE_DIR [exercises/solutions/src/NN_x.py ...]")
        write_nbgrader_sources(Path(args[1]), [Path(a) for a in args[2:]] or
                               sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py")))
        sys.exit(0)
    run = "--no-execute" not in args
    metadata_only = "--metadata-only" in args
    args = [a for a in args if a not in ("--no-execute", "--metadata-only")]
    sources = all_sources() if args in ([], ["all"]) else [Path(a) for a in args]
    for path in sources:
        if metadata_only:
            update_metadata(path)
        else:
            build(path, run=run)
