"""Lesson 002: prefix caching for a fleet of chat users.

The lesson's traffic is many users holding multi-turn chats behind one shared
system prompt. Turn n of a user sends ``system + history + message`` and gets an
answer back; the message and the answer then join that user's history, so turn
n + 1 starts with everything turn n sent and received. Every random number comes
from one ``random.Random(seed)`` in the lesson's order (system prompt, the shuffled
arrival order, then per request: message length, message, answer length, answer),
so every figure matches the lesson's program.

The store is the lesson's: a map of cached block keys in least-recently-used
order with a fixed capacity. A request walks its full prompt blocks from the
start and stops at the first miss (a chained key names the whole prefix, so
nothing after a miss can match); the last prompt token is never a hit, because
the model must run on at least one position to produce logits. Hit blocks are
touched (moved to the young end). Every full block of prompt + answer that is
not cached yet is then added at the young end, the oldest evicted past the
capacity: answers are cached as decode fills their blocks. A block that is
already cached but was not part of the hit is left where it is, as in the
lesson (assigning an existing key of an ``OrderedDict`` keeps its position).

Block keys. The lesson hashes ``sha256(parent digest + repr(block tokens))`` from
a root of ``sha256(salt)``; ``kvlab.core.hashing`` lays the bytes out differently
(its ``"lesson"`` scheme is lesson 000's). The hits only depend on *which*
blocks have equal keys, and any collision-free chain makes two keys equal
exactly when the two whole prefixes (and salts) are equal, so every such chain
gives the same table. The default scheme, ``"exact"``, interns ``(parent key,
block tokens)`` as a small integer: equal by construction, never a collision,
and much cheaper than SHA-256. ``hash_scheme`` selects ``"sha256-repr"`` (the
lesson's own digests), ``"lesson"`` or ``"vllm"`` (``kvlab.core.hashing``) instead;
tests check that all four give the same numbers, and the benchmark checks the
six rows against SHA-256 chains.

Speed. Each user's sequence only grows, so its chain is kept between turns and
every block is keyed once per user chain, not again at every turn as the
lesson's program does. A timestamp at the start changes the prefix every turn,
so there every prompt really is re-keyed (cheaply: see ``_ExactKeys``). The
random content is drawn once and shared by every scenario with the same users,
turns, seed and system prompt.

The engine model. The lesson's store is all cache: nothing runs in it. With
``engine=True`` the same traffic goes through ``kvlab.models.prefix_cache.PrefixCache``,
vLLM's block pool, where the pool also holds the running requests and only
blocks no request holds can be evicted (in vLLM's order: a freed request's tail
first). With one request at a time and no eviction pressure it gives the
lesson's numbers (187,102 at 20,000 blocks); under pressure they differ a
little (68.0% instead of 67.8% at 5,000 blocks) because the eviction orders
differ. ``busy_blocks`` (blocks held by other running work) shows the lesson's
warning that a fixed cache size hides how capacity shrinks under load: 20,000
blocks with 15,000 busy hit like a 5,000-block cache. More chat requests in
flight (``concurrent``) cost almost nothing, because the blocks they pin are the
most recently used ones, which an LRU cache would keep anyway, and running
blocks can still be hit.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from typing import Any

import numpy as np

from kvlab.errors import InvalidArgumentError, OutOfBlocksError, check_int

VOCAB = 50_000
MESSAGE_TOKENS = (20, 200)  # inclusive range of a user message's length
ANSWER_TOKENS = (50, 400)  # inclusive range of an answer's length
KIB_PER_TOKEN = 128  # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes

HEADERS = ("none", "start", "before-message")
SALTS = ("none", "user", "tenant")
ROUTINGS = ("round-robin", "user-hash")
HASH_SCHEMES = ("exact", "sha256-repr", "lesson", "vllm")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class FleetConfig:
    """One scenario of the lesson's simulation.

    ``header`` is where a volatile timestamp goes: ``"none"``; ``"start"``, before
    the system prompt (the lesson's row 5); or ``"before-message"``, in front of
    each new message. A timestamp written before a message is part of that
    message, so it stays in the history the later turns resend.

    ``salt`` gives each user (``"user"``) or each tenant (``"tenant"``, with
    ``tenants``) its own hash chains, as vLLM's ``cache_salt`` does. Tenants are
    contiguous groups of users of near-equal size: user u belongs to tenant
    ``u * tenants // users`` (200 users, 10 tenants: users 0-19 are tenant 0, ...);
    ``tenants`` need not divide ``users``.

    ``replicas`` splits the fleet: each replica has its own store with an equal
    share of ``capacity_blocks`` (the first ``capacity_blocks % replicas`` get one
    block more). ``routing`` sends request i to replica ``i % replicas``
    (``"round-robin"``) or user u always to the replica given by a SHA-256 of
    ``"user-{u}"`` (``"user-hash"``, a sticky session).
    """

    users: int = 200
    turns: int = 6
    seed: int = 1
    system_tokens: int = 1200
    block_size: int = 16
    capacity_blocks: int = 20_000
    header: str = "none"
    salt: str = "none"
    tenants: int | None = None
    replicas: int = 1
    routing: str = "round-robin"
    hash_scheme: str = "exact"

    def __post_init__(self) -> None:
        check_int("users", self.users, minimum=1)
        check_int("turns", self.turns, minimum=1)
        check_int("seed", self.seed)
        check_int("system_tokens", self.system_tokens, minimum=0)
        check_int("block_size", self.block_size, minimum=1)
        check_int("capacity_blocks", self.capacity_blocks, minimum=0)
        check_int("replicas", self.replicas, minimum=1)
        _check_choice("header", self.header, HEADERS)
        _check_choice("salt", self.salt, SALTS)
        _check_choice("routing", self.routing, ROUTINGS)
        _check_choice("hash_scheme", self.hash_scheme, HASH_SCHEMES)
        if self.salt == "tenant":
            if self.tenants is None:
                raise InvalidArgumentError(
                    "salt='tenant' needs tenants=K, the number of tenants (the lesson uses 10)"
                )
            check_int("tenants", self.tenants, minimum=1)
            if self.tenants > self.users:
                raise InvalidArgumentError(
                    f"tenants ({self.tenants}) cannot exceed users ({self.users}): each tenant needs a user"
                )
        elif self.tenants is not None:
            raise InvalidArgumentError(
                f"tenants={self.tenants!r} only applies with salt='tenant' (salt is {self.salt!r}); "
                "set salt='tenant' or leave tenants out"
            )

    @property
    def cache_gib(self) -> float:
        """The cache's size in GiB at the lesson's 128 KiB of KV per token."""
        return self.capacity_blocks * self.block_size * KIB_PER_TOKEN / 2**20

    def describe(self) -> str:
        """A short scenario name that lists what differs from the lesson's stable-prefix row."""
        base = FleetConfig()
        parts = [f"cache {self.capacity_blocks:,} blocks"]
        for name in ("users", "turns", "seed", "system_tokens", "block_size"):
            if getattr(self, name) != getattr(base, name):
                parts.append(f"{name.replace('_', ' ')} {getattr(self, name):,}")
        if self.header == "start":
            parts.append("timestamp before the system prompt")
        elif self.header == "before-message":
            parts.append("timestamp before each message")
        if self.salt == "tenant":
            parts.append(f"salt per tenant ({self.tenants})")
        elif self.salt == "user":
            parts.append("salt per user")
        if self.replicas > 1:
            parts.append(f"{self.replicas} replicas {self.routing}")
        return ", ".join(parts)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


LESSON_SCENARIOS: tuple[tuple[str, FleetConfig], ...] = (
    ("no cache", FleetConfig(capacity_blocks=0)),
    ("shared system prompt, stable prefix", FleetConfig(capacity_blocks=20_000)),
    ("same, cache 4x smaller", FleetConfig(capacity_blocks=5_000)),
    ("same, cache too small for the sessions", FleetConfig(capacity_blocks=1_000)),
    ("timestamp placed before the system prompt", FleetConfig(capacity_blocks=20_000, header="start")),
    ("per-user salt (no cross-user sharing)", FleetConfig(capacity_blocks=20_000, salt="user")),
)
"""The lesson's six rows, in its order: (scenario name, configuration)."""


# ---------------------------------------------------------------- traffic


@dataclass(frozen=True)
class ChatTurn:
    """One request's random content: which user sends it, its new message, the answer it gets."""

    clock: int  # arrival position, 0-based
    user: int
    message: tuple[int, ...]
    answer: tuple[int, ...]


@dataclass(frozen=True)
class ChatTraffic:
    """The shared system prompt and every request, in arrival order."""

    users: int
    turns: int
    seed: int
    system: tuple[int, ...]
    requests: tuple[ChatTurn, ...]

    @cached_property
    def _encoded(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The system prompt and each (message, answer) as chain bytes, encoded once for all scenarios."""
        data = _encode(list(itertools.chain(self.system, *(t.message + t.answer for t in self.requests))))
        system_end = len(self.system) * _TOKEN_BYTES
        turns, pos = [], system_end
        for t in self.requests:
            mid = pos + len(t.message) * _TOKEN_BYTES
            end = mid + len(t.answer) * _TOKEN_BYTES
            turns.append((data[pos:mid], data[mid:end]))
            pos = end
        return data[:system_end], turns


def chat_traffic(users: int = 200, turns: int = 6, seed: int = 1, system_tokens: int = 1200) -> ChatTraffic:
    """The lesson's traffic: ``users`` x ``turns`` requests in a seeded random order.

    The draws are those of ``random.Random(seed)``: ``system_tokens`` ids in
    [0, 50,000), a shuffle of the arrival order (each user listed ``turns`` times),
    then per request a message length in [20, 200], the message, an answer length
    in [50, 400] and the answer. They are taken in bulk from numpy's Mersenne
    Twister started in Python's exact state, which gives the very same numbers
    (CPython's ``randrange`` takes one 32-bit word per try); a self-check falls
    back to plain ``random.Random`` calls should that ever differ.
    """
    check_int("users", users, minimum=1)
    check_int("turns", turns, minimum=1)
    check_int("seed", seed)
    check_int("system_tokens", system_tokens, minimum=0)
    draw = _draw_traffic_fast if _fast_draws_match() else _draw_traffic_reference
    return draw(users, turns, seed, system_tokens)


def _draw_traffic_reference(users: int, turns: int, seed: int, system_tokens: int) -> ChatTraffic:
    """Plain ``random.Random`` calls in the lesson's order (the definition the fast path must match)."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(VOCAB) for _ in range(system_tokens))
    order = [u for u in range(users) for _ in range(turns)]
    rng.shuffle(order)
    requests = []
    for clock, user in enumerate(order):
        message = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(*MESSAGE_TOKENS)))
        answer = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(*ANSWER_TOKENS)))
        requests.append(ChatTurn(clock, user, message, answer))
    return ChatTraffic(users, turns, seed, system, tuple(requests))


