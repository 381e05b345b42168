"""Execute course notebooks in fresh kernels, as shipped or with the solutions filled in.

    python tools/run_notebooks.py                      # every notebook, as shipped
    python tools/run_notebooks.py --solutions 01 03    # notebooks 01 and 03, solved
    python tools/run_notebooks.py --both --jobs 2      # all, both ways, two at a time
    python tools/run_notebooks.py --save executed/     # also write each executed notebook there

Each run starts a new kernel with the working directory notebooks/ and
$KVLAB_EXERCISE_LOG pointing at a temporary file, so every ``check`` and
``compare_table`` call leaves a JSON line; the run's record carries those
lines, the first cell error (if any) and the seconds it took. The notebook
tests (tests/test_notebooks.py) and benchmarks/notebooks.py use ``run_notebook``
and ``run_many`` from here; nothing is written back to the notebooks. ``--save``
writes each executed notebook to a folder, without widget state (the widgets
carry a still copy for readers without a kernel), and prints its size. Set
KVLAB_NOTEBOOK_CELL_TIMEOUT (seconds, default 180) and KVLAB_NOTEBOOK_WORKERS to change the limits.
Kernels get KVLAB_SKIP_LIVE=1 unless it is set already, so cells that bring up a live fleet of servers
(about a minute; notebook 15) skip themselves; tests/serve covers those runs. KVLAB_SKIP_LIVE=0 runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "solutions"
CELL_TIMEOUT = int(os.environ.get("KVLAB_NOTEBOOK_CELL_TIMEOUT", "180"))


def notebook_paths(selectors: list[str] | None = None) -> list[Path]:
    """Course notebooks in order; ``selectors`` are numbers ("01") or file names to keep."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not selectors:
        return paths
    chosen = [p for p in paths if any(p.name == s or p.stem == s or p.name[:2] == s for s in selectors)]
    missing = [s for s in selectors if not any(p.name == s or p.stem == s or p.name[:2] == s for p in paths)]
    if missing:
        raise SystemExit(f"no notebook matches {', '.join(missing)} in {NOTEBOOKS}")
    return chosen


def exercise_cells(nb: Any) -> dict[str, int]:
    """Exercise id -> index of the code cell marked with metadata {"kvlab": {"exercise": id}}."""
    out: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        ex = cell.get("metadata", {}).get("kvlab", {}).get("exercise")
        if ex is not None:
            if ex in out:
                raise ValueError(f"exercise {ex} is marked on cells {out[ex]} and {i}")
            out[ex] = i
    return out


def load_solutions(notebook: Path) -> dict[str, str]:
    """The ``SOLUTIONS`` mapping of solutions/<notebook stem>.py ({} when there is no such file)."""
    path = SOLUTIONS / f"{notebook.stem}.py"
    if not path.exists():
        return {}
    solutions = runpy.run_path(str(path)).get("SOLUTIONS")
    if not isinstance(solutions, dict):
        raise ValueError(f"{path} must define SOLUTIONS = {{exercise id: cell source}}")
    return solutions


def fill_solutions(nb: Any, solutions: dict[str, str]) -> Any:
    """Replace each exercise cell's source with its solution; every cell and solution must pair up."""
    cells = exercise_cells(nb)
    if set(cells) != set(solutions):
        raise ValueError(
            f"exercise cells {sorted(cells)} and solutions {sorted(solutions)} differ: "
            "each exercise cell needs exactly one solution"
        )
    for ex, index in cells.items():
        nb.cells[index].source = solutions[ex]
    return nb


