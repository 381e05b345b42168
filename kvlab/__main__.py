"""Command line: ``python -m kvlab replay|fleet|chat|serve|fleet-up|grade|trace ...``.

Each subcommand lives in its own module and is imported only when used, so
``replay`` never pays for torch.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "replay": (
        "kvlab.cli.replay",
        "Replay a JSON scenario through a model and print one JSON record per op.",
    ),
    "fleet": ("kvlab.cli.fleet", "Simulate prefix caching for a fleet of chat users (lesson 002)."),
    "chat": ("kvlab.cli.chat", "Run an agent-like chat on the tiny real engine and print cache counters."),
    "serve": ("kvlab.cli.serve", "Serve the tiny engine over HTTP: OpenAI and llama-server APIs, metrics."),
    "fleet-up": ("kvlab.cli.fleet_up", "Start several kvlab serve replicas behind a cache-aware router."),
    "trace": ("kvlab.cli.trace", "Predict a real server's cache counters for a trace of its requests."),
    "grade": (
        "kvlab.cli.grade",
        "Grade a class's notebooks outside the students' kernels (CSV, Gradescope).",
    ),
}


def _usage() -> str:
    lines = ["usage: python -m kvlab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10}{help_}" for name, (_, help_) in COMMANDS.items()]
    lines.append("")
    lines.append("Run 'python -m kvlab COMMAND --help' for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"kvlab: unknown command {name!r}; use one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
