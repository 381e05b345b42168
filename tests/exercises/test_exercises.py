"""kvlab.exercises: the registry, check's three verdicts, hints, the log, and the instructors' page."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import runpy
import sys
from pathlib import Path

import pytest
from hostile import all_hostile_values, kvlab_or_ok
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlab.exercises as ex
from kvlab.errors import InvalidArgumentError, KvlabError
from kvlab.exercises import core
from kvlab.exercises import result as result_module
from kvlab.lessons.compare import compare_table
from kvlab.lessons.course import COURSE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def log(monkeypatch, tmp_path):
    path = tmp_path / "checks.jsonl"
    monkeypatch.setenv(core.LOG_ENV, str(path))

    def read() -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return read


def _solutions() -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        out.update(runpy.run_path(str(path))["SOLUTIONS"])
    return out


# ---------------------------------------------------------------- the registry


def test_every_exercise_lives_in_its_notebooks_module():
    assert ex.exercises(), "no exercises registered"
    for e in ex.exercises():
        assert e.checker.__module__ == f"kvlab.exercises.nb{e.notebook}", e.id
        assert e.notebook in {nb.number for nb in COURSE}


def test_registry_is_in_course_order_and_filters_by_notebook():
    ids = [e.id for e in ex.exercises()]
    assert ids == sorted(ids, key=lambda i: (i[:2], int(i[3:])))
    assert [e.id for e in ex.exercises("01")] == ["01.1", "01.2", "01.3", "01.4"]
    assert ex.exercises("77") == []


def test_notebooks_after_the_start_page_have_two_to_four_exercises():
    for nb in {e.notebook for e in ex.exercises()} - {"00"}:
        assert 2 <= len(ex.exercises(nb)) <= 4, nb


@pytest.mark.parametrize("notebook", ["02", "03", "04", "05", "06", "14"])
def test_notebook_exercises_are_registered_in_order(notebook):
    ids = [e.id for e in ex.exercises(notebook)]
    assert ids == [f"{notebook}.{k}" for k in range(1, len(ids) + 1)] and 2 <= len(ids) <= 4


def test_exercise_numbers_run_from_one_without_holes():
    for nb in {e.notebook for e in ex.exercises()}:
        assert [e.number for e in ex.exercises(nb)] == list(range(1, len(ex.exercises(nb)) + 1)), nb


def test_modules_named_nbNN_are_discovered(tmp_path, monkeypatch):
    # A new notebook module is picked up by the package import alone.
    pkg = tmp_path / "kvlab_fake_exercises"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(Path(ex.__file__).read_text())
    (pkg / "nb42.py").write_text(
        "from kvlab.exercises.core import exercise\n"
        "@exercise('42.1', title='t', assesses='a', minutes=1, answer_type='int', hints=['h'],\n"
        "          points=1, difficulty='intro')\n"
        "def _(answer):\n    return None\n"
    )
    (pkg / "helpers.py").write_text("raise AssertionError('only nbNN modules are imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("kvlab_fake_exercises")
    assert [e.id for e in ex.exercises("42")] == ["42.1"]
    sys.modules.pop("kvlab_fake_exercises", None)
    sys.modules.pop("kvlab_fake_exercises.nb42", None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"exercise_id": "1.2"}, "look like '07.2'"),
        ({"exercise_id": "01.0"}, "look like '07.2'"),
        ({"exercise_id": "01.1"}, "registered twice"),
        ({"title": " "}, "title must be a non-empty string"),
        ({"assesses": None}, "assesses must be a non-empty string"),
        ({"minutes": 0}, "minutes must be an int from 1 to 120"),
        ({"minutes": True}, "minutes must be an int from 1 to 120"),
        ({"answer_type": "float"}, "answer_type must be one of"),
        ({"hints": []}, "hints must be a non-empty list"),
        ({"hints": "one string"}, "hints must be a non-empty list"),
        ({"points": 0}, "points must be an int from 1 to 20"),
        ({"points": 2.0}, "points must be an int from 1 to 20"),
        ({"difficulty": "hard"}, "difficulty must be one of intro, core, stretch"),
        ({"prerequisites": ["99.2"]}, "prerequisites must be a list of earlier exercise ids"),
        ({"prerequisites": "01.1"}, "prerequisites must be a list of earlier exercise ids"),
        ({"cases": lambda rng: []}, "only a function exercise takes cases="),
    ],
)
def test_registration_rejects_bad_declarations(kwargs, message):
    args = {
        "exercise_id": "99.1",
        "title": "t",
        "assesses": "a",
        "minutes": 3,
        "answer_type": "int",
        "hints": ["h"],
        "points": 1,
        "difficulty": "core",
    }
    args.update(kwargs)
    before = dict(core._REGISTRY)
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        ex.exercise(args.pop("exercise_id"), **args)(lambda a: None)
    assert before == core._REGISTRY


def test_unknown_exercise_id_is_the_one_error(log):
    with pytest.raises(
        ex.UnknownExerciseError, match=r"unknown exercise '01\.9'; notebook 01 has 01\.1, 01\.2"
    ):
        ex.check("01.9", 3)
    with pytest.raises(ex.UnknownExerciseError, match="known ids: 00.1"):
        ex.check("nope", 3)
    with pytest.raises(KvlabError, match="a string like '01.2', got 1.2"):
        ex.check(1.2, 3)
    with pytest.raises(ex.UnknownExerciseError):
        ex.hint("88.1")
    assert log() == []


# ---------------------------------------------------------------- check's verdicts


def test_every_solution_is_right(log, capsys):
    solutions = _solutions()
    assert set(solutions) == {e.id for e in ex.exercises()}
    for exercise_id, source in solutions.items():
        namespace: dict = {"check": ex.check, "predict": core.predict}
        exec(compile(source, f"<solution {exercise_id}>", "exec"), namespace)
    assert [(r["id"], r["status"]) for r in log()] == [(i, "right") for i in solutions]
    out = capsys.readouterr().out
    assert out.count(": right.") + out.count(": recorded.") == len(solutions)  # a prediction is recorded


def test_solutions_stay_out_of_the_package():
    # A checker computes its expected answer with kvlab; the solution's literal is not in its module.
    package = Path(ex.__file__).parent
    for exercise_id, source in _solutions().items():
        module = (package / f"nb{exercise_id[:2]}.py").read_text()
        for literal in re.findall(r"^answer = (.+)$", source, flags=re.M):
            if len(literal) >= 3:  # a one-digit answer says nothing on its own
                assert not re.search(rf"(?<![\w.]){re.escape(literal)}(?![\w.])", module), (
                    f"the answer of {exercise_id} is written in kvlab/exercises/nb{exercise_id[:2]}.py"
                )


@pytest.mark.parametrize("placeholder", [..., None, [..., 400, 892], {"a": ...}, (1, [...])])
def test_placeholders_are_not_done_yet(placeholder, log, capsys):
    result = ex.check("01.2", placeholder)
    assert result.status == ex.NOT_DONE and not result and result.hint is None
    assert "Replace every ..." in result.message
    assert log() == [{"id": "01.2", "status": "not done yet", "message": result.message}]
    assert "01.2 Predict the gaps: not done yet" in capsys.readouterr().out


def test_a_function_that_still_returns_the_placeholder_is_not_done_yet(log):
    def wasted_slots(lengths, pool_size, max_len):
        return ...

    assert ex.check("01.3", wasted_slots).status == ex.NOT_DONE
    assert log()[-1]["status"] == "not done yet"


@pytest.mark.parametrize(
    "exercise_id, answer, expects",
    [
        ("01.1", "34.8", "a number"),
        ("01.1", True, "a number"),
        ("01.2", 892, "a list"),
        ("01.2", "100, 400, 892", "a list"),
        ("01.3", 5842, "a function"),
        ("00.1", 4.5, "a whole number"),
        ("00.1", "4", "a whole number"),
    ],
)
def test_a_wrong_type_is_not_yet_and_names_the_expected_type(exercise_id, answer, expects, log):
    result = ex.check(exercise_id, answer)
    assert result.status == ex.NOT_YET
    assert f"expects {expects}" in result.message and type(answer).__name__ in result.message
    assert result.hint == ex.get(exercise_id).hints[0]


def test_numpy_values_are_accepted():
    np = pytest.importorskip("numpy")
    assert ex.check("00.1", np.int64(4)).right
    assert ex.check("01.2", np.array([100, 400, 892])).right


def test_hints_are_revealed_one_by_one_and_stay_on_the_last(capsys):
    hints = ex.get("01.3").hints
    seen = [ex.check("01.3", lambda lengths, pool, max_len: 0).hint for _ in range(len(hints) + 2)]
    assert seen == [*hints, hints[-1], hints[-1]]
    ex.hint("01.3")
    assert hints[-1] in capsys.readouterr().out


def test_student_code_that_raises_is_reported_not_raised(log):
    def wasted_slots(lengths, pool_size, max_len):
        return lengths[10]

    result = ex.check("01.3", wasted_slots)
    assert result.status == ex.NOT_YET
    assert result.message.startswith(
        "your function raised IndexError: list index out of range (called with ["
    )
    result = ex.check("01.3", lambda: 0)
    assert result.status == ex.NOT_YET and "TypeError" in result.message


def test_a_checker_that_trips_on_an_odd_answer_is_not_yet_without_a_traceback(log):
    @ex.exercise(
        "99.1",
        title="t",
        assesses="a",
        minutes=1,
        answer_type="list",
        hints=["h"],
        points=1,
        difficulty="core",
    )
    def fussy(answer):
        return answer[0] + 1

    result = ex.check("99.1", ["x"])
    assert result.status == ex.NOT_YET and "could not be checked (TypeError" in result.message


def test_the_log_appends_one_line_per_check(log):
    ex.check("00.1", ...)
    ex.check("00.1", 3)
    ex.check("00.1", 4)
    assert [(r["id"], r["status"]) for r in log()] == [
        ("00.1", "not done yet"),
        ("00.1", "not yet"),
        ("00.1", "right"),
    ]


def test_a_log_that_cannot_be_written_only_warns(monkeypatch, tmp_path):
    monkeypatch.setenv(core.LOG_ENV, str(tmp_path / "missing" / "dir" / "log.jsonl"))
    with pytest.warns(UserWarning, match="could not append to KVLAB_EXERCISE_LOG"):
        assert ex.check("00.1", 4).right


def test_results_show_once_in_a_notebook(monkeypatch):
    published = []
    monkeypatch.setattr(result_module, "_ipython_shell", lambda: object())
    monkeypatch.setattr("IPython.display.publish_display_data", lambda data: published.append(data))
    result = ex.check("00.1", 3)
    result._ipython_display_()  # what IPython does when check(...) ends a cell
    assert len(published) == 1
    assert "✗ Not yet" in published[0]["text/html"] and "Hint:" in published[0]["text/html"]
    assert published[0]["text/plain"] == result.text()
    result.show()  # asking again shows it again
    assert len(published) == 2


def test_html_escapes_the_message():
    result = ex.check("01.4", ["<b>", 1])
    assert "<b>" not in result._repr_html_().replace("<b style", "").replace("<b>Hint", "")


# ---------------------------------------------------------------- compare_table and the page


def test_compare_table_marks_agreement_and_logs_it(log, capsys):
    compare_table([("gaps", (600, 400, 892), [600, 400, 892]), ("free", 1892, 1892), ("share", "28.7%", "28.6%")],
                  title="part two")  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "part two"
    assert out[2].rstrip().endswith("✓") and "[600, 400, 892]" in out[2]
    assert "1,892" in out[3] and out[4].rstrip().endswith("✗ differs")
    assert log() == [{"compare": "part two", "ok": False, "mismatches": ["share"]}]


@pytest.mark.parametrize("rows", [[], [("a", 1)], [("a", 1, 2, 3)], None])
def test_compare_table_rejects_malformed_rows(rows):
    with pytest.raises(InvalidArgumentError, match="rows must be"):
        compare_table(rows)


SERVER = "llama-server 0c1e57098 (tiny test model)"


def test_compare_table_gives_each_source_a_column_and_skips_what_a_source_does_not_give(log, capsys):
    compare_table(
        [("cache_n", 23, 23, None), ("prompt_n", 5, None, 6), ("blocks", (1, 2), [1, 2], [1, 2])],
        "turn two",
        sources=("lesson", SERVER),
        not_reproduced=[("access times", "kvlab models no clock"), ("hit rate at 1M users", "too slow")],
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "turn two"
    assert out[1].split() == ["figure", "kvlab", "lesson", *SERVER.split()]
    assert out[2].split()[-2:] == ["—", "✓"]  # the server does not give cache_n: not compared
    assert out[3].rstrip().endswith(f"✗ differs from {SERVER}") and "—" in out[3]
    assert out[4].rstrip().endswith("✓")
    assert out[5:] == [
        "  not reproduced by kvlab:",
        "    access times: kvlab models no clock",
        "    hit rate at 1M users: too slow",
    ]
    assert log() == [
        {"compare": "turn two", "ok": False, "mismatches": ["prompt_n"],
         "not_reproduced": ["access times", "hit rate at 1M users"]}
    ]  # fmt: skip


def test_compare_table_keeps_the_older_against_call(log, capsys):
    compare_table([("cache_n", 23, 23)], "server", against="server")
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["figure", "kvlab", "server"] and out[2].rstrip().endswith("✓")
    assert log() == [{"compare": "server", "ok": True, "mismatches": []}]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: compare_table([("a", 1, 1)], sources=("lesson", "server"), against="x"), "not both"),
        (lambda: compare_table([("a", 1, None)]), "no source gives"),
        (lambda: compare_table([("a", 1, 1)], sources=()), "1 to 4 sources"),
        (lambda: compare_table([("a", 1, 1, 1)], sources=("lesson", "lesson")), "distinct"),
        (lambda: compare_table([("a", 1, 1, 1)], sources=("lesson", "kvlab")), "distinct"),
        (lambda: compare_table([("a", 1, 1)], sources="lesson"), "sources must be"),
        (lambda: compare_table([("a", 1, 1)], sources=("x" * 61,)), "at most 60"),
        (lambda: compare_table([("a", 1, 1)], sources=("two\nlines",)), "one line"),
        (lambda: compare_table([("a", 1, 1, 2)]), "rows must be"),  # one source, two values
        (lambda: compare_table([("a", None, 1)]), "kvlab"),
        (lambda: compare_table([(1, 1, 1)]), "figure name"),
        (lambda: compare_table([("a", 1, 1)], title=""), "title"),
        (lambda: compare_table([("a", 1, 1)], not_reproduced=[("figure",)]), "pairs"),
        (lambda: compare_table([("a", 1, 1)], not_reproduced=[("figure", "")]), "reason"),
        (lambda: compare_table([("a", 1, 1)], not_reproduced="access times"), "not_reproduced must be"),
        (lambda: compare_table([("a", {1, 2}, 1)]), "number, a string, or a list"),
        (lambda: compare_table([("a", {(1, 2): 1}, 1)]), "keys of"),
        (lambda: compare_table([("a", 1, b"1")]), "number, a string, or a list"),
    ],
)
def test_compare_table_refuses_bad_input_and_prints_nothing(call, match, log, capsys):
    with pytest.raises(InvalidArgumentError, match=match):
        call()
    assert capsys.readouterr().out == "" and log() == []


def test_compare_table_never_lets_a_value_decide_it_agrees(log, capsys):
    from hostile import AlwaysEqual, LyingInt

    for liar in (AlwaysEqual(), [AlwaysEqual()], {0: AlwaysEqual()}):
        with pytest.raises(InvalidArgumentError, match="number, a string, or a list"):
            compare_table([("a", 1, liar)])
    compare_table([("a", LyingInt(3), 4)])  # an int subclass is read by its value, not its ==
    assert capsys.readouterr().out.rstrip().endswith("✗ differs")
    assert log() == [{"compare": "kvlab vs the lesson", "ok": False, "mismatches": ["a"]}]


WHERE = ["kvlab", "source", "label", "row", "missing", "title"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=all_hostile_values(), where=st.sampled_from(WHERE))
def test_compare_table_takes_or_refuses_hostile_values(value, where, capsys):
    capsys.readouterr()
    calls = {
        "kvlab": lambda: compare_table([("a", value, 1)]),
        "source": lambda: compare_table([("a", 1, value)]),
        "label": lambda: compare_table([("a", 1, 1)], sources=(value,)),
        "row": lambda: compare_table([value]),
        "missing": lambda: compare_table([("a", 1, 1)], not_reproduced=[value]),
        "title": lambda: compare_table([("a", 1, 1)], title=value),
    }
    if not kvlab_or_ok(calls[where]):
        assert capsys.readouterr().out == "", "a refused table printed something"


def test_instructors_page_is_up_to_date():
    from kvlab.exercises.instructors import render

    page = render()
    assert (ROOT / "docs" / "instructors.md").read_text() == page, (
        "docs/instructors.md is out of date: run python -m kvlab grade --instructors-doc docs/instructors.md"
    )
    for e in ex.exercises():
        assert (
            f"| {e.id} | {e.title} | {e.assesses} | {e.answer_type} | {e.difficulty} | {e.points} |" in page
        )
