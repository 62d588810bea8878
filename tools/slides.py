"""Turn the executed chapters into reveal.js lecture decks that open from disk.

    python tools/slides.py                      # every notebooks/NN_*.ipynb -> slides/
    python tools/slides.py --out DIR notebooks/04_chunked_prefill_is_exact.ipynb

Converts only (nothing is executed): the decks show the outputs saved in the
notebooks. Each cell's `slideshow` metadata (set in its percent source, see
tools/nb.py) says where it goes: slide, subslide, fragment, skip or notes.
On top of that, a markdown cell is digested for the projector:

- its headings, lists, tables, display math, images and paragraphs that open
  with bold text stay on the slide; its other paragraphs (the prose that the
  book says at length) become speaker notes (press `s` in the deck);
- a `##` heading inside a cell starts a new slide, `###` a subslide.

Tags refine it: `slides-verbatim` keeps a markdown cell as it is,
`slides-hide-input` shows only a code cell's output, `slides-hide-output`
only its code. Code cells lose their `# NBVAL_IGNORE_OUTPUT` marker line and
what they printed to stderr.

reveal.js and MathJax come from tools/slides/node_modules (`make slides` runs
`npm ci` there) and are copied to DIR/_runtime, so the folder works offline.
"""
from __future__ import annotations

import argparse
import copy
import re
import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "tools" / "slides" / "node_modules"
TEMPLATES = ROOT / "tools" / "slides" / "templates"
RUNTIME = "_runtime"          # folder next to the decks
# (source under VENDOR, destination under DIR/_runtime): what the decks load.
RUNTIME_FILES = [
    ("reveal.js/dist/reveal.css", "reveal.js/dist/reveal.css"),
    ("reveal.js/dist/reveal.js", "reveal.js/dist/reveal.js"),
    ("reveal.js/dist/theme/simple.css", "reveal.js/dist/theme/simple.css"),
    ("reveal.js/dist/theme/fonts", "reveal.js/dist/theme/fonts"),
    ("reveal.js/plugin/notes/notes.js", "reveal.js/plugin/notes/notes.js"),
    ("reveal.js/LICENSE", "reveal.js/LICENSE"),
    ("mathjax/es5/tex-chtml-full.js", "mathjax/tex-chtml-full.js"),
    ("mathjax/es5/output/chtml/fonts/woff-v2", "mathjax/output/chtml/fonts/woff-v2"),
    ("mathjax/LICENSE", "mathjax/LICENSE"),
]
# A 16:9 canvas that reveal.js scales to the screen; text sizes are in the template.
WIDTH_PX, HEIGHT_PX, FIGURE_MAX_HEIGHT_PX = 1280, 720, 520

SHOWN_BLOCK = re.compile(r"^(#{1,6} |[-*+] |\d+\. |\||\$\$|```|!\[|<img)")
BOLD_LEAD = re.compile(r"^\*\*")      # "**The question.** ..." shows when it is short
BOLD_LEAD_MAX_CHARS = 300
NBVAL_MARKER = re.compile(r"^# NBVAL_[A-Z_]+[^\n]*\n?", re.M)


def slide_type(cell) -> str:
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def markdown_blocks(text: str) -> list[str]:
    """Split markdown at blank lines, keeping fenced code and $$ math whole."""
    blocks, lines, fenced = [], [], None
    for line in text.splitlines():
        stripped = line.strip()
        if fenced != "$$" and stripped.startswith("```"):
            fenced = None if fenced == "```" else "```"
        elif fenced != "```" and line.count("$$") % 2:     # display math opens or closes here
            fenced = None if fenced == "$$" else "$$"
        if not stripped and fenced is None:
            if lines:
                blocks.append("\n".join(lines))
            lines = []
        else:
            lines.append(line)
    if lines:
        blocks.append("\n".join(lines))
    return blocks


def split_display_math(block: str) -> list[str]:
    """A paragraph with a $$ formula in it -> [text before, formula, text after]:
    the formula belongs on the slide even when the prose around it does not."""
    if SHOWN_BLOCK.match(block.lstrip()) or "$$" not in block:
        return [block]
    pieces, lines, in_math = [], [], False

    def flush():
        if lines:
            pieces.append("\n".join(lines))
            lines.clear()

    for line in block.splitlines():
        opens = not in_math and line.lstrip().startswith("$$")
        if opens:
            flush()
        lines.append(line)
        if opens or in_math:
            # An odd number of $$ on the line flips the state: it opens or closes a formula.
            in_math = in_math != (line.count("$$") % 2 == 1)
            if not in_math:
                flush()
    flush()
    return pieces


