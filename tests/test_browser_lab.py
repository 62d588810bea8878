"""A real browser: JupyterLab in headless Chromium opens chapter 7's lab under load, runs
it, moves the chunk-size and rate sliders, and sees the verdict and the figure change.
Needs Debian's `chromium` (.ci/run installs it) and Playwright's Python package; skips,
saying which is missing, elsewhere.

The notebook it opens is chapter 7 cut to the two cells the lab needs, taken from the
committed chapter: the set-up cell (imports) and the lab-under-load cell. Running every
cell above the lab as well (the engine-against-simulator check, a 30,000-token prompt
simulated twice...) cost most of this test's 44 s and tested nothing about the browser."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
TOKEN = "minillm-browser-test"

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="no Chromium at /usr/bin/chromium: `apt-get install chromium` "
                                       "(.ci/run does) to run the real-browser test of the lab")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAB_CELL = "widgets.lab(LOAD)"


def lab_notebook(source) -> dict:
    """Chapter 7 with only its first code cell (the imports) and the lab-under-load cell,
    outputs cleared: what a learner's "run the lab" needs, in the chapter's own code."""
    nb = json.loads(Path(source).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    lab = [c for c in code if LAB_CELL in "".join(c["source"])]
    assert lab, f"{source}: no cell runs {LAB_CELL}"
    nb["cells"] = [code[0], lab[0]]
    for cell in nb["cells"]:
        cell["outputs"], cell["execution_count"] = [], None
    return nb


@pytest.fixture
def jupyter(tmp_path):
    """JupyterLab serving a cut COPY of chapter 7 (autosave must not touch the committed one)."""
    source = os.environ.get("MINILLM_LAB_NOTEBOOK") or REPO / "notebooks" / "07_the_lab.ipynb"
    (tmp_path / "07_the_lab.ipynb").write_text(json.dumps(lab_notebook(source)))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MPLBACKEND", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={tmp_path}", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    else:
        server.terminate()
        pytest.fail("JupyterLab did not start within 60 s")
    yield url
    server.terminate()
    server.wait(timeout=30)


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def _nudge(page, label: str) -> None:
    """Move the slider labelled `label` one step right, by keyboard, as a learner could."""
    handle = page.locator(".minillm-lab", has_text="request rate").last.locator(
        ".widget-slider", has_text=label).locator(".noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")


def _state(page):
    verdict = page.locator(".minillm-lab .minillm-verdict").last.inner_text()
    image = page.locator(".minillm-lab img").last.get_attribute("src")
    return verdict, image


def _wait_for_change(page, before, what: str, timeout_s: float = 120.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = _state(page)
        if now[0] != before[0] and now[1] != before[1]:
            return now
        time.sleep(0.5)
    pytest.fail(f"moving the {what} slider changed neither the verdict nor the figure in {timeout_s:.0f} s")


def test_chapter_7_lab_answers_slider_moves_in_a_real_browser(jupyter):
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright's Python package is missing: pip install playwright")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        page.goto(f"{jupyter}/lab/tree/07_the_lab.ipynb?token={TOKEN}")
        lab_cell = page.locator(".jp-CodeCell", has_text=LAB_CELL).first
        lab_cell.wait_for()
        lab_cell.locator(".jp-InputArea-prompt").click()          # select it (command mode)
        _menu(page, "Run", "Run All Above Selected Cell")
        page.keyboard.press("Shift+Enter")                        # and the lab cell itself
        page.locator(".minillm-lab .minillm-verdict", has_text="req/s").first.wait_for(timeout=480_000)
        page.wait_for_function("() => { const all = document.querySelectorAll('.minillm-lab img');"
                               " const i = all[all.length - 1];"
                               " return i && i.naturalWidth > 0; }", timeout=240_000)
        before = _state(page)
        assert before[0].startswith(("MEETS", "MISSES"))
        _nudge(page, "chunk size")
        after_chunk = _wait_for_change(page, before, "chunk-size")
        assert "chunk 1024" in after_chunk[0]                      # 512 -> 1024
        _nudge(page, "request rate")
        after_rate = _wait_for_change(page, after_chunk, "rate")
        assert "req/s" in after_rate[0]
        browser.close()
