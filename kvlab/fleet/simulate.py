"""Run lesson 002's fleet: route each request to a replica, serve it, and total the prompt tokens computed.

The flow: ``chat_traffic`` draws the requests (``kvlab.fleet.traffic``);
``keyed_requests`` names their blocks (``kvlab.fleet.keys``); ``route`` picks the
replica; each replica's ``LruStore`` (``kvlab.fleet.store``) serves its requests.
``simulate_many`` draws each traffic and keys each chain layout only once for
all the scenarios that share them. A ``FleetResult`` holds the totals and a
per-request ``FleetTrace`` for plots over time.

The engine model. The lesson's store is all cache: nothing runs in it. With
``engine=True`` the same traffic goes through ``kvlab.models.prefix_cache.PrefixCache``,
vLLM's block pool (its ``KVCacheManager`` over a ``BlockPool``), where the pool
also holds the running requests and only blocks no request holds can be evicted
(in vLLM's order: a freed request's tail first). With one request at a time and
no eviction pressure it gives the lesson's numbers (187,102 at 20,000 blocks);
under pressure they differ a little (68.0% instead of 67.8% at 5,000 blocks)
because the eviction orders differ. ``busy_blocks`` (blocks held by other
running work) shows the lesson's warning that a fixed cache size hides how
capacity shrinks under load: 20,000 blocks with 15,000 busy hit like a
5,000-block cache. More chat requests in flight (``concurrent``) cost almost
nothing, because the blocks they pin are the most recently used ones, which an
LRU cache would keep anyway, and running blocks can still be hit.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import islice
from typing import Any

from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    KvlabError,
    OutOfBlocksError,
    brief,
    cdiv,
    check_bool,
    check_int,
    check_size,
)
from kvlab.fleet.config import FleetConfig, check_user, salt_of
from kvlab.fleet.keys import KeyedRequest, keyed_requests
from kvlab.fleet.store import LruStore
from kvlab.fleet.traffic import (
    ChatTraffic,
    _prompts_and_answers,
    chat_traffic,
    max_traffic_tokens,
    prompt_lengths,
)


@dataclass(frozen=True)
class FleetTrace:
    """Per-request columns, in arrival order, for plots over time.

    ``turn`` is the user's own turn number (0 = first message). ``cached_blocks``
    is the number of chat blocks the whole fleet holds cached right after the
    request (in the engine model: chat blocks with a hash, free or in use).
    ``pinned_blocks`` counts the blocks running requests hold then, other work's
    busy blocks included: always 0 in the lesson's store, which runs nothing;
    in the engine model the pool minus these is all that can be evicted.
    """

    user: tuple[int, ...]
    turn: tuple[int, ...]
    replica: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    cached_tokens: tuple[int, ...]
    cached_blocks: tuple[int, ...]
    evicted_blocks: tuple[int, ...]
    pinned_blocks: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.user)

    def cumulative_hit_rate(self) -> list[float]:
        """Hit rate of all prompt tokens so far, after each request."""
        out, hit, total = [], 0, 0
        for cached, prompt in zip(self.cached_tokens, self.prompt_tokens, strict=True):
            hit += cached
            total += prompt
            out.append(hit / total)
        return out

    def hit_rate_by_turn(self) -> list[float]:
        """Hit rate of each user turn number: the first turns only share the system prompt."""
        hits: dict[int, int] = {}
        totals: dict[int, int] = {}
        for turn, cached, prompt in zip(self.turn, self.cached_tokens, self.prompt_tokens, strict=True):
            hits[turn] = hits.get(turn, 0) + cached
            totals[turn] = totals.get(turn, 0) + prompt
        return [hits[t] / totals[t] for t in sorted(totals)]


@dataclass(frozen=True)
class FleetResult:
    """One scenario's totals; ``hit_rate`` is the share of prompt tokens that were cache hits."""

    scenario: str
    config: FleetConfig
    total_tokens: int
    prefill_tokens: int
    trace: FleetTrace = field(repr=False)
    engine: bool = False
    concurrent: int = 1
    busy_blocks: int = 0

    @property
    def capacity_blocks(self) -> int:
        return self.config.capacity_blocks

    @property
    def cached_tokens(self) -> int:
        return self.total_tokens - self.prefill_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.total_tokens

    def row(self) -> dict[str, object]:
        """The JSON row the CLI prints."""
        return {
            "scenario": self.scenario,
            "capacity_blocks": self.capacity_blocks,
            "hit_rate": self.hit_rate,
            "prefill_tokens": self.prefill_tokens,
            "total_tokens": self.total_tokens,
        }


