"""The grader's teaching data, its page, and the parts of ``python -m kvlab grade`` that need no kernel.

Collecting submissions (student ids, zips that try to escape or explode, links), refusing bad
options, the registry's points/difficulty/prerequisites, and docs/instructors.md being generated
from them.
"""

from __future__ import annotations

import csv
import io
import os
import stat
import zipfile
from pathlib import Path

import pytest

import kvlab.exercises as ex
from kvlab.cli import grade as grade_cli
from kvlab.errors import InvalidArgumentError
from kvlab.exercises.core import DIFFICULTIES
from kvlab.exercises.grading import Row
from kvlab.exercises.instructors import ASSIGNMENTS, render

ROOT = Path(__file__).resolve().parents[2]


def test_every_exercise_carries_its_teaching_data():
    ids = {e.id for e in ex.exercises()}
    for e in ex.exercises():
        assert e.difficulty in DIFFICULTIES and 1 <= e.points <= 20 and 1 <= e.minutes <= 120, e.id
        assert set(e.prerequisites) <= ids, e.id
        assert all((int(p[:2]), int(p[3:])) < (int(e.id[:2]), int(e.id[3:])) for p in e.prerequisites), e.id
    functions = [e for e in ex.exercises() if e.answer_type == "function"]
    with_hidden = [e.id for e in functions if e.cases is not None]
    assert len(with_hidden) >= 9, with_hidden


def test_hidden_cases_are_fresh_for_each_seed():
    import random

    e = ex.get("02.3")
    shown = e.draw_cases(None)
    a, b = e.draw_cases(random.Random(1)), e.draw_cases(random.Random(2))
    assert a[: len(shown)] == shown and len(a) > len(shown)
    assert a[len(shown) :] != b[len(shown) :]
    assert e.draw_cases(random.Random(1)) == a  # --seed draws the same again


def test_the_instructors_page_is_generated_from_the_registry(capsys):
    page = (ROOT / "docs" / "instructors.md").read_text()
    assert page == render(), "run: python -m kvlab grade --instructors-doc docs/instructors.md"
    assert grade_cli.main(["--instructors-doc"]) == 0
    assert capsys.readouterr().out == page
    for a in ASSIGNMENTS:
        assert f"python -m kvlab grade SUBMISSIONS --out grades --assignment {a.name}" in page
    assert "| 02.3 | Write the slot mapping |" in page and "| core | 2 | 8 | 02.1 |" in page


@pytest.mark.parametrize(
    "name, student",
    [
        ("alice_02_block_tables.ipynb", "alice"),
        ("Bob Smith - 02_block_tables.ipynb", "Bob_Smith"),
        ("carol.ipynb", "carol"),
        ("x_12345_02_BLOCK_TABLES.ipynb", "x_12345"),
    ],
)
def test_student_ids_come_from_file_names(tmp_path, name, student):
    path = tmp_path / name
    path.write_text("{}")
    assert grade_cli.student_of(path) == student


def test_a_bare_notebook_name_belongs_to_its_folder(tmp_path):
    (tmp_path / "dan").mkdir()
    path = tmp_path / "dan" / "02_block_tables.ipynb"
    path.write_text("{}")
    assert grade_cli.student_of(path) == "dan"
    subs = grade_cli.collect([tmp_path], tmp_path / "scratch")
    assert [(s.student, s.path.name) for s in subs] == [("dan", "02_block_tables.ipynb")]


def _zip(path: Path, entries: dict[str, bytes], link: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, "/etc/passwd")
    return path


@pytest.mark.parametrize(
    "entries, link, words",
    [
        ({"../evil.ipynb": b"{}"}, None, "points outside the zip"),
        ({"/abs/evil.ipynb": b"{}"}, None, "points outside the zip"),
        ({"a/../../evil.ipynb": b"{}"}, None, "points outside the zip"),
        ({"ok/x.ipynb": b"{}"}, "ok/link.ipynb", "symbolic link"),
    ],
)
def test_an_unsafe_zip_is_refused_whole(tmp_path, entries, link, words):
    archive = _zip(tmp_path / "subs.zip", entries, link)
    with pytest.raises(InvalidArgumentError, match=words):
        grade_cli.collect([archive], tmp_path / "scratch")
    assert not (tmp_path / "evil.ipynb").exists() and not (tmp_path / "scratch").exists()


