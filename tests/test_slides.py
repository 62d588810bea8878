"""Lecture mode: every chapter converts to a reveal.js deck that works offline, and every
slide fits a 1280x720 screen.

Converts the committed, executed chapters (nothing is re-executed), as
`make slides` does, into a temporary folder; reveal.js and MathJax come from
tools/slides/node_modules, installed here with `npm ci` when missing. The fit is
measured in Debian's Chromium (.ci/run installs it) through Playwright: every slide
of every deck shown in turn at 1280x720. Cost: about 20 s to build the decks and
10 s to measure them (about 260 slides).
"""
import importlib.util
import os
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


# ---------------------------------------------------------------------------
# Slides that fit
# ---------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MEASURE = r"""
() => Reveal.getSlides().map((slide, i) => {
  const at = Reveal.getIndices(slide);
  Reveal.slide(at.h, at.v);
  const shown = Reveal.getCurrentSlide();
  // an element that scrolls hides part of its content (MathJax's hidden copy for screen readers aside)
  const scrolls = [...shown.querySelectorAll("*")].filter(el => !el.closest("mjx-assistive-mml") && (
      (el.scrollHeight > el.clientHeight + 2 && ["auto", "scroll"].includes(getComputedStyle(el).overflowY)) ||
      (el.scrollWidth > el.clientWidth + 2 && ["auto", "scroll"].includes(getComputedStyle(el).overflowX))));
  const title = (shown.querySelector("h1, h2, h3") || shown).textContent.trim().slice(0, 60);
  return {i, height: shown.scrollHeight, width: shown.scrollWidth, scrolls: scrolls.length, title};
})
"""


def test_every_slide_fits_a_1280x720_screen(decks):
    if not os.path.exists(CHROMIUM):
        pytest.skip("no Chromium at /usr/bin/chromium: `apt-get install chromium` (.ci/run does) to measure the slides")
    playwright = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    over, total = [], 0
    with playwright.sync_playwright() as browser_driver:
        browser = browser_driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        for chapter in CHAPTERS:
            page.goto((decks / f"{chapter.stem}.slides.html").as_uri())
            page.wait_for_function("window.minillmSlidesFitted === true", timeout=60_000)
            assert page.evaluate("[Reveal.getConfig().width, Reveal.getConfig().height]") == [1280, 720]
            slides = page.evaluate(MEASURE)
            total += len(slides)
            over += [f"{chapter.stem} slide {s['i'] + 1} ({s['title']!r}): {s['width']}x{s['height']}"
                     f"{', a part scrolls' if s['scrolls'] else ''}"
                     for s in slides if s["height"] > 720 or s["width"] > 1280 or s["scrolls"]]
        browser.close()
    assert total > len(CHAPTERS) * 5
    assert not over, f"{len(over)} of {total} slides run past 1280x720:\n" + "\n".join(over[:20])


def _shown_code(html: str) -> list[str]:
    """The code of every input a deck shows (nbconvert's highlighted <pre> in a jp-InputArea)."""
    inputs = re.findall(r'jp-InputArea-editor"[^>]*>\s*<div class="cm-editor[^"]*">\s*<div class="highlight[^"]*">'
                        r'<pre>(.*?)</pre>', html, re.S)
    return [re.sub(r"<[^>]+>", "", code).replace("&quot;", '"').replace("&#39;", "'").replace("&lt;", "<")
            .replace("&gt;", ">").replace("&amp;", "&") for code in inputs]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_plotting_code_and_long_code_stay_off_the_slides(decks, chapter):
    slides = _tool("slides")
    shown = _shown_code((decks / f"{chapter.stem}.slides.html").read_text())
    assert shown, f"{chapter.stem}: no code on any slide (the pattern above no longer finds nbconvert's inputs)"
    plotting = [code.splitlines()[0] for code in shown if slides.PLOTTING.search(code)]
    assert not plotting, f"{chapter.stem}: plotting code on a slide: {plotting[:3]}"
    source = nbformat.read(chapter, as_version=4)
    tagged = {c.source.strip() for c in source.cells if "slides-show-input" in c.metadata.get("tags", [])}
    long = [code.splitlines()[0] for code in shown if len([l for l in code.splitlines() if l.strip()])
            > slides.MAX_CODE_LINES and code.strip() not in tagged]
    assert not long, f"{chapter.stem}: code longer than {slides.MAX_CODE_LINES} lines on a slide: {long[:3]}"


def _code_cell(source, outputs=(), tags=(), slide_type="-"):
    return nbformat.v4.new_code_cell(source, outputs=list(outputs),
                                     metadata={"slideshow": {"slide_type": slide_type}, "tags": list(tags)})


def test_code_shows_only_where_it_teaches():
    slides = _tool("slides")
    image = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})
    text = nbformat.v4.new_output("stream", name="stdout", text="42\n")
    assert slides.code_on_slide(_code_cell("x = engine.step()\nprint(x)", [text])) == "slide"
    assert slides.code_on_slide(_code_cell("draw(x)", [image])) == "nowhere"            # it draws: the figure only
    assert slides.code_on_slide(_code_cell("fig, ax = plt.subplots()\nax.plot(x)")) == "nowhere"
    assert slides.code_on_slide(_code_cell("show_source(Scheduler.schedule)")) == "nowhere"
    long = "\n".join(f"y{i} = {i}" for i in range(slides.MAX_CODE_LINES + 1))
    assert slides.code_on_slide(_code_cell(long, [text])) == "notes"
    assert slides.code_on_slide(_code_cell(long, [text], tags=["slides-show-input"])) == "slide"
    # a long cell keeps its output on the slide and its code in the notes; a slide it opened
    # with nothing to show is opened by the next cell
    nb = nbformat.v4.new_notebook(cells=[_code_cell(long, [text], slide_type="slide"),
                                         _code_cell("plt.plot(x)", slide_type="slide"),
                                         nbformat.v4.new_markdown_cell("- a point", metadata={})])
    deck = slides.lecture_notebook(nb)
    kinds = [(c.cell_type, c.metadata["slideshow"]["slide_type"]) for c in deck.cells]
    assert kinds == [("code", "slide"), ("markdown", "notes"), ("markdown", "slide")]
    assert "slides-hide-input" in deck.cells[0].metadata["tags"] and "y0 = 0" in deck.cells[1].source


def test_a_long_bullet_keeps_its_first_sentence_and_the_notes_keep_it_all():
    long_item = ("- **vLLM**: 512 was the default only in the V0 days (vllm-project/vllm#4580, May 2024); it was "
                 "raised to 2048, and V1 picks 2048 to 16384 by GPU and entry point, which chapter 7 measures "
                 "against the lab on an A100 and an H100. More follows here.")
    parts = _digest(long_item + "\n- a short point")
    assert parts == [("-", "- **vLLM**: 512 was the default only in the V0 days …\n- a short point"),
                     ("notes", long_item + "\n- a short point")]
    slides = _tool("slides")
    # a sentence is never cut inside (a cut could say the opposite); abbreviations do not end one
    assert slides.first_sentence("Chunking does not lower TTFT, e.g. for the long prompt; it raises it.") is None
    assert slides.short_form("A claim (see chapter 6) that is short. Another sentence.", 30) == \
        "A claim that is short."
    bold = "**The question.** " + "word " * 60 + "end. And then more."
    assert _digest(bold)[0] == ("-", "**The question.** " + ("word " * 60).strip() + " end. …")
