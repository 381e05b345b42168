"""Predict first, then reveal: a guess is recorded only before its reveal, and neither call ever raises for it.

``predict`` is ``check`` for a prediction exercise: any well-formed guess is "right" (it earns its points
for being made), the log keeps it with ``before_reveal``, and a guess made once the reveal ran is "not
yet". ``reveal`` shows the guess beside kvlab's value and what to reread when it is off. The grader
grades a prediction like any value answer, from its own cell, in a fresh kernel (tests/exercises/
test_grader.py grades whole notebooks; here its ``evaluate`` is enough).
"""

from __future__ import annotations

import json

import pytest
from hostile import all_hostile_values
from hypothesis import HealthCheck, given, settings

import kvlab.exercises as ex
from kvlab.errors import InvalidArgumentError
from kvlab.exercises import core
from kvlab.exercises.core import Prediction, predict, reveal
from kvlab.exercises.plain import decode, encode


@pytest.fixture
def log(monkeypatch, tmp_path):
    path = tmp_path / "checks.jsonl"
    monkeypatch.setenv(core.LOG_ENV, str(path))
    return lambda: [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def guess_exercise():
    @ex.exercise(
        "99.1", title="Guess the count", assesses="a", minutes=2, answer_type="int", hints=["h1", "h2"],
        points=1, difficulty="intro", predicts=Prediction(reread="part two", within=2),
    )  # fmt: skip
    def guess(answer: int) -> str:
        if not 0 <= answer <= 100:
            raise ex.NotYet("A count from 0 to 100.")
        return "Recorded."

    @ex.exercise(
        "99.2", title="Pick one", assesses="a", minutes=2, answer_type="str", hints=["h"],
        points=1, difficulty="intro", predicts=Prediction(reread="part three"),
    )  # fmt: skip
    def pick(answer: str) -> None:
        if answer not in ("a", "b"):
            raise ex.NotYet("Pick 'a' or 'b'.")

    return "99.1"


def test_a_guess_before_the_reveal_is_recorded_and_shown_beside_the_value(guess_exercise, log, capsys):
    assert ex.get("99.1").kind == "prediction" and ex.get("01.3").kind == "function"
    assert predict("99.1", 40).right
    shown = reveal("99.1", 41)
    assert shown.on_mark is True and shown.prediction == 40 and "on the mark (within 2 of it)" in shown.text()
    assert log() == [
        {"id": "99.1", "status": "right", "message": "Recorded.", "prediction": 40, "before_reveal": True},
        {"reveal": "99.1", "prediction": 40, "value": 41, "on_mark": True},
    ]
    assert "kvlab gives 41" in capsys.readouterr().out


def test_an_off_guess_says_what_to_reread(guess_exercise):
    predict("99.1", 10)
    assert "off. Reread part two" in reveal("99.1", 41).text()
    predict("99.2", " b ")  # tidied as check tidies it
    assert reveal("99.2", "a").on_mark is False


def test_a_guess_after_the_reveal_does_not_count(guess_exercise, log):
    reveal("99.1", 41)
    late = predict("99.1", 41)
    assert late.status == ex.NOT_YET and "already on screen" in late.message
    assert log()[-1]["before_reveal"] is False and log()[-1]["prediction"] is None
    assert reveal("99.1", 41).prediction is None
    assert core._attempts.get("99.1", 0) == 0  # a late guess does not use up a hint


def test_the_latest_run_of_the_cell_is_the_prediction(guess_exercise):
    predict("99.1", 40)
    predict("99.1", ...)  # the cell was emptied and run again
    shown = reveal("99.1", 41)
    assert shown.prediction is None and "No prediction was recorded" in shown.text()
    assert "no prediction" in shown._repr_html_().lower() or "No prediction" in shown._repr_html_()


def test_check_on_a_prediction_exercise_records_it_too(guess_exercise):
    assert ex.check("99.1", 7).right
    assert reveal("99.1", 7).on_mark is True


def test_author_mistakes_raise_and_change_nothing(guess_exercise):
    with pytest.raises(InvalidArgumentError, match="01.2 is not a prediction"):
        predict("01.2", [1, 2])
    with pytest.raises(InvalidArgumentError, match="not a prediction"):
        reveal("01.2", 3)
    with pytest.raises(ex.UnknownExerciseError):
        predict("99.9", 3)
    with pytest.raises(InvalidArgumentError, match="value must be a whole number"):
        reveal("99.1", "41")
    assert "99.1" not in core._revealed  # a refused reveal reveals nothing
    for kwargs, words in [
        ({"predicts": "part two"}, "predicts must be a Prediction"),
        ({"predicts": lambda: Prediction(reread=" ")}, "reread must be a non-empty string"),
        ({"predicts": lambda: Prediction(reread="x", within=-1)}, "within must be a number >= 0"),
        ({"predicts": lambda: Prediction(reread="x", within=float("nan"))}, "within must be a number >= 0"),
        ({"predicts": lambda: Prediction(reread="x", digits=9)}, "digits must be an int from 0 to 6"),
        (
            {"predicts": lambda: Prediction(reread="x"), "answer_type": "list"},
            "answer_type must be one of int",
        ),
    ]:
        args = dict(title="t", assesses="a", minutes=1, answer_type="int", hints=["h"], points=1,
                    difficulty="core") | kwargs  # fmt: skip
        before = dict(core._REGISTRY)
        with pytest.raises(InvalidArgumentError, match=words):
            if callable(args["predicts"]):  # a faulty Prediction is refused where it is built
                args["predicts"] = args["predicts"]()
            ex.exercise("99.5", **args)(lambda a: None)
        assert before == core._REGISTRY


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(answer=all_hostile_values())
def test_hostile_guesses_never_raise_and_are_never_recorded_as_lies(answer, guess_exercise):
    core._predictions.clear()
    core._revealed.clear()
    result = predict("99.1", answer)
    assert result.status in (ex.RIGHT, ex.NOT_YET, ex.NOT_DONE)
    if result.right:  # only a plain int from 0 to 100 gets through, as itself
        assert type(core._predictions["99.1"]) is int and 0 <= core._predictions["99.1"] <= 100
    shown = reveal("99.1", 50)
    assert shown.text() and shown._repr_html_()
    verdict = ex.evaluate(ex.get("99.1"), decode(encode(answer)))  # what the grader would check
    assert verdict.status == result.status or result.status != ex.RIGHT


def test_the_courses_predictions_are_registered_with_what_to_reread():
    predictions = [e for e in ex.exercises() if e.kind == "prediction"]
    assert predictions and all(e.prediction.reread.strip() for e in predictions)
    assert "15.1" in {e.id for e in predictions}


def _prediction_notebook(answer: str):
    import nbformat

    cells = [
        nbformat.v4.new_code_cell("from kvlab.exercises.core import predict, reveal"),
        nbformat.v4.new_code_cell(f"answer = {answer}\npredict('15.1', answer)", metadata={"kvlab": {"exercise": "15.1"}}),
        nbformat.v4.new_code_cell("reveal('15.1', 92.7)\nanswer = 92.7  # changing it after the reveal changes nothing"),
    ]  # fmt: skip
    return nbformat.v4.new_notebook(cells=cells)


def test_the_grader_grades_the_prediction_as_it_stood_before_the_reveal(tmp_path):
    import nbformat

    from kvlab.exercises.grading import Limits, grade_notebook

    limits = Limits(timeout=90, cell_timeout=20, function_seconds=5, memory_mib=2048)
    rows = {}
    for student, answer in (("ada", "40"), ("bo", "140")):
        path = tmp_path / f"{student}_15_fleet_prefix_caching.ipynb"
        nbformat.write(_prediction_notebook(answer), path)
        rows[student] = {r.exercise: r for r in grade_notebook(student, path, limits=limits)}
    ada, bo = rows["ada"]["15.1"], rows["bo"]["15.1"]
    assert (ada.status, ada.points) == (ex.RIGHT, 2) and "Your guess, 40%, is kept" in ada.feedback
    assert (bo.status, bo.points) == (ex.NOT_YET, 0) and "not a percentage" in bo.feedback
    assert rows["ada"]["15.2"].status == "missing"  # the other exercises' cells are not in this notebook


def test_a_prediction_made_below_its_reveal_is_not_graded_right(tmp_path):
    import nbformat

    from kvlab.exercises.grading import Limits, grade_notebook

    nb = _prediction_notebook("40")
    nb.cells[1], nb.cells[2] = nb.cells[2], nb.cells[1]  # the reveal first, then the "prediction"
    path = tmp_path / "cy_15_fleet_prefix_caching.ipynb"
    nbformat.write(nb, path)
    limits = Limits(timeout=90, cell_timeout=20, function_seconds=5, memory_mib=2048)
    row = {r.exercise: r for r in grade_notebook("cy", path, limits=limits)}["15.1"]
    assert (row.status, row.points) == (ex.NOT_YET, 0) and "comes after its reveal" in row.feedback


def test_a_recorded_guess_does_not_look_like_a_right_answer(guess_exercise):
    core._predictions.clear()
    core._revealed.clear()
    result = predict("99.1", 0)
    assert result.right  # it earns its points ...
    assert "recorded" in result.text() and "✓" not in result.text() and "right" not in result.text()
    assert "Prediction recorded" in result._repr_html_() and "Right" not in result._repr_html_()
    assert "✗" in predict("99.1", 140).text()  # ... and a refused guess still says why, as check does


def test_an_off_guess_is_told_the_slip_the_exercise_names():
    def slip(guess, value):
        return "That is the cap." if guess == 160 else None

    @ex.exercise(
        "99.3", title="Count", assesses="a", minutes=2, answer_type="int", hints=["h"], points=1,
        difficulty="intro", predicts=Prediction(reread="part four", slip=slip),
    )  # fmt: skip
    def count(answer: int) -> None:
        return None

    predict("99.3", 160)
    assert "off. That is the cap. Reread part four" in reveal("99.3", 144).text()
    core._revealed.discard("99.3")
    predict("99.3", 150)
    assert "off. Reread part four" in reveal("99.3", 144).text()
    with pytest.raises(InvalidArgumentError, match="slip"):
        ex.exercise("99.4", title="t", assesses="a", minutes=2, answer_type="int", hints=["h"], points=1,
                    difficulty="intro", predicts=Prediction(reread="r", slip="not a function"))  # fmt: skip
