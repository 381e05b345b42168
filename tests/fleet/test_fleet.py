"""kvlab.fleet: lesson 002's six-row table, every option against a plain reference, traces, bad input."""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from collections import OrderedDict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab import fleet
from kvlab.errors import InvalidArgumentError
from kvlab.fleet import FleetConfig, chat_traffic, simulate, simulate_many
from kvlab.fleet import traffic as fleet_traffic
from kvlab.fleet.keys import KeyedRequest
from kvlab.fleet.store import LruStore
from kvlab.lessons.fleet import LESSON_ROWS, LESSON_SCENARIOS, lesson_row, lesson_table

SMALL = FleetConfig(users=12, turns=4, system_tokens=160, capacity_blocks=600)

# ---------------------------------------------------------------------- the lesson's table


def test_lesson_table_matches_the_lesson():
    rows = lesson_table()
    assert [r.scenario for r in rows] == [name for name, _ in LESSON_SCENARIOS]
    assert [r.capacity_blocks for r in rows] == [0, 20_000, 5_000, 1_000, 20_000, 20_000]
    assert [round(100 * r.hit_rate, 1) for r in rows] == [0.0, 92.8, 67.8, 58.0, 0.0, 56.5]
    assert [r.prefill_tokens for r in rows] == [2_581_118, 187_102, 831_582, 1_083_470, 2_583_518, 1_123_214]
    # the timestamp adds 2 tokens to each of the 1,200 prompts
    assert [r.total_tokens for r in rows] == [2_581_118] * 4 + [2_583_518, 2_581_118]
    assert [round(r.config.cache_gib, 1) for r in rows] == [0.0, 39.1, 9.8, 2.0, 39.1, 39.1]
    assert rows[1].row() == {
        "scenario": "shared system prompt, stable prefix",
        "capacity_blocks": 20_000,
        "hit_rate": 1 - 187_102 / 2_581_118,
        "prefill_tokens": 187_102,
        "total_tokens": 2_581_118,
    }
    assert tuple(lesson_row(r) for r in rows) == LESSON_ROWS


def test_bulk_draws_equal_random_random():
    assert fleet_traffic._fast_draws_match()
    for args in [(200, 6, 1, 1200), (5, 3, -7, 0), (3, 9, 2**40, 17)]:
        assert fleet_traffic._draw_traffic_fast(*args) == fleet_traffic._draw_traffic_reference(*args)


def test_traffic_shape():
    t = chat_traffic(users=10, turns=3, seed=4, system_tokens=30)
    assert len(t.system) == 30 and len(t.requests) == 30
    assert [r.clock for r in t.requests] == list(range(30))
    assert sorted(r.user for r in t.requests) == sorted(list(range(10)) * 3)
    for r in t.requests:
        assert 20 <= len(r.message) <= 200 and 50 <= len(r.answer) <= 400
        assert all(0 <= tok < fleet.VOCAB for tok in r.message + r.answer)
    assert chat_traffic(users=10, turns=3, seed=4, system_tokens=30) == t


# ---------------------------------------------------------------------- a plain reference


