"""Checked exercises for the course notebooks.

In a notebook::

    from kvlab.exercises import check
    answer = ...          # the student replaces ... with an answer
    check("01.2", answer)

``check`` shows "right", "not yet" (with a hint) or "not done yet" and returns
a ``Result``; it never raises for a wrong, unfinished or malformed answer.

Each notebook's exercises live in their own module, ``nbNN.py``; every module
of this package named ``nb`` + two digits is imported here, so adding a
notebook's exercises is adding that one file (see docs/notebook_guide.md).
Checkers compute the expected answer with kvlab's models; no solution text is
kept here (solutions live in ``solutions/``).

Every answer reaches a checker as plain data (``plain.py``: exact built-in
types, no student method called), and a submitted function is called
time-limited, quietly, with its exits caught (``core.StudentFunction``). The
same checkers grade a class outside the students' kernels: ``grading.py``
(one notebook), ``sandbox.py`` (a function re-run in a child process on hidden
cases), ``reports.py`` (CSV, feedback, Gradescope) and ``python -m kvlab grade``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from kvlab.exercises.core import (
    NOT_DONE,
    NOT_YET,
    RIGHT,
    Exercise,
    NotYet,
    Prediction,
    Result,
    UnknownExerciseError,
    Verdict,
    call,
    check,
    evaluate,
    exercise,
    exercises,
    get,
    hint,
    predict,
    reveal,
)

__all__ = [
    "NOT_DONE",
    "NOT_YET",
    "RIGHT",
    "Exercise",
    "NotYet",
    "Prediction",
    "Result",
    "UnknownExerciseError",
    "Verdict",
    "call",
    "check",
    "evaluate",
    "exercise",
    "exercises",
    "get",
    "hint",
    "predict",
    "reveal",
]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if re.fullmatch(r"nb\d\d", _module):
        importlib.import_module(f"{__name__}.{_module}")
