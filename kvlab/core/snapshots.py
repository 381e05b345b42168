"""Immutable records of a model's whole state and of what each operation did.

A model that records keeps a ``History``: step 0 is the state before any
operation, and every later step is the state right after one operation, with
an ``Event`` that says, as plain data, what the operation did (what was hit,
allocated, evicted, split, locked). Models never write prose: the views turn
events into captions (``kvlab.views.text.caption``) and states into pictures,
and never touch a model, so a slider is just an index into ``history.steps``.

The state types are frozen dataclasses made of tuples, ints and strings, so a
snapshot can never change after it was taken and two snapshots compare equal
exactly when the states are the same. Kept as one module, longer than most: the
History and the views take every model's state types from this one place, and
the radix node needs its own non-recursive equality, hash, repr and pickling.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kvlab.errors import InvalidArgumentError

S = TypeVar("S")
_MISSING = object()


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

    def find(self, kind: str, **fields: Any) -> Step[S]:
        """The first step whose event is of ``kind`` with these field values.

        ``history.find("prefix_cache.allocate", request_id="C")`` is the step where C arrived.
        """
        for step in self.steps:
            event = step.event
            if (
                isinstance(event, Event)
                and event.kind == kind
                and all(event.get(name, _MISSING) == value for name, value in fields.items())
            ):
                return step
        wanted = ", ".join(f"{name}={value!r}" for name, value in fields.items())
        raise InvalidArgumentError(
            f"no step has a {kind!r} event{' with ' + wanted if wanted else ''}: "
            f"the kinds recorded are {sorted({e.kind for e in self.events if isinstance(e, Event)})}"
        )

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
    that produced this state did, so a view can highlight it; they use the
    words of the models' results (``hit_block_ids``, ``new_block_ids``, and
    ``evicted_block_ids`` for ``AllocationResult.evicted``). Both block-pool
    models (``kvlab.models.paged.BlockPool``, ``kvlab.models.prefix_cache.PrefixCache``)
    produce it. vLLM's names: a request's ``num_tokens`` is what its
    ``Request.num_tokens`` counts once the tokens are in the cache.
    """

    block_size: int
    blocks: tuple[BlockState, ...]
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (request id, block table), in arrival order
    token_counts: tuple[tuple[str, int], ...] = ()  # (request id, tokens held), in arrival order
    free_queue: tuple[int, ...] = ()
    null_block: int | None = None
    hit_block_ids: tuple[int, ...] = ()
    new_block_ids: tuple[int, ...] = ()
    evicted_block_ids: tuple[int, ...] = ()
    copied_blocks: tuple[tuple[int, int], ...] = ()  # (source, copy)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def table(self, request_id: str) -> tuple[int, ...]:
        for rid, table in self.tables:
            if rid == request_id:
                return table
        raise KeyError(request_id)

    def num_tokens(self, request_id: str) -> int:
        """Tokens request ``request_id`` holds (the models' ``num_tokens(request_id)`` at this step)."""
        for rid, n in self.token_counts:
            if rid == request_id:
                return n
        raise KeyError(request_id)

    @property
    def ref_counts(self) -> dict[int, int]:
        return {b.block_id: b.ref_count for b in self.blocks if b.ref_count > 0}

    @property
    def num_cached(self) -> int:
        return sum(1 for b in self.blocks if b.block_hash is not None)

    def translate(self, request_id: str, position: int) -> tuple[int, int, int, int]:
        """(logical block, offset, physical block, slot) of token ``position`` of ``request_id``.

        vLLM's slot mapping, as ``kvlab.models.paged.BlockPool.translate``: the token sits in logical
        block ``position // block_size`` at ``offset = position % block_size``; the request's block
        table names the physical block, and the slot in the whole pool is
        ``physical * block_size + offset``. The caller checks that the request holds that position.
        """
        logical, offset = divmod(position, self.block_size)
        physical = self.table(request_id)[logical]
        return logical, offset, physical, physical * self.block_size + offset


