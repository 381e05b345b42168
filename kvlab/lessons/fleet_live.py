"""Lesson 002's routing comparison on a real fleet, beside the simulation (notebook 15's live section).

The lesson's "try it" 3: route the users across 4 replicas, each with a quarter of the cache,
round-robin per turn, then by user (a sticky session). Here the replicas are real ``kvlab serve``
processes behind a real router (sglang-router when installed, else kvlab's own), the traffic is
the lesson's at a size that runs in about a minute (``LIVE_CONFIG``), and the hit rates are read
from each replica's ``/metrics``. ``live_routing_comparison()`` runs it and returns the rows;
``format_comparison`` lays them out beside the simulation's numbers for the same traffic.

With ``KVLAB_ROUTER_URL`` set (or ``router_url=``), the same traffic goes through that router
instead, once, with whatever policy it runs; its replicas' counters are read when it lists them
at ``/workers``, as sglang-router and kvlab's router do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvlab.errors import InvalidArgumentError, brief, check_size
from kvlab.fleet import FleetConfig
from kvlab.serve.fleet import Fleet, resolve_router, sglang_router_version
from kvlab.serve.load import LiveResult, check_url, context_needed, replay, simulate_live

ROUTER_URL_ENV = "KVLAB_ROUTER_URL"
LIVE_CONFIG = FleetConfig(users=24, turns=4, system_tokens=128, capacity_blocks=800)
"""The lesson's traffic, scaled down: 24 users x 4 turns behind a 128-token system prompt; a
fleet cache of 800 blocks in all (a quarter, 200 blocks, per replica)."""
LIVE_ANSWER_TOKENS = 16  # each reply: 16 tokens from the tiny model (the lesson's answers are 50-400)
LIVE_REPLICAS = 4
LIVE_CONCURRENCY = 4  # requests in flight at once, across the fleet
POLICY_ROUTING = {"round_robin": "round-robin", "cache_aware": "user-hash"}
"""The simulation's routing each live policy is compared with: the lesson has no cache-aware
router, and a sticky session per user is what a perfect one would do for this traffic."""


@dataclass(frozen=True)
class LiveRow:
    """One line of the comparison: a live run or a simulated one."""

    source: str  # "live" or "simulated"
    routing: str  # the router's policy, or the simulation's routing
    hit_rate: float
    router: str = (
        ""  # what served a live row ("sglang-router 0.3.2", "kvlab's router"); "" for the simulation
    )
    requests_per_s: float | None = None
    replica_hit_rates: tuple[float, ...] = ()
    replica_share: tuple[float, ...] = ()  # each replica's share of the prompt tokens
    failed: int = 0


@dataclass(frozen=True)
class LiveComparison:
    rows: tuple[LiveRow, ...]
    router: str  # what served the live runs, in words
    results: tuple[LiveResult, ...]
    note: str = ""

    def row(self, source: str, routing: str) -> LiveRow:
        for r in self.rows:
            if r.source == source and r.routing == routing:
                return r
        raise InvalidArgumentError(
            f"no {source} row for {routing!r}; rows: {[(r.source, r.routing) for r in self.rows]}"
        )


def live_routing_comparison(
    *,
    router_url: str | None = None,
    replicas: int = LIVE_REPLICAS,
    router: str = "auto",
    policies: tuple[str, ...] = ("round_robin", "cache_aware"),
    config: FleetConfig = LIVE_CONFIG,
    answer_tokens: int = LIVE_ANSWER_TOKENS,
    concurrency: int = LIVE_CONCURRENCY,
    router_args: tuple[str, ...] = (),
) -> LiveComparison:
    """Run the traffic through each policy on one real fleet (or through ``router_url``), plus the simulation.

    A local fleet is started once: ``replicas`` replicas, each with ``config.capacity_blocks //
    replicas`` blocks; for each policy the router is restarted and every cache emptied first, so
    each policy starts from the same cold fleet. Every process is stopped before this returns.
    In a notebook kernel the load generator runs its event loop in a helper thread
    (``kvlab.serve.client.run_async``), so this works there as anywhere.
    """
    replicas = check_size("replicas", replicas, "replicas", minimum=1)
    if isinstance(policies, str) or not isinstance(policies, tuple) or not policies:
        raise InvalidArgumentError(
            f"policies must be a non-empty tuple of policy names, got {brief(policies)}"
        )
    url = router_url if router_url is not None else os.environ.get(ROUTER_URL_ENV) or None
    results: list[LiveResult] = []
    if url is not None:
        url = check_url("router_url", url)
        results.append(
            replay(url, config, answer_tokens=answer_tokens, concurrency=concurrency, label="your router")
        )
        served, note = (
            f"the router at {url}",
            f"{ROUTER_URL_ENV} is set: one run through {url}, with its own policy",
        )
        sim_replicas = max(1, len(results[0].replicas)) if results[0].replicas else replicas
    else:
        kind = resolve_router(router)
        note = ""
        if router == "auto" and kind == "kvlab":
            note = "sglang-router is not installed (pip install sglang-router): kvlab's own router serves instead"
        share = config.capacity_blocks // replicas
        longest = context_needed(config, answer_tokens)
        context = max(64, -(-longest // 16) * 16)
        if share < -(-context // 16):
            raise InvalidArgumentError(
                f"each replica's {share} blocks cannot hold the longest request ({longest} tokens); "
                "give config a larger capacity_blocks or use fewer replicas"
            )
        with Fleet.up(replicas, router=kind, policy=policies[0], num_blocks=share, max_model_len=context,
                      router_args=router_args) as fleet:  # fmt: skip
            for policy in policies:
                fleet.restart_router(policy)
                fleet.reset_caches()
                results.append(
                    replay(
                        fleet.url,
                        config,
                        answer_tokens=answer_tokens,
                        concurrency=concurrency,
                        replica_urls=fleet.replica_urls,
                        label=policy,
                    )  # fmt: skip
                )
        version = sglang_router_version()
        served = f"sglang-router {version}" if kind == "sglang" else "kvlab's router"
        sim_replicas = replicas
    rows = [_live_row(r, "your router" if url is not None else served) for r in results]
    for routing in ("round-robin", "user-hash"):
        sim = simulate_live(config, answer_tokens, replicas=sim_replicas, routing=routing)
        shares = _shares([sum(p for p, rep in zip(sim.trace.prompt_tokens, sim.trace.replica, strict=True)
                              if rep == i) for i in range(sim_replicas)])  # fmt: skip
        rows.append(LiveRow("simulated", routing, sim.hit_rate, replica_share=shares))
    return LiveComparison(tuple(rows), served, tuple(results), note)


def _live_row(result: LiveResult, router: str) -> LiveRow:
    return LiveRow(
        "live",
        result.label,
        result.hit_rate,
        router=router,
        requests_per_s=result.requests_per_s,
        replica_hit_rates=tuple(r.hit_rate for r in result.replicas),
        replica_share=_shares([r.queries for r in result.replicas]),
        failed=len(result.failed),
    )


def _shares(counts: list[int]) -> tuple[float, ...]:
    total = sum(counts)
    return tuple(c / total for c in counts) if total else ()


def _routing_name(row: LiveRow) -> str:
    """A row's routing with what served it: the same policy name on two routers reads as two rows."""
    return f"{row.routing} on {row.router}" if row.router else row.routing


