"""Lecture mode: every chapter converts to a reveal.js deck that works offline.

Converts the committed, executed chapters (nothing is re-executed), as
`make slides` does, into a temporary folder; reveal.js and MathJax come from
tools/slides/node_modules, installed here with `npm ci` when missing.
"""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _tool(name):
    spec = importlib.util.spec_from_file_location(f"minillm_{name}_tool", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    slides = _tool("slides")
    if not (slides.VENDOR / "reveal.js").exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: the decks need reveal.js from tools/slides/package.json")
        subprocess.run(["npm", "ci", "--prefix", str(ROOT / "tools" / "slides"), "--no-audit", "--no-fund",
                        "--loglevel=error"], check=True, timeout=300)
    out = tmp_path_factory.mktemp("slides")
    subprocess.run([sys.executable, str(ROOT / "tools" / "slides.py"), "--out", str(out)], check=True, timeout=600)
    return out


def test_one_deck_per_chapter(decks):
    assert CHAPTERS, "no chapters found"
    assert sorted(p.name for p in decks.glob("*.slides.html")) == [f"{c.stem}.slides.html" for c in CHAPTERS]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_deck_has_slides_notes_and_no_errors(decks, chapter):
    html = (decks / f"{chapter.stem}.slides.html").read_text()
    num_slides = _tool("slides").count_slides(html)
    assert num_slides > 1, f"{chapter.stem}: {num_slides} slide(s)"
    assert 'class="notes"' in html, f"{chapter.stem}: no speaker notes"
    assert "jp-RenderedImage" in html, f"{chapter.stem}: no figure on any slide"
    # The decks drop stderr streams, so an stderr-typed output left is an error.
    assert 'jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr"' not in html, \
        f"{chapter.stem}: an error output is on a slide"
    assert "NBVAL_IGNORE_OUTPUT" not in html


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_deck_loads_nothing_from_the_network(decks, chapter):
    html = (decks / f"{chapter.stem}.slides.html").read_text()
    loaded = re.findall(r"<(?:script|link|img)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", html)
    assert any(url.endswith("reveal.js/dist/reveal.js") for url in loaded), "reveal.js is not loaded"
    remote = [url for url in loaded if re.match(r"(https?:)?//", url)]
    assert not remote, f"{chapter.stem} loads {remote[0]}: decks must open offline"
    for url in loaded:
        if not url.startswith("data:"):
            assert (decks / url).is_file(), f"{chapter.stem} loads {url}, which make slides did not copy"
    assert "require(" not in html and "unpkg.com" not in html and "cdnjs" not in html


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_executed_chapter_carries_its_sources_slide_metadata(chapter):
    """The decks read the metadata from the executed notebook: after editing a
    source's headers, `tools/nb.py --metadata-only` (or a rebuild) copies it over."""
    source = _tool("nb").parse_percent((ROOT / "notebooks" / "src" / f"{chapter.stem}.py").read_text())
    executed = nbformat.read(chapter, as_version=4)
    keys = ("slideshow", "tags")
    assert [{k: c.metadata.get(k) for k in keys} for c in executed.cells] == \
        [{k: c.metadata.get(k) for k in keys} for c in source.cells], \
        f"{chapter.name}: stale metadata; run tools/nb.py --metadata-only notebooks/src/{chapter.stem}.py"
    skipped = sum(c.metadata.get("slideshow", {}).get("slide_type") == "skip" for c in source.cells)
    assert skipped, f"{chapter.stem}: no cell is skipped in the lecture (set-up cells should be)"


def _digest(source, slide_type="-", tags=()):
    cell = nbformat.v4.new_markdown_cell(source, metadata={"slideshow": {"slide_type": slide_type},
                                                           "tags": list(tags)})
    return [(c.metadata["slideshow"]["slide_type"], c.source) for c in _tool("slides").digest_markdown(cell)]


def test_prose_goes_to_the_notes_and_structure_stays_on_the_slide():
    source = ("## 2. A section\n\nA paragraph of prose.\n\n- a point\n- another\n\nMore prose:\n"
              "$$x = 1$$\nand after.\n\n### A detail\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    assert _digest(source) == [
        ("slide", "## 2. A section"), ("notes", "A paragraph of prose."), ("-", "- a point\n- another"),
        ("notes", "More prose:"), ("-", "$$x = 1$$"), ("notes", "and after."),
        ("subslide", "### A detail\n\n| a | b |\n|---|---|\n| 1 | 2 |")]


def test_the_cells_own_type_and_tags_win():
    assert _digest("Only prose here.", slide_type="fragment") == [("notes", "Only prose here.")]
    assert _digest("Prose first.\n\n- a point", slide_type="subslide") == \
        [("subslide", "- a point"), ("notes", "Prose first.")]
    assert _digest("Prose kept.", tags=["slides-verbatim"]) == [("-", "Prose kept.")]
    assert _digest("## Hidden\n\nprose", slide_type="skip") == [("skip", "## Hidden\n\nprose")]
