"""Words for what happened: captions rendered from the models' structured events.

Models record an ``Event`` per operation (``kvlab.core.snapshots``); this package turns it into the
one-line caption a student reads under a slider, in an animation's title or in a printed walk-through.
Each model's wording lives in its own module here, named for the event kinds' prefix (``paged.*`` in
``paged.py``, ``prefix_cache.*`` in ``prefix_cache.py``: the model's module name), registered by
event kind with ``@describes``.

    from kvlab.views.text import caption, captions
    for line in captions(cache.history):
        print(line)
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Sequence

from kvlab.core.snapshots import Event, History, Step
from kvlab.errors import InvalidArgumentError

Describe = Callable[[Event], str]
_DESCRIBE: dict[str, Describe] = {}

_loaded = False


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless the count is one: "1 token", "2 tokens", "1,022 tokens".

    ``many`` is the plural where it is not the noun and an "s" ("leaf", "leaves").
    """
    word = noun if count == 1 else many or f"{noun}s"
    return f"{count:,} {word}"


#: Block ids a caption lists one by one; a longer list is written as runs of consecutive ids.
LISTED = 8


def block_list(ids: Sequence[int]) -> str:
    """Block ids as a caption writes them: ``[7, 2, 9]``, or as runs with their count when there are many.

    A request of 1,406 tokens holds 88 blocks; listing them all would fill a
    figure's title, so ``[194–281] (88 blocks)``; runs that are still many keep
    the first and last three (``[0, 2, 4, …, 40, 42, 44] (23 blocks)``).
    """
    ids = list(ids)
    if len(ids) <= LISTED:
        return str(ids)
    runs: list[list[int]] = []
    for b in ids:
        if runs and b == runs[-1][-1] + 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    parts = [str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs]
    if len(parts) > 6:
        parts = [*parts[:3], "…", *parts[-3:]]
    return f"[{', '.join(parts)}] ({len(ids):,} blocks)"


def describes(*kinds: str) -> Callable[[Describe], Describe]:
    """Register ``fn`` as the caption of every event of these kinds."""

    def register(fn: Describe) -> Describe:
        for kind in kinds:
            _DESCRIBE[kind] = fn
        return fn

    return register


def _load() -> None:
    """Import every module of this package once: each registers the captions of one model."""
    global _loaded
    if not _loaded:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _loaded = True


def caption(item: Step | Event | str) -> str:
    """The one-line caption of a step or event (a hand-written string is its own caption)."""
    event = item.event if isinstance(item, Step) else item
    if isinstance(event, str):
        return event
    if not isinstance(event, Event):
        raise InvalidArgumentError(f"expected a kvlab Step or Event, got {type(item).__name__}")
    _load()
    try:
        describe = _DESCRIBE[event.kind]
    except KeyError:
        raise InvalidArgumentError(f"no caption is registered for events of kind {event.kind!r}") from None
    return describe(event)


def captions(history: History | Iterable[Step]) -> list[str]:
    """Every step's caption, in order."""
    steps = history.steps if isinstance(history, History) else history
    return [caption(step) for step in steps]