# ---------------------------------------------------------------- simulation


def simulate(
    config: FleetConfig | None = None,
    *,
    scenario: str | None = None,
    engine: bool = False,
    concurrent: int = 1,
    busy_blocks: int = 0,
    traffic: ChatTraffic | None = None,
) -> FleetResult:
    """Run one scenario; ``scenario`` names it (default: ``config.describe()``).

    ``engine=True`` replays it through the prefix-cache model instead of the
    lesson's store, with ``concurrent`` chat requests in flight and
    ``busy_blocks`` held by other work on each replica (see ``simulate_many``).
    ``traffic`` reuses traffic drawn by ``chat_traffic`` for the same users,
    turns, seed and system prompt.
    """
    config = FleetConfig() if config is None else config
    names = None if scenario is None else [scenario]
    return simulate_many(
        [config], names=names, engine=engine, concurrent=concurrent, busy_blocks=busy_blocks, traffic=traffic
    )[0]


def simulate_many(
    configs: Sequence[FleetConfig],
    *,
    names: Sequence[str] | None = None,
    engine: bool = False,
    concurrent: int = 1,
    busy_blocks: int = 0,
    traffic: ChatTraffic | None = None,
) -> list[FleetResult]:
    """Run several scenarios, drawing each traffic and keying each chain layout only once.

    With ``engine=False`` (the default) each replica is the lesson's store: all
    of its capacity caches. With ``engine=True`` each replica is a
    ``kvlab.models.prefix_cache.PrefixCache`` pool of its share of the blocks, vLLM's
    design, where only blocks that no running request holds can be evicted:

    * a chat request allocates its prompt, then appends its answer (decode;
      each block is cached as it fills) and keeps its blocks until
      ``concurrent`` newer requests have started on that replica, or until the
      pool is too full to admit the next one (a scheduler would make that one
      wait). ``concurrent=1`` finishes each request before the next starts.
    * ``busy_blocks`` blocks per replica are held for the whole run by other
      work (a running request with a prompt nobody else sends).

    In the engine model a pool of ``capacity_blocks`` therefore caches only what
    running work leaves free. Pinning by the chat requests themselves costs
    almost no hits, though: they are the most recently used blocks, which an LRU
    cache would keep anyway, and running blocks can still be hit. Other work's
    blocks are what shrinks the cache. ``capacity_blocks=0`` means no prefix cache:
    nothing is run and every prompt token is computed.

    Bounds, checked before anything is drawn: each config's own (``FleetConfig``); at most
    ``LIMITS.total_tokens`` tokens sent by all the configs together; ``concurrent`` at most ``LIMITS.slots`` (requests in flight);
    ``busy_blocks`` at most ``LIMITS.num_blocks``; in the engine model each replica's pool at
    most ``LIMITS.num_blocks`` blocks and the busy work at most ``LIMITS.tokens`` tokens.
    """
    if isinstance(configs, (str, bytes, FleetConfig)) or not hasattr(configs, "__iter__"):
        raise InvalidArgumentError(f"configs must be a list of FleetConfig, got {type(configs).__name__}")
    configs = _check_configs(configs)
    if names is not None:
        if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
            raise InvalidArgumentError(f"names must be {len(configs)} strings, one per config")
        try:
            names = list(islice(names, len(configs) + 1))
        except Exception:
            raise InvalidArgumentError(f"names must be {len(configs)} strings, one per config") from None
        if len(names) != len(configs) or not all(isinstance(n, str) for n in names):
            raise InvalidArgumentError(f"names must be {len(configs)} strings, one per config")
        names = [n if type(n) is str else str.__str__(n) for n in names]
    check_bool("engine", engine)
    concurrent = check_size("concurrent", concurrent, "slots", minimum=1)
    busy_blocks = check_size("busy_blocks", busy_blocks, "num_blocks")
    if (concurrent > 1 or busy_blocks) and not engine:
        raise InvalidArgumentError(
            "concurrent and busy_blocks only apply to the engine model (the lesson's store runs no requests); "
            "pass engine=True"
        )
    if traffic is not None:
        if not isinstance(traffic, ChatTraffic):
            raise InvalidArgumentError(f"traffic must come from chat_traffic(), got {type(traffic).__name__}")
        for config in configs:
            if _traffic_key(config) != (traffic.users, traffic.turns, traffic.seed, len(traffic.system)):
                raise InvalidArgumentError(
                    "traffic was drawn for other users, turns, seed or system tokens than a config asks for; "
                    "leave traffic out or draw it with the config's values"
                )
    traffics: dict[tuple[int, int, int, int], ChatTraffic] = {}
    if traffic is not None:
        traffics[_traffic_key(configs[0])] = traffic
    if engine:  # check every config fits before running any
        for i, config in enumerate(configs):
            _check_engine_limits(config, busy_blocks, names[i] if names is not None else None)
        for i, config in enumerate(configs):
            tkey = _traffic_key(config)
            if tkey not in traffics:
                traffics[tkey] = chat_traffic(*tkey)
            _check_engine_fits(config, traffics[tkey], busy_blocks, names[i] if names is not None else None)
    workloads: dict[tuple[object, ...], list[KeyedRequest]] = {}
    results = []
    for i, config in enumerate(configs):
        tkey = _traffic_key(config)
        if tkey not in traffics:
            traffics[tkey] = chat_traffic(*tkey)
        name = names[i] if names is not None else config.describe()
        if engine:
            results.append(_run_engine(name, config, traffics[tkey], concurrent, busy_blocks))
            continue
        wkey = (tkey, config.block_size, config.header, config.salt, config.tenants, config.hash_scheme)
        if wkey not in workloads:
            workloads[wkey] = keyed_requests(traffics[tkey], config)
        results.append(_run_store(name, config, workloads[wkey]))
    return results


