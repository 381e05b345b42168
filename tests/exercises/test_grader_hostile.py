"""Hostile submissions the grader must survive with exactly the points deserved.

A cell that finds the grader's record file (the kernel runs as the grader's user) and writes junk
into it once crashed the whole run; a cell that writes a huge file is stopped by the worker's file
limit; a function that writes a deeply nested line over the sandbox's answer channel is a NotYet,
not a RecursionError; a process started with ``setsid`` by a cell or a function is ended with
it; zips the grader cannot unpack are refused in one line, not a traceback. One
notebook run (module fixture) with short limits keeps the machine's cores free.
"""

from __future__ import annotations

import contextlib
import os
import random
import runpy
import signal
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from kvlab.cli import grade as grade_cli
from kvlab.exercises.core import NotYet
from kvlab.exercises.grading import Limits, grade_notebook, read_records
from kvlab.exercises.sandbox import SandboxFunction

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_block_tables.ipynb"
SOLVED = runpy.run_path(str(ROOT / "solutions" / "02_block_tables.py"))["SOLUTIONS"]

TAMPER = r"""
import os
def _records():
    pid = os.getppid()
    while pid > 1:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        for a in args:
            if a.endswith(b"records.jsonl"):
                return a.decode()
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("the record file was not found")
with open(_records(), "a") as f:
    f.write("not json\n[1, 2]\n{\"kind\": 5}\n{\"kind\": \"cell\"}\n" + "[" * 100000 + "\n")
    f.write('{"kind": "answer", "id": "02.2", "text": 7}\n{"kind": "answer", "id": "02.2", "text": "[1]"}\n')
    f.write('{"kind": "answer", "id": "02.2", "text": "not json"}\n\xff\n')
"""

BIG_FILE = """
try:
    with open("big.bin", "wb") as f:
        for _ in range(100):
            f.write(b"x" * 2**20)
    wrote_it_all = True
except OSError:
    wrote_it_all = False
"""


DAEMON = """
import subprocess
subprocess.Popen(["sleep", "4747"], start_new_session=True)
"""


def _left_running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker``; killed here, so a failing test leaves none."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if args[:2] == [b"sleep", marker.encode()]:
            found.append(int(entry))
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
    return found


def _notebook(sources: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        ex = cell.get("metadata", {}).get("kvlab", {}).get("exercise")
        if ex:
            cell.source = sources[ex]
    return nb


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    sources = dict(SOLVED)
    sources["02.1"] = TAMPER + SOLVED["02.1"]
    sources["02.2"] = DAEMON + SOLVED["02.2"]
    sources["02.4"] = BIG_FILE + SOLVED["02.4"].replace(
        'answer = ["A", 21]', 'answer = ["A", 21 + wrote_it_all]'
    )
    path = tmp_path_factory.mktemp("hostile") / "eve_02_block_tables.ipynb"
    nbformat.write(_notebook(sources), path)
    limits = Limits(timeout=120, cell_timeout=20, function_seconds=10, memory_mib=2048)
    return {r.exercise: r for r in grade_notebook("eve", path, limits=limits, rng=random.Random(3))}


def test_junk_in_the_record_file_changes_no_grade(rows):
    assert {ex: (r.points, r.status) for ex, r in rows.items() if ex != "02.4"} == {
        "02.1": (1, "right"),
        "02.2": (1, "right"),
        "02.3": (2, "right"),
    }, {ex: r.feedback for ex, r in rows.items()}


def test_a_daemon_a_cell_starts_is_stopped_with_the_notebook(rows):
    assert _left_running("4747") == []


def test_a_cell_cannot_write_a_file_past_the_limit(rows):
    row = rows["02.4"]
    assert (row.points, row.status) == (row.max_points, "right"), row.feedback


def test_read_records_keeps_only_well_formed_records(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"kind": "cell", "id": "02.1", "error": null}\n{"kind": "cell", "id": 1}\n'
                     b'\xff\xfe\n' + b"[" * 100_000 + b'\n{"kind": "answer", "id": "x", "text": {}}\n'
                     b'{"kind": "end"}\n')  # fmt: skip
    assert read_records(path) == [{"kind": "cell", "id": "02.1", "error": None}, {"kind": "end"}]
    assert read_records(tmp_path / "absent.jsonl") == []


WRITES_OVER_THE_CHANNEL = """
import os
def f(x):
    for fd in range(3, 64):
        try:
            os.write(fd, b'{"value": ' + b"[" * 100000 + b"\\n")
        except OSError:
            pass
    return x
"""


def test_a_function_that_writes_nested_junk_over_the_channel_is_not_yet():
    function = SandboxFunction(WRITES_OVER_THE_CHANNEL, "f", seconds=10, memory_mib=1024)
    try:
        with pytest.raises(NotYet, match="answer channel"):
            function(1)
    finally:
        function.close()
    assert function.child is not None and function.child.poll() is not None


STARTS_DAEMONS = """
import os, subprocess
def f(x):
    subprocess.Popen(["sleep", "4848"], start_new_session=True)
    if os.fork() == 0:  # a double fork: the daemon's parent is gone before the grader looks
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "4848"])
        os._exit(0)
    return x
"""


def test_processes_a_function_starts_end_with_its_sandbox():
    function = SandboxFunction(STARTS_DAEMONS, "f", seconds=10, memory_mib=1024)
    try:
        assert function(5) == 5
    finally:
        function.close()
    time.sleep(0.2)
    assert _left_running("4848") == []


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def _corrupt(path: Path) -> Path:
    data = bytearray(_zip(path, {"a_02_block_tables.ipynb": b"hello world"}).read_bytes())
    data[data.find(b"hello")] = ord("j")  # the CRC no longer matches
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", ["file-and-folder", "deep", "long-name", "bad-crc"])
def test_a_zip_that_cannot_be_unpacked_exits_2_in_one_line(tmp_path, capsys, kind):
    archive = tmp_path / "subs.zip"
    if kind == "file-and-folder":
        _zip(archive, {"a.ipynb": b"{}", "a.ipynb/b_02_block_tables.ipynb": b"{}"})
    elif kind == "deep":
        _zip(archive, {"/".join(["d"] * 2000) + "/x.ipynb": b"{}"})
    elif kind == "long-name":
        _zip(archive, {"a" * 300 + ".ipynb": b"{}"})
    else:
        _corrupt(archive)
    out = tmp_path / "out"
    assert grade_cli.main([str(archive), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlab grade: ") and "refusing it all" in err and "\n" not in err, err
    assert not out.exists()


def test_an_out_folder_that_cannot_be_made_exits_2_in_one_line(tmp_path, capsys):
    notebook = tmp_path / "x_02_block_tables.ipynb"
    notebook.write_text("{}")
    a_file = tmp_path / "taken"
    a_file.write_text("")
    for out, words in ((a_file, "is a file"), (a_file / "below", "cannot write")):
        assert grade_cli.main([str(notebook), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("kvlab grade: ") and words in err and "\n" not in err, err
    assert grade_cli.main(["--instructors-doc", str(a_file / "doc.md")]) == 2
    assert "cannot write" in capsys.readouterr().err