def reference(config: FleetConfig) -> tuple[int, int, list[int]]:
    """The lesson's algorithm written out plainly: every prompt re-hashed with SHA-256 at every turn."""
    rng = random.Random(config.seed)
    system = [rng.randrange(50_000) for _ in range(config.system_tokens)]
    order = [u for u in range(config.users) for _ in range(config.turns)]
    rng.shuffle(order)
    size = config.block_size
    share, extra = divmod(config.capacity_blocks, config.replicas)
    capacities = [share + (r < extra) for r in range(config.replicas)]
    caches: list[OrderedDict] = [OrderedDict() for _ in capacities]
    history: dict[int, list[int]] = {u: [] for u in range(config.users)}
    total = computed = 0
    hits = []
    for clock, u in enumerate(order):
        stamp = [clock % 997, clock // 997]
        msg = [rng.randrange(50_000) for _ in range(rng.randint(20, 200))]
        answer = [rng.randrange(50_000) for _ in range(rng.randint(50, 400))]
        if config.header == "start":
            prompt = stamp + system + history[u] + msg
            history[u] += msg + answer
        elif config.header == "before-message":
            prompt = system + history[u] + stamp + msg
            history[u] += stamp + msg + answer
        else:
            prompt = system + history[u] + msg
            history[u] += msg + answer
        salt = {"none": "", "user": f"user-{u}"}.get(
            config.salt, f"tenant-{u * (config.tenants or 1) // config.users}"
        )
        if config.routing == "user-hash":
            replica = (
                int.from_bytes(hashlib.sha256(f"user-{u}".encode()).digest()[:8], "big") % config.replicas
            )
        else:
            replica = clock % config.replicas
        cache, capacity = caches[replica], capacities[replica]

        def hashes(tokens: list[int], salt: str = salt) -> list[bytes]:
            out, parent = [], hashlib.sha256(salt.encode()).digest()
            for i in range(0, len(tokens) - len(tokens) % size, size):
                parent = hashlib.sha256(parent + repr(tokens[i : i + size]).encode()).digest()
                out.append(parent)
            return out

        hit = 0
        for h in hashes(prompt)[: (len(prompt) - 1) // size]:
            if h not in cache:
                break
            cache.move_to_end(h)
            hit += 1
        for h in hashes(prompt + answer)[hit:]:
            cache[h] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
        total += len(prompt)
        computed += len(prompt) - hit * size
        hits.append(hit * size)
    return total, computed, hits


configs = st.builds(
    FleetConfig,
    users=st.integers(1, 6),
    turns=st.integers(1, 4),
    seed=st.integers(-5, 5),
    system_tokens=st.integers(0, 70),
    block_size=st.integers(1, 20),
    capacity_blocks=st.integers(0, 400),
    header=st.sampled_from(fleet.HEADERS),
    salt=st.sampled_from(["none", "user"]),
    replicas=st.integers(1, 3),
    routing=st.sampled_from(fleet.ROUTINGS),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, tenants=st.integers(1, 6), use_tenants=st.booleans())
def test_simulation_equals_the_plain_reference(config, tenants, use_tenants):
    if use_tenants:
        config = replace(config, salt="tenant", tenants=min(tenants, config.users))
    result = simulate(config)
    total, computed, hits = reference(config)
    assert (result.total_tokens, result.prefill_tokens) == (total, computed)
    assert list(result.trace.cached_tokens) == hits


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"header": "start"},
        {"header": "before-message"},
        {"salt": "user"},
        {"salt": "tenant", "tenants": 3},
    ],
)
def test_any_collision_free_chain_gives_the_same_hits(change):
    base = replace(SMALL, capacity_blocks=150, replicas=2, **change)  # small enough to evict
    results = [simulate(replace(base, hash_scheme=s)) for s in fleet.HASH_SCHEMES]
    assert len({(r.prefill_tokens, r.trace) for r in results}) == 1
    assert results[0].prefill_tokens > 0


@pytest.mark.parametrize(
    "change",
    [{}, {"header": "before-message", "salt": "tenant", "tenants": 3, "replicas": 2, "routing": "user-hash"}],
)
def test_the_engine_model_matches_the_store_when_nothing_is_evicted(change):
    roomy = replace(SMALL, capacity_blocks=10_000, **change)
    store = simulate(roomy)
    engine = simulate(roomy, engine=True)
    assert engine.engine and (engine.prefill_tokens, engine.total_tokens) == (
        store.prefill_tokens,
        store.total_tokens,
    )
    assert engine.trace.cached_tokens == store.trace.cached_tokens


# ---------------------------------------------------------------------- rules of the store


def test_hits_come_in_whole_blocks():
    # two users, one turn each, a 50-token shared system prompt: the second user hits 3 blocks of 16
    result = simulate(FleetConfig(users=2, turns=1, system_tokens=50, capacity_blocks=100))
    assert result.trace.cached_tokens == (0, 48)


