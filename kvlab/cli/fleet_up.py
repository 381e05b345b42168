"""``python -m kvlab fleet-up``: N ``kvlab serve`` replicas on loopback behind a cache-aware router.

Prints the router's URL and each replica's, then waits; Ctrl-C (or SIGTERM) stops every process
it started, as does any error while starting. ``--router sglang`` is SGLang's gateway
(sglang-router, ``pip install sglang-router``); ``--router kvlab`` is kvlab's own prefix-aware
proxy for machines where that wheel cannot run; ``auto`` (the default) takes sglang-router when
installed and says so when it falls back. Options after ``--`` go to every ``kvlab serve``
replica unchanged (``-- --cache slot --slots 2``); ``--router-arg`` passes one option to the router
(``--router-arg=--balance-abs-threshold --router-arg=4``).

``--replay`` sends lesson 002's traffic through the fleet once it is up (``--users``,
``--turns``, ``--system-tokens``, ``--answer-tokens``, ``--concurrency``), prints each replica's
hit rate beside the simulation's, and stops the fleet.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence

from kvlab.cli.options import OneLineParser, whole_number
from kvlab.errors import KvlabError


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m kvlab fleet-up", description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=whole_number, default=4, help="kvlab serve replicas (default 4)")
    p.add_argument("--router", choices=("auto", "sglang", "kvlab"), default="auto",
                   help="sglang: sglang-router; kvlab: kvlab's own router; auto: sglang-router if installed")  # fmt: skip
    p.add_argument("--policy", default="cache_aware",
                   help="cache_aware, round_robin, random (and power_of_two with sglang-router)")  # fmt: skip
    p.add_argument("--num-blocks", type=whole_number, default=None, help="each replica's KV pool, in blocks")
    p.add_argument(
        "--max-model-len", type=whole_number, default=None, help="each replica's context (prompt + output)"
    )
    p.add_argument("--router-arg", action="append", default=[], help="one option for the router (repeatable)")
    p.add_argument(
        "--startup-timeout", type=float, default=120.0, help="seconds to wait for all (default 120)"
    )
    p.add_argument("--log-dir", default=None, help="where each process's log goes (default: a temp folder)")
    p.add_argument("--replay", action="store_true", help="replay lesson 002's traffic through it, then stop")
    p.add_argument("--users", type=whole_number, default=24)
    p.add_argument("--turns", type=whole_number, default=4)
    p.add_argument("--system-tokens", type=whole_number, default=128)
    p.add_argument("--answer-tokens", type=whole_number, default=16)
    p.add_argument("--concurrency", type=whole_number, default=8)
    p.add_argument("--json", action="store_true", help="print the replay's rows as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    serve_args: list[str] = []
    if "--" in args_list:
        cut = args_list.index("--")
        args_list, serve_args = args_list[:cut], args_list[cut + 1 :]
    owned = [a for a in serve_args if a.split("=", 1)[0] in ("--host", "--port")]
    if owned:  # the replicas bind 127.0.0.1 on ports fleet-up picks: never the network, never a fixed port
        print(
            f"kvlab fleet-up: error: {owned[0].split('=', 1)[0]} is fleet-up's to choose (every replica binds "
            "127.0.0.1 on a free port); leave it out of the serve options after --",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(args_list)
    try:
        from kvlab.serve.fleet import Fleet
    except ImportError as exc:
        print(
            f"kvlab fleet-up: {exc}; install the engine extra: pip install 'kvlab[engine]'", file=sys.stderr
        )
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a SIGTERM stops the fleet like Ctrl-C
    try:
        fleet = Fleet.up(
            args.replicas,
            router=args.router,
            policy=args.policy,
            num_blocks=args.num_blocks,
            max_model_len=args.max_model_len,
            serve_args=serve_args,
            router_args=args.router_arg,
            startup_timeout=args.startup_timeout,
            log_dir=args.log_dir,
        )
    except KvlabError as exc:
        print(f"kvlab fleet-up: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvlab fleet-up: interrupted while starting; every process stopped", file=sys.stderr)
        return 130
    try:
        if fleet.note:
            print(f"kvlab fleet-up: {fleet.note}", flush=True)
        print(f"kvlab fleet-up: {fleet.describe()}", flush=True)
        for i, url in enumerate(fleet.replica_urls):
            print(f"  replica {i}: {url}", flush=True)
        print(f"  logs: {fleet.log_dir}", flush=True)
        print(f"router: {fleet.url}", flush=True)
        if args.replay:
            return _replay(fleet, args)
        print("kvlab fleet-up: Ctrl-C stops every process", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except KvlabError as exc:
        print(f"kvlab fleet-up: {exc}", file=sys.stderr)
        return 2
    finally:
        fleet.down()
        print("kvlab fleet-up: stopped every replica and the router", file=sys.stderr, flush=True)


def _replay(fleet: object, args: argparse.Namespace) -> int:
    from kvlab.fleet import FleetConfig
    from kvlab.serve.fleet import Fleet
    from kvlab.serve.load import replay, simulate_live

    assert isinstance(fleet, Fleet)
    capacity = (args.num_blocks or 0) * len(fleet.replica_urls)
    config = FleetConfig(users=args.users, turns=args.turns, system_tokens=args.system_tokens,
                         capacity_blocks=capacity)  # fmt: skip
    live = replay(fleet.url, config, answer_tokens=args.answer_tokens, concurrency=args.concurrency,
                  replica_urls=fleet.replica_urls, label=f"{fleet.router} {fleet.policy}")  # fmt: skip
    rows = [live.row()]
    if capacity:
        for routing in ("round-robin", "user-hash"):
            sim = simulate_live(config, args.answer_tokens, replicas=len(fleet.replica_urls), routing=routing)
            rows.append({"run": sim.scenario, "hit_rate": round(sim.hit_rate, 4)})
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    return 0 if not live.failed else 1


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