def run_notebook(
    path: str | Path, solved: bool = False, timeout: int = CELL_TIMEOUT, save_to: str | Path | None = None
) -> dict[str, Any]:
    """Execute one notebook top to bottom in a fresh kernel; never raises for a notebook's own failure.

    With ``save_to`` (a folder) the executed notebook is written there, as run so far when a cell failed,
    and the record's ``bytes`` is its size. Widget state is never kept: it is megabytes per plotly widget.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path)
    record: dict[str, Any] = {"notebook": path.stem, "mode": "solved" if solved else "shipped", "error": None}
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="kvlab-nb-") as tmp:
        log = Path(tmp) / "checks.jsonl"
        env = {
            "KVLAB_SKIP_LIVE": "1",  # a live fleet takes a minute; tests/serve runs it (set 0 to run it here)
            **os.environ,
            "KVLAB_EXERCISE_LOG": str(log),
            "PYTHONHASHSEED": "0",
            "MPLBACKEND": "Agg",
        }
        start = time.perf_counter()
        try:
            if solved:
                fill_solutions(nb, load_solutions(path))
            client = NotebookClient(
                nb,
                timeout=timeout,
                kernel_name="python3",
                resources={"metadata": {"path": str(path.parent)}},
                store_widget_state=False,
            )
            client.execute(env=env)
        except CellExecutionError as exc:
            record["error"] = _short_error(str(exc))
        except (CellTimeoutError, DeadKernelError, TimeoutError, RuntimeError, ValueError) as exc:
            record["error"] = f"{type(exc).__name__}: {_short_error(str(exc))}"
        record["seconds"] = round(time.perf_counter() - start, 2)
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    if save_to is not None:
        saved = Path(save_to) / path.name
        saved.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, saved)
        record["bytes"] = saved.stat().st_size
    events = [json.loads(line) for line in lines if line.strip()]
    record["checks"] = [e for e in events if "id" in e]
    record["compares"] = [e for e in events if "compare" in e]
    return record


def _short_error(text: str, limit: int = 3000) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[...]"


def default_workers() -> int:
    """$KVLAB_NOTEBOOK_WORKERS, else one kernel per core up to 2."""
    return int(os.environ.get("KVLAB_NOTEBOOK_WORKERS", "0")) or min(2, os.cpu_count() or 1)


def run_many(
    jobs: list[tuple[Path, bool]], workers: int | None = None, save_to: str | Path | None = None
) -> list[Future]:
    """Start ``(notebook, solved)`` runs, ``workers`` at a time (default: up to 2); one future per job.

    Threads are enough: each run's work happens in its own kernel process, and a thread costs
    nothing to start, where a worker process would import nbclient again. ``save_to`` is passed
    on to ``run_notebook`` (a solved run is saved under ``save_to``/solved).
    """
    import nbclient  # noqa: F401  (import once here, not in each thread at the same time)

    pool = ThreadPoolExecutor(max_workers=workers or default_workers(), thread_name_prefix="notebook")

    def folder(solved: bool) -> Path | None:
        return None if save_to is None else Path(save_to) / ("solved" if solved else "")

    futures = [pool.submit(run_notebook, path, solved, CELL_TIMEOUT, folder(solved)) for path, solved in jobs]
    pool.shutdown(wait=False)  # the threads end once the queued runs are done
    return futures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="numbers (01) or file names; default: all")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--solutions", action="store_true", help="fill in the solutions first")
    mode.add_argument("--both", action="store_true", help="run each notebook as shipped and solved")
    parser.add_argument("--jobs", type=int, default=None, help="kernels at once (default: up to 2)")
    parser.add_argument("--json", metavar="FILE", help="also write the run records to FILE")
    parser.add_argument("--save", metavar="DIR", help="write each executed notebook (no widget state) to DIR")
    args = parser.parse_args(argv)

    paths = notebook_paths(args.notebooks)
    modes = [False, True] if args.both else [args.solutions]
    jobs = [(p, solved) for p in paths for solved in modes]
    start = time.perf_counter()
    records = [f.result() for f in run_many(jobs, args.jobs, args.save)]
    wall = time.perf_counter() - start
    failed = 0
    for r in records:
        statuses = ", ".join(f"{c['id']} {c['status']}" for c in r["checks"]) or "no checks"
        bad_compares = [c["compare"] for c in r["compares"] if not c["ok"]]
        ok = r["error"] is None and not bad_compares
        failed += not ok
        size = f"{r['bytes'] / 1e6:6.2f} MB  " if "bytes" in r else ""
        print(
            f"{r['notebook']:<34}{r['mode']:<8}{r['seconds']:>7.1f}s  {size}{'ok' if ok else 'FAILED'}  {statuses}"
        )
        if r["error"]:
            print("    " + r["error"].replace("\n", "\n    "))
        for title in bad_compares:
            print(f"    figures differ from the lesson in: {title}")
    print(f"{len(records)} runs in {wall:.1f}s wall time")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
