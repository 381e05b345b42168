"""Cases a fresh hostile round found across the package, and every public callable fuzzed with hostile values.

``test_every_public_callable_refuses_hostile_arguments`` walks the public surface of the modules in
``FUZZED_MODULES`` (a package's ``__all__``, else the functions and classes a module defines) and calls
each with hostile values from ``tests/hostile.py`` in its arguments: it works, or raises kvlab's error,
within ``CALL_SECONDS``. Never a Python error, never a hang.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hostile import all_hostile_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError


def test_a_fresh_hostile_round_gets_kvlab_errors():
    """Cases a hostile tester found after the hostile-input work: each refused with kvlab's own error."""
    import numpy as np

    from kvlab.core import jsonio
    from kvlab.errors import KvlabError
    from kvlab.fleet.config import check_user
    from kvlab.fleet.traffic import encode_tokens, max_traffic_tokens
    from kvlab.models.free_queue import FreeBlockQueue
    from kvlab.scenarios import module
    from kvlab.scenarios.radix import tree_dict
    from kvlab.server.conversation import tokens_processed
    from kvlab.server.slot_files import ModelShape, synthetic_kv

    class Raising:
        def __iter__(self):
            raise RuntimeError("no")

        def __repr__(self):
            raise RuntimeError("no")

    calls = [
        lambda: FreeBlockQueue(np.array(3)),
        lambda: tokens_processed(np.array(3)),
        lambda: encode_tokens(Raising()),
        lambda: max_traffic_tokens(None, None, None),
        lambda: check_user(1, 1),
        lambda: tree_dict(1),
        lambda: module(Raising()),
        lambda: module(type("D", (dict,), {})()),
        lambda: jsonio.dumps({"a": float("nan")}),
        lambda: jsonio.dumps([object()]),
        lambda: synthetic_kv(ModelShape(1024, 1, 4096, "f16"), []),  # a 16 GiB table: refused, not allocated
    ]
    for call in calls:
        with pytest.raises(KvlabError):
            call()


def test_a_huge_integer_in_a_float_field_is_refused():
    pytest.importorskip("torch")
    from kvlab.engine.model import ModelConfig
    from kvlab.errors import KvlabError

    for value in (10**400, 2**60):  # float(10**400) raises OverflowError
        with pytest.raises(KvlabError, match="rope_theta"):
            ModelConfig(rope_theta=value)


# ---------------------------------------------------------------- every public callable, hostile arguments


#: The modules whose public callables are fuzzed: a package's ``__all__`` where it has one, else every
#: function and class the module defines without a leading underscore.
FUZZED_MODULES = (
    "kvlab.errors",
    "kvlab.core.jsonio",
    "kvlab.scenarios",
    "kvlab.scenarios.checks",
    "kvlab.scenarios.prefix_cache",
    "kvlab.scenarios.radix",
    "kvlab.scenarios.block_pool",
    "kvlab.server.layout",
    "kvlab.server.agents",
    "kvlab.server.save_dir",
    "kvlab.server.slot_files",
    "kvlab.fleet",
    "kvlab.views",
)
#: ``setup`` changes plotly's renderer for the whole process: its refusals are tested in tests/views.
NOT_FUZZED = {"kvlab.views.setup"}
CALL_SECONDS = 10.0  # one call on hostile arguments must be refused (or finish) long before this


def _public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    for module_name in FUZZED_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and (inspect.isfunction(value) or inspect.isclass(value))
            and value.__module__ == module_name
        ]
        for name in names:
            value = getattr(module, name)
            if not callable(value) or f"{module_name}.{name}" in NOT_FUZZED:
                continue
            if inspect.isclass(value) and (
                issubclass(value, BaseException) or getattr(value, "_is_protocol", False)
            ):
                continue
            yield f"{module_name}.{name}", value


PUBLIC = sorted(_public_callables(), key=lambda pair: pair[0])
plain_values = st.one_of(
    st.integers(0, 6), st.sampled_from(["a", "lesson", "prefix-cache"]), st.just([1, 2, 3])
)


class _TooSlow(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _TooSlow


@pytest.fixture(scope="module")
def in_a_scratch_directory(tmp_path_factory):
    """Callables that write files (a slot file to ``directory="."``) write into a directory of their own."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("hostile_round"))
    yield
    os.chdir(before)


def test_the_fuzzed_surface_is_wide():
    """Every package's public functions are here, not a hand-picked few (about 150 callables)."""
    assert len(PUBLIC) > 100
    assert {"kvlab.scenarios.checks.config_size", "kvlab.views.Playground", "kvlab.fleet.simulate"} <= dict(
        PUBLIC
    ).keys()


@pytest.mark.parametrize("name, function", PUBLIC, ids=[name for name, _ in PUBLIC])
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_public_callable_refuses_hostile_arguments(in_a_scratch_directory, name, function, data):
    """Each argument is a hostile value, a plain one, or left out: the call works or raises kvlab's error."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        pytest.skip(f"{name} has no signature")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is not p.empty and data.draw(st.booleans(), label=f"leave out {p.name}"):
            continue
        value = data.draw(st.one_of(all_hostile_values(), plain_values), label=p.name)
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CALL_SECONDS)
    try:
        function(*args, **kwargs)
    except KvlabError as exc:
        assert str(exc), f"{name}: a refusal must say what was wrong"
    except _TooSlow:
        pytest.fail(f"{name} ran for more than {CALL_SECONDS} s on hostile arguments: an unbounded size?")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
