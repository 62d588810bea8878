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
- a list item or a bold-led paragraph longer than a projector line or two keeps
  its first sentence on the slide, and the whole block goes to the notes;
- a `##` heading inside a cell starts a new slide, `###` a subslide.

A code cell shows its code only where the code teaches: plotting code (a cell
that draws a figure or calls matplotlib) and `show_source(...)` calls (the listing
is the output) show only their output, and code longer than MAX_CODE_LINES lines
goes to the speaker notes, its output staying on the slide. Tags refine it:
`slides-verbatim` keeps a markdown cell as it is, `slides-show-input` shows a code
cell's code whatever its length, `slides-hide-input` shows only its output,
`slides-hide-output` only its code. Code cells lose their `# NBVAL_IGNORE_OUTPUT`
marker line and what they printed to stderr.

The deck's own script (templates/minillm_reveal) then fits every slide to the
1280x720 canvas before reveal.js starts: what still runs past the bottom moves to a
following slide, cut between blocks, or inside a listing, table or list.

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
BOLD_LEAD = re.compile(r"^\*\*")      # "**The question.** ..." shows (its first sentence when long)
BOLD_LEAD_MAX_CHARS = 300
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+\.)\s+")
ITEM_MAX_WORDS = 30                   # a longer list item keeps its first sentence on the slide
NBVAL_MARKER = re.compile(r"^# NBVAL_[A-Z_]+[^\n]*\n?", re.M)
MAX_CODE_LINES = 12                   # longer code goes to the speaker notes
PLOTTING = re.compile(r"\b(plt|ax|axes|axs|fig)\.|\bmatplotlib\b|\.plot\(|\bfigures\.plot_|\bplot_\w+\(|"
                      r"\bset_[xy](label|lim|scale|ticks)\(|\bsubplots\(")
SHOW_SOURCE = re.compile(r"^\s*(display\()?show_source\(")
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")
NOT_SENTENCE_ENDS = ("e.g", "i.e", "vs", "al", "etc", "cf", "Fig", "approx")


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


# A parenthesis that only says where something comes from (an issue, a file, a chapter, a
# year): the slide can do without it, the notes keep it.
CITATION = re.compile(r"\s*\((?=[^()]*?(?:#\d|https?:|arXiv|\.py\b|vllm-project|sgl-project|\bPR\b|[Cc]hapter|"
                      r"[Ss]ection|§|\b(?:19|20)\d\d\b))[^()]*\)")


def _ends(text: str, marks: str):
    """Positions of `marks` followed by a space, outside code, math, links and parentheses."""
    depth, quote = 0, None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "`$":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth = max(0, depth - 1)
        elif char in marks and depth == 0 and text[i + 1:i + 2] == " " and i + 2 < len(text.rstrip()):
            word = re.split(r"[\s(*]", text[:i])[-1]
            if word not in NOT_SENTENCE_ENDS and not word.isdigit():
                yield i


def first_sentence(text: str) -> str | None:
    """The text up to its first sentence end (". ", "? ", "! "), None when it has one
    sentence. A sentence is never cut inside: a shortened bullet says less, never
    something else."""
    end = next(_ends(text, ".?!"), None)
    return None if end is None else text[:end + 1].rstrip()


def short_form(text: str, max_words: int) -> str | None:
    """What of a long bullet or paragraph a slide shows: without its citations, its first
    sentence, and if that is still long, its first clause before a semicolon (which
    stands alone); None when nothing shorter is found."""
    plain = CITATION.sub("", text)
    short = first_sentence(plain) or plain
    if len(short.split()) > max_words:
        clause = next((short[:i] for i in _ends(short, ";") if len(short[:i].split()) >= 6), None)
        short = clause or short
    return short if short != text else None


def shorten_list(block: str) -> str | None:
    """The list with each long item cut to its first sentence; None when no item is long."""
    items, changed = [], False
    for line in block.splitlines():
        if LIST_ITEM.match(line) or not items:
            items.append([line])
        else:
            items[-1].append(line)
    out = []
    for lines in items:
        marker = LIST_ITEM.match(lines[0])
        text = " ".join(l.strip() for l in lines)[len(marker.group(0)) - len(marker.group(1)):] if marker else ""
        short = short_form(text, ITEM_MAX_WORDS) if marker and len(text.split()) > ITEM_MAX_WORDS else None
        if short is None:
            out.extend(lines)
        else:
            out.append(marker.group(0) + short + " …")
            changed = True
    return "\n".join(out) if changed else None