def _check_configs(configs: object) -> list[FleetConfig]:
    """The configs as a list, read lazily: refused once their traffics together may send more than
    ``LIMITS.total_tokens`` tokens (each config replays its traffic), so an endless iterator stops too."""
    out: list[FleetConfig] = []
    work = 0
    try:
        for i, config in enumerate(configs):  # type: ignore[call-overload]
            if not isinstance(config, FleetConfig):
                raise InvalidArgumentError(f"configs[{i}] must be a FleetConfig, got {type(config).__name__}")
            work += max_traffic_tokens(config.users, config.turns, config.system_tokens)
            if work > LIMITS.total_tokens:
                raise InvalidArgumentError(
                    f"configs[0..{i}] may send up to {work:,} tokens in all, more than {LIMITS.total_tokens:,} "
                    "(kvlab's limit LIMITS.total_tokens); run fewer or smaller scenarios per call"
                )
            out.append(config)
    except KvlabError:
        raise
    except Exception:
        raise InvalidArgumentError(f"configs must be a list of FleetConfig, got {brief(configs)}") from None
    return out


def _traffic_key(config: FleetConfig) -> tuple[int, int, int, int]:
    return (config.users, config.turns, config.seed, config.system_tokens)


def replica_capacities(capacity_blocks: int, replicas: int) -> list[int]:
    """Each replica's share of the cache: equal, the first ``capacity_blocks % replicas`` one block more.

    Bounded as in ``FleetConfig``: ``capacity_blocks`` by ``LIMITS.total_tokens``, ``replicas`` by ``LIMITS.replicas``.
    """
    capacity_blocks = check_size("capacity_blocks", capacity_blocks, "total_tokens")
    replicas = check_size("replicas", replicas, "replicas", minimum=1)
    share, extra = divmod(capacity_blocks, replicas)
    return [share + (1 if r < extra else 0) for r in range(replicas)]


def route(config: FleetConfig, clock: int, user: int) -> int:
    """The replica that serves request ``clock`` (0..MAX_TOKEN_ID) of ``user`` (0..users - 1)."""
    if not isinstance(config, FleetConfig):
        raise InvalidArgumentError(f"config must be a FleetConfig, got {type(config).__name__}")
    clock = check_int("clock", clock, minimum=0, maximum=2**31 - 1)
    user = check_user(config, user)
    return _route(config, clock, user)


