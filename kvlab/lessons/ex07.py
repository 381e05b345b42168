"""Lesson example 7: LRU eviction in vLLM's prefix cache, requests A-D in a pool of 6 blocks.

The lesson talks about blocks by their hash names ("a1", "b2"). ``HashLabels``
turns names into prompts of whole blocks and keeps which digest each name is;
``named_history`` shows those names in a recorded history instead of short hex
(the model knows only digests). Every run of the lesson's steps goes through
``run_example_7``: the figures (``example_7``), the replay scenario
(``example_7_scenario``) and the exercises of notebook 07.

Expected, as the lesson prints it: evictions a3, b2, b1; free queue [3, 4, 5, 2, 1, 0]
after A, [5, 2, 1, 0, 4, 3] after B, [5, 1, 0] after C.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from kvlab.core import hashing
from kvlab.core.snapshots import BlockPoolState, Event, History
from kvlab.errors import InvalidArgumentError, check_int
from kvlab.models.paged import AllocationResult
from kvlab.models.prefix_cache import FreeResult, PrefixCache

NUM_BLOCKS = 6
EXAMPLE_7_REQUESTS: dict[str, tuple[str, ...]] = {
    "A": ("a1", "a2", "a3"),
    "B": ("b1", "b2"),
    "C": ("a1", "a2", "c3"),
    "D": ("d1", "d2", "d3"),
}
EXAMPLE_7_STEPS: tuple[tuple[str, str], ...] = (
    ("alloc", "A"),
    ("free", "A"),
    ("alloc", "B"),
    ("free", "B"),
    ("alloc", "C"),
    ("alloc", "D"),
    ("free", "C"),
)


class HashLabels:
    """Token ids for block-hash *names*, so a scenario written as "a1, a2, a3" runs on real tokens.

    The lesson's example 7 talks about blocks by their hash ("a1", "b2"). Each
    distinct name here gets its own run of ``block_size`` token ids, so a
    sequence of names becomes a prompt of whole blocks, and the block hash of
    each name is recorded for display. A name stands for a whole prefix (that
    is what a chained hash identifies), so using one name after two different
    prefixes is rejected.
    """

    def __init__(self, block_size: int, *, scheme: str = "lesson", salt: str | None = None) -> None:
        check_int("block_size", block_size, minimum=1)
        if scheme not in hashing.SCHEMES:
            raise InvalidArgumentError(
                f"unknown hash scheme {scheme!r}: use one of {', '.join(hashing.SCHEMES)}"
            )
        if salt is not None and (not isinstance(salt, str) or not salt):
            # vLLM's API rejects an empty cache_salt, and treats a missing one as no salt.
            raise InvalidArgumentError(f"cache_salt must be a non-empty string or None, got {salt!r}")
        self.block_size = block_size
        self.scheme = scheme
        self.salt = salt
        self._run: dict[str, int] = {}  # name -> index of its token run
        self._digest: dict[str, bytes] = {}
        self.names: dict[bytes, str] = {}  # digest -> name

    def tokens(self, labels: Sequence[str]) -> list[int]:
        """The prompt for ``labels``: one full block of distinct token ids per name."""
        if isinstance(labels, str) or not hasattr(labels, "__iter__"):
            raise InvalidArgumentError(f"labels must be a list of block names, got {type(labels).__name__}")
        names = list(labels)
        if not names:
            raise InvalidArgumentError("labels is empty: give at least one block name")
        runs = dict(self._run)
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(f"labels[{i}] must be a non-empty string, got {name!r}")
            runs.setdefault(name, len(runs))
        bs = self.block_size
        toks = [runs[name] * bs + k + 1 for name in names for k in range(bs)]
        digests = hashing.block_hashes(toks, bs, salt=self.salt, scheme=self.scheme)
        for name, digest in zip(names, digests, strict=True):
            known = self._digest.get(name)
            if known is not None and known != digest:
                raise InvalidArgumentError(
                    f"block name {name!r} was already used after a different prefix; a block hash names "
                    "the whole prefix up to it, so give this block another name"
                )
        self._run = runs
        for name, digest in zip(names, digests, strict=True):
            self._digest[name] = digest
            self.names[digest] = name
        return toks

    def __getitem__(self, digest: bytes) -> str:
        return self.names[digest]


def named_history(history: History[BlockPoolState], labels: HashLabels) -> History[BlockPoolState]:
    """``history`` with every hash the labels know shown by its name ("a1") instead of short hex.

    Snapshots and events hold ``hashing.short(digest)``; this swaps those
    strings, in the blocks' ``block_hash`` and the events' ``evicted_hashes``,
    for the names. A hash the labels do not know keeps its hex.
    """
    names = {hashing.short(digest): name for digest, name in labels.names.items()}
    out: History[BlockPoolState] = History()
    for step in history:
        state = step.state
        blocks = tuple(
            dataclasses.replace(b, block_hash=names.get(b.block_hash, b.block_hash))
            if b.block_hash is not None
            else b
            for b in state.blocks
        )
        event = step.event
        if isinstance(event, Event) and "evicted_hashes" in event.as_dict():
            fields = tuple(
                (key, tuple(names.get(h, h) for h in value) if key == "evicted_hashes" else value)
                for key, value in event.fields
            )
            event = Event(event.kind, fields)
        out.add(event, dataclasses.replace(state, blocks=blocks))
    return out


def example_7_ops(labels: HashLabels) -> Iterator[tuple[str, str, list[int] | None]]:
    """The lesson's steps in order: (op, request id, prompt tokens for an alloc, None for a free)."""
    for op, request_id in EXAMPLE_7_STEPS:
        yield op, request_id, labels.tokens(EXAMPLE_7_REQUESTS[request_id]) if op == "alloc" else None


