"""docs/teaching.md covers every chapter the book ships.

For each chapter notebook in notebooks/ (NN_topic.ipynb) the teacher's guide must have:
- a plan: a section headed `### Chapter N: ...` holding a **Show** part (what to present)
  and an **Ask** part with at least one question and its answer in brackets
  ("...?" [answer]); a heading with a placeholder under it does not count;
- a place in both course outlines: chapter N named in the four-session part (a
  lecture, or the reading list under its table) and in the eight-session table.

A new chapter fails these tests until its plan and its outline slots are written: that
is the point (issue 43). The guide's last section belongs to whoever grades a class; these
tests read only the sections named above.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "teaching.md"
CHAPTERS = sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def plan(text: str, chapter: int) -> str:
    """The text of the `### Chapter N:` section, up to the next heading of level 2 or 3."""
    match = re.search(rf"^### Chapter {chapter}:.*?$(.*?)(?=^##|\Z)", text, re.M | re.S)
    return match.group(1) if match else ""


def outline(text: str, label: str) -> str:
    """The part of the course outlines that starts at the bold label (e.g. "Four sessions")
    and ends at the next bold label or heading."""
    match = re.search(rf"^\*\*{label}\*\*(.*?)(?=^\*\*|^##|\Z)", text, re.M | re.S)
    assert match, f"docs/teaching.md has no **{label}** outline"
    return match.group(1)


def names_chapter(text: str, chapter: int) -> bool:
    """Whether the text names chapter N: "chapter 7", "chapters 8-12", "8 and 10", a table cell "7"."""
    for a, b in re.findall(r"\b(\d{1,2})\s*-\s*(\d{1,2})\b", text):      # ranges such as 8-12
        if int(a) <= chapter <= int(b) and int(b) <= max(CHAPTERS, default=0) + 1:
            return True
    return re.search(rf"(?<![\d.x-]){chapter}(?![\d.%x-])", text) is not None


def test_the_book_has_chapters_to_check():
    assert CHAPTERS[:11] == list(range(11)), CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_lecture_plan_with_questions_and_answers(chapter):
    section = plan(GUIDE.read_text(), chapter)
    assert section.strip(), f"docs/teaching.md has no '### Chapter {chapter}:' section"
    assert "**Show**" in section, f"chapter {chapter}'s plan says nothing of what to show"
    ask = section.split("**Ask**", 1)
    assert len(ask) == 2, f"chapter {chapter}'s plan asks the room nothing (**Ask**)"
    assert re.search(r'\?"?\s*\[[^\]]{10,}\]', ask[1]), \
        f"chapter {chapter}'s questions come without answers in brackets"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_slot_in_both_course_outlines(chapter):
    text = GUIDE.read_text()
    four = outline(text, "Four sessions")
    eight_rows = [row for row in outline(text, "Eight sessions").splitlines()
                  if row.startswith("| ") and not row.startswith(("| session", "|---"))]
    assert names_chapter(four, chapter), f"the four-session outline never names chapter {chapter}"
    assert any(names_chapter(row.split("|")[2], chapter) for row in eight_rows), \
        f"no session of the eight-session outline covers chapter {chapter}"


def test_the_guide_counts_what_it_covers():
    """No stale count of chapters or notebooks (it said "nine chapters", "all 8 notebooks")."""
    text = GUIDE.read_text()
    words = {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13}
    for word, n in words.items():
        assert not re.search(rf"\b{word} chapters\b", text, re.I) or n == len(CHAPTERS), word
    exercises = len(list((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb")))
    for n in re.findall(r"all (\d+) notebooks", text):
        assert int(n) == exercises, f"the grading example says all {n} notebooks; exercises/ holds {exercises}"
