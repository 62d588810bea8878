"""docs/teaching.md's "Grading a class", run as written: its commands, in order, on a class of
two students (a solved and an untouched chapter-1 notebook), in a temporary folder.

Cost: about 20 s on 2 cores (the release, then two chapter-1 notebooks graded at once).
"""
import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_causal_attention.ipynb"


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_grading_a_class_section_comes_last_and_its_commands_grade_a_class(tmp_path):
    teaching = (ROOT / "docs" / "teaching.md").read_text()
    section = _section(teaching, "Grading a class")
    assert teaching.rstrip().endswith(section.rstrip()), "\"Grading a class\" is the last section"
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("python -m minillm")]
    assert [c.split()[3] for c in commands] == ["release", "grade"], commands

    (tmp_path / "submissions" / "alice" / "week1").mkdir(parents=True)
    (tmp_path / "submissions" / "bob").mkdir(parents=True)
    shutil.copy(ROOT / "exercises" / "solutions" / NOTEBOOK, tmp_path / "submissions" / "alice" / "week1" / NOTEBOOK)
    shutil.copy(ROOT / "exercises" / NOTEBOOK, tmp_path / "submissions" / "bob" / NOTEBOOK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for command in commands:
        args = [sys.executable, *shlex.split(command)[1:]]
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

    assert (tmp_path / "handout" / "exercises" / NOTEBOOK).is_file()
    assert not (tmp_path / "handout" / "exercises" / "solutions").exists()
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    tasks = [t for t in __import__("json").loads((ROOT / "exercises" / "manifest.json").read_text())
             ["notebooks"]["01_causal_attention"]["tasks"]]
    by_student = {s: [r for r in rows if r["student"] == s and r["task"] != "(note)"] for s in ("alice", "bob")}
    assert [(r["task"], int(r["points"]), int(r["max"]), r["message"]) for r in by_student["alice"]] == \
        [(t["heading"], t["points"], t["points"], "passed") for t in tasks]
    assert [int(r["points"]) for r in by_student["bob"]] == [0] * len(tasks)
    assert all(r["notebook"] == NOTEBOOK for r in rows)
