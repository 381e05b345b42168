"""A paged KV pool: fixed-size blocks, per-request block tables, ref counts, copy-on-write.

This is the memory manager of lesson examples 2 to 5, the design PagedAttention
introduced:

* KV lives in ``num_blocks`` blocks of ``block_size`` token slots. Free blocks
  wait in a free list; allocation takes them from the front, so the order the
  free list starts in decides which physical ids a sequence gets.
* Each sequence has a block table: logical block i of the sequence lives in
  physical block ``table[i]``. Token position p is at logical block
  ``p // block_size``, offset ``p % block_size``, and its slot in the whole
  pool is ``physical * block_size + offset`` (vLLM's slot mapping).
* A block's ref count is the number of block tables holding it. ``fork``
  shares every block of a sequence with a new one (parallel sampling). A
  sequence that appends into a partially filled block held by others first
  copies it to a fresh block (copy-on-write, as vLLM v0's block manager did);
  full blocks are never written again, so they are never copied.
* With ``share_prefixes=True`` a new sequence reuses full blocks whose whole
  prefix matches a block already in the pool (lesson example 5). Blocks are
  keyed by ``kvlab.core.hashing`` chained hashes, so one key names the prefix
  through that block; reuse stops at the first block that misses.

Vocabulary, shared with ``kvlab.models.prefix_cache.PrefixCache``: a
``request_id`` names a sequence (vLLM's ``req_id``; the lesson says
"sequence"), ``block_table(request_id)``, ``num_tokens(request_id)``,
``requests``, ``free_queue()`` (front first), and ``AllocationResult`` with
``hit_block_ids``, ``new_block_ids``, ``evicted``, ``block_table``. In vLLM
this pool's job is split between ``KVCacheManager`` (tables, prefix lookup)
and ``BlockPool`` (blocks, ref counts, the free queue); v1 has no fork or
copy-on-write (parallel samples are child requests that share via prefix
hits), which v0's block manager had.

Simplifications, said plainly: a freed block forgets its content at once (no
lazy eviction; ``kvlab``'s vLLM prefix cache models that), freed blocks go to
the back of the free list in block-table order, and a prefix hit may cover
the whole prompt as in the lesson (``recompute_last_token=True`` applies
vLLM's cap of prompt length - 1 tokens).

Token ids are kept in the blocks so views can show them. ``allocate`` and
``append`` accept either token ids or a bare count; a count writes
``UNKNOWN_TOKEN`` placeholders, which are never hashed or shared.

Kept as one module (under 600 lines, with ``BlockTableView``, the table both pools' results
carry): block tables, reference counts, fork and copy-on-write are one mechanism, and each rule
reads the others' state.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from kvlab.core.hashing import SCHEMES, _hash_block, none_hash, short
from kvlab.core.snapshots import BlockPoolState, BlockState, Event, History
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownRequestError,
    brief,
    cdiv,
    check_bool,
    check_choice,
    check_id,
    check_int,
    check_size,
    check_tokens,
)

UNKNOWN_TOKEN = -1
"""Placeholder id for a token written by count only (its id is not modelled)."""


@dataclass(frozen=True)
class Translation:
    """Where token ``position`` of request ``request_id`` lives (vLLM's slot mapping for one token)."""

    request_id: str
    position: int
    logical_block: int
    offset: int
    physical_block: int
    slot: int


@dataclass(frozen=True)
class Copy:
    """A copy-on-write: ``num_tokens`` KV entries copied from block ``source`` to ``target``."""

    source: int
    target: int
    num_tokens: int


class BlockTableView(Sequence[int]):
    """The first ``length`` ids of an append-only block table, read when asked for: a tuple in all but cost.

    ``PrefixCache`` results carry one instead of a copy of the table, so an
    append costs what it adds, not the length of the whole table (vLLM keeps a
    request's block table append-only for the same reason). It compares equal
    to the tuple of the same ids, hashes and prints as that tuple, and stays the
    table as it was at the call: later appends go past ``length``, and nothing
    writes below it.
    """

    __slots__ = ("_ids", "_length")

    def __init__(self, ids: list[int], length: int) -> None:
        self._ids = ids
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        return self._tuple()[index]

    def __iter__(self) -> Iterator[int]:
        return islice(self._ids, self._length)

    def _tuple(self) -> tuple[int, ...]:
        ids = self._ids
        return tuple(ids) if len(ids) == self._length else tuple(ids[: self._length])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockTableView):
            return self._tuple() == other._tuple()
        if isinstance(other, tuple):
            return self._tuple() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return repr(self._tuple())

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self._tuple(),))


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """What an allocation did to request ``request_id``; both block pools return it.

    ``BlockPool.allocate`` and ``PrefixCache.allocate``/``append`` fill the same
    fields. ``num_tokens`` is the request's length after the call,
    ``num_new_tokens`` how many tokens this call brought (the prompt, or the
    appended tokens). ``hit_block_ids`` are blocks reused from the cache (ref
    count up), ``new_block_ids`` blocks taken from the free queue. ``evicted``
    lists blocks whose cached content was dropped to make room, in the order
    they were taken, and ``evicted_hashes`` the hashes they lost; a
    ``BlockPool`` forgets content when a block is freed, so it never evicts here.
    vLLM: ``KVCacheManager.allocate_slots`` returns the new blocks; hits come
    from ``get_computed_blocks``.
    """

    request_id: str
    num_tokens: int
    num_new_tokens: int
    num_cached_tokens: int
    hit_block_ids: tuple[int, ...]
    new_block_ids: tuple[int, ...]
    evicted: tuple[int, ...]
    evicted_hashes: tuple[bytes, ...]
    block_table: tuple[int, ...] | BlockTableView  # the table after the call

    @property
    def num_computed_tokens(self) -> int:
        """Tokens of this call the model must compute: the new tokens minus the cache hit."""
        return self.num_new_tokens - self.num_cached_tokens


