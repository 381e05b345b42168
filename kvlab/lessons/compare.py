"""``compare_table``: what kvlab computed beside the figures its sources give, one row per figure.

A source is where a figure comes from: the lesson, or a real server kvlab observed (its label names
the build and the model, e.g. ``"llama-server 0c1e57098 (tiny test model)"``). Each row gets a mark
that says whether kvlab agrees with every source that gives the figure; a source that does not
give it shows "—". Lesson figures kvlab does not reproduce are listed under the table with the
reason, so none is quietly left out.

When $KVLAB_EXERCISE_LOG is set (the notebook tests set it), each table also appends a JSON line
``{"compare": title, "ok": bool, "mismatches": [...]}`` (``kvlab.lessons.log``), so a figure that
drifts from a source fails CI instead of only showing a mark.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_items, check_text
from kvlab.lessons.log import log_event

MISSING = "—"
"""What a cell shows when its source does not give the figure."""

LESSON_ONLY = ("lesson",)
MAX_SOURCES = 4
MAX_LABEL = 60  # characters of a source label (a column head)
MAX_NAME = 120  # characters of a figure's name (a row head)
MAX_TEXT = 400  # characters of a title, a text figure or a reason
WRAP = 108  # a reason wraps at this width, to stay readable under the table
MAX_VALUES = 100_000  # values one table reads in all (a printed table never needs more; shared nesting counts each time)
MAX_DIGITS = 60  # digits of one integer figure: a longer one is no figure a table can show


_TOO_LONG = 10**MAX_DIGITS


class _Budget:
    """How many more values one table may read: lists that share their items count every time they are read."""

    def __init__(self) -> None:
        self.left = MAX_VALUES

    def take(self, name: str, n: int = 1, *, keep: bool = True) -> None:
        """Take ``n`` values, or with ``keep=False`` only check that ``n`` more are left."""
        if n > self.left:
            raise InvalidArgumentError(
                f"{name}: the table reads more than {MAX_VALUES:,} values in all (nested lists count each "
                "time they appear); compare a summary (a length, a total, the first items) instead"
            )
        if keep:
            self.left -= n


def _text(name: str, value: object) -> str:
    """``check_text``, and text that can be printed: a lone surrogate (``"\\ud800"``) is refused here,
    before anything is printed, rather than half-way through the table."""
    text = check_text(name, value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{name} holds a character that cannot be printed (a lone surrogate), got {brief(text)}: "
            "pass text made of whole characters"
        ) from None
    return text


def _integer(name: str, value: int) -> int:
    """A plain int of at most ``MAX_DIGITS`` digits (so it prints, with separators, in one cell)."""
    value = int.__int__(value)  # a subclass by its value: never its own __eq__
    if not -_TOO_LONG < value < _TOO_LONG:
        raise InvalidArgumentError(
            f"{name} must be an integer of at most {MAX_DIGITS} digits, got {brief(value)}: "
            "pass such a figure as text (its first digits and its length)"
        )
    return value


def _figure(name: str, value: object, budget: _Budget, depth: int = 0) -> Any:
    """A figure as a plain Python value (bool, int, float, str, or a list or dict of them), or a refusal.

    Tuples become lists and numpy values Python ones, so equal figures compare equal; a model's
    tuple-like views (a block table) are read as lists. Anything else is refused, so no object's
    own ``__eq__`` decides whether kvlab agrees with a source. Every value read is taken from
    ``budget``, so no shape of nesting can make the walk (or the print) unbounded.
    """
    budget.take(name)
    if depth > LIMITS.json_depth:
        raise InvalidArgumentError(f"{name} is nested more than {LIMITS.json_depth} deep")
    kind = type(value)
    if kind is int:  # the common figures first: exact types run no code of their own
        return _integer(name, value)
    if kind is list or kind is tuple:
        return [_figure(name, v, budget, depth + 1) for v in value]  # type: ignore[attr-defined]
    if isinstance(value, (np.generic, np.ndarray)):
        if value.dtype.kind not in "biuf":
            raise InvalidArgumentError(f"{name} must hold numbers, got a numpy {value.dtype} value")
        budget.take(name, value.size, keep=False)  # before tolist: its values are counted as they are read
        value = value.tolist()
    if isinstance(value, bool):  # bool has no subclasses; numpy bools were made plain above
        return value
    if isinstance(value, int):
        return _integer(name, value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        text = _text(name, value)
        if len(text) > MAX_TEXT:
            raise InvalidArgumentError(f"{name} must be at most {MAX_TEXT} characters, got {len(text)}")
        return text
    if isinstance(value, dict):  # read through dict's own methods, never a subclass's
        pairs = list(dict.items(value))
        if len(pairs) > LIMITS.count:
            raise InvalidArgumentError(f"{name} holds more than {LIMITS.count:,} items (LIMITS.count)")
        return {_key(name, k): _figure(name, v, budget, depth + 1) for k, v in pairs}
    if isinstance(value, (list, tuple)) or (
        isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray, int, float))
    ):
        return [_figure(name, v, budget, depth + 1) for v in check_items(name, value, "count")]
    raise InvalidArgumentError(
        f"{name} must be a number, a string, or a list or dict of them, got {brief(value)} ({type(value).__name__})"
    )


def _key(name: str, key: object) -> int | str:
    """A dict figure's key: a plain int or a short string (a block id, a request id)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return _integer(f"a key of {name}", key)
    if isinstance(key, str):
        return _label(f"a key of {name}", key)
    raise InvalidArgumentError(f"the keys of {name} must be ints or strings, got {brief(key)}")


