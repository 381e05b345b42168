"""A paged KV pool: fixed-size blocks, per-sequence block tables, ref counts, copy-on-write.

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

Simplifications, said plainly: a freed block forgets its content at once (no
lazy eviction; ``kvlab``'s vLLM prefix cache models that), freed blocks go to
the back of the free list in block-table order, and a prefix hit may cover
the whole prompt as in the lesson (``recompute_last_token=True`` applies
vLLM's cap of prompt length - 1 tokens).

Token ids are kept in the blocks so views can show them. ``allocate`` and
``append`` accept either token ids or a bare count; a count writes
``UNKNOWN_TOKEN`` placeholders, which are never hashed or shared.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.hashing import SCHEMES, hash_block, none_hash, short
from kvlab.core.snapshots import BlockPoolState, BlockState, History
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownRequestError,
    check_int,
    check_tokens,
)

UNKNOWN_TOKEN = -1
"""Placeholder id for a token written by count only (its id is not modelled)."""

_MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class Translation:
    """Where token ``position`` of sequence ``seq_id`` lives."""

    seq_id: str
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


@dataclass(frozen=True)
class AllocateResult:
    seq_id: str
    block_table: tuple[int, ...]
    hit_blocks: tuple[int, ...]  # shared with earlier sequences (prefix reuse)
    new_blocks: tuple[int, ...]  # taken from the free list
    num_tokens: int
    num_cached_tokens: int  # tokens whose KV was reused

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV must be computed (prefill work)."""
        return self.num_tokens - self.num_cached_tokens