def run_example_7(
    cache: PrefixCache, labels: HashLabels, *, before: Callable[[str, str], None] | None = None
) -> Iterator[tuple[str, str, AllocationResult | FreeResult]]:
    """Apply the lesson's steps to ``cache``, yielding (op, request id, result) after each one.

    ``before(op, request_id)``, when given, is called just before each step,
    so a caller can look at the cache as the step finds it.
    """
    for op, request_id, tokens in example_7_ops(labels):
        if before is not None:
            before(op, request_id)
        if tokens is None:
            yield op, request_id, cache.free(request_id)
        else:
            yield op, request_id, cache.allocate(request_id, tokens)


@dataclass(frozen=True)
class Example7:
    """Lesson example 7: which hashes were evicted, the free queue after each finished request, the log,
    and each request's block table and cache hits as its allocation returned them."""

    evictions: tuple[str, ...]
    queues: tuple[tuple[int, ...], ...]
    log: tuple[str, ...]
    history: History[BlockPoolState]
    tables: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # each request's block table
    hits: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # blocks its lookup hit


def example_7_scenario(block_size: int = 16, *, hash_scheme: str = "lesson") -> dict:
    """Example 7 as a replay scenario: ``{"config": ..., "ops": [...]}`` for ``python -m kvlab replay prefix-cache``.

    Each request's prompt is its named blocks and nothing more (whole blocks),
    so the prompt_len - 1 cap only keeps C from hitting its own last block,
    which misses anyway.
    """
    labels = HashLabels(block_size, scheme=hash_scheme)
    ops: list[dict] = []
    for op, request_id, tokens in example_7_ops(labels):
        ops.append(
            {"op": op, "req": request_id}
            if tokens is None
            else {"op": op, "req": request_id, "tokens": tokens}
        )
    config = {"block_size": block_size, "num_blocks": NUM_BLOCKS, "null_block": False, "hash": hash_scheme}
    return {"config": config, "ops": ops}


def example_7(block_size: int = 16, *, hash_scheme: str = "lesson") -> Example7:
    """Run lesson example 7 (a pool of 6 blocks, requests A-D) and return its evictions and queues.

    Expected: evictions a3, b2, b1; queues [3, 4, 5, 2, 1, 0] after A,
    [5, 2, 1, 0, 4, 3] after B, and [5, 1, 0] after C.
    """
    labels = HashLabels(block_size, scheme=hash_scheme)
    cache = PrefixCache(NUM_BLOCKS, block_size, hash_scheme=hash_scheme, record=True)
    evictions: list[str] = []
    queues: list[tuple[int, ...]] = []
    log: list[str] = []
    tables: dict[str, tuple[int, ...]] = {}
    hits: dict[str, tuple[int, ...]] = {}
    for op, request_id, result in run_example_7(cache, labels):
        if op == "free":
            queues.append(tuple(cache.free_queue()))
            log.append(f"  {request_id} finished; free queue, front first: {list(queues[-1])}")
            continue
        assert isinstance(result, AllocationResult)
        tables[request_id], hits[request_id] = tuple(result.block_table), tuple(result.hit_block_ids)
        names = EXAMPLE_7_REQUESTS[request_id]
        parts = [f"{names[i]} hit in block {b}" for i, b in enumerate(result.hit_block_ids)]
        dropped = dict(zip(result.evicted, result.evicted_hashes, strict=True))
        for i, b in enumerate(result.new_block_ids, start=len(result.hit_block_ids)):
            if b in dropped:
                evictions.append(labels[dropped[b]])
                parts.append(f"{names[i]} into block {b} (evicting {evictions[-1]})")
            else:
                parts.append(f"{names[i]} into block {b}")
        log.append(f"{request_id}: " + ", ".join(parts))
    assert cache.history is not None
    return Example7(
        tuple(evictions), tuple(queues), tuple(log), named_history(cache.history, labels), tables, hits
    )
