"""Immutable records of a model's whole state and of what each operation did.

A model that records keeps a ``History``: step 0 is the state before any
operation, and every later step is the state right after one operation, with
an ``Event`` that says, as plain data, what the operation did (what was hit,
allocated, evicted, split, locked). Models never write prose: the views turn
events into captions (``kvlab.views.text.caption``) and states into pictures,
and never touch a model, so a slider is just an index into ``history.steps``.

The state types are frozen dataclasses made of tuples, ints and strings, so a
snapshot can never change after it was taken and two snapshots compare equal
exactly when the states are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class Event:
    """What one operation did, as plain data: ``kind`` names the model and op, ``fields`` the facts.

    ``kind`` is ``"<model>.<op>"`` (``"prefix_cache.allocate"``, ``"radix.evict"``); ``fields`` are
    (name, value) pairs of ints, strings and tuples, in a fixed order. Read a field with
    ``event["request_id"]`` or ``event.get("evicted", ())``.
    """

    kind: str
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, kind: str, **fields: Any) -> Event:
        return cls(kind, tuple(fields.items()))

    @property
    def op(self) -> str:
        """The op's name without the model: ``"allocate"`` for ``"prefix_cache.allocate"``."""
        return self.kind.rpartition(".")[2]

    def __getitem__(self, name: str) -> Any:
        for key, value in self.fields:
            if key == name:
                return value
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        for key, value in self.fields:
            if key == name:
                return value
        return default

    def as_dict(self) -> dict[str, Any]:
        return dict(self.fields)


@dataclass(frozen=True)
class Step(Generic[S]):
    """One recorded state: its position, what the operation that produced it did, the state.

    ``event`` is an ``Event``; a plain string is accepted too, for steps a notebook builds by hand.
    """

    index: int
    event: Event | str
    state: S


@dataclass
class History(Generic[S]):
    """An append-only list of steps; the views' only input."""

    steps: list[Step[S]] = field(default_factory=list)

    def add(self, event: Event | str, state: S) -> Step[S]:
        step = Step(len(self.steps), event, state)
        self.steps.append(step)
        return step

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: int) -> Step[S]:
        return self.steps[index]

    def __iter__(self) -> Iterator[Step[S]]:
        return iter(self.steps)

    @property
    def events(self) -> list[Event | str]:
        return [s.event for s in self.steps]

    @property
    def states(self) -> list[S]:
        return [s.state for s in self.steps]


# ---------------------------------------------------------------- contiguous pool (example 1)


@dataclass(frozen=True)
class Region:
    """A contiguous reservation: ``size`` slots from ``start``, of which ``used`` hold tokens."""

    owner: str
    start: int
    size: int
    used: int

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class ContiguousState:
    pool_size: int
    regions: tuple[Region, ...]  # sorted by start
    rejected: tuple[str, ...] = ()  # requests refused so far, in order

    @property
    def gaps(self) -> tuple[tuple[int, int], ...]:
        """Free gaps as (start, size), lowest first."""
        out, pos = [], 0
        for r in self.regions:
            if r.start > pos:
                out.append((pos, r.start - pos))
            pos = r.end
        if self.pool_size > pos:
            out.append((pos, self.pool_size - pos))
        return tuple(out)

    @property
    def reserved(self) -> int:
        return sum(r.size for r in self.regions)

    @property
    def stored(self) -> int:
        return sum(r.used for r in self.regions)


# ---------------------------------------------------------------- block pools (examples 2-5, 7)


@dataclass(frozen=True)
class BlockState:
    """One physical block.

    ``ref_count`` counts the block tables holding it. ``block_hash`` is a short
    hex label of its chained hash when the block is full and cached (it stays
    while the block is free, until the block is handed out again: lazy
    eviction). ``tokens`` are the token ids written into it so far.
    """

    block_id: int
    ref_count: int = 0
    tokens: tuple[int, ...] = ()
    block_hash: str | None = None
    ever_used: bool = False
    is_null: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def status(self) -> str:
        """One of 'null', 'never used', 'in use', 'free, cached', 'free'."""
        if self.is_null:
            return "null"
        if self.ref_count > 0:
            return "in use"
        if self.block_hash is not None:
            return "free, cached"
        return "free" if self.ever_used else "never used"


@dataclass(frozen=True)
class BlockPoolState:
    """A paged KV pool: blocks, per-request block tables and lengths, and the free queue.

    ``free_queue`` lists free block ids from the front (handed out next, so
    evicted first) to the back. The last four fields say what the operation
    that produced this state did, so a view can highlight it.
    """

    block_size: int
    blocks: tuple[BlockState, ...]
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (request id, block table), in arrival order
    seq_lens: tuple[tuple[str, int], ...] = ()  # (request id, tokens held)
    free_queue: tuple[int, ...] = ()
    null_block: int | None = None
    hit_blocks: tuple[int, ...] = ()
    new_blocks: tuple[int, ...] = ()
    evicted_blocks: tuple[int, ...] = ()
    copied_blocks: tuple[tuple[int, int], ...] = ()  # (source, copy)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def table(self, request_id: str) -> tuple[int, ...]:
        for rid, table in self.tables:
            if rid == request_id:
                return table
        raise KeyError(request_id)

    def seq_len(self, request_id: str) -> int:
        for rid, n in self.seq_lens:
            if rid == request_id:
                return n
        raise KeyError(request_id)

    @property
    def ref_counts(self) -> dict[int, int]:
        return {b.block_id: b.ref_count for b in self.blocks if b.ref_count > 0}

    @property
    def num_cached(self) -> int:
        return sum(1 for b in self.blocks if b.block_hash is not None)


# ---------------------------------------------------------------- radix tree (example 8)


@dataclass(frozen=True)
class RadixNodeState:
    """One node of a radix tree: the token run on the edge into it, its lock count, last access.

    ``extra_key`` is the namespace the run belongs to (a LoRA id or cache salt in
    SGLang); runs under different extra keys never share nodes, so two trees that
    differ only in namespaces must not compare equal.
    """

    node_id: int
    key: tuple[int, ...]
    lock_ref: int
    last_access: int
    children: tuple[RadixNodeState, ...] = ()
    extra_key: str | None = None

    def walk(self) -> Iterator[tuple[int, RadixNodeState]]:
        """Yield (depth, node) in depth-first order, children in stored order, root at depth 0."""
        stack = [(0, self)]
        while stack:
            depth, node = stack.pop()
            yield depth, node
            stack.extend((depth + 1, c) for c in reversed(node.children))


@dataclass(frozen=True)
class RadixState:
    root: RadixNodeState
    page_size: int
    evictable_size: int
    protected_size: int
    matched_node: int | None = None  # node id where the last match ended
    split_nodes: tuple[int, ...] = ()  # node ids created by a split during the last op
    evicted_runs: tuple[tuple[int, ...], ...] = ()  # token runs removed by the last op, in order

    @property
    def total_tokens(self) -> int:
        return sum(len(n.key) for _, n in self.root.walk())
