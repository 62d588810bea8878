"""tools/nb.py: cell metadata on percent headers, and copying it onto executed notebooks."""
import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("minillm_nb_tool_meta", ROOT / "tools" / "nb.py")
nb_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nb_tool)

SOURCE = '''# %% [markdown] slideshow={"slide_type": "slide"}
# # Title

# %% slideshow={"slide_type": "skip"} tags=["setup", "slides-hide-input"]
import math

# %%
print(math.pi)
'''


def test_headers_carry_jupytext_metadata_and_plain_headers_still_work():
    nb = nb_tool.parse_percent(SOURCE)
    assert [(c.cell_type, c.source) for c in nb.cells] == \
        [("markdown", "# Title"), ("code", "import math"), ("code", "print(math.pi)")]
    assert nb.cells[0].metadata == {"slideshow": {"slide_type": "slide"}}
    assert nb.cells[1].metadata == {"slideshow": {"slide_type": "skip"}, "tags": ["setup", "slides-hide-input"]}
    assert nb.cells[2].metadata == {}
    nbformat.validate(nb)


@pytest.mark.parametrize("header, named", [
    ("# %% A title", "expected key=JSON"),
    ('# %% slideshow={"slide_type": "slid"}', "slideshow="),
    ('# %% slideshow={"slide_type": "skip"', "not JSON"),
    ('# %% tags="slides-hide-input"', "tags="),
])
def test_a_bad_header_names_its_line_and_what_is_wrong(header, named):
    with pytest.raises(ValueError, match=named) as err:
        nb_tool.parse_percent(f"# %%\nx = 1\n{header}\ny = 2\n", "ch.py: ")
    assert str(err.value).startswith("ch.py: line 3: ")


def _executed(source: str):
    nb = nb_tool.parse_percent(source)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"out {i}\n")]
            cell.metadata["execution"] = {"iopub.status.idle": "then"}
    return nb


def test_metadata_only_copies_headers_and_markdown_and_keeps_outputs():
    executed = _executed(SOURCE.replace(' slideshow={"slide_type": "skip"} tags=["setup", "slides-hide-input"]', "")
                         .replace("# # Title", "# # Old title"))
    changed = nb_tool.copy_metadata(nb_tool.parse_percent(SOURCE), executed, "ch.ipynb")
    assert changed == 2                          # the title's text, the skipped cell's metadata
    assert executed.cells[0].source == "# Title"
    assert executed.cells[1].metadata == {"slideshow": {"slide_type": "skip"}, "tags": ["setup", "slides-hide-input"],
                                          "execution": {"iopub.status.idle": "then"}}
    assert [c.outputs[0].text for c in executed.cells[1:]] == ["out 1\n", "out 2\n"]


def test_metadata_only_refuses_changed_code():
    executed = _executed(SOURCE.replace("print(math.pi)", "print(math.e)"))
    with pytest.raises(ValueError, match=r"ch.ipynb: cell 2 differs .*rebuild it"):
        nb_tool.copy_metadata(nb_tool.parse_percent(SOURCE), executed, "ch.ipynb")


def test_the_learner_copy_drops_hidden_tests_and_stubs_the_solution():
    nb = nb_tool.parse_percent(
        "# %%\ndef f():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION\n\n"
        "# %%\nex.check_f(f)  # points: 1\n### BEGIN HIDDEN TESTS\nassert f() == 42   # the answer\n"
        "### END HIDDEN TESTS\n")
    learner = nb_tool.learner_version(nb)
    assert [c.source for c in learner.cells] == [
        "def f():\n    # YOUR CODE HERE\n    raise NotImplementedError", "ex.check_f(f)  # points: 1"]
    text = "".join(c.source for c in learner.cells)
    assert "42" not in text and "HIDDEN" not in text
    broken = nb_tool.parse_percent("# %%\nx = 1\n### BEGIN HIDDEN TESTS\nassert x\n")
    with pytest.raises(ValueError, match="unmatched"):
        nb_tool.learner_version(broken)