def test_a_zip_bomb_is_refused_before_unpacking(tmp_path, monkeypatch):
    monkeypatch.setattr(grade_cli, "ZIP_MAX_BYTES", 1000)
    archive = _zip(tmp_path / "bomb.zip", {"a.ipynb": b"0" * 2000})
    with pytest.raises(InvalidArgumentError, match="unpacks to more than"):
        grade_cli.collect([archive], tmp_path / "scratch")
    monkeypatch.setattr(grade_cli, "ZIP_MAX_ENTRIES", 2)
    archive = _zip(tmp_path / "many.zip", {f"{i}.ipynb": b"{}" for i in range(3)})
    with pytest.raises(InvalidArgumentError, match="entries"):
        grade_cli.collect([archive], tmp_path / "scratch2")


def test_a_safe_zip_unpacks_only_notebooks(tmp_path):
    archive = _zip(tmp_path / "subs.zip", {"eve/02_block_tables.ipynb": b"{}", "eve/run.sh": b"rm -rf /",
                                            "__MACOSX/eve/._02.ipynb": b"x"})  # fmt: skip
    subs = grade_cli.collect([archive], tmp_path / "scratch")
    assert [(s.student, s.path.name) for s in subs] == [("eve", "02_block_tables.ipynb")]
    assert not list((tmp_path / "scratch").rglob("run.sh"))


def test_links_in_a_folder_are_not_followed(tmp_path):
    (tmp_path / "subs").mkdir()
    outside = tmp_path / "secret.ipynb"
    outside.write_text("{}")
    os.symlink(outside, tmp_path / "subs" / "frank_02_block_tables.ipynb")
    os.symlink(tmp_path, tmp_path / "subs" / "loop")
    assert grade_cli.collect([tmp_path / "subs"], tmp_path / "scratch") == []


@pytest.mark.parametrize(
    "args, words",
    [
        (["x.ipynb"], "--out DIR is required"),
        (["--out", "o"], "give SUBMISSIONS"),
        (["nowhere.ipynb", "--out", "o"], "does not exist"),
        (["x.ipynb", "--out", "o", "--timeout", "0"], "--timeout must be from 1"),
        (["x.ipynb", "--out", "o", "--memory", "10"], "--memory must be from 256"),
        (["x.ipynb", "--out", "o", "--jobs", "0"], "--jobs must be from 1"),
        (["x.ipynb", "--out", "o", "--assignment", "99"], "--assignment takes lab, module, course"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.ipynb").write_text("{}")
    assert grade_cli.main(args) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists() or "assignment" in words


def test_csv_and_gradescope_shapes(tmp_path):
    rows = [
        Row(
            "ann",
            "02",
            "02.1",
            1,
            1,
            "right",
            'Slot 46, "quoted", and a,comma',
            "Predict the slot of a token",
        ),
        Row("ann", "02", "02.2", 0, 1, "not yet", "line one\nline two", "How many blocks?", "[1, 2]"),
    ]
    grade_cli.write_csv(rows, tmp_path / "grades.csv")
    back = list(csv.DictReader(io.StringIO((tmp_path / "grades.csv").read_text())))
    assert (
        back[0]["feedback"] == 'Slot 46, "quoted", and a,comma'
        and back[1]["feedback"] == "line one\nline two"
    )
    result = grade_cli.gradescope_results(rows, 1.5)
    assert result["score"] == 1 and result["execution_time"] == 1.5
    assert [(t["name"], t["score"], t["max_score"]) for t in result["tests"]] == [
        ("02.1 Predict the slot of a token", 1, 1),
        ("02.2 How many blocks?", 0, 1),
    ]
    assert all(isinstance(t["output"], str) for t in result["tests"])


def test_the_autograder_alone_is_made_without_submissions(tmp_path, capsys):
    assert (
        grade_cli.main(["--out", str(tmp_path / "g"), "--format", "gradescope", "--assignment", "lab"]) == 0
    )
    runner = (tmp_path / "g" / "autograder" / "run_autograder").read_text()
    assert "--assignment 00,01,02" in runner and "/autograder" in runner and "KVLAB_AUTOGRADER_ROOT" in runner
    assert os.access(tmp_path / "g" / "autograder" / "setup.sh", os.X_OK)
    assert (tmp_path / "g" / "autograder" / "kvlab_src" / "kvlab" / "exercises" / "grading.py").exists()
