"""Hostile values for property-based tests: what a careless or malicious user can pass to kvlab.

``hostile_values()`` draws anything a public function should refuse with kvlab's own error (or
accept and handle): wrong types, huge and negative integers, floats that look integral, NaN,
numpy arrays and scalars, deeply nested lists, strings of odd encodings, and objects that lie
(``__eq__`` always True, ``__hash__``/``__repr__``/``__index__`` raising, an ``int`` subclass whose
``==`` says yes to everything). ``all_hostile_values()`` adds lying containers: ``str``, ``list`` and
``dict`` subclasses whose own methods raise (``__len__``, ``__iter__``, ``__hash__``, ``items`` ...).
Import them from a test module: ``from hostile import hostile_values``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from kvlab.errors import KvlabError


class AlwaysEqual:
    """Claims to equal everything (a choice check that uses ``in`` or ``==`` would accept it)."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


class BadRepr:
    """Its repr raises: an error message built with ``{x!r}`` would crash instead of refusing."""

    def __repr__(self) -> str:
        raise RuntimeError("repr refused")

    __str__ = __repr__


class BadHash:
    """Unhashable in a hostile way: ``hash(x)`` raises something other than TypeError."""

    def __hash__(self) -> int:
        raise RuntimeError("hash refused")


class LyingInt(int):
    """An int whose ``==`` says yes to everything and whose ``__index__`` lies."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


class BadIndex:
    """Pretends to be an integer through ``__index__`` and then raises."""

    def __index__(self) -> int:
        raise RuntimeError("index refused")


class LyingStr(str):
    """A str whose own methods raise or lie: text must be read as its plain value (``check_text``)."""

    def __len__(self) -> int:
        raise RuntimeError("len refused")

    def __iter__(self):
        raise RuntimeError("iter refused")

    def __getitem__(self, index: object) -> str:
        raise RuntimeError("getitem refused")

    def __hash__(self) -> int:
        raise RuntimeError("hash refused")

    def __eq__(self, other: object) -> bool:
        return True

    def __format__(self, spec: str) -> str:
        raise RuntimeError("format refused")

    def __str__(self) -> str:
        raise RuntimeError("str refused")

    def __bool__(self) -> bool:
        raise RuntimeError("bool refused")

    def __repr__(self) -> str:  # what a failing example prints (hypothesis would iterate the value)
        return f"LyingStr({str.__repr__(self)})"


class LyingList(list):
    """A list whose ``len``, iteration and indexing raise: a container must be copied by ``list`` itself."""

    def __len__(self) -> int:
        raise RuntimeError("len refused")

    def __iter__(self):
        raise RuntimeError("iter refused")

    def __getitem__(self, index: object) -> object:
        raise RuntimeError("getitem refused")

    def __repr__(self) -> str:
        return f"LyingList({list.__repr__(self)})"


class LyingDict(dict):
    """A dict whose every reading method raises: a mapping must be read through ``dict``'s own methods."""

    def __iter__(self):
        raise RuntimeError("iter refused")

    def __contains__(self, key: object) -> bool:
        raise RuntimeError("contains refused")

    def __getitem__(self, key: object) -> object:
        raise RuntimeError("getitem refused")

    def get(self, *args: object) -> object:
        raise RuntimeError("get refused")

    def keys(self):
        raise RuntimeError("keys refused")

    def items(self):
        raise RuntimeError("items refused")

    def __repr__(self) -> str:
        return f"LyingDict({dict.__repr__(self)})"


class BadBool:
    """Its truth value (and length) raises: ``if value:`` or ``value or default`` would crash."""

    def __bool__(self) -> bool:
        raise RuntimeError("bool refused")

    def __len__(self) -> int:
        raise RuntimeError("len refused")


def nested_list(depth: int) -> list:
    """A list nested ``depth`` deep, built without recursion."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


LIAR_TYPES = (AlwaysEqual, BadRepr, BadHash, BadIndex)
liars = st.one_of(*(st.builds(t) for t in LIAR_TYPES), st.builds(LyingInt, st.integers(0, 5)))

huge_ints = st.one_of(
    st.integers(min_value=2**31, max_value=2**80),
    st.integers(min_value=-(2**80), max_value=-1),
    st.sampled_from([10**30, -(10**30), 10**400, 2**63, 2**64, -(2**63)]),
)

odd_floats = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 4.0, 1.9, -0.0, 1e308]),
    st.floats(allow_nan=True, allow_infinity=True),
)

numpy_values = st.one_of(
    st.builds(np.int64, st.integers(-5, 5)),
    st.builds(np.float64, st.floats()),
    st.builds(np.bool_, st.booleans()),
    st.builds(lambda: np.array([1, 2, 3])),
    st.builds(lambda: np.array(["lesson"])),
    st.builds(lambda: np.array([])),
)

wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.builds(set),
    st.just(object()),
)

deep = st.sampled_from([50, 2_000, 100_000]).map(nested_list)


def hostile_values() -> st.SearchStrategy:
    """Anything a hostile user might pass where kvlab expects a plain value."""
    return st.one_of(huge_ints, odd_floats, numpy_values, wrong_types, deep, liars)


lying_containers = st.one_of(
    st.builds(LyingStr, st.sampled_from(["lesson", "prefix-cache", "a", "", "p.bin", "nul.bin"])),
    st.builds(LyingList, st.lists(st.integers(0, 5), max_size=3)),
    st.builds(LyingDict, st.dictionaries(st.sampled_from(["op", "a"]), st.integers(), max_size=2)),
    st.builds(BadBool),
)


def all_hostile_values() -> st.SearchStrategy:
    """``hostile_values()`` and lying containers: a ``str``, ``list`` or ``dict`` subclass whose methods raise."""
    return st.one_of(hostile_values(), lying_containers)


# ---------------------------------------------------------------- assertions the hostile tests share


def kvlab_or_ok(call: Callable[[], Any]) -> bool:
    """``call()`` works (True) or is refused with kvlab's own error, which says something (False)."""
    try:
        call()
    except KvlabError as exc:
        assert str(exc)
        return False
    return True


def fingerprint(model: Any) -> tuple[Any, int | None]:
    """The model's whole state and history length: what a refused call must leave as it was."""
    state = model.snapshot() if hasattr(model, "snapshot") else model.state()
    history = getattr(model, "history", None)
    return state, (len(history) if history is not None else None)


def refused_or_ok(model: Any, call: Callable[[Any], Any]) -> None:
    """``call(model)`` works, or is refused with KvlabError and changes nothing."""
    before = fingerprint(model)
    try:
        call(model)
    except KvlabError as exc:
        assert str(exc)
        assert fingerprint(model) == before, "a refused call changed the model"


def quick_refusal(call: Callable[[], Any], match: str) -> None:
    """An absurd size is refused without first doing the work (a guard against hangs, generous on a loaded machine)."""
    start = time.process_time()
    with pytest.raises(KvlabError, match=match):
        call()
    assert time.process_time() - start < 10.0, "an absurd size must be refused before any work"
