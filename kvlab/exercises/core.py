"""The exercise registry and ``check``: the part every notebook's exercises share.

An exercise is registered once, by the module of its notebook
(``kvlab/exercises/nbNN.py``), with the ``@exercise`` decorator on its checker.
A checker receives the student's answer, already converted to the declared
``answer_type``, computes the expected answer with kvlab's own models, and
either returns (the answer is right; a returned string is shown as a remark)
or raises ``NotYet`` with a message that says what to look at.

``check`` turns every outcome into a ``Result`` and shows it; it never lets an
exception from an answer escape, because a student's unfinished or wrong work
must never end in a traceback. The only error it raises is for an exercise id
that does not exist, which is the notebook author's mistake, not the student's.

Every answer first goes through ``kvlab.exercises.plain`` (exact built-in
types, no student method called); a submitted function is wrapped so that each
call is time-limited, its printing is swallowed, an exit is caught, and what it
returns is converted the same way. A checker therefore only ever sees plain
data, here and in the grader (``kvlab/exercises/grading.py``), which runs the
same checkers outside the student's kernel.

A *prediction* exercise (registered with ``predicts=Prediction(...)``) asks for
a guess before a cell shows the real value: ``predict(id, answer)`` records the
guess (the log keeps it, and whether it came before the reveal), and
``reveal(id, value)`` shows it beside kvlab's value, with what to reread when
it is off (and the likely slip, when the exercise names one: ``Prediction.slip``). An accepted guess
keeps the status "right" but is shown as "recorded" with a neutral mark (``RecordedGuess``). Its checker only refuses what is not a prediction (a percentage of
140, a choice that does not exist), so a guess earns its points for being made
before the reveal, never for being right: there is nothing to gain by editing
it afterwards, and the exercises that follow it are graded for correctness.

Kept as one module (about 730 lines): registering, converting, checking,
predicting and revealing share the one registry, the one conversion of an
answer and the per-kernel state (hints seen, predictions made, values
revealed); split, each part would reach into the others' internals.
"""

from __future__ import annotations

import contextlib
import html
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import InvalidArgumentError, brief
from kvlab.exercises.guard import PRINT_LIMIT, Capped, TimeUp, deadline, what_was_raised
from kvlab.exercises.plain import Opaque, describe, plain, tidy
from kvlab.exercises.plain import name_in as name_in  # the checkers import it from here
from kvlab.exercises.result import NOT_DONE as NOT_DONE
from kvlab.exercises.result import NOT_YET as NOT_YET
from kvlab.exercises.result import RIGHT as RIGHT
from kvlab.exercises.result import Result, ShownOnce
from kvlab.lessons.log import LOG_ENV as LOG_ENV  # the tests and the grader name it here too
from kvlab.lessons.log import log_event

_ID = re.compile(r"(\d\d)\.([1-9]\d*)")


