"""A real fleet against lesson 002's simulation: requests/s and hit rate per policy at 1, 2 and 4 replicas.

For each replica count the script starts that many ``kvlab serve`` replicas on 127.0.0.1, each with
an equal share of the same fleet cache (``--capacity-blocks`` in all), and for each router
(sglang-router when installed, and kvlab's own) and policy it restarts the router, empties the
caches and replays the lesson's traffic (``kvlab.serve.load.replay``) ``--repeat`` times. It
prints the median requests/s with its spread (min..max), the hit rate from the replicas'
``/metrics``, and the simulation's hit rate for the same traffic: round-robin beside
``round_robin``, a sticky session per user beside ``cache_aware``. The baseline for requests/s
is round-robin on one replica of the same run (ratio column).

    python benchmarks/fleet_live.py [--replicas 1 2 4] [--repeat 3] [--routers sglang kvlab]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvlab.fleet import FleetConfig  # noqa: E402
from kvlab.lessons.fleet_live import LIVE_ANSWER_TOKENS, LIVE_CONCURRENCY, LIVE_CONFIG  # noqa: E402
from kvlab.serve.fleet import Fleet, sglang_router_version  # noqa: E402
from kvlab.serve.load import context_needed, replay, simulate_live  # noqa: E402

SIM_ROUTING = {"round_robin": "round-robin", "cache_aware": "user-hash", "random": None, "power_of_two": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--routers", nargs="+", default=None, help="sglang and/or kvlab (default: both if installed)"
    )
    parser.add_argument("--policies", nargs="+", default=["round_robin", "cache_aware"])
    parser.add_argument("--users", type=int, default=LIVE_CONFIG.users)
    parser.add_argument("--turns", type=int, default=LIVE_CONFIG.turns)
    parser.add_argument("--system-tokens", type=int, default=LIVE_CONFIG.system_tokens)
    parser.add_argument("--capacity-blocks", type=int, default=LIVE_CONFIG.capacity_blocks)
    parser.add_argument("--answer-tokens", type=int, default=LIVE_ANSWER_TOKENS)
    parser.add_argument("--concurrency", type=int, default=LIVE_CONCURRENCY)
    args = parser.parse_args()
    routers = args.routers or (["sglang", "kvlab"] if sglang_router_version() else ["kvlab"])
    config = FleetConfig(users=args.users, turns=args.turns, system_tokens=args.system_tokens,
                         capacity_blocks=args.capacity_blocks)  # fmt: skip
    context = -(-context_needed(config, args.answer_tokens) // 16) * 16
    print(f"traffic: {config.users} users x {config.turns} turns, {config.system_tokens}-token system prompt, "
          f"{args.answer_tokens}-token answers; fleet cache {config.capacity_blocks} blocks split across replicas; "
          f"{args.concurrency} requests in flight; sglang-router {sglang_router_version() or 'not installed'}")  # fmt: skip
    print(f"{'replicas':>8} {'router':<8}{'policy':<13}{'req/s (min..max)':>22}{'ratio':>7}"
          f"{'hit rate':>10}{'simulated':>11}  share of prompt tokens per replica")  # fmt: skip
    baseline = None
    for n in args.replicas:
        share = config.capacity_blocks // n
        with Fleet.up(n, router=routers[0], policy=args.policies[0], num_blocks=share,
                      max_model_len=max(context, 64)) as fleet:  # fmt: skip
            for router in routers:
                for policy in args.policies:
                    speeds, rates, shares = [], [], []
                    for _ in range(args.repeat):
                        fleet.restart_router(policy, router=router)
                        fleet.reset_caches()
                        result = replay(fleet.url, config, answer_tokens=args.answer_tokens,
                                        concurrency=args.concurrency, replica_urls=fleet.replica_urls)  # fmt: skip
                        if result.failed:
                            print(f"  {len(result.failed)} requests failed: {result.failed[0].error}")
                        speeds.append(result.requests_per_s)
                        rates.append(result.hit_rate)
                        total = sum(r.queries for r in result.replicas) or 1
                        shares = [r.queries / total for r in result.replicas]
                    median = statistics.median(speeds)
                    if baseline is None:
                        baseline = median
                    routing = SIM_ROUTING.get(policy)
                    sim = (
                        simulate_live(config, args.answer_tokens, replicas=n, routing=routing)
                        if routing
                        else None
                    )
                    sim_text = f"{sim.hit_rate:.1%}" if sim else "-"
                    spread = f"{median:.1f} ({min(speeds):.1f}..{max(speeds):.1f})"
                    print(f"{n:>8} {router:<8}{policy:<13}{spread:>22}{median / baseline:>7.2f}"
                          f"{statistics.median(rates):>10.1%}{sim_text:>11}  "
                          + " ".join(f"{s:.0%}" for s in shares), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