def slide_and_notes(block: str) -> list[tuple[bool, str]]:
    """One markdown block -> [(shown on the slide?, text)]: a short form for the slide and
    the whole block for the notes when the block is too long for a projector."""
    text = block.lstrip()
    if LIST_ITEM.match(text) and not text.startswith(("#", "|")):
        short = shorten_list(block)
        return [(True, block)] if short is None else [(True, short), (False, block)]
    if BOLD_LEAD.match(text):
        if len(text) <= BOLD_LEAD_MAX_CHARS:
            return [(True, block)]
        short = short_form(" ".join(text.split()), ITEM_MAX_WORDS)
        return [(False, block)] if short is None else [(True, short + " …"), (False, block)]
    return [(bool(SHOWN_BLOCK.match(text)), block)]


def digest_markdown(cell) -> list:
    """One markdown cell -> cells for the deck: what to show, and speaker notes.

    Consecutive blocks of one kind are merged; a heading inside the cell opens
    a new slide (`##` or higher) or subslide (`###` and deeper)."""
    kind = slide_type(cell)
    if kind in ("skip", "notes") or "slides-verbatim" in cell.metadata.get("tags", []):
        return [cell]
    parts: list[list] = []            # [slide_type, [blocks]] in order
    pieces = (piece for block in markdown_blocks(cell.source) for piece in split_display_math(block))
    for shown, block in (part for piece in pieces for part in slide_and_notes(piece)):
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


def code_on_slide(cell) -> str:
    """Where a code cell's code goes: "slide", "notes" or "nowhere" (its output stays)."""
    tags = cell.metadata.get("tags", [])
    if "slides-show-input" in tags:
        return "slide"
    if "slides-hide-input" in tags:
        return "nowhere"
    draws = any(key in out.get("data", {}) for out in cell.get("outputs", []) for key in IMAGE_TYPES)
    if draws or PLOTTING.search(cell.source):
        return "nowhere"                  # plotting code stays off the slides
    lines = [line for line in cell.source.strip().splitlines() if line.strip()]
    if lines and all(SHOW_SOURCE.match(line) for line in lines):
        return "nowhere"                  # the engine's source is the output
    return "notes" if len(lines) > MAX_CODE_LINES else "slide"


def _shows_output(cell) -> bool:
    return bool(cell.outputs) and "slides-hide-output" not in cell.metadata.get("tags", [])


def code_cells(cell) -> list:
    """One code cell -> cells for the deck: the cell (its code hidden where it does not
    teach), and its code in the speaker notes when it is too long for a slide."""
    cell.source = NBVAL_MARKER.sub("", cell.source)
    # Log lines on stderr (profilers, progress bars) are noise on a
    # projector; error outputs are kept, and the tests refuse them.
    cell.outputs = [out for out in cell.outputs if not (out.output_type == "stream" and out.name == "stderr")]
    where = code_on_slide(cell)
    if where == "slide":
        return [cell]
    tags = cell.metadata.get("tags", [])
    cell.metadata["tags"] = tags + ["slides-hide-input"] * ("slides-hide-input" not in tags)
    notes = [_markdown(cell, f"The code of this slide:\n\n```python\n{cell.source}\n```", "notes")] \
        if where == "notes" else []
    if _shows_output(cell):
        return [cell] + notes
    # Nothing of it on a slide: a slide that it opened opens with what comes next.
    return notes + ([_slide_start(slide_type(cell))] if slide_type(cell) in ("slide", "subslide") else [])


def _slide_start(kind: str):
    """A marker that hands a dropped cell's slide start to the next cell (see lecture_notebook)."""
    return {"minillm_slide_start": kind}


def lecture_notebook(nb):
    """The chapter as the deck shows it (a copy; the notebook is not changed)."""
    nb = copy.deepcopy(nb)
    cells, start = [], None
    for cell in nb.cells:
        new = digest_markdown(cell) if cell.cell_type == "markdown" else code_cells(cell)
        for item in new:
            if isinstance(item, dict) and "minillm_slide_start" in item:
                start = start or item["minillm_slide_start"]
                continue
            if start and slide_type(item) not in ("slide", "subslide", "skip", "notes"):
                item.metadata["slideshow"] = {"slide_type": start}
                start = None
            cells.append(item)
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
