"""The front door: the README stays short and its links land."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_a_front_door_of_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: measurement logs go to docs/benchmarks.md"


def test_every_link_of_the_readme_lands():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor and path.endswith(".md"):
            headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)}
            assert anchor in headings, f"README links to {path}#{anchor}; its headings: {sorted(headings)}"