def test_the_last_prompt_token_is_never_a_hit():
    store = LruStore(10)
    keys = ["a", "b", "c", "d"]
    store.blocks.update(dict.fromkeys(keys))
    # a 64-token prompt of four cached 16-token blocks: only (64 - 1) // 16 = 3 may hit
    request = KeyedRequest(0, 0, 0, None, 64, keys, (64 - 1) // 16, 4)
    assert store.serve(request) == (3, 0)
    assert list(store.blocks) == ["d", "a", "b", "c"]  # hits touched; the cached last block left in place


def test_lru_evicts_the_oldest_block():
    store = LruStore(3)
    assert store.serve(KeyedRequest(0, 0, 0, None, 40, ["a", "b", "c"], 2, 3)) == (0, 0)
    assert store.serve(KeyedRequest(1, 1, 0, None, 33, ["a", "x"], 2, 2)) == (1, 1)  # evicts b
    assert list(store.blocks) == ["c", "a", "x"]


# ---------------------------------------------------------------------- what the options do


def rate(**change) -> float:
    return simulate(replace(SMALL, **change)).hit_rate


def test_timestamp_placement():
    stable = rate()
    assert rate(header="start") == 0.0  # every block follows a different first block
    assert rate(header="before-message") > 0.9 * stable  # history stays append-only


def test_salts_trade_sharing_for_isolation():
    unsalted, per_tenant, per_user = rate(), rate(salt="tenant", tenants=3), rate(salt="user")
    assert unsalted > per_tenant > per_user
    assert rate(salt="tenant", tenants=1) == unsalted  # one tenant shares everything
    assert rate(salt="tenant", tenants=SMALL.users) == per_user  # one user per tenant
    odd = simulate(replace(SMALL, salt="tenant", tenants=5))  # 12 users in 5 tenants of 2 or 3
    assert per_user < odd.hit_rate < unsalted


def test_routing_by_user_beats_round_robin():
    sticky = simulate(replace(SMALL, replicas=3, routing="user-hash"))
    spread = simulate(replace(SMALL, replicas=3, routing="round-robin"))
    assert sticky.hit_rate > spread.hit_rate
    assert spread.trace.replica[:6] == (0, 1, 2, 0, 1, 2)
    homes: dict[int, set[int]] = {}
    for user, replica in zip(sticky.trace.user, sticky.trace.replica, strict=True):
        homes.setdefault(user, set()).add(replica)
    assert all(len(r) == 1 for r in homes.values())
    assert rate(replicas=1, routing="user-hash") == rate()


def test_capacity_is_split_between_replicas():
    assert fleet.replica_capacities(10, 4) == [3, 3, 2, 2]
    assert fleet.replica_capacities(0, 2) == [0, 0]
    result = simulate(replace(SMALL, capacity_blocks=101, replicas=4, routing="user-hash"))
    assert max(result.trace.cached_blocks) <= 101


def test_no_cache_and_a_tiny_cache():
    none = simulate(replace(SMALL, capacity_blocks=0))
    assert none.prefill_tokens == none.total_tokens and set(none.trace.cached_blocks) == {0}
    assert rate(capacity_blocks=20) == 0.0  # each request evicts the system prompt before the next one comes
    assert 0 < rate(capacity_blocks=50) < rate(capacity_blocks=2000)


# ---------------------------------------------------------------------- traces


def test_trace_columns():
    result = simulate(SMALL)
    trace = result.trace
    assert len(trace) == SMALL.users * SMALL.turns
    assert sum(trace.prompt_tokens) == result.total_tokens
    assert sum(trace.prompt_tokens) - sum(trace.cached_tokens) == result.prefill_tokens
    assert trace.cumulative_hit_rate()[-1] == pytest.approx(result.hit_rate)
    assert len(trace.hit_rate_by_turn()) == SMALL.turns
    roomy = simulate(replace(SMALL, capacity_blocks=2000)).trace.hit_rate_by_turn()
    assert roomy == sorted(roomy) and roomy[0] < 0.6 < roomy[1]  # first turns share only the system prompt
    assert max(trace.cached_blocks) <= SMALL.capacity_blocks and set(trace.pinned_blocks) == {0}
    assert sum(trace.evicted_blocks) > 0
    assert sorted(trace.turn) == sorted(list(range(SMALL.turns)) * SMALL.users)


def test_one_traffic_shared_by_many_scenarios():
    traffic = chat_traffic(SMALL.users, SMALL.turns, SMALL.seed, SMALL.system_tokens)
    configs = [SMALL, replace(SMALL, capacity_blocks=50), replace(SMALL, header="start")]
    shared = simulate_many(configs, names=["a", "b", "c"], traffic=traffic)
    assert [r.scenario for r in shared] == ["a", "b", "c"]
    assert [r.prefill_tokens for r in shared] == [simulate(c).prefill_tokens for c in configs]
    assert (
        simulate(SMALL).scenario
        == SMALL.describe()
        == "cache 600 blocks, users 12, turns 4, system tokens 160"
    )


# ---------------------------------------------------------------------- engine model


def test_busy_pools_cache_less():
    config = replace(SMALL, capacity_blocks=700)
    free = simulate(config, engine=True)
    busy = simulate(config, engine=True, busy_blocks=500)
    assert busy.hit_rate < free.hit_rate
    assert min(busy.trace.pinned_blocks) >= 500
    crowded = simulate(config, engine=True, concurrent=8)
    assert max(crowded.trace.pinned_blocks) > max(free.trace.pinned_blocks)
    assert crowded.concurrent == 8 and busy.busy_blocks == 500


def test_engine_errors_before_running():
    with pytest.raises(InvalidArgumentError, match="capacity_blocks of at least"):
        simulate(replace(SMALL, capacity_blocks=50), engine=True)
    with pytest.raises(InvalidArgumentError, match="busy blocks"):
        simulate(SMALL, engine=True, busy_blocks=590)
    with pytest.raises(InvalidArgumentError, match="engine=True"):
        simulate(SMALL, concurrent=2)
    with pytest.raises(InvalidArgumentError, match="engine=True"):
        simulate(SMALL, busy_blocks=1)
    none = simulate(replace(SMALL, capacity_blocks=0), engine=True)
    assert none.prefill_tokens == none.total_tokens


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"users": 0}, "users must be at least 1"),
        ({"turns": -1}, "turns must be at least 1"),
        ({"system_tokens": -1}, "system_tokens"),
        ({"block_size": 0}, "block_size"),
        ({"capacity_blocks": -5}, "capacity_blocks"),
        ({"replicas": 0}, "replicas must be at least 1"),
        ({"users": 2.5}, "users must be an integer"),
        ({"seed": True}, "seed must be an integer"),
        ({"header": "middle"}, "header must be one of"),
        ({"salt": "tenants"}, "salt must be one of"),
        ({"routing": "random"}, "routing must be one of"),
        ({"hash_scheme": "md5"}, "hash_scheme must be one of"),
        ({"tenants": 4}, "only applies with salt='tenant'"),
        ({"salt": "tenant"}, "needs tenants"),
        ({"salt": "tenant", "tenants": 0}, "tenants must be at least 1"),
        ({"salt": "tenant", "tenants": 13}, "cannot exceed users"),
    ],
)
def test_bad_configs_are_rejected(change, match):
    with pytest.raises(InvalidArgumentError, match=match):
        replace(SMALL, **change)