@dataclass(frozen=True)
class AppendResult:
    """What ``BlockPool.append`` did: new blocks, the copy-on-write if any, and the slots written."""

    request_id: str
    block_table: tuple[int, ...]
    new_block_ids: tuple[int, ...]  # taken from the free list to grow the request
    copy: Copy | None  # the copy-on-write this append needed, if any
    slots: tuple[int, ...]  # where the appended tokens were written


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` token slots, handed out through a free list.

    ``free_order`` is the initial free list, front first; it must list every
    block id once (default: 0, 1, 2, ...). With ``record=True`` the pool keeps
    a ``History`` of ``BlockPoolState``: step 0 is the initial pool and each
    successful operation adds one step, with a ``paged.<op>`` ``Event``
    (captions: ``kvlab.views.text.block_pool``). A call that raises changes nothing.

    Bounds (``kvlab.errors.LIMITS``): ``num_blocks`` at most ``LIMITS.num_blocks`` and
    ``block_size`` at most ``LIMITS.block_size`` (the pool's lists are built at once), and one
    ``allocate``/``append`` brings at most ``LIMITS.tokens`` tokens, ids or a count.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        free_order: Sequence[int] | None = None,
        share_prefixes: bool = False,
        recompute_last_token: bool = False,
        hash_scheme: str = "lesson",
        record: bool = False,
    ) -> None:
        num_blocks = check_size("num_blocks", num_blocks, "num_blocks", minimum=1)
        block_size = check_size("block_size", block_size, "block_size", minimum=1)
        check_bool("share_prefixes", share_prefixes)
        check_bool("recompute_last_token", recompute_last_token)
        check_bool("record", record)
        hash_scheme = check_choice("hash_scheme", hash_scheme, SCHEMES)
        order = list(range(num_blocks)) if free_order is None else _check_free_order(free_order, num_blocks)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.share_prefixes = share_prefixes
        self.recompute_last_token = recompute_last_token
        self.hash_scheme = hash_scheme
        self._free: deque[int] = deque(order)
        self._ref = [0] * num_blocks
        self._tokens: list[list[int]] = [[] for _ in range(num_blocks)]
        self._ever_used = [False] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks  # set while the block is in the prefix map
        self._block_by_hash: dict[bytes, int] = {}
        self._tables: dict[str, list[int]] = {}  # arrival order
        # chained hashes of each request's full blocks; None once an unknown token broke the chain
        self._chain: dict[str, list[bytes] | None] = {}
        self._finished: set[str] = set()
        self._last: dict[str, tuple] = {}  # what the last op did, for the snapshot's highlight fields
        self.history: History[BlockPoolState] | None = None
        if record:
            self.history = History()
            self.history.add(Event.of("paged.init", num_blocks=num_blocks, block_size=block_size),
                             self.snapshot())  # fmt: skip

    # ------------------------------------------------------------------ queries

    def free_queue(self) -> list[int]:
        """Free block ids, front (handed out next) first."""
        return list(self._free)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def requests(self) -> tuple[str, ...]:
        """Live request ids in arrival order."""
        return tuple(self._tables)

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._table(request_id))

    def num_tokens(self, request_id: str) -> int:
        """Tokens the request holds (vLLM: ``num_computed_tokens`` once they are all in the cache)."""
        table = self._table(request_id)
        return (len(table) - 1) * self.block_size + len(self._tokens[table[-1]])

    def tokens(self, request_id: str) -> list[int]:
        """The request's token ids (``UNKNOWN_TOKEN`` where only a count was given)."""
        return [t for b in self._table(request_id) for t in self._tokens[b]]

    def ref_count(self, block_id: int) -> int:
        check_int("block_id", block_id, minimum=0)
        if block_id >= self.num_blocks:
            raise InvalidArgumentError(
                f"block_id {block_id} is out of range: the pool has blocks 0..{self.num_blocks - 1}"
            )
        return self._ref[block_id]

    @property
    def ref_counts(self) -> dict[int, int]:
        """Ref counts of the blocks in use, by block id."""
        return {b: n for b, n in enumerate(self._ref) if n > 0}

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that ``num_tokens`` tokens occupy: ceil(num_tokens / block_size)."""
        check_int("num_tokens", num_tokens, minimum=0)
        return cdiv(num_tokens, self.block_size)

    def translate(self, request_id: str, position: int) -> Translation:
        """Logical block, offset, physical block and slot of token ``position``."""
        table = self._table(request_id)
        check_int("position", position, minimum=0)
        length = self.num_tokens(request_id)
        if position >= length:
            raise InvalidArgumentError(
                f"position {position} is past the end of sequence {request_id!r}, which holds {length} tokens "
                f"(positions 0..{length - 1})"
            )
        logical, offset = divmod(position, self.block_size)
        physical = table[logical]
        return Translation(
            request_id, position, logical, offset, physical, physical * self.block_size + offset
        )

    def slot_mapping(self, request_id: str) -> list[int]:
        """The slot of every token of the request, in position order."""
        table = self._table(request_id)
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(self.num_tokens(request_id))]

    # ------------------------------------------------------------------ operations

    def allocate(self, request_id: str, tokens: int | Sequence[int]) -> AllocationResult:
        """Give a new request the blocks for its prompt: ``tokens`` ids, or a token count.

        With ``share_prefixes`` the leading full blocks already in the pool are
        reused (ref count up) instead of taken from the free list.
        """
        request_id = self._check_new_id(request_id)
        toks, known = self._check_new_tokens(tokens)
        hits, chain = self._find_prefix(toks) if known else ([], None)
        need = self.blocks_needed(len(toks)) - len(hits)
        self._check_room(need, f"allocate {len(toks)} tokens for {request_id!r}")
        # validated: mutate
        for b in hits:
            self._ref[b] += 1
        table = list(hits)
        self._tables[request_id] = table
        self._chain[request_id] = chain
        self._finished.discard(request_id)
        cached = len(hits) * self.block_size
        self._write(request_id, toks[cached:])  # takes the `need` new blocks from the free list
        new = tuple(table[len(hits) :])  # no lazy eviction here: a freed block forgot its content already
        result = AllocationResult(
            request_id, len(toks), len(toks), cached, tuple(hits), new, (), (), tuple(table)
        )
        self._last = {"hit_block_ids": result.hit_block_ids, "new_block_ids": result.new_block_ids}
        if self.history is not None:
            self._record(Event.of("paged.allocate", request_id=request_id, num_tokens=len(toks),
                                  block_table=result.block_table, hit_block_ids=result.hit_block_ids,
                                  new_block_ids=result.new_block_ids, num_cached_tokens=cached))  # fmt: skip
        return result

    def append(self, request_id: str, tokens: int | Sequence[int]) -> AppendResult:
        """Write new tokens (ids, or a count) after the request's last token.

        Blocks are taken on demand. When the last block is partly filled and
        shared, it is first copied to a fresh block (copy-on-write) so the
        other holders never see this request's tokens.
        """
        table = self._table(request_id)
        toks, _ = self._check_new_tokens(tokens)
        last = table[-1]
        fill = len(self._tokens[last])
        cow = fill < self.block_size and self._ref[last] > 1
        room = self.block_size - fill
        need = self.blocks_needed(max(0, len(toks) - room)) + int(cow)
        self._check_room(need, f"append {len(toks)} tokens to {request_id!r}")
        # validated: mutate
        copy = None
        if cow:
            target = self._take()
            self._tokens[target] = list(self._tokens[last])
            self._ref[last] -= 1
            table[-1] = target
            copy = Copy(last, target, fill)
        start = self.num_tokens(request_id)
        before = len(table)
        self._write(request_id, toks)
        new = tuple(table[before:])
        bs = self.block_size
        slots = tuple(table[p // bs] * bs + p % bs for p in range(start, start + len(toks)))
        self._last = {"new_block_ids": new, "copied_blocks": ((copy.source, copy.target),) if copy else ()}
        if self.history is not None:
            copied = (copy.source, copy.target, copy.num_tokens) if copy else None
            self._record(Event.of("paged.append", request_id=request_id, num_new_tokens=len(toks),
                                  new_block_ids=new, copy=copied))  # fmt: skip
        return AppendResult(request_id, tuple(table), new, copy, slots)

    def fork(self, parent: str, child: str) -> tuple[int, ...]:
        """Start ``child`` as a copy of ``parent`` that shares all its blocks; return the child's table."""
        table = self._table(parent)
        parent = str.__str__(parent)
        child = self._check_new_id(child, name="child")
        for b in table:
            self._ref[b] += 1
        self._tables[child] = list(table)
        chain = self._chain[parent]
        self._chain[child] = None if chain is None else list(chain)
        self._finished.discard(child)
        self._last = {"hit_block_ids": tuple(table)}
        if self.history is not None:
            self._record(Event.of("paged.fork", parent=parent, request_id=child, block_table=tuple(table)))
        return tuple(table)

    def free(self, request_id: str) -> tuple[int, ...]:
        """Drop the request; blocks no other table holds return to the back of the free list.

        Returns the block ids that became free.
        """
        table = self._table(request_id)
        freed, forgotten = [], []
        for b in table:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                h = self._hash_of[b]
                if h is not None:
                    del self._block_by_hash[h]
                    self._hash_of[b] = None
                    forgotten.append(b)
                self._tokens[b] = []
                self._free.append(b)
                freed.append(b)
        del self._tables[request_id]
        del self._chain[request_id]
        self._finished.add(request_id)
        self._last = {"evicted_block_ids": tuple(forgotten)}
        if self.history is not None:
            self._record(Event.of("paged.free", request_id=request_id, freed=tuple(freed),
                                  evicted=tuple(forgotten)))  # fmt: skip
        return tuple(freed)

    def snapshot(self) -> BlockPoolState:
        """The whole pool now, with the last operation's hit/new/copied/evicted blocks."""
        blocks = tuple(
            BlockState(
                block_id=b,
                ref_count=self._ref[b],
                tokens=tuple(self._tokens[b]),
                block_hash=short(h) if (h := self._hash_of[b]) is not None else None,
                ever_used=self._ever_used[b],
            )
            for b in range(self.num_blocks)
        )
        return BlockPoolState(
            block_size=self.block_size,
            blocks=blocks,
            tables=tuple((s, tuple(t)) for s, t in self._tables.items()),
            token_counts=tuple((s, self.num_tokens(s)) for s in self._tables),
            free_queue=tuple(self._free),
            **self._last,
        )

    # ------------------------------------------------------------------ internals

    def _table(self, request_id: str) -> list[int]:
        if type(request_id) is not str:
            if not isinstance(request_id, str):
                raise InvalidArgumentError(
                    f"sequence id must be a string, got {brief(request_id)} ({type(request_id).__name__})"
                )
            request_id = str.__str__(request_id)
        table = self._tables.get(request_id)
        if table is None:
            if request_id in self._finished:
                raise UnknownRequestError(
                    f"sequence {request_id!r} was already freed; allocate it again first"
                )
            held = ", ".join(map(repr, self._tables)) or "none"
            raise UnknownRequestError(f"unknown sequence {request_id!r}; live sequences: {held}")
        return table

    def _check_new_id(self, request_id: object, name: str = "request_id") -> str:
        request_id = check_id(name, request_id)
        if request_id in self._tables:
            raise DuplicateRequestError(
                f"sequence {request_id!r} already exists; free it first or pick a new id"
            )
        return request_id

    def _check_new_tokens(self, tokens: object) -> tuple[list[int], bool]:
        """Token ids (or UNKNOWN_TOKEN placeholders for a count) and whether the ids are known."""
        if isinstance(tokens, (bool, float)):  # never a count: pass an int
            raise InvalidArgumentError(
                f"tokens must be a token count or a list of token ids, got {brief(tokens)} "
                f"({type(tokens).__name__}); pass an int count"
            )
        if isinstance(tokens, int) or type(tokens).__module__ == "numpy" and not hasattr(tokens, "__len__"):
            count = check_size("tokens", tokens, "tokens", minimum=1)
            return [UNKNOWN_TOKEN] * count, False
        if not hasattr(tokens, "__iter__") or isinstance(tokens, (str, bytes)):
            raise InvalidArgumentError(
                f"tokens must be a token count or a list of token ids, got {brief(tokens)} ({type(tokens).__name__})"
            )
        return check_tokens("tokens", tokens), True

    def _check_room(self, need: int, what: str) -> None:
        if need > len(self._free):
            raise OutOfBlocksError(
                f"cannot {what}: needs {need} free blocks, {len(self._free)} are free; "
                "free a sequence or use a larger pool"
            )

    def _find_prefix(self, toks: list[int]) -> tuple[list[int], list[bytes] | None]:
        """Blocks already holding this prompt's leading full blocks, and the hash chain through them.

        The walk stops at the first full block whose chained hash (whole
        prefix through it) is not in the pool. Without ``share_prefixes``
        nothing is hashed and the chain is None.
        """
        if not self.share_prefixes:
            return [], None
        bs = self.block_size
        hits: list[int] = []
        chain: list[bytes] = []
        parent = none_hash(self.hash_scheme)
        for start in range(0, len(toks) - bs + 1, bs):
            parent = _hash_block(parent, toks[start : start + bs], None, start == 0, self.hash_scheme)
            b = self._block_by_hash.get(parent)
            if b is None:
                break
            hits.append(b)
            chain.append(parent)
        if self.recompute_last_token and hits and len(hits) * bs >= len(toks):
            hits.pop()  # vLLM: the last prompt token is always computed, so never hit the whole prompt
            chain.pop()
        return hits, chain

    def _take(self) -> int:
        b = self._free.popleft()
        self._ref[b] = 1
        self._ever_used[b] = True
        return b

    def _write(self, request_id: str, toks: list[int]) -> None:
        """Write tokens after the request's end, growing its table; callers checked there is room."""
        table = self._tables[request_id]
        bs = self.block_size
        pos = 0
        if table:
            last = self._tokens[table[-1]]
            take = min(bs - len(last), len(toks))
            last.extend(toks[:take])
            pos = take
            self._on_written(request_id, len(table) - 1)
        while pos < len(toks):
            b = self._take()
            table.append(b)
            self._tokens[b] = list(toks[pos : pos + bs])
            pos += bs
            self._on_written(request_id, len(table) - 1)

    def _on_written(self, request_id: str, logical: int) -> None:
        """Extend the hash chain when block ``logical`` became full, and offer it for prefix reuse."""
        chain = self._chain[request_id]
        block = self._tables[request_id][logical]
        content = self._tokens[block]
        if chain is None or len(content) < self.block_size or len(chain) > logical:
            return
        if UNKNOWN_TOKEN in content:
            self._chain[request_id] = None
            return
        parent = chain[-1] if chain else none_hash(self.hash_scheme)
        h = _hash_block(parent, content, None, logical == 0, self.hash_scheme)
        chain.append(h)
        if h not in self._block_by_hash and self._hash_of[block] is None:
            self._block_by_hash[h] = block
            self._hash_of[block] = h

    def _record(self, event: Event) -> None:
        assert self.history is not None  # callers build the event only while recording
        self.history.add(event, self.snapshot())


def _check_free_order(free_order: object, num_blocks: int) -> list[int]:
    if isinstance(free_order, (str, bytes)) or not hasattr(free_order, "__iter__"):
        raise InvalidArgumentError(f"free_order must be a list of block ids, got {type(free_order).__name__}")
    try:  # read at most one id too many: an endless iterator is refused, not drained
        order = list(islice(free_order, num_blocks + 1))  # type: ignore[call-overload]
    except Exception:
        raise InvalidArgumentError(
            f"free_order must be a list of block ids, got {brief(free_order)}"
        ) from None
    for i, b in enumerate(order):
        order[i] = check_int(f"free_order[{i}]", b, minimum=0)
    if sorted(order) != list(range(num_blocks)):
        seen = Counter(order)
        missing = [b for b in range(num_blocks) if b not in seen][:20]
        extra = sorted(b for b, n in seen.items() if b >= num_blocks or n > 1)[:20]
        raise InvalidArgumentError(
            f"free_order must list every block id 0..{num_blocks - 1} exactly once; "
            f"missing {missing}, out of range or repeated {extra}"
        )
    return order
