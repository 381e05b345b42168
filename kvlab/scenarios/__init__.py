"""Scenarios: the one place that loads, validates and applies a ``{"config": ..., "ops": [...]}`` file.

A scenario drives one model through a list of ops. Each model has a module
here with the same small interface:

* ``NAME`` (the model's name in a scenario and on the command line) and
  ``OP_FIELDS`` (op -> (required fields, optional fields));
* ``Run(config, *, record=False)``: the model built from ``config`` (a bad
  config raises ``ScenarioError`` naming the key), with ``run.model`` and
  ``run.apply(op, index) -> Outcome``: the op's JSON-ready record and, when the
  pool refused the op for want of room (it changed nothing), why;
* ``replay(config, ops) -> list[dict]``: every op's record, what
  ``python -m kvlab replay NAME`` prints.

A bad op raises ``ScenarioError`` naming its index, having applied nothing of
it. The replay CLI (``kvlab.cli.replay``) replays the models in ``CLI_MODELS``;
the Playground (``kvlab.views.playground``) runs the block-pool models through
``start``. Scenario models: ``prefix-cache`` (vLLM's prefix cache,
``kvlab.models.prefix_cache``), ``radix`` (SGLang's radix tree), and
``block-pool`` (``kvlab.models.paged.BlockPool`` with fork; the Playground
only, since the CLI has no fork to check against a real engine).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, NamedTuple

from kvlab.core import jsonio
from kvlab.errors import LIMITS, InvalidArgumentError, ScenarioError, brief, check_text

MODULES = {
    "prefix-cache": "kvlab.scenarios.prefix_cache",
    "radix": "kvlab.scenarios.radix",
    "block-pool": "kvlab.scenarios.block_pool",
}
CLI_MODELS = ("prefix-cache", "radix")  # what ``python -m kvlab replay`` takes


class Outcome(NamedTuple):
    """One applied op: its record, and why the pool refused it (None when the op was carried out)."""

    record: dict[str, Any]
    refused: str | None = None


def module(model: str) -> ModuleType:
    """The scenario module of ``model`` (one of ``MODULES``)."""
    if type(model) is not str or model not in MODULES:
        raise ScenarioError(f"unknown model {brief(model)}: use one of {', '.join(MODULES)}")
    return importlib.import_module(MODULES[model])


def start(model: str, config: dict[str, Any], *, record: bool = False) -> Any:
    """A fresh ``Run`` of ``model`` built from ``config``: apply ops to it one at a time."""
    return module(model).Run(config, record=record)


def replay(model: str, config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Replay ``ops`` through ``model`` from ``config``: every op's record, as ``python -m kvlab replay`` prints them."""
    return module(model).replay(config, ops)


def load_scenario(data: bytes | str) -> tuple[str | None, dict[str, Any], list[Any]]:
    """Parse scenario JSON (bytes or text) into (model it names or None, config, ops).

    Untrusted input is read by ``kvlab.core.jsonio.read_json`` within ``LIMITS``
    (``scenario_bytes``, strict UTF-8, ``json_depth``, ``int_digits``, no
    NaN/Infinity), and a scenario holds at most ``LIMITS.ops`` ops (a million: a
    replay keeps them all in memory, and the Playground rebuilds from them). Every
    refusal, like a wrong shape, is a ``ScenarioError``.
    """
    data = jsonio.read_json(data, "the scenario", ScenarioError)
    if not isinstance(data, dict):
        raise ScenarioError('the scenario must be a JSON object: {"config": {...}, "ops": [...]}')
    unknown = set(data) - {"config", "ops", "model"}
    if unknown:
        raise ScenarioError(
            f"unknown top-level key(s) {brief(sorted(unknown))}: a scenario has only 'config', 'ops' and an "
            "optional 'model'"
        )
    model = data.get("model")
    if model is not None and type(model) is not str:  # JSON gives exact types
        raise ScenarioError(f"'model' must be a string naming the model, got {brief(model)}")
    config = data.get("config", {})
    ops = data.get("ops")
    if not isinstance(config, dict):
        raise ScenarioError("'config' must be a JSON object")
    if not isinstance(ops, list):
        raise ScenarioError("'ops' must be a JSON list of operations")
    check_num_ops(ops)
    return model, config, ops


def check_num_ops(ops: list[Any]) -> None:
    """At most ``LIMITS.ops`` ops in one scenario (a list; its length read by ``list`` itself, not an override)."""
    if not isinstance(ops, list):
        raise ScenarioError(f"'ops' must be a list of operations, got {brief(ops)} ({type(ops).__name__})")
    if list.__len__(ops) > LIMITS.ops:
        raise ScenarioError(
            f"the scenario has {len(ops):,} ops; kvlab replays at most {LIMITS.ops:,} (LIMITS.ops): split it, "
            "or lift the limit deliberately with kvlab.errors.raised_limits(ops=...)"
        )


def parse_scenario(scenario: object) -> tuple[str | None, dict[str, Any], list[Any]]:
    """``load_scenario`` for a scenario given as a dict, as its JSON text or as bytes.

    A dict is written out as JSON first (without recursion) and read back through
    the same limits, so a dict and its file are refused alike, and what comes back
    is plain JSON data the caller's later changes cannot reach.
    """
    if isinstance(scenario, dict):
        try:
            scenario = jsonio.dumps(scenario)
        except (TypeError, ValueError, InvalidArgumentError) as exc:
            raise ScenarioError(f"the scenario is not JSON data: {exc}") from None
    elif not isinstance(scenario, (str, bytes, bytearray)):
        raise ScenarioError(
            f'a scenario is a dict or JSON text {{"config": ..., "ops": [...]}}, got {type(scenario).__name__}'
        )
    return load_scenario(scenario)


def check_model(named: object, model: str) -> None:
    """A scenario may name the model it was written for (playground exports do); it must be this one."""
    if named is not None:
        try:
            named = check_text("the scenario's model", named)
        except InvalidArgumentError as exc:
            raise ScenarioError(str(exc)) from None
    if type(model) is not str or model not in MODULES:
        model = module(model).NAME  # refuses anything but one of MODULES, by exact value
    if named is None or named == model:
        return
    if named == "block-pool":
        raise ScenarioError(
            "this scenario was exported from the block-pool playground (it may fork, which the replay CLI "
            "has no op for): load it with kvlab.views.Playground.from_scenario instead"
        )
    raise ScenarioError(
        f"the scenario names model {brief(named)} but is replayed as {model!r}: replay it as {brief(named)}"
    )