# ---------------------------------------------------------------- radix tree (example 8)


@dataclass(frozen=True, eq=False, repr=False)
class RadixNodeState:
    """One node of a radix tree: the token run on the edge into it, its lock count, last access.

    ``extra_key`` is the namespace the run belongs to (a LoRA id or cache salt in
    SGLang); runs under different extra keys never share nodes, so two trees that
    differ only in namespaces must not compare equal.

    A tree can be as deep as its longest prompt (each insert that leaves a run one
    token further down adds a level), far deeper than Python's recursion limit, so
    nothing here recurses: equality, hashing, ``repr``, copying and pickling walk
    the subtree with an explicit stack. They mean what a frozen dataclass's would
    (field by field, children in order, the same ``repr`` text). Two snapshots of
    one tree share every subtree that did not change between them
    (``RadixTree.snapshot``), and equality takes a shared subtree as equal at once.
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

    def _own(self) -> tuple[Any, ...]:
        return self.node_id, self.key, self.lock_ref, self.last_access, self.extra_key, len(self.children)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        stack: list[tuple[RadixNodeState, RadixNodeState]] = [(self, other)]  # type: ignore[list-item]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue
            if a._own() != b._own():
                return False
            stack.extend(zip(a.children, b.children, strict=True))  # as many: _own compares the counts
        return True

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is not None:
            return cached
        stack: list[tuple[RadixNodeState, bool]] = [(self, False)]
        while stack:
            node, ready = stack.pop()
            if ready:
                kids = tuple(c.__dict__["_hash"] for c in node.children)
                object.__setattr__(node, "_hash", hash((*node._own(), kids)))
            elif "_hash" not in node.__dict__:
                stack.append((node, True))
                stack.extend((c, False) for c in node.children)
        return self.__dict__["_hash"]

    def __repr__(self) -> str:
        parts: list[str] = []
        stack: list[RadixNodeState | str] = [self]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
                continue
            parts.append(
                f"{item.__class__.__qualname__}(node_id={item.node_id!r}, key={item.key!r}, "
                f"lock_ref={item.lock_ref!r}, last_access={item.last_access!r}, children=("
            )
            kids = item.children
            stack.append(f"{',' if len(kids) == 1 else ''}), extra_key={item.extra_key!r})")
            for i in range(len(kids) - 1, -1, -1):
                stack.append(kids[i])
                if i:
                    stack.append(", ")
        return "".join(parts)

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> RadixNodeState:
        return self  # immutable, as a tuple is

    __copy__ = __deepcopy__

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as a flat list of nodes (depth first, each with its child count): no recursion."""
        return _radix_nodes_from_flat, ([n._own() for _, n in self.walk()],)


def _radix_nodes_from_flat(flat: list[tuple[Any, ...]]) -> RadixNodeState:
    """Rebuild a pickled ``RadixNodeState`` subtree from ``__reduce__``'s flat list, bottom up."""
    built: list[RadixNodeState] = []
    for node_id, key, lock_ref, last_access, extra_key, n_children in reversed(flat):
        children = tuple(built[len(built) - n_children :][::-1]) if n_children else ()
        del built[len(built) - n_children :]
        built.append(RadixNodeState(node_id, key, lock_ref, last_access, children, extra_key))
    return built[0]


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


# ---------------------------------------------------------------- llama-server slots (examples 10, 11)


