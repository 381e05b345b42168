"""Lesson 002's routing claim on a real fleet: two ``kvlab serve`` replicas behind a real router.

One pair of replicas (127.0.0.1, each with half of the fleet's cache) serves every test here; each
router (kvlab's own, and sglang-router when installed) is started in front of them in turn, and
the replicas' caches are emptied between runs. The traffic is the lesson's (users in multi-turn
chats behind a shared system prompt), small enough for a few seconds per run.
"""

from __future__ import annotations

import pytest

from kvlab.fleet import FleetConfig
from kvlab.serve.fleet import Fleet, sglang_router_version
from kvlab.serve.load import discover_replicas, replay, simulate_live

REPLICAS = 2
BLOCKS_PER_REPLICA = 300  # the working set of CONFIG fits in the two together
CONFIG = FleetConfig(users=16, turns=3, system_tokens=64, capacity_blocks=REPLICAS * BLOCKS_PER_REPLICA)
ANSWER_TOKENS = 8
MARGIN = 0.08  # cache-aware beats round-robin by at least 8 points of hit rate (simulation: 58% vs 44%)
CONCURRENCY = 2  # two requests in flight: the order the router sees them in is nearly fixed
ROUTERS = [
    "kvlab",
    pytest.param(
        "sglang",
        marks=pytest.mark.skipif(sglang_router_version() is None, reason="sglang-router is not installed"),
    ),
]


@pytest.fixture(scope="module")
def fleet():
    with Fleet.up(REPLICAS, router="kvlab", policy="cache_aware", num_blocks=BLOCKS_PER_REPLICA,
                  max_model_len=1024, startup_timeout=120) as running:  # fmt: skip
        yield running
    assert not running.pids


@pytest.fixture(scope="module")
def runs(fleet):
    """Each router and policy's replay of the same traffic, from empty caches: {(router, policy): result}."""
    out = {}
    for router in ("kvlab", "sglang"):
        if router == "sglang" and sglang_router_version() is None:
            continue
        for policy in ("round_robin", "cache_aware"):
            fleet.restart_router(policy, router=router)
            fleet.reset_caches()
            out[router, policy] = replay(fleet.url, CONFIG, answer_tokens=ANSWER_TOKENS, concurrency=CONCURRENCY,
                                         replica_urls=fleet.replica_urls, request_timeout=30, deadline=120)  # fmt: skip
    return out


@pytest.mark.parametrize("router", ROUTERS)
def test_cache_aware_routing_hits_more_than_round_robin(runs, router):
    rr, ca = runs[router, "round_robin"], runs[router, "cache_aware"]
    assert not rr.failed and not ca.failed
    assert ca.hit_rate > rr.hit_rate + MARGIN, (router, ca.hit_rate, rr.hit_rate)
    sim_rr = simulate_live(CONFIG, ANSWER_TOKENS, replicas=REPLICAS, routing="round-robin")
    sim_sticky = simulate_live(CONFIG, ANSWER_TOKENS, replicas=REPLICAS, routing="user-hash")
    assert sim_sticky.hit_rate > sim_rr.hit_rate + MARGIN  # the simulation says the same


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
def test_replica_counters_add_up_to_the_totals(runs, router, policy):
    result = runs[router, policy]
    assert len(result.replicas) == REPLICAS
    assert all(r.queries > 0 for r in result.replicas)  # both replicas served traffic
    # every prompt token a response reports was looked up once, on one replica, and so was every hit
    assert sum(r.queries for r in result.replicas) == result.prompt_tokens
    assert sum(r.hits for r in result.replicas) == result.cached_tokens
    assert result.hit_rate == pytest.approx(result.cached_tokens / result.prompt_tokens)
    assert len(result.requests) == CONFIG.users * CONFIG.turns


@pytest.mark.parametrize("router", ROUTERS)
def test_the_router_lists_its_replicas(fleet, router):
    fleet.restart_router("cache_aware", router=router)
    assert discover_replicas(fleet.url) == sorted(fleet.replica_urls)