def _route(config: FleetConfig, clock: int, user: int) -> int:
    if config.replicas == 1:
        return 0
    if config.routing == "round-robin":
        return clock % config.replicas
    return _user_hash(user) % config.replicas


@cache
def _user_hash(user: int) -> int:
    return int.from_bytes(hashlib.sha256(f"user-{user}".encode()).digest()[:8], "big")


def _run_store(name: str, config: FleetConfig, requests: list[KeyedRequest]) -> FleetResult:
    stores = [LruStore(c) for c in replica_capacities(config.capacity_blocks, config.replicas)]
    size = config.block_size
    replicas, cached_tokens, cached_blocks, evicted_blocks = [], [], [], []
    prefill = occupancy = 0
    for req in requests:
        replica = _route(config, req.clock, req.user)
        store = stores[replica]
        before = len(store.blocks)
        hit, evicted = store.serve(req)
        occupancy += len(store.blocks) - before
        prefill += req.prompt_tokens - hit * size
        replicas.append(replica)
        cached_tokens.append(hit * size)
        cached_blocks.append(occupancy)
        evicted_blocks.append(evicted)
    trace = FleetTrace(
        user=tuple(r.user for r in requests),
        turn=tuple(r.turn for r in requests),
        replica=tuple(replicas),
        prompt_tokens=tuple(r.prompt_tokens for r in requests),
        cached_tokens=tuple(cached_tokens),
        cached_blocks=tuple(cached_blocks),
        evicted_blocks=tuple(evicted_blocks),
        pinned_blocks=(0,) * len(requests),
    )
    return FleetResult(name, config, sum(trace.prompt_tokens), prefill, trace)


# ---------------------------------------------------------------- engine model


def _engine_model() -> Any:
    from kvlab.models.prefix_cache import PrefixCache

    return PrefixCache


_OTHER_WORK_SALT = "other-work"  # the busy blocks' chains can never meet the chat's


def _check_engine_limits(config: FleetConfig, busy_blocks: int, name: str | None) -> None:
    """Refuse, before any traffic is drawn, pools or busy work past ``LIMITS``."""
    if config.capacity_blocks == 0:
        return
    shares = replica_capacities(config.capacity_blocks, config.replicas)
    what = f"scenario {name!r}" if name else "this traffic"
    if max(shares) > LIMITS.num_blocks:
        raise InvalidArgumentError(
            f"the engine model cannot run {what}: a replica's pool of {max(shares):,} blocks is more than "
            f"{LIMITS.num_blocks:,} (kvlab's limit LIMITS.num_blocks); use fewer capacity_blocks or more replicas"
        )
    if busy_blocks * config.block_size > LIMITS.tokens:
        raise InvalidArgumentError(
            f"the engine model cannot run {what}: {busy_blocks:,} busy blocks of {config.block_size} tokens "
            f"are more than {LIMITS.tokens:,} tokens of other work (kvlab's limit LIMITS.tokens); "
            "use fewer busy blocks"
        )


def _check_engine_fits(config: FleetConfig, traffic: ChatTraffic, busy_blocks: int, name: str | None) -> None:
    """Refuse, before anything runs, pools that cannot hold the busy blocks plus their largest request."""
    if config.capacity_blocks == 0:
        return
    shares = replica_capacities(config.capacity_blocks, config.replicas)
    what = f"scenario {name!r}" if name else "this traffic"
    largest = [0] * config.replicas  # blocks of the largest request each replica gets
    for req, (prompt_len, answer_len) in zip(
        traffic.requests, prompt_lengths(traffic, config.header), strict=True
    ):
        replica = _route(config, req.clock, req.user)
        largest[replica] = max(largest[replica], cdiv(prompt_len + answer_len, config.block_size))
    short = [r for r in range(config.replicas) if largest[r] and largest[r] + busy_blocks > shares[r]]
    if short:
        r = short[0]
        busy = f" plus {busy_blocks:,} busy blocks" if busy_blocks else ""
        raise InvalidArgumentError(
            f"the engine model cannot run {what}: replica {r} has {shares[r]:,} blocks, but its largest "
            f"request needs {largest[r]:,}{busy}; give capacity_blocks of at least "
            f"{(max(largest) + busy_blocks) * config.replicas:,}"
            + (" or fewer busy blocks" if busy_blocks else "")
        )