def test_choices_compare_by_exact_str():
    class Anything:  # claims to equal every choice
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    with pytest.raises(InvalidArgumentError, match="header must be one of none, start, before-message"):
        replace(SMALL, header=Anything())

    class Name(str):
        pass

    assert type(replace(SMALL, salt=Name("user")).salt) is str  # a str subclass is kept as the plain str


def test_the_fleet_imports_no_upper_room():
    code = (
        "import sys, kvlab.fleet; "
        "print(sorted(m for m in sys.modules if m.split('.')[1:2] in "
        "(['lessons'], ['views'], ['cli'], ['exercises'])))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert {"simulate", "FleetConfig", "chat_traffic", "UserTurn"} <= set(fleet.__all__)


def test_bad_calls_are_rejected():
    with pytest.raises(InvalidArgumentError, match="FleetConfig"):
        simulate_many([SMALL, {"users": 3}])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="names"):
        simulate_many([SMALL], names=["a", "b"])
    with pytest.raises(InvalidArgumentError, match="engine"):
        simulate(SMALL, engine="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="concurrent"):
        simulate(SMALL, engine=True, concurrent=0)
    with pytest.raises(InvalidArgumentError, match="traffic was drawn"):
        simulate(SMALL, traffic=chat_traffic(users=3, turns=1))
    with pytest.raises(InvalidArgumentError, match="traffic must come"):
        simulate(SMALL, traffic=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="users"):
        chat_traffic(users=0)
    with pytest.raises(InvalidArgumentError, match="hash_scheme"):
        lesson_table(hash_scheme="crc")
    with pytest.raises(InvalidArgumentError, match="replicas"):
        fleet.replica_capacities(5, 0)
