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
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import InvalidArgumentError, KvlabError, brief
from kvlab.lessons.log import LOG_ENV as LOG_ENV  # the tests and the grader name it here too
from kvlab.lessons.log import log_event

RIGHT = "right"
NOT_YET = "not yet"
NOT_DONE = "not done yet"


_ID = re.compile(r"(\d\d)\.([1-9]\d*)")


class UnknownExerciseError(KvlabError, LookupError):
    """``check`` was given an exercise id that no notebook registered."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0]) if self.args else ""


class NotYet(Exception):
    """Raised by a checker when the answer is wrong; the message is shown to the student."""


class _NotDone(Exception):
    """The answer (or what a submitted function returned) is still the ``...`` placeholder."""


# How each answer_type is described and converted. A converter returns the
# answer in the declared type or None when the answer does not have that type.
def _as_int(a: Any) -> int | None:
    if isinstance(a, bool):
        return None
    if isinstance(a, int):
        return a
    if hasattr(a, "dtype") and getattr(a, "shape", None) == () and a.dtype.kind in "iu":
        return int(a)  # a numpy integer
    return None


def _as_number(a: Any) -> float | None:
    if isinstance(a, bool):
        return None
    if isinstance(a, (int, float)):
        return float(a)
    if hasattr(a, "dtype") and getattr(a, "shape", None) == () and a.dtype.kind in "iuf":
        return float(a)
    return None


def _as_list(a: Any) -> list | None:
    if isinstance(a, (list, tuple)):
        return list(a)
    if hasattr(a, "tolist") and getattr(a, "ndim", 0) == 1:
        return list(a.tolist())
    return None


_TYPES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "int": ("a whole number, such as 3", _as_int),
    "number": ("a number, such as 3 or 2.5", _as_number),
    "str": ("a string in quotes, such as 'internal'", lambda a: a if isinstance(a, str) else None),
    "bool": ("True or False", lambda a: a if isinstance(a, bool) else None),
    "list": ("a list, such as [1, 2, 3]", _as_list),
    "dict": ("a dict, such as {'a': 1}", lambda a: a if isinstance(a, dict) else None),
    "function": ("a function (write `def name(...):` and pass the name, without calling it)",
                 lambda a: a if callable(a) else None),
}  # fmt: skip


@dataclass(frozen=True)
class Exercise:
    """One registered exercise; ``docs/instructors.md`` is generated from these fields."""

    id: str  # "NN.k": notebook NN, k-th exercise
    title: str
    assesses: str  # what a right answer shows the student can do
    minutes: int  # a typical student's time
    answer_type: str  # a key of _TYPES
    hints: tuple[str, ...]  # gentlest first; each "not yet" reveals the next one
    checker: Callable[[Any], str | None] = field(repr=False, compare=False)

    @property
    def notebook(self) -> str:
        return self.id.split(".")[0]

    @property
    def number(self) -> int:
        return int(self.id.split(".")[1])

    @property
    def expects(self) -> str:
        return _TYPES[self.answer_type][0]


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
) -> Callable[[Callable[[Any], str | None]], Callable[[Any], str | None]]:
    """Register the decorated function as the checker of ``exercise_id``.

    The checker gets the answer converted to ``answer_type`` (one of int,
    number, str, bool, list, dict, function). It returns None or a remark when
    the answer is right and raises ``NotYet("what to look at")`` when it is not.
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

    def register(checker: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        _REGISTRY[exercise_id] = Exercise(
            exercise_id, title, assesses, minutes, answer_type, tuple(hints), checker
        )
        return checker

    return register


def get(exercise_id: str) -> Exercise:
    """The registered exercise ``exercise_id``; ``UnknownExerciseError`` names the ones that exist."""
    if not isinstance(exercise_id, str):
        raise UnknownExerciseError(f"an exercise id is a string like '01.2', got {exercise_id!r}")
    try:
        return _REGISTRY[exercise_id]
    except KeyError:
        nb = exercise_id.split(".")[0]
        same = [e.id for e in exercises(nb)] if _ID.fullmatch(exercise_id) else []
        known = (
            f"notebook {nb} has {', '.join(same)}" if same else f"known ids: {', '.join(_REGISTRY) or 'none'}"
        )
        raise UnknownExerciseError(f"unknown exercise {exercise_id!r}; {known}") from None


def exercises(notebook: str | None = None) -> list[Exercise]:
    """Registered exercises in course order, all or those of ``notebook`` ("01")."""
    chosen = [e for e in _REGISTRY.values() if notebook is None or e.notebook == notebook]
    return sorted(chosen, key=lambda e: (e.notebook, e.number))


# ---------------------------------------------------------------- results


@dataclass
class Result:
    """What one ``check`` found. ``status`` is "right", "not yet" or "not done yet"."""

    exercise_id: str
    title: str
    status: str
    message: str
    hint: str | None = None
    _shown: bool = field(default=False, repr=False, compare=False)

    @property
    def right(self) -> bool:
        return self.status == RIGHT

    def __bool__(self) -> bool:
        return self.right

    def text(self) -> str:
        mark = {RIGHT: "✓", NOT_YET: "✗", NOT_DONE: "…"}[self.status]
        lines = [f"{mark} {self.exercise_id} {self.title}: {self.status}. {self.message}".rstrip()]
        if self.hint:
            lines.append(f"  Hint: {self.hint}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        color = {RIGHT: "#1a7f37", NOT_YET: "#bc4c00", NOT_DONE: "#57606a"}[self.status]
        mark = {RIGHT: "✓ Right", NOT_YET: "✗ Not yet", NOT_DONE: "… Not done yet"}[self.status]
        hint = f"<div style='margin-top:4px'><b>Hint:</b> {html.escape(self.hint)}</div>" if self.hint else ""
        return (
            f"<div style='border-left:4px solid {color};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{color}'>{mark}</b> &middot; {html.escape(self.exercise_id)} "
            f"{html.escape(self.title)}<div>{html.escape(self.message)}</div>{hint}</div>"
        )

    def show(self) -> None:
        """Show the result: rich output in a notebook, plain text elsewhere."""
        self._shown = True
        shell = _ipython_shell()
        if shell is None:
            print(self.text())
        else:
            from IPython.display import publish_display_data

            publish_display_data({"text/plain": self.text(), "text/html": self._repr_html_()})

    def _ipython_display_(self) -> None:
        # check() has shown the result already; a cell ending in check(...) must not show it twice.
        if not self._shown:
            self.show()


def _ipython_shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return None
    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


# ---------------------------------------------------------------- checking


def _has_placeholder(answer: Any, depth: int = 0) -> bool:
    if answer is ...:
        return True
    if depth >= 4:
        return False
    if isinstance(answer, (list, tuple, set, frozenset)):
        return any(_has_placeholder(a, depth + 1) for a in answer)
    if isinstance(answer, dict):
        return any(_has_placeholder(a, depth + 1) for a in answer.values())
    return False


def call(function: Callable[..., Any], *args: Any) -> Any:
    """Call a student's function from a checker: its errors become ``NotYet``, ``...`` means not done."""
    try:
        out = function(*args)
    except Exception as exc:  # the student's code: report it, never raise it
        shown = ", ".join(brief(a) for a in args)
        raise NotYet(f"your function raised {type(exc).__name__}: {exc} (called with {shown})") from None
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
    """Whether ``value`` is a whole number as an answer needs it: an int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def all_whole(values: Any) -> bool:
    """Whether every item of ``values`` is ``whole`` (True for no items)."""
    return all(whole(v) for v in values)


def expect_two_whole(answer: list[Any], what: str) -> None:
    """``NotYet`` unless ``answer`` is two whole numbers; ``what`` says which, e.g. ``"[cache_n, prompt_n]"``."""
    if len(answer) != 2 or not all_whole(answer):
        raise NotYet(f"Give two whole numbers: {what}.")


def _evaluate(ex: Exercise, answer: Any) -> tuple[str, str]:
    """(status, message) for ``answer``; never raises."""
    done_msg = "Replace every ... with your answer, then run the cell again."
    if answer is None or _has_placeholder(answer):
        return NOT_DONE, done_msg
    converted = _TYPES[ex.answer_type][1](answer)
    if converted is None:
        return (
            NOT_YET,
            f"This exercise expects {ex.expects}; you gave {type(answer).__name__} {brief(answer)}.",
        )
    try:
        remark = ex.checker(converted)
    except _NotDone:
        return NOT_DONE, "Your function still returns ...: write its body, then run the cell again."
    except NotYet as exc:
        return NOT_YET, str(exc)
    except Exception as exc:  # a malformed answer the checker did not foresee
        return (
            NOT_YET,
            f"This answer could not be checked ({type(exc).__name__}: {exc}); expected {ex.expects}.",
        )
    return RIGHT, remark if isinstance(remark, str) else "Well done."


def check(exercise_id: str, answer: Any) -> Result:
    """Check ``answer`` for exercise ``exercise_id``, show the verdict and return it.

    A wrong answer is "not yet" with a hint (the next one on each try), an
    answer still holding ``...`` (or None) is "not done yet". Only an unknown
    exercise id raises (``UnknownExerciseError``).
    """
    ex = get(exercise_id)
    status, message = _evaluate(ex, answer)
    hint = None
    if status == NOT_YET:
        tries = _attempts.get(ex.id, 0)
        _attempts[ex.id] = tries + 1
        hint = ex.hints[min(tries, len(ex.hints) - 1)]
    result = Result(ex.id, ex.title, status, message, hint)
    log_event({"id": ex.id, "status": status, "message": message})
    result.show()
    return result


def hint(exercise_id: str) -> None:
    """Show the next hint of an exercise without checking an answer."""
    ex = get(exercise_id)
    tries = _attempts.get(ex.id, 0)
    _attempts[ex.id] = tries + 1
    text = ex.hints[min(tries, len(ex.hints) - 1)]
    print(f"Hint for {ex.id} ({min(tries, len(ex.hints) - 1) + 1} of {len(ex.hints)}): {text}")
