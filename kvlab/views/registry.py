"""The views a history can be stepped through: one record per concept, registered in one place.

Animations (``kvlab.views.animations``) and the stepper (``kvlab.views.live``)
draw a history one spec per snapshot. What they need to know about a view is
its ``View`` record here:

* ``spec(state, previous, *, caption=..., head_lines=..., sub_lines=..., **hints)``
  builds one snapshot's figure as plain dicts;
* ``hints(states)`` returns the keyword arguments that give every snapshot of
  a history the same axes and legend (the largest table, every mark any step
  shows), so nothing jumps between frames;
* ``marks(state, previous)`` names the marks one snapshot shows (what its
  operation hit, allocated, evicted...), for the legend;
* ``state_type`` is the snapshot type the view draws, and views of one type
  are that type's default views, in registration order;
* ``highlight`` says the spec takes ``highlight=(request_id, position)``.

Adding a view means writing its module and registering it below. The SWA and
agent-turns views (``kvlab.views.swa``, ``kvlab.views.agents``) draw their own
histories with ``animate`` and ``Stepper`` directly and are not listed here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.core.snapshots import BlockPoolState, ContiguousState, RadixState
from kvlab.errors import InvalidArgumentError, brief, check_choice, check_text
from kvlab.views import block_pool, contiguous, free_queue, radix
from kvlab.views._common import Spec


def _no_hints(states: Sequence[Any]) -> dict[str, Any]:
    return {}


def _no_marks(state: Any, previous: Any = None) -> set[str]:
    return set()


@dataclass(frozen=True)
class View:
    """A view over one kind of snapshot: how to draw a step, what a history's steps share, its marks."""

    name: str
    state_type: type
    spec: Callable[..., Spec]
    hints: Callable[[Sequence[Any]], dict[str, Any]] = _no_hints
    marks: Callable[[Any, Any], set[str]] = _no_marks
    highlight: bool = False


VIEWS: dict[str, View] = {}


def register(view: View) -> View:
    """Add ``view`` to the registry under ``view.name``."""
    VIEWS[view.name] = view
    return view


register(View("contiguous", ContiguousState, contiguous.contiguous_spec))
register(View("block_pool", BlockPoolState, block_pool.block_pool_spec, block_pool.block_pool_hints,
              block_pool.block_pool_marks, highlight=True))  # fmt: skip
register(View("free_queue", BlockPoolState, free_queue.free_queue_spec, free_queue.free_queue_hints,
              free_queue.free_queue_marks))  # fmt: skip
register(View("radix", RadixState, radix.radix_tree_spec, radix.radix_hints, radix.radix_marks))

#: ``stepper(history, kind)`` kinds that are not a view's own name, and the views they show.
ALIASES: dict[str, tuple[str, ...]] = {"paged": ("block_pool",), "prefix_cache": ("block_pool", "free_queue")}


def get(name: object, *, extra: str = "") -> View:
    """The view registered as ``name``; an unknown name is an ``InvalidArgumentError`` listing the views."""
    try:  # by exact text, never the value's own __eq__ or __hash__
        return VIEWS[check_choice("view", name, tuple(VIEWS))]
    except InvalidArgumentError:
        extra = check_text("extra", extra)
        raise InvalidArgumentError(
            f"unknown view {brief(name)}: use one of {', '.join(VIEWS)}{extra}"
        ) from None


def defaults(state_type: type) -> tuple[str, ...]:
    """The views a history of ``state_type`` snapshots shows by default (every view of that type)."""
    return tuple(v.name for v in VIEWS.values() if v.state_type is state_type)


def kinds() -> dict[str, tuple[str, ...]]:
    """``stepper`` kinds and the views each shows: every view by its name, each alias after its last view."""
    out: dict[str, tuple[str, ...]] = {}
    for name in VIEWS:
        out[name] = (name,)
        out.update({alias: names for alias, names in ALIASES.items() if names[-1] == name})
    return out