def format_comparison(comparison: LiveComparison) -> str:
    """The rows as a small table: hit rate and each replica's share of the traffic.

    No requests per second: the live replicas share the machine's cores with each other (and the
    recorded run with other work), so a rate says more about that contention than about the routing.
    """
    if not isinstance(comparison, LiveComparison):
        raise InvalidArgumentError(
            f"comparison must come from live_routing_comparison(), got {brief(comparison)}"
        )
    lines = [f"live: {comparison.router}" + (f" ({comparison.note})" if comparison.note else "")]
    width = max(len("routing"), *(len(_routing_name(r)) for r in comparison.rows)) + 2
    lines.append(f"{'':<10}{'routing':<{width}}{'hit rate':>8}  share of prompt tokens per replica")
    for r in comparison.rows:
        share = " ".join(f"{s:.0%}" for s in r.replica_share)
        failed = f"  ({r.failed} failed)" if r.failed else ""
        lines.append(f"{r.source:<10}{_routing_name(r):<{width}}{r.hit_rate:>8.1%}  {share}{failed}")
    return "\n".join(lines)


# ---------------------------------------------------------------- a recorded run, for when the live cell is skipped

RECORDED_WHEN = (
    "recorded 2026-12-01 15:29 UTC with this module's defaults: 4 kvlab serve replicas x 200 blocks, "
    "24 users x 4 turns, 4 requests in flight, on a two-core machine shared with other work; "
    "three live rows: round_robin and cache_aware on sglang-router 0.3.2, then cache_aware on kvlab's router"
)
RECORDED_ROWS: tuple[tuple[str, str, str, float, tuple[float, ...]], ...] = (
    ("live", "round_robin", "sglang-router 0.3.2", 0.3971, (0.244, 0.251, 0.261, 0.244)),
    ("live", "cache_aware", "sglang-router 0.3.2", 0.4888, (1.0, 0.0, 0.0, 0.0)),
    ("live", "cache_aware", "kvlab's router", 0.664, (0.427, 0.248, 0.295, 0.03)),
    ("simulated", "round-robin", "", 0.3857, (0.255, 0.258, 0.245, 0.242)),
    ("simulated", "user-hash", "", 0.6911, (0.33, 0.163, 0.323, 0.185)),
)
"""(source, routing, router, hit rate, share of prompt tokens per replica) of that run, as it printed."""


def recorded_comparison() -> LiveComparison:
    """The stored run above, as ``format_comparison`` lays it out (``results`` is empty: no live replies)."""
    rows = tuple(
        LiveRow(source, routing, rate, router=router, replica_share=share)
        for source, routing, router, rate, share in RECORDED_ROWS
    )
    return LiveComparison(rows, "a recorded run, not this machine's", (), RECORDED_WHEN)