class UnknownExerciseError(InvalidArgumentError, LookupError):
    """``check`` was given an exercise id that no notebook registered (a wrong argument, so an
    ``InvalidArgumentError``; a ``LookupError`` too, as a failed lookup)."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0]) if self.args else ""


class NotYet(Exception):
    """Raised by a checker when the answer is wrong; the message is shown to the student."""


class _NotDone(Exception):
    """The answer (or what a submitted function returned) is still the ``...`` placeholder."""


class _Refused(Exception):
    """The answer does not have the declared type; the message says why (it does not use up a hint)."""


# How each answer_type is described and converted. A converter gets the answer as
# plain data (``plain``) and returns it in the declared type or raises _Refused.
def _whole_float(a: Any) -> bool:
    return type(a) is float and a.is_integer() and abs(a) <= 2**53


def _quoted(a: Any, what: str) -> _Refused:
    if str.endswith(str.strip(a), "%"):  # "34.8%": the sign has to go as well as the quotes
        return _Refused(
            f"you gave str {describe(a)}, text in quotes; write {what} without the quotes and without "
            "the % sign, e.g. 34.8."
        )
    return _Refused(f"you gave str {describe(a)}, text in quotes; write {what} without the quotes.")


def _as_int(a: Any) -> int:
    if type(a) is int:
        return a
    if _whole_float(a):
        return int(a)  # 8192 / 2048 is 4.0: a human grader reads it as 4
    if type(a) is float:
        raise _Refused(f"you gave float {a!r}, which is not a whole number.")
    if type(a) is str:
        raise _quoted(a, "the number")
    raise _Refused("")


def _as_number(a: Any) -> float:
    if type(a) is int and a.bit_length() > 1023:  # past any float: float(a) would raise OverflowError
        with contextlib.suppress(OverflowError):
            return float(a)
        raise _Refused(f"you gave {brief(a)}, a number out of range: it is larger than any float.")
    if type(a) in (int, float):
        return float(a)
    if type(a) is str:
        raise _quoted(a, "the number")
    raise _Refused("")


def _as_list(a: Any) -> list:
    if type(a) in (list, tuple):
        return list(a)
    if type(a) is str:
        raise _Refused("a string is not a list; put the items in [ ].")
    raise _Refused("")


def _exact(kind: type) -> Callable[[Any], Any]:
    def convert(a: Any) -> Any:
        if type(a) is kind:
            return a
        raise _Refused("")

    return convert


def _as_function(a: Any) -> Callable[..., Any]:
    if callable(a) and not isinstance(a, (Opaque, type)):
        return a
    raise _Refused("")


_TYPES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "int": ("a whole number, such as 3", _as_int),
    "number": ("a number, such as 3 or 2.5", _as_number),
    "str": ("a string in quotes, such as 'internal'", _exact(str)),
    "bool": ("True or False", _exact(bool)),
    "list": ("a list, such as [1, 2, 3]", _as_list),
    "dict": ("a dict, such as {'a': 1}", _exact(dict)),
    "function": ("a function (write `def name(...):` and pass the name, without calling it)", _as_function),
}  # fmt: skip

DIFFICULTIES = ("intro", "core", "stretch")
PREDICTION_TYPES = ("int", "number", "str", "bool")  # what a guess can be: a number or one choice
TRUSTED_FUNCTIONS: set[type] = set()  # callables that time-limit a student's function and return plain data
FUNCTION_SECONDS = 10.0  # all the calls one check makes of a student's function, together


@dataclass(frozen=True)
class Prediction:
    """What the reveal of a prediction exercise needs: when a guess is on the mark, what to reread if not."""

    reread: str  # the part of the notebook that explains the value, e.g. "'Where a timestamp goes'"
    within: float = 0.0  # a number guess this close to the value is on the mark (a choice must be equal)
    unit: str = ""  # printed after numbers, e.g. "%"
    digits: int = 1  # decimals a float is shown with
    slip: Callable[[Any, Any], str | None] | None = field(default=None, compare=False)
    """For an off guess: ``slip(guess, value)`` names the likely slip behind it (None: only "reread")."""

    def __post_init__(self) -> None:
        fault = _prediction_fault(self)  # a faulty Prediction is refused where it is written
        if fault:
            raise InvalidArgumentError(fault)


@dataclass(frozen=True)
class Exercise:
    """One registered exercise; ``docs/instructors.md`` is generated from these fields."""

    id: str  # "NN.k": notebook NN, k-th exercise
    title: str
    assesses: str  # what a right answer shows the student can do
    minutes: int  # a typical student's time
    answer_type: str  # a key of _TYPES
    hints: tuple[str, ...]  # gentlest first; each "not yet" reveals the next one
    checker: Callable[..., str | None] = field(repr=False, compare=False)
    points: int = 1  # what the exercise is worth when graded
    difficulty: str = "core"  # one of DIFFICULTIES
    prerequisites: tuple[str, ...] = ()  # exercise ids a student should have done first
    cases: Callable[[random.Random | None], list[Any]] | None = field(default=None, repr=False, compare=False)
    prediction: Prediction | None = None  # set for a predict-then-reveal exercise

    @property
    def kind(self) -> str:
        """ "prediction" (graded for being made before the reveal), "function" or "value"."""
        if self.prediction is not None:
            return "prediction"
        return "function" if self.answer_type == "function" else "value"

    @property
    def notebook(self) -> str:
        return self.id.split(".")[0]

    @property
    def number(self) -> int:
        return int(self.id.split(".")[1])

    @property
    def expects(self) -> str:
        return _TYPES[self.answer_type][0]

    def draw_cases(self, rng: random.Random | None = None) -> list[Any] | None:
        """A function exercise's cases: the notebook's (``rng`` None) or the notebook's plus fresh ones."""
        return None if self.cases is None else self.cases(rng)