@dataclass(frozen=True)
class AppendResult:
    seq_id: str
    block_table: tuple[int, ...]
    new_blocks: tuple[int, ...]  # taken from the free list to grow the sequence
    copy: Copy | None  # the copy-on-write this append needed, if any
    slots: tuple[int, ...]  # where the appended tokens were written


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` token slots, handed out through a free list.

    ``free_order`` is the initial free list, front first; it must list every
    block id once (default: 0, 1, 2, ...). With ``record=True`` the pool keeps
    a ``History`` of ``BlockPoolState``: step 0 is the initial pool and each
    successful operation adds one step. A call that raises changes nothing.
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
        check_int("num_blocks", num_blocks, minimum=1)
        check_int("block_size", block_size, minimum=1)
        order = list(range(num_blocks)) if free_order is None else _check_free_order(free_order, num_blocks)
        for name, flag in (
            ("share_prefixes", share_prefixes),
            ("recompute_last_token", recompute_last_token),
            ("record", record),
        ):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False, got {flag!r}")
        if hash_scheme not in SCHEMES:
            raise InvalidArgumentError(
                f"unknown hash_scheme {hash_scheme!r}: use one of {', '.join(SCHEMES)}"
            )
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
        # chained hashes of each sequence's full blocks; None once an unknown token broke the chain
        self._chain: dict[str, list[bytes] | None] = {}
        self._finished: set[str] = set()
        self._last: dict[str, tuple] = {}
        self.history: History[BlockPoolState] | None = History() if record else None
        self._record(f"{num_blocks} free blocks of {block_size} slots")

    # ------------------------------------------------------------------ queries

    @property
    def free_blocks(self) -> tuple[int, ...]:
        """Free block ids, front (handed out next) first."""
        return tuple(self._free)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def sequences(self) -> tuple[str, ...]:
        """Live sequence ids in arrival order."""
        return tuple(self._tables)

    def block_table(self, seq_id: str) -> tuple[int, ...]:
        return tuple(self._table(seq_id))

    def seq_len(self, seq_id: str) -> int:
        table = self._table(seq_id)
        return (len(table) - 1) * self.block_size + len(self._tokens[table[-1]])

    def tokens(self, seq_id: str) -> list[int]:
        """The sequence's token ids (``UNKNOWN_TOKEN`` where only a count was given)."""
        return [t for b in self._table(seq_id) for t in self._tokens[b]]

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
        return -(-num_tokens // self.block_size)

    def translate(self, seq_id: str, position: int) -> Translation:
        """Logical block, offset, physical block and slot of token ``position``."""
        table = self._table(seq_id)
        check_int("position", position, minimum=0)
        length = self.seq_len(seq_id)
        if position >= length:
            raise InvalidArgumentError(
                f"position {position} is past the end of sequence {seq_id!r}, which holds {length} tokens "
                f"(positions 0..{length - 1})"
            )
        logical, offset = divmod(position, self.block_size)
        physical = table[logical]
        return Translation(seq_id, position, logical, offset, physical, physical * self.block_size + offset)

    def slot_mapping(self, seq_id: str) -> list[int]:
        """The slot of every token of the sequence, in position order."""
        table = self._table(seq_id)
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(self.seq_len(seq_id))]

    # ------------------------------------------------------------------ operations

    def allocate(self, seq_id: str, tokens: int | Sequence[int]) -> AllocateResult:
        """Give a new sequence the blocks for its prompt: ``tokens`` ids, or a token count.

        With ``share_prefixes`` the leading full blocks already in the pool are
        reused (ref count up) instead of taken from the free list.
        """
        self._check_new_id(seq_id)
        toks, known = self._check_new_tokens(tokens)
        hits, chain = self._find_prefix(toks) if known else ([], None)
        need = self.blocks_needed(len(toks)) - len(hits)
        self._check_room(need, f"allocate {len(toks)} tokens for {seq_id!r}")
        # validated: mutate
        for b in hits:
            self._ref[b] += 1
        table = list(hits)
        self._tables[seq_id] = table
        self._chain[seq_id] = chain
        self._finished.discard(seq_id)
        cached = len(hits) * self.block_size
        self._write(seq_id, toks[cached:])  # takes the `need` new blocks from the free list
        new = table[len(hits) :]
        self._last = {"hit_blocks": tuple(hits), "new_blocks": tuple(new)}
        reuse = f", reused {cached}" if hits else ""
        self._record(f"allocate {seq_id}: {len(toks)} tokens -> blocks {table}{reuse}")
        return AllocateResult(seq_id, tuple(table), tuple(hits), tuple(new), len(toks), cached)

    def append(self, seq_id: str, tokens: int | Sequence[int]) -> AppendResult:
        """Write new tokens (ids, or a count) after the sequence's last token.

        Blocks are taken on demand. When the last block is partly filled and
        shared, it is first copied to a fresh block (copy-on-write) so the
        other holders never see this sequence's tokens.
        """
        table = self._table(seq_id)
        toks, _ = self._check_new_tokens(tokens)
        last = table[-1]
        fill = len(self._tokens[last])
        cow = fill < self.block_size and self._ref[last] > 1
        room = self.block_size - fill
        need = self.blocks_needed(max(0, len(toks) - room)) + int(cow)
        self._check_room(need, f"append {len(toks)} tokens to {seq_id!r}")
        # validated: mutate
        copy = None
        if cow:
            target = self._take()
            self._tokens[target] = list(self._tokens[last])
            self._ref[last] -= 1
            table[-1] = target
            copy = Copy(last, target, fill)
        start = self.seq_len(seq_id)
        before = len(table)
        self._write(seq_id, toks)
        new = tuple(table[before:])
        bs = self.block_size
        slots = tuple(table[p // bs] * bs + p % bs for p in range(start, start + len(toks)))
        self._last = {"new_blocks": new, "copied_blocks": ((copy.source, copy.target),) if copy else ()}
        what = f"; copy block {copy.source} -> {copy.target} ({copy.num_tokens} entries)" if copy else ""
        self._record(f"append {len(toks)} to {seq_id}{what}")
        return AppendResult(seq_id, tuple(table), new, copy, slots)

    def fork(self, parent: str, child: str) -> tuple[int, ...]:
        """Start ``child`` as a copy of ``parent`` that shares all its blocks; return the child's table."""
        table = self._table(parent)
        self._check_new_id(child, name="child")
        for b in table:
            self._ref[b] += 1
        self._tables[child] = list(table)
        chain = self._chain[parent]
        self._chain[child] = None if chain is None else list(chain)
        self._finished.discard(child)
        self._last = {"hit_blocks": tuple(table)}
        self._record(f"fork {parent} -> {child}: share blocks {table}")
        return tuple(table)

    def free(self, seq_id: str) -> tuple[int, ...]:
        """Drop the sequence; blocks no other table holds return to the back of the free list.

        Returns the block ids that became free.
        """
        table = self._table(seq_id)
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
        del self._tables[seq_id]
        del self._chain[seq_id]
        self._finished.add(seq_id)
        self._last = {"evicted_blocks": tuple(forgotten)}
        self._record(f"free {seq_id}: blocks {freed} return to the free list")
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
            seq_lens=tuple((s, self.seq_len(s)) for s in self._tables),
            free_queue=tuple(self._free),
            **self._last,
        )

    # ------------------------------------------------------------------ internals

    def _table(self, seq_id: str) -> list[int]:
        if not isinstance(seq_id, str):
            raise InvalidArgumentError(
                f"sequence id must be a string, got {seq_id!r} ({type(seq_id).__name__})"
            )
        table = self._tables.get(seq_id)
        if table is None:
            if seq_id in self._finished:
                raise UnknownRequestError(f"sequence {seq_id!r} was already freed; allocate it again first")
            held = ", ".join(map(repr, self._tables)) or "none"
            raise UnknownRequestError(f"unknown sequence {seq_id!r}; live sequences: {held}")
        return table

    def _check_new_id(self, seq_id: object, name: str = "seq_id") -> None:
        if not isinstance(seq_id, str) or not seq_id:
            raise InvalidArgumentError(f"{name} must be a non-empty string, got {seq_id!r}")
        if seq_id in self._tables:
            raise DuplicateRequestError(f"sequence {seq_id!r} already exists; free it first or pick a new id")

    def _check_new_tokens(self, tokens: object) -> tuple[list[int], bool]:
        """Token ids (or UNKNOWN_TOKEN placeholders for a count) and whether the ids are known."""
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            check_int("tokens", tokens, minimum=1)
            return [UNKNOWN_TOKEN] * tokens, False
        if not hasattr(tokens, "__iter__") or isinstance(tokens, (str, bytes)):
            raise InvalidArgumentError(
                f"tokens must be a token count or a list of token ids, got {type(tokens).__name__}"
            )
        toks = check_tokens("tokens", tokens)
        for i, t in enumerate(toks):
            if not 0 <= t <= _MAX_TOKEN_ID:
                raise InvalidArgumentError(f"tokens[{i}] = {t} is not a token id: use 0..{_MAX_TOKEN_ID}")
        return toks, True

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
            parent = hash_block(parent, toks[start : start + bs], first=start == 0, scheme=self.hash_scheme)
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

    def _write(self, seq_id: str, toks: list[int]) -> None:
        """Write tokens after the sequence's end, growing its table; callers checked there is room."""
        table = self._tables[seq_id]
        bs = self.block_size
        pos = 0
        if table:
            last = self._tokens[table[-1]]
            take = min(bs - len(last), len(toks))
            last.extend(toks[:take])
            pos = take
            self._on_written(seq_id, len(table) - 1)
        while pos < len(toks):
            b = self._take()
            table.append(b)
            self._tokens[b] = list(toks[pos : pos + bs])
            pos += bs
            self._on_written(seq_id, len(table) - 1)

    def _on_written(self, seq_id: str, logical: int) -> None:
        """Extend the hash chain when block ``logical`` became full, and offer it for prefix reuse."""
        chain = self._chain[seq_id]
        block = self._tables[seq_id][logical]
        content = self._tokens[block]
        if chain is None or len(content) < self.block_size or len(chain) > logical:
            return
        if UNKNOWN_TOKEN in content:
            self._chain[seq_id] = None
            return
        parent = chain[-1] if chain else none_hash(self.hash_scheme)
        h = hash_block(parent, content, first=logical == 0, scheme=self.hash_scheme)
        chain.append(h)
        if h not in self._block_by_hash and self._hash_of[block] is None:
            self._block_by_hash[h] = block
            self._hash_of[block] = h

    def _record(self, caption: str) -> None:
        if self.history is not None:
            self.history.add(caption, self.snapshot())


def _check_free_order(free_order: object, num_blocks: int) -> list[int]:
    if isinstance(free_order, (str, bytes)) or not hasattr(free_order, "__iter__"):
        raise InvalidArgumentError(f"free_order must be a list of block ids, got {type(free_order).__name__}")
    order = list(free_order)  # type: ignore[call-overload]
    for i, b in enumerate(order):
        check_int(f"free_order[{i}]", b, minimum=0)
    if sorted(order) != list(range(num_blocks)):
        missing = sorted(set(range(num_blocks)) - set(order))
        extra = sorted({b for b in order if b >= num_blocks or order.count(b) > 1})
        raise InvalidArgumentError(
            f"free_order must list every block id 0..{num_blocks - 1} exactly once; "
            f"missing {missing}, out of range or repeated {extra}"
        )
    return order


# ---------------------------------------------------------------- lesson examples 2, 4, 5


@dataclass(frozen=True)
class Example2:
    """Two sequences take blocks from a shuffled free list; five positions are translated."""

    tables: dict[str, tuple[int, ...]]
    lengths: dict[str, int]
    translations: tuple[Translation, ...]
    free_blocks: tuple[int, ...]
    history: History[BlockPoolState]


def example_2() -> Example2:
    """Lesson example 2: A (37 tokens) and B (20) on 16-token blocks, free list [7, 2, 9, 4, 0, 5, 11, 3].

    The lesson's pool has 12 block ids but lists only 8 as free; here the
    other 4 (1, 6, 8, 10) are held by a sequence called ``others`` so that
    every block is accounted for.
    """
    free_list = [7, 2, 9, 4, 0, 5, 11, 3]
    busy = [1, 6, 8, 10]
    pool = BlockPool(12, 16, free_order=busy + free_list, record=True)
    pool.allocate("others", len(busy) * 16)
    lengths = {"A": 37, "B": 20}
    for seq, n in lengths.items():
        pool.allocate(seq, n)
    queries = [("A", 0), ("A", 15), ("A", 16), ("A", 36), ("B", 19)]
    translations = tuple(pool.translate(seq, pos) for seq, pos in queries)
    assert pool.history is not None
    return Example2(
        {seq: pool.block_table(seq) for seq in lengths}, lengths, translations, pool.free_blocks, pool.history
    )


@dataclass(frozen=True)
class Example4:
    """A 40-token prompt forked into three samples; each writes one token at position 40."""

    tables_after_fork: tuple[tuple[int, ...], ...]
    ref_counts_after_fork: dict[int, int]
    writes: tuple[AppendResult, ...]
    tables: tuple[tuple[int, ...], ...]
    ref_counts: dict[int, int]
    blocks_used: int
    blocks_without_sharing: int
    history: History[BlockPoolState]


def parallel_sampling(prompt_len: int = 40, n: int = 3, *, block_size: int = 16) -> Example4:
    """Fork a prompt into ``n`` samples and let each write its first generated token (copy-on-write)."""
    check_int("prompt_len", prompt_len, minimum=1)
    check_int("n", n, minimum=1)
    check_int("block_size", block_size, minimum=1)
    prompt_blocks = -(-prompt_len // block_size)
    pool = BlockPool(n * (prompt_blocks + 1), block_size, record=True)
    names = [f"sample {s}" for s in range(n)]
    pool.allocate(names[0], prompt_len)
    for name in names[1:]:
        pool.fork(names[0], name)
    after_fork = tuple(pool.block_table(s) for s in names)
    refs_after_fork = pool.ref_counts
    writes = tuple(pool.append(s, 1) for s in names)
    assert pool.history is not None
    return Example4(
        after_fork, refs_after_fork, writes, tuple(pool.block_table(s) for s in names), pool.ref_counts,
        pool.num_used_blocks, n * prompt_blocks, pool.history,
    )  # fmt: skip


def example_4() -> Example4:
    """Lesson example 4: a 40-token prompt, n = 3, 16-token blocks."""
    return parallel_sampling(40, 3, block_size=16)


@dataclass(frozen=True)
class Example5:
    """Two requests with the same system prompt and different questions."""

    requests: tuple[AllocateResult, ...]
    ref_counts: dict[int, int]
    blocks_in_use: int
    blocks_without_sharing: int
    history: History[BlockPoolState]


def system_prompt_request(system_len: int, question_len: int, question_start: int) -> list[int]:
    """Token ids of a request: system prompt 1000, 1001, ... then question ``question_start``, ..."""
    check_int("system_len", system_len, minimum=0)
    check_int("question_len", question_len, minimum=0)
    check_int("question_start", question_start, minimum=0)
    return list(range(1000, 1000 + system_len)) + list(range(question_start, question_start + question_len))


def shared_prefix(prompts: Sequence[Sequence[int]], *, block_size: int = 16) -> Example5:
    """Admit ``prompts`` in order into a pool that shares full-prefix blocks; nothing is freed."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
        raise InvalidArgumentError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    prompts = [check_tokens(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
    if not prompts:
        raise InvalidArgumentError("prompts is empty: give at least one prompt")
    check_int("block_size", block_size, minimum=1)
    without_sharing = sum(-(-len(p) // block_size) for p in prompts)
    pool = BlockPool(without_sharing, block_size, share_prefixes=True, record=True)
    results = tuple(pool.allocate(f"request {i + 1}", p) for i, p in enumerate(prompts))
    assert pool.history is not None
    return Example5(results, pool.ref_counts, pool.num_used_blocks, without_sharing, pool.history)


def example_5() -> Example5:
    """Lesson example 5: a 70-token system prompt, then 20- and 33-token questions."""
    return shared_prefix(
        [system_prompt_request(70, 20, 5000), system_prompt_request(70, 33, 6000)], block_size=16
    )
