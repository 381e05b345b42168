"""Every course notebook runs top to bottom in a fresh kernel, as shipped and with the solutions filled in.

As shipped, every exercise check reports "not done yet" and the notebook still reaches its end; with
solutions/NN_slug.py pasted into the exercise cells, every check reports "right". Every compare_table
agrees with the lesson both ways. The runs go two at a time (KVLAB_NOTEBOOK_WORKERS to change it) on
tools/run_notebooks.py; their times are printed after the last test of this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvlab.exercises import exercises

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import run_notebooks  # noqa: E402

pytestmark = pytest.mark.notebooks

PATHS = run_notebooks.notebook_paths()
MODES = ["shipped", "solved"]


@pytest.fixture(scope="module")
def runs(request):
    """Start every selected run at once on the worker pool; each test waits for its own."""
    jobs = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is sys.modules[__name__] and callspec is not None:
            jobs.append((ROOT / "notebooks" / f"{callspec.params['name']}.ipynb", callspec.params["mode"]))
    futures = run_notebooks.run_many([(path, mode == "solved") for path, mode in jobs])
    runs = {(path.stem, mode): future for (path, mode), future in zip(jobs, futures, strict=True)}
    yield runs
    done = [f.result() for f in runs.values() if f.done() and not f.exception()]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter and capture and done:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(
                f"notebook runs, {run_notebooks.default_workers()} at a time, each in a fresh kernel:"
            )
            for r in done:
                reporter.write_line(f"  {r['notebook']:<34}{r['mode']:<8}{r['seconds']:>6.1f}s")
            reporter.write_line(f"  sum {sum(r['seconds'] for r in done):.1f}s")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [p.stem for p in PATHS])
def test_notebook_runs(name, mode, runs):
    record = runs[(name, mode)].result()
    assert record["error"] is None, f"{name} ({mode}) stopped with an error:\n{record['error']}"

    want = "not done yet" if mode == "shipped" else "right"
    registered = [e.id for e in exercises(name[:2])]
    checked = [c["id"] for c in record["checks"]]
    assert sorted(checked) == sorted(registered), (
        f"{name} ({mode}) checked {checked}; each registered exercise {registered} is checked exactly once"
    )
    wrong = [f"{c['id']}: {c['status']} ({c['message']})" for c in record["checks"] if c["status"] != want]
    assert not wrong, f"{name} ({mode}): every check should say {want!r}:\n" + "\n".join(wrong)

    differing = [f"{c['compare']}: {', '.join(c['mismatches'])}" for c in record["compares"] if not c["ok"]]
    assert not differing, f"{name} ({mode}) figures differ from the lesson:\n" + "\n".join(differing)
    if name[:2] != "00":
        assert record["compares"], f"{name} prints no compare_table of kvlab's figures against the lesson's"