def _draw_traffic_fast(users: int, turns: int, seed: int, system_tokens: int) -> ChatTraffic:
    words = _TwisterWords(random.Random(seed))
    system = words.many_below(VOCAB, system_tokens)
    order = [u for u in range(users) for _ in range(turns)]
    for i in reversed(range(1, len(order))):  # random.shuffle's loop
        j = words.below(i + 1)
        order[i], order[j] = order[j], order[i]
    msg_lo, msg_hi = MESSAGE_TOKENS
    ans_lo, ans_hi = ANSWER_TOKENS
    requests = []
    for clock, user in enumerate(order):
        message = words.many_below(VOCAB, msg_lo + words.below(msg_hi - msg_lo + 1))
        answer = words.many_below(VOCAB, ans_lo + words.below(ans_hi - ans_lo + 1))
        requests.append(ChatTurn(clock, user, message, answer))
    return ChatTraffic(users, turns, seed, system, tuple(requests))


class _TwisterWords:
    """Python's Mersenne Twister output, 32-bit words drawn in bulk by numpy.

    CPython draws ``randrange(n)`` as ``getrandbits(k)`` with ``k = n.bit_length()``,
    retried while the result is >= n, and ``getrandbits(k)`` for k <= 32 is one
    32-bit word shifted right by ``32 - k``. So a run of draws below ``n`` is the
    accepted words of a vectorised filter.
    """

    def __init__(self, rng: random.Random) -> None:
        _version, internal, _gauss = rng.getstate()
        self._bits = np.random.MT19937()
        self._bits.state = {
            "bit_generator": "MT19937",
            "state": {"key": np.array(internal[:-1], dtype=np.uint32), "pos": internal[-1]},
        }
        self._words = np.empty(0, dtype=np.uint64)
        self._pos = 0

    def _ensure(self, count: int) -> None:
        if self._pos + count > len(self._words):
            fresh = self._bits.random_raw(max(count, 1 << 16))
            self._words = np.concatenate((self._words[self._pos :], fresh))
            self._pos = 0

    def below(self, n: int) -> int:
        shift = 32 - n.bit_length()
        while True:
            self._ensure(1)
            value = int(self._words[self._pos]) >> shift
            self._pos += 1
            if value < n:
                return value

    def many_below(self, n: int, count: int) -> tuple[int, ...]:
        if count == 0:
            return ()
        shift = np.uint64(32 - n.bit_length())
        span = int(count * (1 << n.bit_length()) / n * 1.1) + 32
        while True:
            self._ensure(span)
            values = self._words[self._pos : self._pos + span] >> shift
            accepted = np.flatnonzero(values < n)
            if len(accepted) >= count:
                self._pos += int(accepted[count - 1]) + 1
                return tuple(values[accepted[:count]].tolist())
            span *= 2