def _run_engine(
    name: str, config: FleetConfig, traffic: ChatTraffic, concurrent: int, busy: int
) -> FleetResult:
    """Replay the traffic through ``PrefixCache`` pools (``_check_engine_fits`` has passed)."""
    size = config.block_size
    load = {"engine": True, "concurrent": concurrent, "busy_blocks": busy}
    if config.capacity_blocks == 0:  # no pool to cache in: every prompt token is computed
        return _no_cache_result(name, config, traffic, load)
    shares = replica_capacities(config.capacity_blocks, config.replicas)
    prefix_cache = _engine_model()
    scheme = "vllm" if config.hash_scheme == "vllm" else "lesson"
    pools = [prefix_cache(share, size, hash_scheme=scheme) if share else None for share in shares]
    for pool in pools:
        if pool is not None and busy:
            pool.allocate("other work", list(range(busy * size)), cache_salt=_OTHER_WORK_SALT)
    in_flight: list[deque[str]] = [deque() for _ in shares]
    columns: dict[str, list[int]] = {n: [] for n in FleetTrace.__dataclass_fields__}
    turns_seen: dict[int, int] = {}
    prefill = occupancy = 0
    for req, (prompt, answer) in zip(
        traffic.requests, _prompts_and_answers(traffic, config.header), strict=True
    ):
        replica = _route(config, req.clock, req.user)
        pool, running = pools[replica], in_flight[replica]
        assert pool is not None  # _check_engine_fits: a replica that gets requests has blocks
        while len(running) >= concurrent:
            pool.free(running.popleft())
        rid, salt = f"r{req.clock}", salt_of(config, req.user)
        admitted = _retry(lambda: pool.allocate(rid, prompt, cache_salt=salt), pool, running)  # noqa: B023
        decoded = _retry(lambda: pool.append(rid, answer), pool, running)  # noqa: B023
        running.append(rid)
        evicted = len(admitted.evicted) + len(decoded.evicted)
        occupancy += (len(prompt) + len(answer)) // size - admitted.num_cached_tokens // size - evicted
        pinned = sum(p.num_blocks - p.num_free_blocks for p in pools if p is not None)
        prefill += len(prompt) - admitted.num_cached_tokens
        turn = turns_seen.get(req.user, 0)
        turns_seen[req.user] = turn + 1
        row = (req.user, turn, replica, len(prompt), admitted.num_cached_tokens, occupancy, evicted, pinned)
        _append_row(columns, *row)
    total = sum(columns["prompt_tokens"])
    trace = FleetTrace(**{k: tuple(v) for k, v in columns.items()})
    return FleetResult(name, config, total, prefill, trace, **load)  # type: ignore[arg-type]


def _retry(call: Callable[[], Any], pool: Any, running: deque[str]) -> Any:
    """Make the call; while the pool is too full, finish the oldest running request first (a scheduler waits)."""
    while True:
        try:
            return call()
        except OutOfBlocksError:
            if not running:  # pragma: no cover - ruled out by the size check before the run
                raise
            pool.free(running.popleft())


def _append_row(columns: dict[str, list[int]], *values: int) -> None:
    for column, value in zip(columns.values(), values, strict=True):
        column.append(value)


def _no_cache_result(
    name: str, config: FleetConfig, traffic: ChatTraffic, load: dict[str, Any]
) -> FleetResult:
    turns_seen: dict[int, int] = {}
    columns: dict[str, list[int]] = {n: [] for n in FleetTrace.__dataclass_fields__}
    for req, (prompt_len, _answer_len) in zip(
        traffic.requests, prompt_lengths(traffic, config.header), strict=True
    ):
        turn = turns_seen.get(req.user, 0)
        turns_seen[req.user] = turn + 1
        _append_row(columns, req.user, turn, _route(config, req.clock, req.user), prompt_len, 0, 0, 0, 0)
    total = sum(columns["prompt_tokens"])
    trace = FleetTrace(**{k: tuple(v) for k, v in columns.items()})
    return FleetResult(name, config, total, total, trace, **load)
