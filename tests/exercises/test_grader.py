"""``python -m kvlab grade`` on a small class: every submission gets exactly the points it deserves.

One grading run (module fixture) over six copies of notebook 02, each a real kernel: solved, blank
with outputs edited to say "right", half-solved with accepted spellings, and three hostile ones
(lying objects, a redefined check, a syntax error, a monkeypatched kvlab, loops, exits). The
Gradescope autograder folder is then run as Gradescope runs it, in a subprocess with its documented
paths under a temporary root. Kernels are few and the limits short to keep the machine's cores free.
"""

from __future__ import annotations

import csv
import json
import os
import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from kvlab.cli import grade as grade_cli
from kvlab.exercises import exercises

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_block_tables.ipynb"
SOLVED = runpy.run_path(str(ROOT / "solutions" / "02_block_tables.py"))["SOLUTIONS"]
LIMITS = ["--timeout", "120", "--cell-timeout", "6", "--function-timeout", "6", "--memory", "2048"]

LIAR = """
class Liar(int):
    def __eq__(self, other):
        return True
    __ne__ = lambda self, other: False
    __hash__ = int.__hash__
    def __repr__(self):
        raise RuntimeError("no repr for you")
"""

HOSTILE_1 = {  # lying objects, a redefined check, a syntax error: 0 points
    "02.1": LIAR + "answer = Liar(0)\ncheck('02.1', answer)\n",
    "02.2": "answer = [1, 1, 2, 4, 7, 128\ncheck('02.2', answer)\n",
    "02.3": LIAR + "def slot_mapping(block_table, block_size, num_tokens):\n"
    "    return [Liar(0)] * num_tokens\n\n\ncheck('02.3', slot_mapping)\n",
    "02.4": "def check(*args):\n    print('✓ right')\n\n\nanswer = ['B', 0]\ncheck('02.4', answer)\n",
}

HOSTILE_2 = {  # a monkeypatched kvlab, a loop in a cell, a function that loops, a kernel that exits: 0 points
    "02.1": "import kvlab.exercises.core as core\nimport kvlab.models.paged as paged\n"
    "paged.BlockPool.translate = lambda self, seq, pos: None\n"
    "core._REGISTRY['02.1'] = core._REGISTRY['00.1']\n"
    "core.evaluate = lambda *a, **k: core.Verdict('right', 'yes')\n"
    "answer = 7\ncheck('02.1', answer)\n",
    "02.2": "while True:\n    pass\nanswer = [1, 1, 2, 4, 7, 128]\ncheck('02.2', answer)\n",
    "02.3": "def slot_mapping(block_table, block_size, num_tokens):\n    while True:\n        pass\n\n\n"
    "check('02.3', slot_mapping)\n",
    "02.4": "import os\nos._exit(0)\nanswer = ['A', 21]\ncheck('02.4', answer)\n",
}

PARTIAL = {  # what a human grader accepts (4.0, a tuple, " a "), and a function that exits: 1 + 1 + 2
    "02.1": "answer = 736 / 16\ncheck('02.1', answer)\n",
    "02.2": "answer = (1, 1, 2, 4, 7, 128)\ncheck('02.2', answer)\n",
    "02.3": "import sys\n\n\ndef slot_mapping(block_table, block_size, num_tokens):\n    sys.exit(0)\n\n\n"
    "check('02.3', slot_mapping)\n",
    "02.4": "answer = [' a ', 21]\ncheck('02.4', answer)\n",
}


def _notebook(sources: dict[str, str] | None, fake_right: bool = False) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        ex = cell.get("metadata", {}).get("kvlab", {}).get("exercise")
        if ex and sources is not None:
            cell.source = sources[ex]
        if ex and fake_right:  # outputs edited by hand to look like a right answer
            cell.outputs = [
                nbformat.v4.new_output("stream", name="stdout", text=f"✓ {ex}: right. Well done.\n")
            ]
            cell.execution_count = 1
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    subs = base / "submissions"
    subs.mkdir()
    nbformat.write(_notebook(SOLVED), subs / "alice_02_block_tables.ipynb")
    (subs / "bob").mkdir()
    nbformat.write(_notebook(None, fake_right=True), subs / "bob" / "02_block_tables.ipynb")
    nbformat.write(_notebook(PARTIAL), subs / "carol-02_block_tables.ipynb")
    nbformat.write(_notebook(HOSTILE_1), subs / "mallory_02_block_tables.ipynb")
    nbformat.write(_notebook(HOSTILE_2), subs / "trudy_02_block_tables.ipynb")
    archive = base / "more.zip"
    with zipfile.ZipFile(archive, "w") as z:  # one more student, as a platform's zip holds them
        z.writestr("dave/02_block_tables.ipynb", nbformat.writes(_notebook(SOLVED)))
    out = base / "out"
    args = [
        str(subs),
        str(archive),
        "--out",
        str(out),
        "--format",
        "gradescope",
        "--jobs",
        "2",
        "--seed",
        "11",
    ]
    assert grade_cli.main(args + LIMITS) == 0
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return out, rows


