"""``python -m kvlab replay MODEL < scenario.json``: replay a scenario, print JSON records.

A scenario is ``{"config": {...}, "ops": [...]}``. Loading, checking and
applying it is ``kvlab.scenarios``' job (one module per model, each with a
``replay(config, ops) -> list[dict]`` that raises ``ScenarioError`` with the
op's index for a bad scenario, having applied nothing of the bad op). This
module only reads the file, dispatches and turns errors into one line on
stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvlab import scenarios
from kvlab.errors import KvlabError, ScenarioError

REPLAYERS = {model: scenarios.MODULES[model] for model in scenarios.CLI_MODELS}


def replay(model: str, config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Replay ``ops`` through ``model`` (one of the CLI's models); the records the CLI prints."""
    if model not in REPLAYERS:
        raise ScenarioError(f"unknown model {model!r}: use one of {', '.join(REPLAYERS)}")
    return scenarios.replay(model, config, ops)


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
        named, config, ops = scenarios.load_scenario(text)
        scenarios.check_model(named, args.model)
        records = replay(args.model, config, ops)
    except KvlabError as exc:
        print(f"kvlab replay: {exc}", file=sys.stderr)
        return 2
    json.dump(records, sys.stdout)
    sys.stdout.write("\n")
    return 0