def digest_markdown(cell) -> list:
    """One markdown cell -> cells for the deck: what to show, and speaker notes.

    Consecutive blocks of one kind are merged; a heading inside the cell opens
    a new slide (`##` or higher) or subslide (`###` and deeper)."""
    kind = slide_type(cell)
    if kind in ("skip", "notes") or "slides-verbatim" in cell.metadata.get("tags", []):
        return [cell]
    parts: list[list] = []            # [slide_type, [blocks]] in order
    for block in (piece for block in markdown_blocks(cell.source) for piece in split_display_math(block)):
        text = block.lstrip()
        shown = SHOWN_BLOCK.match(text) or (BOLD_LEAD.match(text) and len(text) <= BOLD_LEAD_MAX_CHARS)
        if not shown:
            part_type = "notes"
        elif block.startswith("#"):
            part_type = "slide" if len(block) - len(block.lstrip("#")) <= 2 else "subslide"
        else:
            part_type = "-"
        previous = parts[-1][0] if parts else None
        if previous is not None and (part_type == previous == "notes" or
                                     (part_type == "-" and previous != "notes")):
            parts[-1][1].append(block)
        else:
            parts.append([part_type, [block]])
    shown_parts = [p for p in parts if p[0] != "notes"]
    if not shown_parts:                 # all prose: it is what the speaker says
        return [_markdown(cell, "\n\n".join(b for p in parts for b in p[1]), "notes")]
    # The cell's own slide type, when set, goes to its first shown part (else a
    # leading heading opens a slide); notes that came before it belong to that
    # same slide, so they follow it.
    first = parts.index(shown_parts[0])
    if kind != "-":
        shown_parts[0][0] = kind
    ordered = [parts[first]] + parts[:first] + parts[first + 1:]
    return [_markdown(cell, "\n\n".join(blocks), part_type) for part_type, blocks in ordered]


def _markdown(cell, source: str, kind: str):
    new = nbformat.v4.new_markdown_cell(source, metadata=copy.deepcopy(cell.metadata))
    new.metadata["slideshow"] = {"slide_type": kind}
    new.pop("id", None)
    return new


def lecture_notebook(nb):
    """The chapter as the deck shows it (a copy; the notebook is not changed)."""
    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cells.extend(digest_markdown(cell))
        else:
            cell.source = NBVAL_MARKER.sub("", cell.source)
            # Log lines on stderr (profilers, progress bars) are noise on a
            # projector; error outputs are kept, and the tests refuse them.
            cell.outputs = [out for out in cell.outputs
                            if not (out.output_type == "stream" and out.name == "stderr")]
            cells.append(cell)
    nb.cells = cells
    for i, cell in enumerate(nb.cells):
        cell.id = f"slide-cell-{i:03d}"
    return nb


def exporter():
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    config = Config()
    config.TagRemovePreprocessor.enabled = True
    config.TagRemovePreprocessor.remove_input_tags = {"slides-hide-input"}
    config.TagRemovePreprocessor.remove_all_outputs_tags = {"slides-hide-output"}
    return SlidesExporter(
        config=config, template_name="minillm_reveal", extra_template_basedirs=[str(TEMPLATES)],
        reveal_url_prefix=f"{RUNTIME}/reveal.js", reveal_theme="simple", reveal_transition="none",
        reveal_number="c/t", reveal_width=str(WIDTH_PX), reveal_height=str(HEIGHT_PX),
        exclude_anchor_links=True)


def copy_runtime(out_dir: Path) -> None:
    missing = [src for src, _ in RUNTIME_FILES if not (VENDOR / src).exists()]
    if missing:
        raise FileNotFoundError(
            f"reveal.js/MathJax not installed ({VENDOR.relative_to(ROOT)}/{missing[0]} missing): "
            f"run `make slides`, or `npm ci --prefix tools/slides` once")
    for src, dest in RUNTIME_FILES:
        target = out_dir / RUNTIME / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if (VENDOR / src).is_dir():
            shutil.copytree(VENDOR / src, target, dirs_exist_ok=True)
        else:
            shutil.copy2(VENDOR / src, target)


def convert(notebook: Path, out_dir: Path) -> Path:
    nb = lecture_notebook(nbformat.read(notebook, as_version=4))
    resources = {"metadata": {"name": notebook.stem},
                 "mathjax_local_url": f"{RUNTIME}/mathjax/tex-chtml-full.js",
                 "figure_max_height_px": FIGURE_MAX_HEIGHT_PX}
    html, _ = exporter().from_notebook_node(nb, resources=resources)
    deck = out_dir / f"{notebook.stem}.slides.html"
    deck.write_text(html)
    return deck


def count_slides(html: str) -> int:
    """Slides and subslides of a deck: the <section>s that hold no other <section>."""
    return len(re.findall(r"<section[^>]*>(?:(?!<section).)*?</section>", html, re.S))


def chapters() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/NN_*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "slides", help="folder for the decks (default slides/)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    copy_runtime(args.out)
    for notebook in args.notebooks or chapters():
        deck = convert(notebook, args.out)
        print(f"{deck.relative_to(Path.cwd()) if deck.is_relative_to(Path.cwd()) else deck}: "
              f"{count_slides(deck.read_text())} slides")


if __name__ == "__main__":
    main(sys.argv[1:])
