"""Execute one prepared notebook in a fresh kernel, under limits, and record what the grader reads.

    python notebook_worker.py NOTEBOOK RECORDS CELL_TIMEOUT MEMORY_MIB CPU_SECONDS

Run as a script by ``kvlab.exercises.grading.execute`` (it imports nbclient, not kvlab, so it starts
fast). It limits its own address space, CPU time and file size (``resource.setrlimit``; the kernel it
starts inherits them), runs every cell with ``allow_errors`` (a cell past CELL_TIMEOUT is interrupted and
the rest still runs), and appends one JSON line to RECORDS per exercise cell (its error, if any) and
per grader cell (the answer it published as ``MIME``), then ``{"kind": "end"}``. A kernel that dies
leaves ``{"kind": "died"}``; a worker killed for time leaves what came before. Processes the
notebook started (even with ``setsid``) are killed before the worker ends.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

MIME = "application/vnd.kvlab.answer+json"
FILE_LIMIT = 64 * 2**20  # bytes of any one file the worker or the kernel writes (the records are a few KB)


def _limit_self(memory_mib: int, cpu_seconds: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_mib * 2**20, memory_mib * 2**20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))  # a cell writing gigabytes stops


def run_worker(notebook_path: str, records_path: str, cell_timeout: float, memory_mib: int, cpu: int) -> int:
    """Execute a prepared notebook in a fresh kernel, appending what the grader needs to ``records_path``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(notebook_path, as_version=4)
    out = open(records_path, "a", encoding="utf-8")  # noqa: SIM115 - open until the worker exits

    def record(entry: dict[str, Any]) -> None:
        out.write(json.dumps(entry, allow_nan=True) + "\n")
        out.flush()

    def executed(cell: Any, cell_index: int, execute_reply: Any = None, **_: Any) -> None:
        meta = cell.get("metadata", {}).get("kvlab", {})
        if "exercise_index" in meta:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            error = f"{errors[0].get('ename')}: {errors[0].get('evalue')}"[:300] if errors else None
            record({"kind": "cell", "id": meta["exercise_index"], "error": error})
        elif "grader" in meta:
            for o in cell.get("outputs", []):
                text = o.get("data", {}).get(MIME) if o.get("output_type") == "display_data" else None
                if isinstance(text, str):
                    record({"kind": "answer", "id": meta["grader"], "text": text})
        cell.outputs = []  # the grader has what it needs; a cell that printed megabytes is dropped here

    _limit_self(memory_mib, cpu)
    guard = _guard()
    guard.become_subreaper()  # a process the notebook starts with setsid stays below this worker
    with tempfile.TemporaryDirectory(prefix="kvlab-grade-cwd-") as cwd:
        client = NotebookClient(
            nb,
            timeout=cell_timeout,
            interrupt_on_timeout=True,
            allow_errors=True,
            kernel_name="python3",
            resources={"metadata": {"path": cwd}},
            on_cell_executed=executed,
        )
        try:
            client.execute(env=dict(os.environ))  # the grader made it: child_env()
        except DeadKernelError:
            record({"kind": "died"})
        except Exception as exc:  # the kernel could not start, or nbclient gave up: the reason is the grade
            record({"kind": "failed", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"})
    guard.kill_descendants(os.getpid())  # what the notebook started and left running
    record({"kind": "end"})
    return 0


def _guard() -> Any:
    """``guard.py`` from beside this file, loaded without importing the kvlab package."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_kvlab_worker_guard", os.path.join(here, "guard.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    a = sys.argv
    sys.exit(run_worker(a[1], a[2], float(a[3]), int(a[4]), int(a[5])))
