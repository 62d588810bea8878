"""Every exercise notebook's hints give the idea and the question to ask, never the answer to copy.

For every task of every exercise notebook (tools/nb.py's percent sources, all chapters,
new ones included as they appear): no line of the reference answer (the code between
`### BEGIN SOLUTION` and `### END SOLUTION`) appears in any hint of that notebook, and
no code span of a hint is a whole expression lifted from the answer.
"""
import re
from difflib import SequenceMatcher
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "exercises" / "solutions" / "src").glob("*.py"))
HINT = re.compile(r"<details><summary>Hint</summary>(.*?)</details>", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
CODE_SPAN = re.compile(r"`([^`]+)`")
# Lines too generic to give anything away (a bare return of names the statement gives).
MIN_LINE_CHARS = 14
MIN_SPAN_CHARS = 24


def _normalise(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _hints(text: str) -> list[str]:
    """The hints' text, with the percent format's '# ' comment markers removed."""
    markdown = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in text.splitlines())
    return HINT.findall(markdown)


def _answer_lines(text: str) -> list[str]:
    lines = []
    for block in SOLUTION.findall(text):
        for line in block.splitlines():
            code = line.split("  #", 1)[0].strip()          # the code, not its comment
            if len(code) >= MIN_LINE_CHARS and not code.startswith("#"):
                lines.append(code)
    return lines


def test_there_are_exercise_sources():
    assert SOURCES


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_no_hint_holds_a_line_of_the_answer(src):
    text = src.read_text()
    hints, answer = _hints(text), _answer_lines(text)
    assert hints, f"{src.name}: no hints found"
    assert answer, f"{src.name}: no reference answer found"
    found = [(line, i) for i, hint in enumerate(hints) for line in answer if _normalise(line) in _normalise(hint)]
    assert not found, f"{src.name}: hint {found[0][1] + 1} holds the answer line {found[0][0]!r}"
    lifted = _lifted_spans(hints, "\n".join(SOLUTION.findall(text)))
    assert not lifted, f"{src.name}: hint {lifted[0][1] + 1} quotes the answer's expression `{lifted[0][0]}`"


def _lifted_spans(hints: list[str], solution: str) -> list[tuple[str, int]]:
    """Code spans of the hints that share MIN_SPAN_CHARS or more (spaces ignored) with the answer."""
    solution = _normalise(solution)
    lifted = []
    for i, hint in enumerate(hints):
        for span in CODE_SPAN.findall(hint):
            span_n = _normalise(span)
            match = SequenceMatcher(None, span_n, solution, autojunk=False).find_longest_match(
                0, len(span_n), 0, len(solution))
            if match.size >= MIN_SPAN_CHARS:
                lifted.append((span, i))
    return lifted


def test_the_check_catches_a_hint_that_gives_the_answer_away(tmp_path):
    """The test above can fail: a hint quoting the answer is found."""
    text = ("# %% [markdown]\n# ## 1. Task\n#\n# <details><summary>Hint</summary>\n#\n"
            "# `return -(-num_tokens // block_size)`\n#\n# </details>\n\n# %%\ndef f(num_tokens, block_size):\n"
            "    ### BEGIN SOLUTION\n    return -(-num_tokens // block_size)\n    ### END SOLUTION\n")
    hints, answer = _hints(text), _answer_lines(text)
    assert any(_normalise(line) in _normalise(h) for h in hints for line in answer)


@pytest.mark.parametrize("chapter", ["01_causal_attention", "02_the_model"])
def test_the_hints_this_check_was_written_against_would_fail_it(chapter):
    """Chapters 1 and 2's hints before issue 30 quoted the answer's expressions: the check finds them."""
    import subprocess
    old = subprocess.run(["git", "show", f"9780782:exercises/solutions/src/{chapter}.py"], cwd=ROOT,
                         capture_output=True, text=True)
    if old.returncode:
        pytest.skip("the pre-issue-30 sources are not in this clone's history")
    text = old.stdout
    hints, answer = _hints(text), _answer_lines(text)
    found = [line for hint in hints for line in answer if _normalise(line) in _normalise(hint)]
    assert found or _lifted_spans(hints, "\n".join(SOLUTION.findall(text)))