@cache
def _fast_draws_match() -> bool:
    """Whether the bulk draws equal ``random.Random``'s on this Python (checked once, on a small case)."""
    args = (7, 3, 2024, 40)
    return _draw_traffic_fast(*args) == _draw_traffic_reference(*args)


def timestamp_tokens(clock: int) -> tuple[int, int]:
    """The lesson's volatile header: two tokens that change at every request, like a clock."""
    return (clock % 997, clock // 997)


# ---------------------------------------------------------------- chained block keys


Key = Hashable
_TOKEN_BYTES = 4  # chains read tokens as native 32-bit ints: a fixed width, so equal bytes = equal tokens


def _encode(tokens: Sequence[int]) -> bytes:
    return array("i", tokens).tobytes()


class _Chain:
    """One sequence's block keys, extended as its tokens grow; each full block is keyed once."""

    __slots__ = ("keys", "length", "salt", "root", "step", "run", "_namer", "_tail")

    def __init__(self, namer: _ExactKeys | _DigestKeys, salt: str | None, block_size: int) -> None:
        self.keys: list[Key] = []
        self.length = 0  # tokens so far
        self.salt = salt
        self.root = namer.root(salt)
        self.step = block_size * _TOKEN_BYTES  # bytes per block
        self.run: _PrivateRun | None = None  # used by _ExactKeys
        self._namer = namer
        self._tail = bytearray()  # encoded tokens of the partial last block

    def extend(self, data: bytes) -> None:
        """Append encoded tokens (see ``_encode``)."""
        tail = self._tail
        tail += data
        self.length += len(data) // _TOKEN_BYTES
        full = len(tail) - len(tail) % self.step
        if full:
            self._namer.extend(self, bytes(tail[:full]))
            del tail[:full]


@dataclass
class _PrivateRun:
    """Keys a chain made up after its first miss, not yet entered in the table.

    ``keys[head]`` is in the table; the blocks of ``data`` are the keys after it.
    """

    keys: list[Key]
    head: int
    data: bytearray
    step: int
    open: bool = True


class _ExactKeys:
    """Interns ``(parent key, block bytes)`` as a small int: keys are equal exactly when prefixes are.

    Lazily: a child of a key that no other chain has reached is certainly new, so
    after a chain's first miss its keys are handed out without building table
    entries. The entries are written only if another chain later reaches the
    run's first key (``runs``). A timestamp at the start makes every request
    such a chain, which is why it costs almost nothing here.
    """

    def __init__(self) -> None:
        self.table: dict[Hashable, int] = {}
        self.runs: dict[int, _PrivateRun] = {}  # first key of an unwritten run -> the run
        self.next_key = 0

    def root(self, salt: str | None) -> Key:
        if ("root", salt) not in self.table:
            self.table["root", salt] = self._fresh(1)[0]
        return self.table["root", salt]

    def _fresh(self, count: int) -> range:
        keys = range(self.next_key, self.next_key + count)
        self.next_key += count
        return keys

    def extend(self, chain: _Chain, data: bytes) -> None:
        keys, step = chain.keys, chain.step
        if chain.run is not None and chain.run.open:  # the parent is private: so are its children
            chain.run.data += data
            keys.extend(self._fresh(len(data) // step))
            return
        table, runs = self.table, self.runs
        parent = keys[-1] if keys else chain.root
        for start in range(0, len(data), step):
            block = data[start : start + step]
            child = table.get((parent, block))
            if child is None:  # first miss: enter this key, keep the rest private
                child = table[parent, block] = self._fresh(1)[0]
                keys.append(child)
                rest = data[start + step :]
                keys.extend(self._fresh(len(rest) // step))
                chain.run = runs[child] = _PrivateRun(
                    keys, len(keys) - len(rest) // step - 1, bytearray(rest), step
                )
                return
            if child in runs:
                self._write(runs.pop(child))
            keys.append(child)
            parent = child

    def _write(self, run: _PrivateRun) -> None:
        """Enter a private run's keys in the table: another chain has reached its first key."""
        parent, data, step = run.keys[run.head], bytes(run.data), run.step
        for i, start in enumerate(range(0, len(data), step)):
            child = run.keys[run.head + 1 + i]
            self.table[parent, data[start : start + step]] = child
            parent = child
        run.open, run.data = False, bytearray()


class _DigestKeys:
    """Real chained digests: the lesson's ``sha256(parent + repr(list))`` or a ``kvlab.core.hashing`` scheme."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme

    def root(self, salt: str | None) -> Key:
        if self.scheme == "sha256-repr":
            return hashlib.sha256((salt or "").encode()).digest()
        from kvlab.core import hashing

        return hashing.none_hash(self.scheme)

    def extend(self, chain: _Chain, data: bytes) -> None:
        from kvlab.core import hashing

        keys, step = chain.keys, chain.step
        parent = keys[-1] if keys else chain.root
        for start in range(0, len(data), step):
            block = array("i", data[start : start + step]).tolist()
            if self.scheme == "sha256-repr":
                parent = hashlib.sha256(parent + repr(block).encode()).digest()  # type: ignore[operator]
            else:
                parent = hashing.hash_block(
                    parent, block, salt=chain.salt, first=not keys, scheme=self.scheme
                )  # type: ignore[arg-type]
            keys.append(parent)


def _namer(scheme: str) -> _ExactKeys | _DigestKeys:
    return _ExactKeys() if scheme == "exact" else _DigestKeys(scheme)


@dataclass(frozen=True)
class _Request:
    """One request reduced to what the store needs: its chain and where the prompt ends."""

    clock: int
    user: int
    turn: int
    salt: str | None
    prompt_tokens: int
    keys: list[Key]  # the sequence's block keys (may run past this request; use up to ``end``)
    usable: int  # prompt blocks that may hit: (prompt_tokens - 1) // block_size
    end: int  # full blocks of prompt + answer


def _salt_of(config: FleetConfig, user: int) -> str | None:
    if config.salt == "user":
        return f"user-{user}"
    if config.salt == "tenant":
        assert config.tenants is not None
        return f"tenant-{user * config.tenants // config.users}"
    return None


def _requests(traffic: ChatTraffic, config: FleetConfig) -> list[_Request]:
    """Key every request's blocks, incrementally per user where the sequence only grows."""
    size = config.block_size
    namer = _namer(config.hash_scheme)
    system, encoded_turns = traffic._encoded
    chains: dict[int, _Chain] = {}
    histories: dict[int, bytearray] = {}  # only needed when the prefix changes every turn
    turns_seen: dict[int, int] = {}
    out = []
    for req, (message, answer) in zip(traffic.requests, encoded_turns, strict=True):
        user, salt = req.user, _salt_of(config, req.user)
        if config.header == "start":
            chain = _Chain(namer, salt, size)
            history = histories.setdefault(user, bytearray())
            chain.extend(_encode(timestamp_tokens(req.clock)) + system + history)
            history += message + answer
        else:
            chain = chains.get(user)  # type: ignore[assignment]
            if chain is None:
                chain = chains[user] = _Chain(namer, salt, size)
                chain.extend(system)
            if config.header == "before-message":
                chain.extend(_encode(timestamp_tokens(req.clock)))
        chain.extend(message)
        prompt_tokens = chain.length
        chain.extend(answer)
        turn = turns_seen.get(user, 0)
        turns_seen[user] = turn + 1
        out.append(
            _Request(
                req.clock,
                user,
                turn,
                salt,
                prompt_tokens,
                chain.keys,
                (prompt_tokens - 1) // size,
                len(chain.keys),
            )
        )
    return out


def _prompt_and_answer(traffic: ChatTraffic, config: FleetConfig) -> Iterable[tuple[list[int], list[int]]]:
    """The token lists themselves, request by request (the engine model hashes them itself)."""
    histories: dict[int, list[int]] = {}
    for req in traffic.requests:
        history = histories.setdefault(req.user, [])
        stamp = list(timestamp_tokens(req.clock))
        if config.header == "start":
            prompt = stamp + list(traffic.system) + history + list(req.message)
            history += req.message + req.answer
        elif config.header == "before-message":
            prompt = list(traffic.system) + history + stamp + list(req.message)
            history += stamp + list(req.message) + list(req.answer)
        else:
            prompt = list(traffic.system) + history + list(req.message)
            history += req.message + req.answer
        yield prompt, list(req.answer)


# ---------------------------------------------------------------- the lesson's store


class _LruStore:
    """The lesson's block store: cached keys, oldest first, at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[Key, None] = OrderedDict()

    def serve(self, req: _Request) -> tuple[int, int]:
        """Look the prompt up, then cache prompt + answer; return (hit blocks, blocks evicted)."""
        if not self.capacity:  # every block would be added and evicted at once
            return 0, req.end
        blocks, keys = self.blocks, req.keys
        touch = blocks.move_to_end
        hit = 0
        for key in keys[: req.usable]:
            if key not in blocks:
                break  # a chained key names its whole prefix: nothing later can match
            touch(key)
            hit += 1
        evicted, size, capacity = 0, len(blocks), self.capacity
        evict = blocks.popitem
        for key in keys[hit : req.end]:
            if key not in blocks:
                blocks[key] = None
                if size < capacity:
                    size += 1
                else:
                    evict(last=False)
                    evicted += 1
        return hit, evicted


# ---------------------------------------------------------------- results


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
    """
    configs = list(configs)
    for i, config in enumerate(configs):
        if not isinstance(config, FleetConfig):
            raise InvalidArgumentError(f"configs[{i}] must be a FleetConfig, got {type(config).__name__}")
    if names is not None:
        names = list(names)
        if len(names) != len(configs) or not all(isinstance(n, str) for n in names):
            raise InvalidArgumentError(f"names must be {len(configs)} strings, one per config")
    if not isinstance(engine, bool):
        raise InvalidArgumentError(f"engine must be True or False, got {engine!r}")
    check_int("concurrent", concurrent, minimum=1)
    check_int("busy_blocks", busy_blocks, minimum=0)
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
            tkey = _traffic_key(config)
            if tkey not in traffics:
                traffics[tkey] = chat_traffic(*tkey)
            _check_engine_fits(config, traffics[tkey], busy_blocks, names[i] if names is not None else None)
    workloads: dict[tuple[object, ...], list[_Request]] = {}
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
            workloads[wkey] = _requests(traffics[tkey], config)
        results.append(_run_store(name, config, workloads[wkey]))
    return results


def lesson_table(
    *, hash_scheme: str = "exact", engine: bool = False, concurrent: int = 1, busy_blocks: int = 0
) -> list[FleetResult]:
    """The lesson's six rows (see ``LESSON_SCENARIOS``); the options as in ``FleetConfig`` and ``simulate_many``."""
    _check_choice("hash_scheme", hash_scheme, HASH_SCHEMES)
    names = [name for name, _ in LESSON_SCENARIOS]
    configs = [replace(config, hash_scheme=hash_scheme) for _, config in LESSON_SCENARIOS]
    return simulate_many(configs, names=names, engine=engine, concurrent=concurrent, busy_blocks=busy_blocks)


def _traffic_key(config: FleetConfig) -> tuple[int, int, int, int]:
    return (config.users, config.turns, config.seed, config.system_tokens)


def replica_capacities(capacity_blocks: int, replicas: int) -> list[int]:
    """Each replica's share of the cache: equal, the first ``capacity_blocks % replicas`` one block more."""
    check_int("capacity_blocks", capacity_blocks, minimum=0)
    check_int("replicas", replicas, minimum=1)
    share, extra = divmod(capacity_blocks, replicas)
    return [share + (1 if r < extra else 0) for r in range(replicas)]


def route(config: FleetConfig, clock: int, user: int) -> int:
    """The replica that serves request ``clock`` of ``user``."""
    if config.replicas == 1:
        return 0
    if config.routing == "round-robin":
        return clock % config.replicas
    return _user_hash(user) % config.replicas


@cache
def _user_hash(user: int) -> int:
    return int.from_bytes(hashlib.sha256(f"user-{user}".encode()).digest()[:8], "big")


def _run_store(name: str, config: FleetConfig, requests: list[_Request]) -> FleetResult:
    stores = [_LruStore(c) for c in replica_capacities(config.capacity_blocks, config.replicas)]
    size = config.block_size
    replicas, cached_tokens, cached_blocks, evicted_blocks = [], [], [], []
    prefill = occupancy = 0
    for req in requests:
        replica = route(config, req.clock, req.user)
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


def _check_engine_fits(config: FleetConfig, traffic: ChatTraffic, busy_blocks: int, name: str | None) -> None:
    """Refuse, before anything runs, pools that cannot hold the busy blocks plus their largest request."""
    if config.capacity_blocks == 0:
        return
    shares = replica_capacities(config.capacity_blocks, config.replicas)
    largest = [0] * config.replicas  # blocks of the largest request each replica gets
    for req, (prompt_len, answer_len) in zip(traffic.requests, _lengths(traffic, config), strict=True):
        replica = route(config, req.clock, req.user)
        largest[replica] = max(largest[replica], -(-(prompt_len + answer_len) // config.block_size))
    short = [r for r in range(config.replicas) if largest[r] and largest[r] + busy_blocks > shares[r]]
    if short:
        r = short[0]
        busy = f" plus {busy_blocks:,} busy blocks" if busy_blocks else ""
        what = f"scenario {name!r}" if name else "this traffic"
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
    for req, (prompt, answer) in zip(traffic.requests, _prompt_and_answer(traffic, config), strict=True):
        replica = route(config, req.clock, req.user)
        pool, running = pools[replica], in_flight[replica]
        assert pool is not None  # _check_engine_fits: a replica that gets requests has blocks
        while len(running) >= concurrent:
            pool.free(running.popleft())
        rid, salt = f"r{req.clock}", _salt_of(config, req.user)
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


def _lengths(traffic: ChatTraffic, config: FleetConfig) -> list[tuple[int, int]]:
    """(prompt tokens, answer tokens) of each request, without building the prompts."""
    history: dict[int, int] = {}
    stamp = 2 if config.header != "none" else 0
    out = []
    for req in traffic.requests:
        before = history.get(req.user, 0)
        prompt = len(traffic.system) + before + stamp + len(req.message)
        kept = stamp if config.header == "before-message" else 0
        history[req.user] = before + kept + len(req.message) + len(req.answer)
        out.append((prompt, len(req.answer)))
    return out


def _no_cache_result(
    name: str, config: FleetConfig, traffic: ChatTraffic, load: dict[str, Any]
) -> FleetResult:
    turns_seen: dict[int, int] = {}
    columns: dict[str, list[int]] = {n: [] for n in FleetTrace.__dataclass_fields__}
    for req, (prompt_len, _answer_len) in zip(traffic.requests, _lengths(traffic, config), strict=True):
        turn = turns_seen.get(req.user, 0)
        turns_seen[req.user] = turn + 1
        _append_row(columns, req.user, turn, route(config, req.clock, req.user), prompt_len, 0, 0, 0, 0)
    total = sum(columns["prompt_tokens"])
    trace = FleetTrace(**{k: tuple(v) for k, v in columns.items()})
    return FleetResult(name, config, total, total, trace, **load)


__all__ = [
    "ANSWER_TOKENS",
    "HASH_SCHEMES",
    "HEADERS",
    "KIB_PER_TOKEN",
    "LESSON_SCENARIOS",
    "MESSAGE_TOKENS",
    "ROUTINGS",
    "SALTS",
    "VOCAB",
    "ChatTraffic",
    "ChatTurn",
    "FleetConfig",
    "FleetResult",
    "FleetTrace",
    "chat_traffic",
    "lesson_table",
    "replica_capacities",
    "route",
    "simulate",
    "simulate_many",
    "timestamp_tokens",
]
