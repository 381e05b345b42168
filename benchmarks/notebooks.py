"""How long the course notebooks take to run, against the 3-minute budget for the whole set.

    python benchmarks/notebooks.py [--workers 2] [NN ...]

Runs every notebook (or the chosen ones) as shipped and with the solutions, each in a fresh kernel,
the same way tests/test_notebooks.py does, and prints seconds per run, the wall time of the whole set
and its share of the budget. A notebook that takes much longer than its neighbours is the one to trim.
Run it on an idle machine: other processes on the two cores stretch every number.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import run_notebooks  # noqa: E402

from kvlab.core.timing import measure_once  # noqa: E402

BUDGET_S = 180.0
# What every run pays before a notebook does anything: a kernel, then the imports a notebook needs.
FLOORS = {"floor: empty kernel": "pass", "floor: + import kvlab.views": "import kvlab.exercises, kvlab.views"}


def _floor_notebooks(folder: Path) -> list[Path]:
    paths = []
    for i, source in enumerate(FLOORS.values()):
        path = folder / f"floor{i}.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="numbers (01) or file names; default: all")
    parser.add_argument("--workers", type=int, default=None, help="kernels at once (default: up to 2)")
    args = parser.parse_args(argv)

    paths = run_notebooks.notebook_paths(args.notebooks)
    jobs = [(p, solved) for p in paths for solved in (False, True)]
    workers = args.workers or run_notebooks.default_workers()
    with tempfile.TemporaryDirectory() as tmp:
        floors = [
            f.result() for f in run_notebooks.run_many([(p, False) for p in _floor_notebooks(Path(tmp))], 1)
        ]
    # one run of the whole set: it cannot be repeated cheaply, so there is no spread to print
    records, timing = measure_once(lambda: [f.result() for f in run_notebooks.run_many(jobs, workers)])
    wall = timing.median_ms / 1e3

    seconds = {(r["notebook"], r["mode"]): r for r in records}
    print(f"{'notebook':<34}{'shipped':>9}{'solved':>9}   status")
    for p in paths:
        shipped, solved = seconds[(p.stem, "shipped")], seconds[(p.stem, "solved")]
        ok = shipped["error"] is None and solved["error"] is None
        print(
            f"{p.stem:<34}{shipped['seconds']:>8.1f}s{solved['seconds']:>8.1f}s   {'ok' if ok else 'ERROR'}"
        )
    for name, r in zip(FLOORS, floors, strict=True):
        print(f"{name:<34}{r['seconds']:>8.1f}s   (alone; a notebook run pays this first)")
    total = sum(r["seconds"] for r in records)
    print(
        f"{len(records)} runs, {workers} at a time: {total:.1f}s of kernel time, {wall:.1f}s wall "
        f"(this process's CPU {timing.cpu_median_ms / 1e3:.1f}s: the kernels run in their own processes)"
    )
    print(f"wall / budget ({BUDGET_S:.0f}s for the whole set): {wall / BUDGET_S:.2f}")
    if len(paths) < 16:
        print(
            f"(only {len(paths)} of 16 notebooks exist; at this rate 16 would take about {wall * 16 / len(paths):.0f}s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
