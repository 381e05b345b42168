"""``compare_table``: what kvlab computed beside the figure the lesson printed, one row per figure.

Each row gets a mark that says whether they agree. When $KVLAB_EXERCISE_LOG is set (the notebook
tests set it), each table also appends a JSON line ``{"compare": title, "ok": bool, "mismatches":
[...]}`` (``kvlab.lessons.log``), so a figure that drifts from the lesson fails CI instead of only
showing a mark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvlab.errors import InvalidArgumentError
from kvlab.lessons.log import log_event


def _plain(value: Any) -> Any:
    """Tuples as lists and numpy scalars/arrays as Python values, so equal figures compare equal."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))
    ):  # a model's tuple-like views (a block table) too
        return [_plain(v) for v in value]
    return value


def _show(value: Any, *, nested: bool = False) -> str:
    """A lone integer gets thousands separators (2,350); numbers inside lists print plainly, as the
    lessons print them ([557, 1324])."""
    value = _plain(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if nested else f"{value:,}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v, nested=True) for v in value) + "]"
    return str(value)


def compare_table(
    rows: Iterable[Sequence[Any]], title: str = "kvlab vs the lesson", *, against: str = "lesson"
) -> None:
    """Print ``(what, kvlab value, lesson value)`` rows side by side with ✓ where they agree.

    Values agree when they are equal after tuples become lists and numpy
    values become Python ones; format floats yourself (``f"{x:.1f}%"``) to
    compare them at the lesson's precision. ``against`` names the second
    column when its numbers are not the lesson's (``"server"``: what a real
    server reported).
    """
    if not isinstance(title, str):
        raise InvalidArgumentError(f"title must be a string, got {title!r}")
    if type(against) is not str or not 0 < len(against) <= 40:
        raise InvalidArgumentError(
            f"against must name the second column (1 to 40 characters), got {against!r}"
        )
    shape = "rows must be a non-empty list of (what, kvlab value, lesson value) triples"
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise InvalidArgumentError(f"{shape}, got {type(rows).__name__}")
    table = [tuple(r) if isinstance(r, (list, tuple)) else (r,) for r in rows]
    if not table or any(len(r) != 3 for r in table):
        raise InvalidArgumentError(shape)
    cells = [
        (str(what), _show(ours), _show(theirs), _plain(ours) == _plain(theirs))
        for what, ours, theirs in table
    ]
    w0 = max(len("figure"), *(len(c[0]) for c in cells))
    w1 = max(len("kvlab"), *(len(c[1]) for c in cells))
    w2 = max(len(against), *(len(c[2]) for c in cells))
    print(title)
    print(f"  {'figure':<{w0}}  {'kvlab':>{w1}}  {against:>{w2}}")
    for what, ours, theirs, ok in cells:
        print(f"  {what:<{w0}}  {ours:>{w1}}  {theirs:>{w2}}  {'✓' if ok else '✗ differs'}")
    mismatches = [c[0] for c in cells if not c[3]]
    log_event({"compare": title, "ok": not mismatches, "mismatches": mismatches})