@dataclass(frozen=True)
class RequestRecord:
    """What one llama-server request did: the response's ``timings`` counters plus how the slot was chosen.

    ``selected_by`` is ``"lcp"`` (prompt similarity), ``"lru"`` or ``"id"`` (the
    request named a slot). ``similarity`` is the chosen slot's LCP / prompt length
    when chosen by similarity. ``ram_saved`` / ``ram_loaded`` say whether the slot's
    old tokens went to the RAM cache and whether a cached prompt came back from it.
    Invariant: ``cache_n + prompt_n == prompt_tokens`` and ``cache_n < prompt_tokens``.
    """

    request_id: str
    slot_id: int
    selected_by: str
    similarity: float | None
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    max_tokens: int
    ram_saved: bool = False
    ram_loaded: bool = False
    n_generated: int = 0
    finished: bool = False
    error: str | None = (
        None  # "exceed_context_size": the server refused it (HTTP 400); cache_n = prompt_n = 0
    )

    @property
    def tokens_evaluated(self) -> int:
        return self.prompt_tokens


@dataclass(frozen=True)
class SlotState:
    """One slot: the token ids its KV cache holds (llama-server's ``slot.prompt.tokens``)."""

    slot_id: int
    tokens: tuple[int, ...]
    request_id: str | None  # the request it is processing, None when idle
    t_last_used: int  # logical time of its last release, -1 if never used

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class RamEntry:
    """One saved prompt in the RAM prompt cache (``--cache-ram``): its tokens and its state size."""

    tokens: tuple[int, ...]
    size_bytes: int


@dataclass(frozen=True)
class SlotServerState:
    """Every slot, the RAM prompt cache (oldest entry first, evicted first) and the latest request."""

    slots: tuple[SlotState, ...]
    ram_cache: tuple[RamEntry, ...]
    ram_limit_bytes: int
    last: RequestRecord | None = None

    @property
    def ram_bytes(self) -> int:
        return sum(e.size_bytes for e in self.ram_cache)


# ---------------------------------------------------------------- sliding-window slot (example 12)

EMPTY = -1
"""An SWA cell that holds no position."""


class HeldPositions:
    """``pos_min``/``pos_max`` of the positions in ``self.cells`` (llama.cpp's ``seq_pos_min``/``seq_pos_max``).

    Shared by the live ring (``kvlab.server.swa.SwaRing``) and its snapshot (``SwaState``), so both
    answer the same; ``EMPTY`` when no cell holds a position.
    """

    __slots__ = ()

    @property
    def pos_min(self) -> int:
        held = [p for p in self.cells if p != EMPTY]  # type: ignore[attr-defined]
        return min(held) if held else EMPTY

    @property
    def pos_max(self) -> int:
        return max(self.cells, default=EMPTY)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Checkpoint:
    """A copy of the slot's SWA cells taken when ``n_tokens`` prompt tokens had been processed.

    ``pos_min``/``pos_max`` are the oldest and newest positions in the copy (llama.cpp's
    ``server_prompt_checkpoint``); ``cells`` is the copy itself and does not take part in equality.
    """

    pos_min: int
    pos_max: int
    n_tokens: int
    cells: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def span(self) -> tuple[int, int]:
        return (self.pos_min, self.pos_max)


@dataclass(frozen=True)
class SwaState(HeldPositions):
    """The slot after one step: ring cells (positions, -1 empty), head, tokens held, checkpoints."""

    cells: tuple[int, ...]
    head: int
    n_tokens: int
    checkpoints: tuple[Checkpoint, ...]
    batch: tuple[int, int] | None = None  # the batch this step decoded
    created: Checkpoint | None = None  # checkpoint taken in this step
    restored: Checkpoint | None = None


# ---------------------------------------------------------------- agent turns (example 13)


@dataclass(frozen=True)
class AgentTurnsState:
    """Every history policy after the same turn: that turn's record and the tokens processed so far.

    ``current[i]`` is policy ``names[i]``'s ``kvlab.server.agents.AgentTurn`` for
    turn ``turn`` (None before turn 1, at step 0); ``totals[i]`` is the sum of its
    ``processed_tokens`` over turns 1..``turn``. ``kvlab.views.agents.agent_turns_history``
    lines the runs up into one such state per turn.
    """

    turn: int
    names: tuple[str, ...]
    current: tuple[Any, ...]  # AgentTurn | None each; typed loosely so core does not import server
    totals: tuple[int, ...]