def _order(exercise_id: str) -> tuple[int, int]:
    nb, k = exercise_id.split(".")
    return int(nb), int(k)


_REGISTRY: dict[str, Exercise] = {}
_attempts: dict[str, int] = {}  # "not yet" results so far per exercise, to reveal hints one by one


def exercise(
    exercise_id: str,
    *,
    title: str,
    assesses: str,
    minutes: int,
    answer_type: str,
    hints: list[str] | tuple[str, ...],
    points: int,
    difficulty: str,
    prerequisites: list[str] | tuple[str, ...] = (),
    cases: Callable[[random.Random | None], list[Any]] | None = None,
    predicts: Prediction | None = None,
) -> Callable[[Callable[..., str | None]], Callable[..., str | None]]:
    """Register the decorated function as the checker of ``exercise_id``.

    The checker gets the answer converted to ``answer_type`` (one of int,
    number, str, bool, list, dict, function), as plain data. It returns None
    or a remark when the answer is right and raises ``NotYet("what to look
    at")`` when it is not. ``points``, ``difficulty`` (intro, core, stretch)
    and ``prerequisites`` are the teaching data docs/instructors.md and the
    grader use. A function exercise may declare ``cases(rng)``: the argument
    cases the checker tries, the notebook's when ``rng`` is None, the
    notebook's plus fresh hidden ones drawn from ``rng`` when grading; its
    checker is then called as ``checker(answer, cases)``. ``predicts`` makes
    it a prediction exercise (see ``predict`` and ``reveal``): its answer_type
    is one of int, number, str, bool, and its checker refuses only what is
    not a prediction.
    """
    if not isinstance(exercise_id, str) or not _ID.fullmatch(exercise_id):
        raise InvalidArgumentError(
            f"exercise id must look like '07.2' (notebook.number), got {exercise_id!r}"
        )
    if exercise_id in _REGISTRY:
        raise InvalidArgumentError(
            f"exercise {exercise_id} is registered twice; give the new one the next number"
        )
    for name, value in (("title", title), ("assesses", assesses)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidArgumentError(f"exercise {exercise_id}: {name} must be a non-empty string")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 120:
        raise InvalidArgumentError(
            f"exercise {exercise_id}: minutes must be an int from 1 to 120, got {minutes!r}"
        )
    if answer_type not in _TYPES:
        raise InvalidArgumentError(
            f"exercise {exercise_id}: answer_type must be one of {', '.join(_TYPES)}, got {answer_type!r}"
        )
    if isinstance(hints, str) or not hints or not all(isinstance(h, str) and h.strip() for h in hints):
        raise InvalidArgumentError(f"exercise {exercise_id}: hints must be a non-empty list of strings")
    if isinstance(points, bool) or not isinstance(points, int) or not 1 <= points <= 20:
        raise InvalidArgumentError(
            f"exercise {exercise_id}: points must be an int from 1 to 20, got {points!r}"
        )
    if difficulty not in DIFFICULTIES:
        raise InvalidArgumentError(
            f"exercise {exercise_id}: difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}"
        )
    if isinstance(prerequisites, str) or not all(
        isinstance(p, str) and _ID.fullmatch(p) and _order(p) < _order(exercise_id) for p in prerequisites
    ):
        raise InvalidArgumentError(
            f"exercise {exercise_id}: prerequisites must be a list of earlier exercise ids, got {prerequisites!r}"
        )
    if cases is not None and (answer_type != "function" or not callable(cases)):
        raise InvalidArgumentError(
            f"exercise {exercise_id}: only a function exercise takes cases=, a callable"
        )

    if predicts is not None:
        _check_prediction(exercise_id, answer_type, predicts)

    def register(checker: Callable[..., str | None]) -> Callable[..., str | None]:
        _REGISTRY[exercise_id] = Exercise(
            exercise_id, title, assesses, minutes, answer_type, tuple(hints), checker,
            points, difficulty, tuple(prerequisites), cases, predicts,
        )  # fmt: skip
        return checker

    return register


def _check_prediction(exercise_id: str, answer_type: str, predicts: object) -> None:
    if not isinstance(predicts, Prediction):
        raise InvalidArgumentError(f"exercise {exercise_id}: predicts must be a Prediction")
    if answer_type not in PREDICTION_TYPES:
        raise InvalidArgumentError(
            f"exercise {exercise_id}: a prediction's answer_type must be one of {', '.join(PREDICTION_TYPES)}"
        )
    fault = _prediction_fault(predicts)
    if fault:
        raise InvalidArgumentError(f"exercise {exercise_id}: {fault}")


def _prediction_fault(p: Prediction) -> str:
    """What is wrong with ``p``'s fields, or "": ``exercise(..., predicts=p)`` refuses a faulty one."""
    if not isinstance(p.reread, str) or not str.strip(p.reread):
        return f"Prediction.reread must be a non-empty string, got {brief(p.reread)}"
    within = p.within
    try:
        finite = type(within) in (int, float) and math.isfinite(float(within)) and within >= 0
    except OverflowError:  # an int past any float: the reveal could not print it
        finite = False
    if not finite:
        return f"Prediction.within must be a number >= 0, finite (an int or a float), got {brief(within)}"
    if not isinstance(p.unit, str) or len(str.__str__(p.unit)) > 12:
        return f"Prediction.unit must be a string of at most 12 characters, got {brief(p.unit)}"
    if p.slip is not None and not callable(p.slip):
        return f"Prediction.slip must be a function or None, got {brief(p.slip)}"
    if type(p.digits) is not int or not 0 <= p.digits <= 6:
        return f"Prediction.digits must be an int from 0 to 6, got {brief(p.digits)}"
    return ""


def get(exercise_id: str) -> Exercise:
    """The registered exercise ``exercise_id``; ``UnknownExerciseError`` names the ones that exist."""
    if not isinstance(exercise_id, str):
        raise UnknownExerciseError(f"an exercise id is a string like '01.2', got {brief(exercise_id)}")
    exercise_id = str.__str__(exercise_id)  # plain text: a subclass's own __hash__ never runs
    try:
        return _REGISTRY[exercise_id]
    except KeyError:
        nb = exercise_id.split(".")[0]
        same = [e.id for e in exercises(nb)] if _ID.fullmatch(exercise_id) else []
        known = (
            f"notebook {nb} has {', '.join(same)}" if same else f"known ids: {', '.join(_REGISTRY) or 'none'}"
        )
        raise UnknownExerciseError(f"unknown exercise {brief(exercise_id)}; {known}") from None


def exercises(notebook: str | None = None) -> list[Exercise]:
    """Registered exercises in course order, all or those of ``notebook`` ("01")."""
    chosen = [e for e in _REGISTRY.values() if notebook is None or e.notebook == notebook]
    return sorted(chosen, key=lambda e: (e.notebook, e.number))


# ---------------------------------------------------------------- checking


def _has_placeholder(answer: Any, depth: int = 0) -> bool:
    """Whether a plain answer still holds the ``...`` placeholder (looked for 4 levels deep)."""
    if answer is ...:
        return True
    if depth >= 4:
        return False
    if type(answer) in (list, tuple, set):
        return any(_has_placeholder(a, depth + 1) for a in answer)
    if type(answer) is dict:
        return any(_has_placeholder(a, depth + 1) for a in answer.values())
    return False


class StudentFunction:
    """A student's function as a checker calls it: time-limited, quiet, never exiting, returning plain data.

    One instance serves one check: all its calls share ``seconds``. What the function printed is kept
    (``printed``) up to ``PRINT_LIMIT`` characters.
    """

    def __init__(self, function: Callable[..., Any], seconds: float | None = None) -> None:
        self.function = function
        self.seconds = FUNCTION_SECONDS if seconds is None else seconds
        self.deadline = time.monotonic() + self.seconds
        self.out = Capped()
        self.__name__ = "your function"

    def __call__(self, *args: Any) -> Any:
        left = self.deadline - time.monotonic()
        shown = ", ".join(brief(a, 40) for a in args)
        if left <= 0:
            raise NotYet(f"your function ran out of time ({self.seconds:g} s for the whole check)")
        try:
            with deadline(left), contextlib.redirect_stdout(self.out), contextlib.redirect_stderr(self.out):
                out = self.function(*args)
                return plain(out)  # inside the deadline: a huge answer cannot stall the check either
        except TimeUp:
            raise NotYet(
                f"your function did not return within {self.seconds:g} s (called with {shown}); "
                "is there a loop that never ends?"
            ) from None
        except SystemExit:
            raise NotYet(
                f"your function called sys.exit() or exit() (called with {shown}); return a value instead"
            ) from None
        except NotYet:
            raise
        except BaseException as exc:  # the student's code: report it, never raise it
            raise NotYet(f"your function raised {what_was_raised(exc)} (called with {shown})") from None

    @property
    def printed(self) -> str:
        text = "".join(self.out.kept)
        return text + (
            f"\n[... {self.out.size - PRINT_LIMIT:,} more characters]" if self.out.size > PRINT_LIMIT else ""
        )


def call(function: Callable[..., Any], *args: Any) -> Any:
    """Call a student's function from a checker: its errors become ``NotYet``, ``...`` means not done."""
    try:
        out = function(*args)
    except NotYet:
        raise
    except Exception as exc:  # the student's code: report it, never raise it
        shown = ", ".join(brief(a) for a in args)
        raise NotYet(f"your function raised {what_was_raised(exc)} (called with {shown})") from None
    if out is ...:
        raise _NotDone
    return out


def call_for_list(function: Callable[..., Any], what: str, *args: Any) -> list[Any]:
    """``call`` for a function that must return a list (a tuple is accepted); ``what`` names the list."""
    got = call(function, *args)
    if not isinstance(got, (list, tuple)):
        raise NotYet(f"Return {what}; got {type(got).__name__}.")
    return list(got)


def whole(value: Any) -> bool:
    """Whether ``value`` is a whole number as an item of a list answer needs it: an int, not a bool.

    (A whole-number answer on its own accepts an integral float such as ``8192 / 2048``; see ``_as_int``.)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def all_whole(values: Any) -> bool:
    """Whether every item of ``values`` is ``whole`` (True for no items)."""
    return all(whole(v) for v in values)


def expect_two_whole(answer: list[Any], what: str) -> None:
    """``NotYet`` unless ``answer`` is two whole numbers; ``what`` says which, e.g. ``"[cache_n, prompt_n]"``."""
    if len(answer) != 2 or not all_whole(answer):
        raise NotYet(f"Give two whole numbers: {what}.")


@dataclass(frozen=True)
class Verdict:
    """What ``evaluate`` found: status, message, and whether it counts as a try (uses up a hint)."""

    status: str
    message: str
    counts: bool = True


def evaluate(ex: Exercise, answer: Any, cases: list[Any] | None = None) -> Verdict:
    """The verdict on ``answer`` (any object, or a grader's stand-in function); never raises.

    ``cases`` replaces the notebook's cases of a function exercise (the grader's hidden ones).
    """
    return _evaluate_keeping(ex, answer, cases)[0]


def _evaluate_keeping(ex: Exercise, answer: Any, cases: list[Any] | None) -> tuple[Verdict, Any]:
    """The verdict, and the answer as the checker saw it (None when it never got that far)."""
    seen: list[Any] = [None]
    try:
        return _evaluate(ex, answer, cases, seen), seen[0]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # nothing a student hands in may end in a traceback
        return Verdict(NOT_YET, f"This answer could not be checked ({what_was_raised(exc)}).", False), None


def _evaluate(ex: Exercise, answer: Any, cases: list[Any] | None, seen: list[Any]) -> Verdict:
    done_msg = "Replace every ... with your answer, then run the cell again."
    function = ex.answer_type == "function"
    value = answer if function and callable(answer) else plain(answer)
    if value is None or _has_placeholder(value):
        return Verdict(NOT_DONE, done_msg)
    try:
        converted = _TYPES[ex.answer_type][1](tidy(value))
    except _Refused as why:
        gave = (
            f"{type(value).__name__} {describe(value)}"
            if not isinstance(value, Opaque)
            else repr(value)[1:-1]
        )
        said = str(why) or f"you gave {gave}."
        return Verdict(NOT_YET, f"This exercise expects {ex.expects}: {said}", False)
    seen[0] = converted
    trusted = type(converted) in TRUSTED_FUNCTIONS  # the grader's stand-in: limited and plain already
    guarded = StudentFunction(converted) if function and not trusted else None
    if trusted:
        guarded = converted
    try:
        if guarded is not None and ex.cases is not None:
            remark = ex.checker(guarded, cases if cases is not None else ex.draw_cases(None))
        else:
            remark = ex.checker(guarded if guarded is not None else converted)
    except _NotDone:
        return Verdict(NOT_DONE, "Your function still returns ...: write its body, then run the cell again.")
    except NotYet as exc:
        return Verdict(NOT_YET, _said(exc) + _printed(guarded))
    except Exception as exc:  # a malformed answer the checker did not foresee
        return Verdict(
            NOT_YET, f"This answer could not be checked ({what_was_raised(exc)}); expected {ex.expects}."
        )
    return Verdict(RIGHT, remark if isinstance(remark, str) else "Well done.")


def _said(exc: NotYet) -> str:
    text = exc.args[0] if exc.args else ""
    return text if type(text) is str else "Not yet."


def _printed(guarded: Any) -> str:
    if not isinstance(guarded, StudentFunction) or not guarded.out.size:
        return ""
    return f" (Your function printed {guarded.out.size:,} characters; they are not shown here.)"


def check(exercise_id: str, answer: Any) -> Result:
    """Check ``answer`` for exercise ``exercise_id``, show the verdict and return it.

    A wrong answer is "not yet" with a hint (the next one on each try; an
    answer of the wrong type shows the current hint without using it up), an
    answer still holding ``...`` (or None) is "not done yet". Only an unknown
    exercise id raises (``UnknownExerciseError``).
    """
    ex = get(exercise_id)
    if ex.prediction is not None:
        return predict(exercise_id, answer)
    return _show(ex, evaluate(ex, answer))


def _show(ex: Exercise, verdict: Verdict, kind: type[Result] = Result, **logged: Any) -> Result:
    """The verdict as a ``kind`` of ``Result`` with its hint (a counted try reveals the next), logged and shown."""
    hint = None
    if verdict.status == NOT_YET:
        tries = _attempts.get(ex.id, 0)
        if verdict.counts:
            _attempts[ex.id] = tries + 1
        hint = ex.hints[min(tries, len(ex.hints) - 1)]
    result = kind(ex.id, ex.title, verdict.status, verdict.message, hint)
    log_event({"id": ex.id, "status": verdict.status, "message": verdict.message, **logged})
    result.show()
    return result


def hint(exercise_id: str) -> None:
    """Show the next hint of an exercise without checking an answer."""
    ex = get(exercise_id)
    tries = _attempts.get(ex.id, 0)
    _attempts[ex.id] = tries + 1
    text = ex.hints[min(tries, len(ex.hints) - 1)]
    print(f"Hint for {ex.id} ({min(tries, len(ex.hints) - 1) + 1} of {len(ex.hints)}): {text}")


# ---------------------------------------------------------------- predict first, then reveal

_predictions: dict[str, Any] = {}  # exercise id -> the guess predict() recorded in this kernel
_revealed: set[str] = set()  # exercise ids whose value reveal() has shown in this kernel

_TOO_LATE = (
    "kvlab's value is already on screen (the reveal cell below this one ran), and a prediction counts "
    "only when it is made before it. Restart the kernel (Kernel > Restart), write your guess here, run "
    "this cell, then the reveal."
)


def _prediction_exercise(exercise_id: str, what: str) -> Exercise:
    ex = get(exercise_id)
    if ex.prediction is None:
        raise InvalidArgumentError(
            f"exercise {ex.id} is not a prediction; {what} is for predict-then-reveal exercises "
            f"(check({ex.id!r}, answer) checks this one)"
        )
    return ex


def predict(exercise_id: str, answer: Any) -> Result:
    """Record ``answer`` as the guess for prediction exercise ``exercise_id``, before its reveal.

    The verdict is "right" for any well-formed guess made before ``reveal`` showed the value in this
    kernel, "not yet" for one made after it (or for something that is not a guess, such as a
    percentage of 140), "not done yet" while the answer is ``...``. The log record keeps the guess
    and ``before_reveal``. Never raises for an answer; an unknown id, or an exercise that is not a
    prediction, is the notebook author's mistake and raises.
    """
    ex = _prediction_exercise(exercise_id, "predict")
    _predictions.pop(ex.id, None)  # the cell as it is now is the prediction; an earlier run is replaced
    before = ex.id not in _revealed
    if before:
        verdict, guess = _evaluate_keeping(ex, answer, None)
    else:
        verdict, guess = Verdict(NOT_YET, _TOO_LATE, False), None
    if verdict.status == RIGHT:
        _predictions[ex.id] = guess
    recorded = guess if verdict.status == RIGHT else None
    return _show(ex, verdict, RecordedGuess, prediction=recorded, before_reveal=before)


class RecordedGuess(Result):
    """What ``predict`` shows. An accepted guess keeps the status "right" (it earns its points) but is shown
    with a neutral mark as "recorded": a guess is not yet known to be right, and must not look it."""

    def text(self) -> str:
        if self.status != RIGHT:
            return super().text()
        return f"• {self.exercise_id} {self.title}: recorded. {self.message}".rstrip()

    def _repr_html_(self) -> str:
        if self.status != RIGHT:
            return super()._repr_html_()
        return (
            "<div style='border-left:4px solid #0969da;padding:4px 10px;margin:4px 0'>"
            f"<b style='color:#0969da'>&#9679; Prediction recorded</b> &middot; {html.escape(self.exercise_id)} "
            f"{html.escape(self.title)}<div>{html.escape(self.message)}</div></div>"
        )


@dataclass
class Reveal(ShownOnce):
    """What ``reveal`` shows: the guess made before it (or None), kvlab's value, and whether they agree."""

    exercise_id: str
    title: str
    prediction: Any  # None when no guess was recorded before the reveal
    value: Any
    on_mark: bool | None  # None without a prediction
    text_value: str
    text_prediction: str
    reread: str
    within: str
    slip: str = ""  # for an off guess: the likely slip behind it, when the exercise names one
    _shown: bool = field(default=False, repr=False, compare=False)

    def remark(self) -> str:
        """What the reveal says about the guess: none, on the mark, or off and what to reread."""
        if self.on_mark is None:
            return (
                "No prediction was recorded before this cell ran (the prediction cell above was not run, "
                "still holds ..., or was not accepted). Next time write a guess first: a wrong guess, then "
                "the reason, is what sticks."
            )
        if self.on_mark:
            return f"Your prediction, {self.text_prediction}, is on the mark{self.within}."
        slip = f" {self.slip}" if self.slip else ""
        return f"Your prediction was {self.text_prediction}: off.{slip} Reread {self.reread}, then say why."

    def text(self) -> str:
        return f"{self.exercise_id} {self.title}: kvlab gives {self.text_value}. {self.remark()}"

    def _repr_html_(self) -> str:
        color = {None: "#57606a", True: "#1a7f37", False: "#bc4c00"}[self.on_mark]
        mark = {None: "No prediction", True: "On the mark", False: "Off"}[self.on_mark]
        guess = self.text_prediction if self.on_mark is not None else "none"
        rows = "".join(
            f"<tr><td style='padding-right:12px'>{a}</td><td><b>{html.escape(b)}</b></td></tr>"
            for a, b in (("kvlab", self.text_value), ("your prediction", guess))
        )
        return (
            f"<div style='border-left:4px solid {color};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{color}'>{mark}</b> &middot; {html.escape(self.exercise_id)} "
            f"{html.escape(self.title)}<table>{rows}</table><div>{html.escape(self.remark())}</div></div>"
        )


def _shown_value(value: Any, p: Prediction) -> str:
    if type(value) is float:
        return f"{value:,.{p.digits}f}{p.unit}"
    if type(value) is int:
        return f"{value:,}{p.unit}"
    return describe(value, 80)


def _on_mark(answer_type: str, guess: Any, value: Any, p: Prediction) -> bool:
    if answer_type in ("int", "number"):
        return abs(guess - value) <= p.within
    return guess == value


def _slip(p: Prediction, guess: Any, value: Any) -> str:
    """What the exercise's ``slip`` says about an off guess ("" when it has none or fails)."""
    if p.slip is None:
        return ""
    try:
        said = p.slip(guess, value)
    except Exception:  # the exercise's own helper: a fault in it must not hide the reveal
        return ""
    return said if isinstance(said, str) else ""


def reveal(exercise_id: str, value: Any) -> Reveal:
    """Show kvlab's ``value`` for prediction exercise ``exercise_id`` beside the guess recorded before it.

    ``value`` is what the notebook computed (the notebook's, not the student's: a value that does not
    have the exercise's answer_type is the author's mistake and raises ``InvalidArgumentError``).
    From now on in this kernel a new ``predict`` for the exercise no longer counts. The reveal is
    logged (``{"reveal": id, "prediction", "value", "on_mark"}``) and shown.
    """
    ex = _prediction_exercise(exercise_id, "reveal")
    p = ex.prediction
    assert p is not None
    try:
        value = _TYPES[ex.answer_type][1](tidy(plain(value)))
    except _Refused:
        raise InvalidArgumentError(
            f"reveal({ex.id!r}, value): value must be {ex.expects}, got {brief(value)}"
        ) from None
    _revealed.add(ex.id)
    guess = _predictions.get(ex.id)
    on_mark = None if guess is None else _on_mark(ex.answer_type, guess, value, p)
    unit = " points" if p.unit == "%" else p.unit  # a percentage's distance is in percentage points
    within = f" (within {p.within:g}{unit} of it)" if p.within and ex.answer_type in ("int", "number") else ""
    slip = _slip(p, guess, value) if on_mark is False else ""
    shown = Reveal(ex.id, ex.title, guess, value, on_mark, _shown_value(value, p),
                   "none" if guess is None else _shown_value(guess, p), p.reread, within, slip)  # fmt: skip
    log_event({"reveal": ex.id, "prediction": guess, "value": value, "on_mark": on_mark})
    shown.show()
    return shown