def _show(value: Any, *, nested: bool = False) -> str:
    """A lone integer gets thousands separators (2,350); numbers inside lists print plainly, as the
    lessons print them ([557, 1324]); a figure a source does not give prints as "—"."""
    if value is None:
        return MISSING
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if nested else f"{value:,}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v, nested=True) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_show(v, nested=True)}" for k, v in value.items()) + "}"
    return str(value)


def _label(name: str, value: object, *, limit: int = MAX_LABEL) -> str:
    """A non-empty one-line label of at most ``limit`` characters (a column head, a figure's name)."""
    text = _text(name, check_text(name, value, allow_empty=False))
    if len(text) > limit or "\n" in text:
        raise InvalidArgumentError(
            f"{name} must be one line of at most {limit} characters, got {brief(text)}"
        )
    return text


def _sources(sources: object, against: object) -> tuple[str, ...]:
    """The column heads after "kvlab": ``sources``, or the old one-column ``against=``."""
    if against is not None:
        if sources is not LESSON_ONLY:
            raise InvalidArgumentError("give either sources=(...) or the older against=..., not both")
        label = _label("against", against, limit=40)
        if label == "kvlab":
            raise InvalidArgumentError("against must name a source other than 'kvlab' (kvlab's own column)")
        return (label,)
    items = check_items("sources", sources, what="a tuple of source labels")
    if not 1 <= len(items) <= MAX_SOURCES:
        raise InvalidArgumentError(f"sources must name 1 to {MAX_SOURCES} sources, got {len(items)}")
    labels = tuple(_label("each source", s) for s in items)
    if len(set(labels)) != len(labels) or "kvlab" in labels:
        raise InvalidArgumentError(f"sources must be distinct and other than 'kvlab', got {list(labels)}")
    return labels


def _rows(rows: object, sources: tuple[str, ...]) -> list[tuple[str, Any, list[Any]]]:
    """Each row as (what, kvlab's figure, one figure or None per source); at least one source gives it."""
    width = 2 + len(sources)
    row_shape = f"(what, kvlab value, {', '.join(f'{s} value' for s in sources)}) of {width} items"
    shape = f"a non-empty list of rows {row_shape}"
    items = check_items("rows", rows, what=shape) if rows is not None else []
    if not items:
        raise InvalidArgumentError(f"rows must be {shape}, got {brief(rows)}")
    budget = _Budget()
    table = []
    for row in items:
        cells = (
            check_items("each of the rows", row, what=f"a tuple {row_shape}")
            if isinstance(row, (list, tuple))
            else None
        )
        if cells is None or len(cells) != width:
            raise InvalidArgumentError(f"each of the rows must be a tuple {row_shape}, got {brief(row)}")
        what = _label("a row's figure name", cells[0], limit=MAX_NAME)
        theirs = [
            None if v is None else _figure(f"{what!r} ({s})", v, budget)
            for s, v in zip(sources, cells[2:], strict=True)
        ]
        if all(v is None for v in theirs):
            raise InvalidArgumentError(
                f"row {what!r}: no source gives this figure, so there is nothing to compare"
            )
        table.append((what, _figure(f"{what!r} (kvlab)", cells[1], budget), theirs))
    return table


