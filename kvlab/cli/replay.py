"""``python -m kvlab replay MODEL [FILE] [--changes]``: replay a scenario, print JSON records.

A scenario is ``{"config": {...}, "ops": [...]}``. Loading, checking and
applying it is ``kvlab.scenarios``' job (one module per model, each with a
``replay(config, ops) -> list[dict]`` that raises ``ScenarioError`` with the
op's index for a bad scenario, having applied nothing of the bad op). This
module only reads the input, dispatches and turns errors into one line on
stderr with exit status 2.

The input, a FILE or standard input, is read the same way: as bytes, at most
``LIMITS.scenario_bytes`` of them, then parsed by ``kvlab.scenarios.load_scenario``
within kvlab's limits (strict UTF-8, nesting, integer digits, op count).

By default the output is one JSON array of every op's full record, printed
once the whole scenario replayed (a bad op prints nothing on stdout). Each
record repeats the whole free queue or tree, so the output grows as ops x
state: fine for the lessons' scenarios, not for a long trace. ``--changes``
prints instead one JSON line per op as it is applied, with only what the op
changed, and a last line with the final state: output and time grow with the
ops. A bad op then stops the replay after the lines of the ops before it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from typing import IO, Any

from kvlab import scenarios
from kvlab.core import jsonio
from kvlab.errors import KvlabError, ScenarioError, brief

REPLAYERS = {model: scenarios.MODULES[model] for model in scenarios.CLI_MODELS}


def replay(model: str, config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Replay ``ops`` through ``model`` (one of the CLI's models); the records the CLI prints."""
    _check_model(model)
    return scenarios.replay(model, config, ops)


def replay_changes(model: str, config: dict[str, Any], ops: list[Any]) -> Any:
    """The ``--changes`` records of ``ops`` through ``model``, one at a time (an iterator), then the final state."""
    _check_model(model)
    return scenarios.module(model).replay_changes(config, ops)


def _check_model(model: object) -> None:
    if type(model) is not str or model not in REPLAYERS:
        raise ScenarioError(f"unknown model {brief(model)}: use one of {', '.join(REPLAYERS)}")


def read_input(file: str | None, stdin: IO[Any] | None = None) -> bytes:
    """The scenario's bytes from ``file`` or standard input, at most ``LIMITS.scenario_bytes``."""
    if file is None:
        stream = stdin if stdin is not None else sys.stdin
        return jsonio.read_limited(getattr(stream, "buffer", stream), "standard input")
    try:
        with open(file, "rb") as fh:
            return jsonio.read_limited(fh, file)
    except OSError as exc:
        raise ScenarioError(f"cannot read {file}: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab replay", description=__doc__.splitlines()[0])
    parser.add_argument("model", help=f"one of: {', '.join(REPLAYERS)}")
    parser.add_argument("file", nargs="?", help="scenario JSON file (default: standard input)")
    parser.add_argument(
        "--changes",
        action="store_true",
        help="print one JSON line per op with only what it changed, then the final state "
        "(output grows with the ops, not ops x state: for long scenarios)",
    )
    args = parser.parse_intermixed_args(argv)  # MODEL --changes FILE, as the README writes it
    out = sys.stdout
    try:
        try:
            _check_model(args.model)
            named, config, ops = scenarios.load_scenario(read_input(args.file))
            scenarios.check_model(named, args.model)
            # The parsed ops live until the end and never form cycles: keep the garbage collector from
            # walking their millions of token ids on every full collection (about 1 s per 100k ops).
            gc.collect()
            gc.freeze()
            if args.changes:
                for record in replay_changes(args.model, config, ops):
                    out.write(jsonio.dumps(record))
                    out.write("\n")
                return 0
            pieces = [jsonio.dumps(record) for record in replay(args.model, config, ops)]
        except KvlabError as exc:
            _error(str(exc))
            return 2
        except (MemoryError, RecursionError) as exc:
            _error(f"the scenario is too large to replay ({type(exc).__name__}); make it smaller")
            return 2
        out.write("[" + ", ".join(pieces) + "]\n")
        return 0
    except BrokenPipeError:  # the reader stopped early (| head): not an error of the scenario
        with contextlib.suppress(OSError, ValueError):  # no flush of the closed pipe at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0


def _error(message: str) -> None:
    line = " ".join(message.split())  # one line, whatever the message holds
    print(f"kvlab replay: {line}", file=sys.stderr)
