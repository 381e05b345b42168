"""``python -m kvlab replay MODEL < scenario.json``: replay a scenario, print JSON records.

A scenario is ``{"config": {...}, "ops": [...]}``. Each model has its own
replayer module with a ``replay(config, ops) -> list[dict]`` function that
raises ``ScenarioError`` (with the op's index) for a bad scenario, having
applied nothing of the bad op. This module only parses, dispatches and turns
errors into one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from kvlab.errors import KvlabError, ScenarioError

REPLAYERS = {
    "prefix-cache": "kvlab.scenarios.prefix_cache",
    "radix": "kvlab.scenarios.radix",
}


def load_scenario(text: str) -> tuple[str | None, dict[str, Any], list[Any]]:
    """Parse scenario JSON into (model it names or None, config, ops); raise ScenarioError when its shape is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"the scenario is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise ScenarioError('the scenario must be a JSON object: {"config": {...}, "ops": [...]}')
    unknown = set(data) - {"config", "ops", "model"}
    if unknown:
        raise ScenarioError(
            f"unknown top-level key(s) {sorted(unknown)}: a scenario has only 'config', 'ops' and an optional 'model'"
        )
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ScenarioError(f"'model' must be a string naming the model, got {model!r}")
    config = data.get("config", {})
    ops = data.get("ops")
    if not isinstance(config, dict):
        raise ScenarioError("'config' must be a JSON object")
    if not isinstance(ops, list):
        raise ScenarioError("'ops' must be a JSON list of operations")
    return model, config, ops


def check_model(named: object, model: str) -> None:
    """A scenario may name the model it was written for (playground exports do); it must be this one."""
    if named is None or named == model:
        return
    if named == "block-pool":
        raise ScenarioError(
            "this scenario was exported from the block-pool playground (it may fork, which the replay CLI "
            "has no op for): load it with kvlab.views.Playground.from_scenario instead"
        )
    raise ScenarioError(
        f"the scenario names model {named!r} but is replayed as {model!r}: replay it as {named!r}"
    )


def replay(model: str, config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Replay ``ops`` through ``model``; the records the CLI prints."""
    if model not in REPLAYERS:
        raise ScenarioError(f"unknown model {model!r}: use one of {', '.join(REPLAYERS)}")
    module = importlib.import_module(REPLAYERS[model])
    return module.replay(config, ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab replay", description=__doc__.splitlines()[0])
    parser.add_argument("model", help=f"one of: {', '.join(REPLAYERS)}")
    parser.add_argument("file", nargs="?", help="scenario JSON file (default: standard input)")
    args = parser.parse_args(argv)
    try:
        if args.file:
            try:
                with open(args.file, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                raise ScenarioError(f"cannot read {args.file}: {exc.strerror}") from None
        else:
            text = sys.stdin.read()
        if args.model not in REPLAYERS:
            raise ScenarioError(f"unknown model {args.model!r}: use one of {', '.join(REPLAYERS)}")
        named, config, ops = load_scenario(text)
        check_model(named, args.model)
        records = replay(args.model, config, ops)
    except KvlabError as exc:
        print(f"kvlab replay: {exc}", file=sys.stderr)
        return 2
    json.dump(records, sys.stdout)
    sys.stdout.write("\n")
    return 0