def _not_reproduced(not_reproduced: object) -> list[tuple[str, str]]:
    """(figure, reason) pairs: lesson figures kvlab does not reproduce, and why."""
    out = []
    for pair in check_items("not_reproduced", not_reproduced, what="a list of (figure, reason) pairs"):
        cells = (
            check_items("a pair of not_reproduced", pair, what="a (figure, reason) pair")
            if isinstance(pair, (list, tuple))
            else None
        )
        if cells is None or len(cells) != 2:
            raise InvalidArgumentError(
                f"not_reproduced must be a list of (figure, reason) pairs; one item is {brief(pair)}"
            )
        out.append(
            (
                _label("a figure not reproduced", cells[0], limit=MAX_TEXT),
                _label("its reason", cells[1], limit=MAX_TEXT),
            )
        )
    return out


def compare_table(
    rows: Iterable[Sequence[Any]],
    title: str = "kvlab vs the lesson",
    *,
    sources: Sequence[str] = LESSON_ONLY,
    not_reproduced: Iterable[Sequence[str]] = (),
    against: str | None = None,
) -> None:
    """Print ``(what, kvlab value, one value per source)`` rows side by side with ✓ where they agree.

    A value None means the source does not give that figure: it prints as "—" and is not
    compared. Values agree when they are equal after tuples become lists and numpy values become
    Python ones; format floats yourself (``f"{x:.1f}%"``) to compare at the source's precision.
    ``not_reproduced`` lists ``(figure, reason)`` for the source's figures kvlab does not compute;
    they print under the table. ``against="server"`` is the older spelling of ``sources=("server",)``.
    """
    title = _label("title", title, limit=MAX_TEXT)
    heads = _sources(sources, against)
    table = _rows(rows, heads)
    missing = _not_reproduced(not_reproduced)

    cells = []
    for what, ours, theirs in table:
        differ = [s for s, v in zip(heads, theirs, strict=True) if v is not None and v != ours]
        mark = "✓" if not differ else "✗ differs" + (f" from {', '.join(differ)}" if len(heads) > 1 else "")
        cells.append((what, _show(ours), [_show(v) for v in theirs], mark))
    widths = [
        max(len("figure"), *(len(c[0]) for c in cells)),
        max(len("kvlab"), *(len(c[1]) for c in cells)),
        *(max(len(h), *(len(c[2][i]) for c in cells)) for i, h in enumerate(heads)),
    ]
    print(title)
    head = "  ".join(f"{h:>{w}}" for h, w in zip(("kvlab", *heads), widths[1:], strict=True))
    print(f"  {'figure':<{widths[0]}}  {head}")
    for what, ours, theirs, mark in cells:
        values = "  ".join(f"{v:>{w}}" for v, w in zip((ours, *theirs), widths[1:], strict=True))
        print(f"  {what:<{widths[0]}}  {values}  {mark}")
    if missing:
        print("  not reproduced by kvlab:")
        for figure, reason in missing:
            print(
                textwrap.fill(f"{figure}: {reason}", WRAP, initial_indent="    ", subsequent_indent="      ")
            )
    mismatches = [c[0] for c in cells if c[3] != "✓"]
    record: dict[str, Any] = {"compare": title, "ok": not mismatches, "mismatches": mismatches}
    if missing:
        record["not_reproduced"] = [figure for figure, _ in missing]
    log_event(record)