def _points(rows: list[dict[str, str]], student: str) -> dict[str, tuple[int, str]]:
    return {r["exercise"]: (int(r["points"]), r["status"]) for r in rows if r["student"] == student}


def test_every_student_gets_one_row_per_exercise(graded):
    _, rows = graded
    ids = [e.id for e in exercises("02")]
    students = {"alice", "bob", "carol", "dave", "mallory", "trudy"}
    assert {r["student"] for r in rows} == students
    for s in students:
        assert sorted(_points(rows, s)) == ids
    assert list(rows[0]) == ["student", "notebook", "exercise", "points", "max_points", "status", "feedback"]


def test_solved_notebooks_get_full_marks(graded):
    _, rows = graded
    full = {e.id: (e.points, "right") for e in exercises("02")}
    assert _points(rows, "alice") == full
    assert _points(rows, "dave") == full  # from the zip, student id from its folder


def test_blank_notebook_with_edited_outputs_is_not_done(graded):
    _, rows = graded
    assert set(_points(rows, "bob").values()) == {(0, "not done yet")}


def test_what_a_human_grader_accepts_is_accepted(graded):
    _, rows = graded
    got = _points(rows, "carol")
    assert got["02.1"] == (1, "right") and got["02.2"] == (1, "right") and got["02.4"] == (2, "right")
    assert got["02.3"] == (0, "not yet")
    feedback = {r["exercise"]: r["feedback"] for r in rows if r["student"] == "carol"}
    assert "sys.exit()" in feedback["02.3"]


def test_hostile_answers_get_nothing(graded):
    _, rows = graded
    m, t = _points(rows, "mallory"), _points(rows, "trudy")
    assert m == {"02.1": (0, "not yet"), "02.2": (0, "error"), "02.3": (0, "not yet"), "02.4": (0, "not yet")}
    assert t == {"02.1": (0, "not yet"), "02.2": (0, "error"), "02.3": (0, "not yet"), "02.4": (0, "error")}
    feedback = {(r["student"], r["exercise"]): r["feedback"] for r in rows}
    assert "SyntaxError" in feedback[("mallory", "02.2")]
    assert "time limit of 6 s per cell" in feedback[("trudy", "02.2")]
    assert "did not finish within 6 s" in feedback[("trudy", "02.3")]
    assert "kernel stopped" in feedback[("trudy", "02.4")]


def test_feedback_and_summary_files(graded):
    out, _ = graded
    text = (out / "feedback" / "carol.md").read_text()
    assert "**4 of 6 points.**" in text and "Hint:" in text
    summary = (out / "summary.md").read_text()
    assert "| 02.1 | Predict the slot of a token | 3/6 |" in summary
    with open(out / "summary.csv", newline="") as f:
        table = {r["exercise"]: r for r in csv.DictReader(f)}
    assert table["02.4"]["most_common_wrong"].startswith("['B', 0]")


def test_gradescope_results_have_the_documented_fields(graded):
    out, _ = graded
    result = json.loads((out / "gradescope" / "carol" / "results.json").read_text())
    assert result["score"] == 4
    assert {"name", "score", "max_score", "output"} <= set(result["tests"][0])
    assert [t["score"] for t in result["tests"]] == [1, 1, 0, 2]
    assert sum(t["max_score"] for t in result["tests"]) == 6


def test_the_autograder_grades_a_submission_as_gradescope_runs_it(graded, tmp_path):
    out, _ = graded
    source = tmp_path / "autograder" / "source"
    zip_path = tmp_path / "autograder.zip"
    with zipfile.ZipFile(zip_path, "w") as z:  # what the instructor uploads: the folder's contents
        for p in (out / "autograder").rglob("*"):
            z.write(p, p.relative_to(out / "autograder"))
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(source)
    assert (source / "setup.sh").exists()
    runner = tmp_path / "autograder" / "run_autograder"
    runner.write_bytes((source / "run_autograder").read_bytes())  # Gradescope copies it to /autograder
    runner.chmod(0o755)
    submission = tmp_path / "autograder" / "submission"
    submission.mkdir()
    nbformat.write(_notebook(PARTIAL), submission / "02_block_tables.ipynb")
    env = {**os.environ, "KVLAB_AUTOGRADER_ROOT": str(tmp_path / "autograder"), "KVLAB_PYTHON": sys.executable,
           "PYTHONPATH": str(source / "kvlab_src")}  # fmt: skip
    run = subprocess.run([str(runner)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "autograder" / "results" / "results.json").read_text())
    assert result["score"] == 4 and len(result["tests"]) == 4, result
