"""Block keys for lesson 002's fleet: each sequence's full blocks named by a chain over its whole prefix.

The invariant every scheme keeps: two blocks get equal keys exactly when their
whole prefixes (and salts) are equal. A store looks a prompt's keys up in order
and stops at the first miss, so that is all the hits depend on, and every
collision-free chain gives the same table.

The lesson hashes ``sha256(parent digest + repr(block tokens))`` from a root of
``sha256(salt)``; ``kvlab.core.hashing`` lays the bytes out differently (its
``"lesson"`` scheme is lesson 000's, ``"vllm"`` is vLLM's ``hash_block_tokens``,
which puts the salt into block 0's hash only: the later blocks inherit it
through the chain, with the same effect). The default scheme, ``"exact"``
(``_ExactKeys``), interns ``(parent key, block tokens)`` as a small integer:
equal by construction, never a collision, and much cheaper than SHA-256.
``"sha256-repr"`` (the lesson's own digests), ``"lesson"`` and ``"vllm"`` are
real digests (``_DigestKeys``); tests check that all four give the same numbers,
and the benchmark checks the six rows against SHA-256 chains.

Speed. Each user's sequence only grows, so its chain (``_Chain``) is kept
between turns and every block is keyed once per user chain, not again at every
turn as the lesson's program does. A timestamp at the start changes the prefix
every turn, so there every prompt really is re-keyed (cheaply: see
``_ExactKeys``). ``keyed_requests`` turns traffic into ``KeyedRequest`` rows,
all a store needs.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable
from dataclasses import dataclass

from kvlab.errors import InvalidArgumentError
from kvlab.fleet.config import FleetConfig, salt_of
from kvlab.fleet.traffic import TOKEN_BYTES, ChatTraffic, encode_tokens, timestamp_tokens

Key = Hashable
"""A block key: an int (``"exact"``) or a digest (bytes); only equality matters."""


class _Chain:
    """One sequence's block keys, extended as its tokens grow; each full block is keyed once."""

    __slots__ = ("keys", "length", "salt", "root", "step", "run", "_namer", "_tail")

    def __init__(self, namer: _ExactKeys | _DigestKeys, salt: str | None, block_size: int) -> None:
        self.keys: list[Key] = []
        self.length = 0  # tokens so far
        self.salt = salt
        self.root = namer.root(salt)
        self.step = block_size * TOKEN_BYTES  # bytes per block
        self.run: _PrivateRun | None = None  # used by _ExactKeys
        self._namer = namer
        self._tail = bytearray()  # encoded tokens of the partial last block

    def extend(self, data: bytes) -> None:
        """Append encoded tokens (see ``encode_tokens``)."""
        tail = self._tail
        tail += data
        self.length += len(data) // TOKEN_BYTES
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
                parent = hashing._hash_block(parent, block, chain.salt, not keys, self.scheme)  # type: ignore[arg-type]
            keys.append(parent)


def _namer(scheme: str) -> _ExactKeys | _DigestKeys:
    return _ExactKeys() if scheme == "exact" else _DigestKeys(scheme)


@dataclass(frozen=True)
class KeyedRequest:
    """One request reduced to what the lesson's store needs: its chain's keys and where the prompt ends.

    ``keys`` is the user's chain, shared with that user's later requests (it only grows), so
    only ``keys[:end]`` belong to this request. It runs nothing: it is not the record
    ``kvlab.models.prefix_cache`` keeps of a running request's blocks.
    """

    clock: int
    user: int
    turn: int
    salt: str | None
    prompt_tokens: int
    keys: list[Key]  # the sequence's block keys (may run past this request; use up to ``end``)
    usable: int  # prompt blocks that may hit: (prompt_tokens - 1) // block_size
    end: int  # full blocks of prompt + answer


def keyed_requests(traffic: ChatTraffic, config: FleetConfig) -> list[KeyedRequest]:
    """Key every request's blocks, incrementally per user where the sequence only grows."""
    if not isinstance(traffic, ChatTraffic):
        raise InvalidArgumentError(f"traffic must come from chat_traffic(), got {type(traffic).__name__}")
    if not isinstance(config, FleetConfig):
        raise InvalidArgumentError(f"config must be a FleetConfig, got {type(config).__name__}")
    if config.users < traffic.users:
        raise InvalidArgumentError("traffic has more users than config: draw it with the config's values")
    size = config.block_size
    namer = _namer(config.hash_scheme)
    system, encoded_turns = traffic.encoded
    chains: dict[int, _Chain] = {}
    histories: dict[int, bytearray] = {}  # only needed when the prefix changes every turn
    turns_seen: dict[int, int] = {}
    out = []
    for req, (message, answer) in zip(traffic.requests, encoded_turns, strict=True):
        user, salt = req.user, salt_of(config, req.user)
        if config.header == "start":
            chain = _Chain(namer, salt, size)
            history = histories.setdefault(user, bytearray())
            chain.extend(encode_tokens(timestamp_tokens(req.clock)) + system + history)
            history += message + answer
        else:
            chain = chains.get(user)  # type: ignore[assignment]
            if chain is None:
                chain = chains[user] = _Chain(namer, salt, size)
                chain.extend(system)
            if config.header == "before-message":
                chain.extend(encode_tokens(timestamp_tokens(req.clock)))
        chain.extend(message)
        prompt_tokens = chain.length
        chain.extend(answer)
        turn = turns_seen.get(user, 0)
        turns_seen[user] = turn + 1
        out.append(
            KeyedRequest(
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
