"""The static site (tools/build_site.py), built for notebook 07: light, offline, and readable without a kernel.

07 has plotly figures, an animation, a Stepper and a Playground, so one page covers every kind of output.
The site holds plotly.js once, as a file its pages load; no page inlines it or loads anything from the
network, no widget state is saved, and each widget shows its still copy. The browser test opens the
page from disk with every network request refused and checks that every figure is drawn with no
console error. Building the page executes the notebook once (a few seconds).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.views.live import KERNEL_NOTE

ROOT = Path(__file__).resolve().parents[2]
STEM = "07_lru_eviction"
PAGE_LIMIT = 2_000_000  # bytes a page may take besides the shared plotly.js
SITE_LIMIT = 40_000_000  # the whole site (issue 16), with every notebook built
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _build_site_module():
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "build_site.py"),
            "--out",
            str(out),
            "--only",
            STEM,
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def test_plotly_js_is_one_shared_file_that_the_page_loads(site) -> None:
    from plotly.offline import get_plotlyjs

    assert (site / "plotly.min.js").read_text(encoding="utf-8") == get_plotlyjs()
    page = (site / f"{STEM}.html").read_text(encoding="utf-8")
    assert page.count('<script src="plotly.min.js"></script>') == 1
    assert "* plotly.js v" not in page, "the page inlines plotly.js"
    assert sorted(p.name for p in site.iterdir()) == ["07_lru_eviction.html", "index.html", "plotly.min.js"]


def test_the_page_needs_no_network_and_no_widget_state(site) -> None:
    page = (site / f"{STEM}.html").read_text(encoding="utf-8")
    assert not re.findall(r'<script[^>]*\bsrc="(?:https?:)?//', page), "a script comes from the network"
    assert not re.findall(r'<link[^>]*\bhref="(?:https?:)?//', page), "a stylesheet comes from the network"
    assert "application/vnd.jupyter.widget-state+json" not in page
    assert 'type="application/vnd.jupyter.widget-view+json"' not in page
    assert page.count(KERNEL_NOTE) == 2, "the Stepper and the Playground each show their still copy"


def test_the_site_stays_small(site) -> None:
    build_site = _build_site_module()
    page = (site / f"{STEM}.html").stat().st_size
    assert page <= PAGE_LIMIT, f"{STEM}.html is {page / 1e6:.1f} MB"
    shared = (site / "plotly.min.js").stat().st_size
    notebooks = len(build_site.course_notebooks())
    # the whole course at this page's size (07 is among the heaviest) stays within the site's limit
    assert shared + notebooks * page <= SITE_LIMIT
    assert build_site.site_size(site) == shared + page + (site / "index.html").stat().st_size


def test_site_form_takes_out_what_a_page_does_not_show() -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    build_site = _build_site_module()
    plotly_source = "/** plotly.js stand-in */ window.Plotly = {};"
    mathjax = (
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/3.2.2/es5/tex-svg.min.js"></script>'
    )
    figure = {
        "application/vnd.plotly.v1+json": {"data": []},
        "text/html": f"<div>{mathjax}<div id='f'></div></div>",
    }
    widget = {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}, "text/plain": "VBox()",
              "text/html": "<div class='kvlab-still'></div>"}  # fmt: skip
    nb = new_notebook(cells=[
        new_markdown_cell("see [the next notebook](08_radix_tree.ipynb)"),
        new_code_cell("fig", outputs=[new_output("display_data", data={"text/html": f"<script>{plotly_source}</script>"}),
                                      new_output("display_data", data=figure)]),
        new_code_cell("st", outputs=[new_output("execute_result", data=widget, execution_count=1),
                                     new_output("stream", name="stdout", text="kept\n")]),
    ], metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}}})  # fmt: skip
    out = build_site.site_form(nbformat.from_dict(nb), plotly_source)
    assert out.cells[0].source == "see [the next notebook](08_radix_tree.html)"
    assert [list(o.get("data", {})) for o in out.cells[1].outputs] == [["text/html"]]
    assert out.cells[1].outputs[0].data["text/html"] == "<div><div id='f'></div></div>"
    assert [sorted(o.get("data", {})) for o in out.cells[2].outputs] == [["text/html", "text/plain"], []]
    assert "widgets" not in out.metadata


@pytest.mark.browser
def test_the_page_draws_every_figure_offline_without_a_kernel(site) -> None:
    if CHROMIUM is None and not os.environ.get("CI"):
        pytest.skip("Chromium is not installed (apt-get install chromium); CI installs it")
    assert CHROMIUM is not None, "CI must install Chromium (apt-get install chromium)"
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        refused: list[str] = []
        page.route(
            re.compile(r"^(https?|wss?)://"), lambda route: (refused.append(route.request.url), route.abort())
        )
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto((site / f"{STEM}.html").as_uri(), wait_until="load")
        page.wait_for_function(
            "() => { const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));"
            " return divs.length > 0 && divs.every(d => d._fullLayout); }",
            timeout=60_000,
        )
        stills = page.evaluate(
            """() => Array.from(document.querySelectorAll('.kvlab-still')).map(s => ({
                 note: s.querySelector('.kvlab-kernel-note').innerText,
                 visible: s.getBoundingClientRect().height > 200,
                 frames: Array.from(s.querySelectorAll('.plotly-graph-div')).map(
                   d => (d._transitionData && d._transitionData._frames || []).length),
                 traces: Array.from(s.querySelectorAll('.plotly-graph-div')).map(
                   d => d.querySelectorAll('.trace, .hm, image').length) }))"""
        )
        browser.close()
    assert not problems, problems
    assert not refused, f"the page asked the network for {refused}"
    assert len(stills) == 2 and all(KERNEL_NOTE in s["note"] and s["visible"] for s in stills), stills
    stepper, playground = stills
    assert stepper["frames"] == [8, 8], "the stepper's still copy animates its 8 steps in both views"
    assert playground["frames"] == [0, 0], "the playground's still copy is its final state"
    assert all(n > 0 for s in stills for n in s["traces"]), "a figure of a still copy is empty"
