"""``python -m kvlab fleet``: lesson 002's prefix-caching table, or one scenario of your own.

With no scenario option it prints the lesson's six rows. Any of ``--users``,
``--turns``, ``--seed``, ``--system-tokens``, ``--block-size``,
``--capacity-blocks``, ``--header``, ``--salt``/``--tenants``,
``--replicas``/``--routing`` switches to one row for that configuration (the
other settings keep the lesson's values: 200 users, 6 turns, seed 1, a
1,200-token system prompt, 16-token blocks, 20,000 blocks, no timestamp, no
salt, one replica). ``--engine`` runs the same traffic through the prefix-cache
model, where running work pins blocks (``--concurrent``, ``--busy-blocks``).
``--json`` prints the rows as a JSON list. Bad arguments exit with status 2
and one line on stderr, at once: sizes past ``kvlab.errors.LIMITS`` (users, turns,
replicas, a system prompt or a traffic whose tokens exceed ``LIMITS.total_tokens``)
are refused before any traffic is drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from kvlab.errors import InvalidArgumentError, KvlabError, check_int_text
from kvlab.fleet import HASH_SCHEMES, HEADERS, ROUTINGS, SALTS, FleetConfig, simulate
from kvlab.lessons.fleet import format_table, lesson_table

SCENARIO_OPTIONS = (
    "users",
    "turns",
    "seed",
    "system_tokens",
    "block_size",
    "capacity_blocks",
    "header",
    "salt",
    "tenants",
    "replicas",
    "routing",
)


class _UsageError(Exception):
    """A bad command line; main prints it as one line and returns 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _integer(minimum: int | None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:  # ASCII digits only: kvlab.errors.check_int_text
            value = check_int_text("the value", text)
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("the value ", "", 1)) from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m kvlab fleet",
        description="Prefix caching for 200 chat users behind a shared system prompt (lesson 002). "
        "Without scenario options: the lesson's six-row table.",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    scenario = parser.add_argument_group(
        "scenario options (any of them: print one row for that configuration)"
    )
    scenario.add_argument("--users", type=_integer(1), help="chat users (default 200)")
    scenario.add_argument("--turns", type=_integer(1), help="turns per user (default 6)")
    scenario.add_argument("--seed", type=_integer(None), help="random.Random seed (default 1)")
    scenario.add_argument(
        "--system-tokens", type=_integer(0), help="shared system prompt length (default 1200)"
    )
    scenario.add_argument("--block-size", type=_integer(1), help="tokens per KV block (default 16)")
    scenario.add_argument("--capacity-blocks", type=_integer(0), help="cache size in blocks (default 20000)")
    scenario.add_argument(
        "--header",
        choices=HEADERS,
        help="where a volatile timestamp goes: nowhere, before the system prompt, "
        "or in front of each new message (default none)",
    )
    scenario.add_argument(
        "--salt", choices=SALTS, help="cache salt: none, per user, or per tenant (default none)"
    )
    scenario.add_argument(
        "--tenants",
        type=_integer(1),
        help="tenants, with --salt tenant: contiguous groups of near-equal size (K need not divide --users)",
    )
    scenario.add_argument(
        "--replicas", type=_integer(1), help="replicas, each with an equal share of the cache"
    )
    scenario.add_argument(
        "--routing",
        choices=ROUTINGS,
        help="with --replicas: per request, or by a hash of the user id (default round-robin)",
    )
    other = parser.add_argument_group("model options (apply to the table or to the row)")
    other.add_argument(
        "--engine",
        action="store_true",
        help="run through kvlab.models.prefix_cache (vLLM's pool: running work pins blocks)",
    )
    other.add_argument(
        "--concurrent", type=_integer(1), help="with --engine: chat requests in flight per replica"
    )
    other.add_argument(
        "--busy-blocks", type=_integer(0), help="with --engine: blocks per replica held by other work"
    )
    other.add_argument(
        "--hash",
        choices=HASH_SCHEMES,
        help="block keys: exact (default, fastest), sha256-repr (the lesson's), "
        "lesson or vllm (kvlab.core.hashing); the numbers do not depend on it",
    )
    return parser


def _check_combinations(args: argparse.Namespace) -> None:
    if args.tenants is not None and args.salt != "tenant":
        raise _UsageError("--tenants only applies with --salt tenant")
    if args.salt == "tenant" and args.tenants is None:
        raise _UsageError(
            "--salt tenant needs --tenants K, the number of tenants (the lesson's Try it uses 10)"
        )
    if args.routing is not None and args.replicas is None:
        raise _UsageError("--routing only applies with --replicas R")
    for flag, value in (("--concurrent", args.concurrent), ("--busy-blocks", args.busy_blocks)):
        if value is not None and not args.engine:
            raise _UsageError(f"{flag} only applies with --engine (the lesson's store runs no requests)")


def _scenario_config(args: argparse.Namespace) -> FleetConfig:
    given = {name: getattr(args, name) for name in SCENARIO_OPTIONS if getattr(args, name) is not None}
    if args.hash is not None:
        given["hash_scheme"] = args.hash
    return FleetConfig(**given)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
        _check_combinations(args)
        load = {
            "engine": args.engine,
            "concurrent": args.concurrent if args.concurrent is not None else 1,
            "busy_blocks": args.busy_blocks if args.busy_blocks is not None else 0,
        }
        if any(getattr(args, name) is not None for name in SCENARIO_OPTIONS):
            results = [simulate(_scenario_config(args), **load)]
        else:
            results = lesson_table(hash_scheme=args.hash or "exact", **load)
    except _UsageError as exc:
        print(f"kvlab fleet: error: {exc} (see python -m kvlab fleet --help)", file=sys.stderr)
        return 2
    except KvlabError as exc:
        print(f"kvlab fleet: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    text = json.dumps([r.row() for r in results], indent=2) if args.json else format_table(results)
    if args.engine and not args.json:
        text += (
            f"\nengine model (kvlab.models.prefix_cache): {load['concurrent']} chat request(s) in flight and "
            f"{load['busy_blocks']:,} blocks held by other work, per replica"
        )
    try:
        print(text)
    except BrokenPipeError:  # e.g. piped into head: the reader has all it wants
        sys.stdout = None  # type: ignore[assignment]
    return 0


if __name__ == "__main__":
    sys.exit(main())
