"""The notebooks as readers browse them: executed, error-free, with their figures.

nbval re-runs the notebooks but ignores what was saved; these tests check the
saved files (a kernel started with MPLBACKEND=Agg, for one, saves no figures).
"""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_every_chapter_of_the_map_is_there():
    """The README's chapter map and the notebooks folder list the same chapters (helpers
    add chapters in parallel, so the numbers are the map's, not a fixed range)."""
    import re
    mapped = re.findall(r"^\| (\d+) \| `notebooks/(\d\d_\w+)\.ipynb`", (ROOT / "README.md").read_text(), re.M)
    assert [p.stem for p in CHAPTERS] == [stem for _, stem in mapped]
    assert [int(n) for n, _ in mapped] == [int(stem[:2]) for _, stem in mapped]
    assert [int(n) for n, _ in mapped]== list(range(len(mapped)))
    assert len(mapped) >= 13
    for chapter in CHAPTERS:
        assert (ROOT / "notebooks" / "src" / (chapter.stem + ".py")).exists(), chapter.name


@pytest.mark.parametrize("path", CHAPTERS + SOLUTIONS, ids=lambda p: p.name)
def test_saved_executed_and_without_errors(path):
    cells = code_cells(path)
    assert cells and all(c["execution_count"] is not None for c in cells), "saved without running every cell"
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"saved with an error: {errors[0].get('ename')}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_ships_its_figures(path):
    images = [o for c in code_cells(path) for o in c["outputs"] if "image/png" in o.get("data", {})]
    assert images, "no figure saved: was the kernel run with MPLBACKEND=Agg?"
