"""What a student does, in a real browser.

1. Start JupyterLab on 127.0.0.1 with a token, open the LRU-eviction notebook in
   Chromium, run all cells, check no cell shows an error, move the stepper's
   slider with the keyboard and check that the free-queue figure changes.
2. Build the static site page of the same notebook, open it from disk, press the
   animation's play button and check the animation steps.

Screenshots go to renders/browser/. Chromium is Debian's build, driven by
Playwright with its executable path (Playwright cannot download browsers here).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "notebooks/07_lru_eviction.ipynb"
SHOTS = ROOT / "renders" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.browser

if CHROMIUM is None and not os.environ.get("CI"):
    pytest.skip(
        "Chromium is not installed (apt-get install chromium); CI installs it", allow_module_level=True
    )

sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM is not None, "CI must install Chromium (apt-get install chromium)"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a random token, rooted at the repository."""
    port, token = _free_port(), secrets.token_hex(16)
    home = tmp_path_factory.mktemp("lab")
    served = home / "course"
    shutil.copytree(ROOT / "notebooks", served / "notebooks")  # JupyterLab saves what it opens
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = dict(
        os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "ws")
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={served}",
            "--LabApp.expose_app_in_browser=True",
            "--ServerApp.open_browser=False",
            "--allow-root",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(home / "lab.log", "w"),  # noqa: SIM115
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("JupyterLab did not start:\n" + (home / "lab.log").read_text()[-3000:])
        time.sleep(0.5)
    yield base, token
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


PLOTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
  title: String((gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || ''),
  data: JSON.stringify((gd.data || []).map(t => [t.x, t.y, t.text, t.marker && t.marker.color])),
}))"""


def test_student_runs_the_lru_notebook_and_steps_the_slider(lab, browser) -> None:
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}", wait_until="domcontentloaded")
    # ready = the notebook's model is loaded and its own kernel is idle (the toolbar's indicator
    # already reads idle before any kernel is attached, and a placeholder cell exists before loading)
    page.wait_for_function(
        """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                   const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                   return !!(w && w.context && w.context.isReady && k && k.status === 'idle'); }""",
        timeout=120_000,
    )
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    # done when every code cell shows an execution count and none is queued or running
    page.wait_for_function(
        """() => {
          const prompts = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'));
          return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""",
        timeout=240_000,
    )
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SHOTS / "lab_after_run_all.png"), full_page=False)

    errors = page.locator('[data-mime-type="application/vnd.jupyter.error"]')
    assert errors.count() == 0, "a cell shows an error:\n" + "\n".join(errors.all_inner_texts())[:3000]

    handle = page.locator(".widget-slider .noUi-handle").first
    handle.scroll_into_view_if_needed()
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
        "gd => /free queue/i.test(String((gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '')))",
        timeout=60_000,
    )
    before = [p for p in page.evaluate(PLOTS_JS) if "free queue" in p["title"].lower()]
    handle.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(300)
    page.wait_for_timeout(1000)
    after = [p for p in page.evaluate(PLOTS_JS) if "free queue" in p["title"].lower()]
    page.screenshot(path=str(SHOTS / "lab_after_slider.png"), full_page=False)
    assert before and after
    assert [p["data"] for p in before] != [p["data"] for p in after], "the free-queue figure did not change"
    page.close()


def test_static_site_page_plays_its_animation(browser, tmp_path) -> None:
    out = tmp_path / "site"
    stem = Path(NOTEBOOK).stem
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "build_site.py"),
            "--out",
            str(out),
            "--only",
            stem,
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "index.html").exists()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto((out / f"{stem}.html").as_uri())
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
        "gd => gd._transitionData && gd._transitionData._frames && gd._transitionData._frames.length > 1)",
        timeout=60_000,
    )
    state_js = """() => { const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
        g => g._transitionData && g._transitionData._frames && g._transitionData._frames.length > 1);
        gd.scrollIntoView(); gd.id = gd.id || 'kvlab-animated';
        return {id: gd.id, active: gd._fullLayout.sliders[0].active,
                data: JSON.stringify(gd.data.map(t => [t.x, t.y, t.text, t.marker && t.marker.color]))}; }"""
    before = page.evaluate(state_js)
    page.locator(f'[id="{before["id"]}"] .updatemenu-button').first.click()
    page.wait_for_timeout(2500)
    after = page.evaluate(state_js)
    page.screenshot(path=str(SHOTS / "site_after_play.png"), full_page=False)
    assert after["active"] > before["active"], (before["active"], after["active"])
    assert after["data"] != before["data"]
    page.close()
