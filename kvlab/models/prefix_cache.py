"""A prefix cache that works the way vLLM v1's block pool does (lesson example 7).

The pieces, each named after its vLLM counterpart (``vllm/v1/core/block_pool.py``,
``kv_cache_utils.py``, ``single_type_kv_cache_manager.py``, ``kv_cache_manager.py``):

* **Free queue** (``FreeKVCacheBlockQueue``): a doubly linked list threaded
  through the blocks themselves, so a block leaves it from anywhere in O(1).
  New blocks are taken from the front. It starts in block-id order.
* **Hash map** (``BlockHashToBlockMap``): chained block hash -> the blocks
  cached under it. vLLM never de-duplicates (a block table must stay
  append-only), so one hash can name several blocks; a lookup returns the
  oldest one still cached.
* **Lookup** (``find_longest_cache_hit``): walk the prompt's full-block hashes
  from the start and stop at the first miss. At most ``(prompt_len - 1) //
  block_size`` blocks can hit, because the last prompt token must be computed
  to get logits: a 64-token prompt sent twice hits 48 tokens, not 64.
* **Allocation** (``allocate_slots``): refuse, changing nothing, unless the
  free queue holds the new blocks *plus* every hit block that sits in the
  queue (taking a hit out of the queue uses up free capacity). Otherwise
  *touch* the hits (ref count + 1, out of the queue if they were free), then
  take the new blocks from the front. A block taken from the front that still
  has a hash is evicted right then: its hash leaves the map (lazy eviction --
  until that moment a freed block can still be hit).
* **Caching** (``cache_full_blocks``): every block that becomes full, from the
  prompt or from appended (decoded) tokens, gets its chained hash and enters
  the map at once. A partial last block is never hashed.
* **Free** (``free_blocks``): a request's blocks are released in reverse
  block-table order; those whose ref count drops to 0 go back to the queue.
  Blocks with a hash are appended at the back (in that reverse order, so a
  chain's tail is evicted before its head); blocks without one -- the partial
  last block -- are prepended at the front, since they can never be hit.
* **Null block**: vLLM pops block 0 at start-up as a placeholder that is never
  handed out. The lesson numbers blocks without it, so it is off by default;
  ``null_block=True`` reserves block 0 and gives vLLM's block ids.

The lesson's example 7 program leaves out two vLLM rules that the lesson
itself states (the front rule in example 7's last paragraph, the cap in
example 6): it appends every freed block at the back and has no
prompt_len - 1 cap. This model keeps both, always, because neither changes a
lesson figure: example 7's prompts are whole blocks (no unhashed block) and C
hits only 2 of its 3 blocks, so ``example_7`` reproduces the lesson exactly.
The null block is the one difference that shows in the figures (block ids),
so it is the one behind an option, off by default.

Scope: one KV cache group of full attention, whole prompts allocated at once
(no chunked prefill), no speculative lookahead, no admission watermark
(vLLM's default is 0). Preemption is not modelled: an ``append`` the pool
cannot serve is refused and changes nothing, where vLLM would preempt a
running request to make room.

The replay (``null_block`` on, ``hash="vllm"``) is checked record by record
against vLLM 0.33.0's real ``KVCacheManager`` on random scenarios by
``tools/conformance/fuzz_vllm.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvlab.core import hashing
from kvlab.core.snapshots import BlockPoolState, BlockState, History
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownRequestError,
    check_int,
    check_tokens,
)

MAX_TOKEN_ID = 2**31 - 1


class Block:
    """One physical block's metadata; ``prev_free``/``next_free`` link it into the free queue."""

    __slots__ = (
        "block_id",
        "ref_count",
        "block_hash",
        "tokens",
        "ever_used",
        "is_null",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None
        self.tokens: list[int] = []
        self.ever_used = False
        self.is_null = False
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_count={self.ref_count}, hashed={self.block_hash is not None})"


class FreeBlockQueue:
    """Free blocks in hand-out order, as a doubly linked list between two sentinels.

    Every operation touches only the blocks it moves: ``remove`` of a block in
    the middle (a cache hit on a free block) is O(1), which a Python list or
    deque cannot do.
    """

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._head = Block(-1)  # sentinels: the real blocks always have both neighbours
        self._tail = Block(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next_free

    def __contains__(self, block: Block) -> bool:
        return block.prev_free is not None

    def popleft_n(self, n: int) -> list[Block]:
        """Take ``n`` blocks from the front (the caller checked there are enough)."""
        out: list[Block] = []
        node = self._head.next_free
        for _ in range(n):
            assert node is not None and node is not self._tail, "free queue underflow"
            out.append(node)
            nxt = node.next_free
            node.prev_free = node.next_free = None
            node = nxt
        assert node is not None
        self._head.next_free = node
        node.prev_free = self._head
        self._len -= n
        return out

    def remove(self, block: Block) -> None:
        """Unlink ``block`` from wherever it is in the queue."""
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"block {block.block_id} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def append_n(self, blocks: Sequence[Block]) -> None:
        """Put ``blocks`` at the back, in the given order."""
        self._link_after(self._tail.prev_free, blocks)

    def prepend_n(self, blocks: Sequence[Block]) -> None:
        """Put ``blocks`` at the front, in the given order (``blocks[0]`` becomes the front)."""
        self._link_after(self._head, blocks)

    def _link_after(self, anchor: Block | None, blocks: Sequence[Block]) -> None:
        assert anchor is not None
        after = anchor.next_free
        assert after is not None
        prev = anchor
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = after
        after.prev_free = prev
        self._len += len(blocks)


@dataclass(frozen=True)
class ProbeResult:
    """What a lookup found: ``num_cached_tokens`` tokens in ``hit_block_ids``; nothing was allocated."""

    num_tokens: int
    num_cached_tokens: int
    hit_block_ids: tuple[int, ...]


@dataclass(frozen=True)
class AllocationResult:
    """What ``allocate`` or ``append`` did to request ``request_id``.

    ``num_tokens`` is the request's length after the call, ``num_new_tokens``
    how many tokens this call brought (the prompt, or the appended tokens).
    ``evicted`` lists blocks whose cached content was dropped to make room, in
    the order they were taken; ``evicted_hashes`` holds the hashes they lost.
    """

    request_id: str
    num_tokens: int
    num_new_tokens: int
    num_cached_tokens: int
    hit_block_ids: tuple[int, ...]
    new_block_ids: tuple[int, ...]
    evicted: tuple[int, ...]
    evicted_hashes: tuple[bytes, ...]
    block_table: tuple[int, ...]

    @property
    def num_computed_tokens(self) -> int:
        """Tokens of this call the model must compute: the new tokens minus the cache hit."""
        return self.num_new_tokens - self.num_cached_tokens


@dataclass(frozen=True)
class FreeResult:
    """``block_table`` is the table the request had; ``released`` the blocks that became free, in queue order."""

    request_id: str
    block_table: tuple[int, ...]
    released: tuple[int, ...]


class _Request:
    __slots__ = ("tokens", "table", "hashes", "salt")

    def __init__(self, tokens: list[int], table: list[Block], hashes: list[bytes], salt: str | None) -> None:
        self.tokens = tokens
        self.table = table
        self.hashes = hashes  # chained hash of every full block, in table order; all of them are cached
        self.salt = salt


class PrefixCache:
    """vLLM v1's prefix cache over ``num_blocks`` blocks of ``block_size`` tokens.

    ``null_block=True`` reserves block 0 the way vLLM does (``num_blocks - 1``
    blocks are usable and ids match vLLM's); the default numbers blocks from 0
    as the lesson does. ``hash_scheme`` picks the ``kvlab.core.hashing`` digest
    ("lesson" or "vllm"); the cache's behaviour does not depend on it.
    ``record=True`` keeps a ``History`` with one step per successful call,
    probes included; a call that raises records nothing, like it changes nothing.
    ``hash_labels`` maps digests to display names (see ``HashLabels``).
    """

    free_queue_class: type[FreeBlockQueue] = FreeBlockQueue  # benchmarks swap in a list-based queue

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        null_block: bool = False,
        hash_scheme: str = "lesson",
        record: bool = False,
    ) -> None:
        check_int("block_size", block_size, minimum=1)
        check_int("num_blocks", num_blocks, minimum=1)
        _check_bool("null_block", null_block)
        _check_bool("record", record)
        if hash_scheme not in hashing.SCHEMES:
            raise InvalidArgumentError(
                f"unknown hash scheme {hash_scheme!r}: use one of {', '.join(hashing.SCHEMES)}"
            )
        self.block_size = block_size
        self.hash_scheme = hash_scheme
        self._none_hash = hashing.none_hash(hash_scheme)
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._queue = self.free_queue_class(self._blocks)
        self._cached: dict[bytes, dict[int, Block]] = {}
        self._requests: dict[str, _Request] = {}
        self.null_block: int | None = None
        if null_block:
            (reserved,) = self._queue.popleft_n(1)  # vLLM: BlockPool.__init__ pops block 0 for good
            reserved.is_null = True
            self.null_block = reserved.block_id
        self.hash_labels: dict[bytes, str] = {}
        self.history: History[BlockPoolState] | None = None
        if record:
            self.history = History()
            usable = len(self._queue)
            extra = ", block 0 reserved as the null block" if null_block else ""
            self.history.add(f"{usable} free blocks of {block_size} tokens{extra}", self.snapshot())

    # ------------------------------------------------------------------ queries

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue)

    @property
    def requests(self) -> tuple[str, ...]:
        """Ids of the requests holding blocks, in arrival order."""
        return tuple(self._requests)

    def free_queue(self) -> list[int]:
        """Free block ids from the front (handed out next, so evicted first) to the back."""
        return [b.block_id for b in self._queue]

    def block_table(self, req_id: str) -> tuple[int, ...]:
        return tuple(b.block_id for b in self._request(req_id).table)

    def num_tokens(self, req_id: str) -> int:
        return len(self._request(req_id).tokens)

    def ref_count(self, block_id: int) -> int:
        return self._block(block_id).ref_count

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash a block is cached under, or None (never full, or evicted)."""
        return self._block(block_id).block_hash

    def cached_blocks(self) -> dict[bytes, tuple[int, ...]]:
        """A copy of the hash map: each hash with the blocks cached under it, the one a hit returns first."""
        return {h: tuple(holders) for h, holders in self._cached.items()}

    def label(self, digest: bytes) -> str:
        """A hash's display name: its entry in ``hash_labels``, else its first 4 bytes in hex."""
        return self.hash_labels.get(digest) or hashing.short(digest)

    def probe(self, tokens: Sequence[int], cache_salt: str | None = None) -> ProbeResult:
        """Look ``tokens`` up as a new prompt would be; allocates and changes nothing."""
        toks = _check_token_ids("tokens", tokens)
        salt = _check_salt(cache_salt)
        hits = self._lookup(self._hash_prompt(toks, salt), len(toks))
        result = ProbeResult(len(toks), len(hits) * self.block_size, tuple(b.block_id for b in hits))
        self._record(
            f"probe {len(toks)} tokens: {_hit_text(result.hit_block_ids, self.block_size)}", hits=hits
        )
        return result

    # ------------------------------------------------------------------ operations

    def allocate(self, req_id: str, tokens: Sequence[int], cache_salt: str | None = None) -> AllocationResult:
        """Admit a new request: reuse its cached prefix, allocate blocks for the rest, cache full blocks.

        Raises OutOfBlocksError, having changed nothing, when the free queue
        cannot supply the new blocks plus the free blocks the hit takes out of it.
        """
        self._check_new_id(req_id)
        toks = _check_token_ids("tokens", tokens)
        salt = _check_salt(cache_salt)
        hashes = self._hash_prompt(toks, salt)
        hits = self._lookup(hashes, len(toks))
        num_new = -(-len(toks) // self.block_size) - len(hits)
        num_free_hits = sum(1 for b in hits if b.ref_count == 0)
        if num_new + num_free_hits > len(self._queue):
            held = f" plus the {num_free_hits} free cached blocks it hits" if num_free_hits else ""
            raise OutOfBlocksError(
                f"cannot allocate request {req_id!r}: it needs {num_new} new blocks{held}, "
                f"but only {len(self._queue)} blocks are free; free a request or use a larger pool"
            )
        self._touch(hits)
        new, evicted = self._take(num_new)
        req = _Request(list(toks), hits + new, hashes, salt)
        self._requests[req_id] = req
        bs = self.block_size
        for i in range(len(hits), len(req.table)):
            req.table[i].tokens = toks[i * bs : (i + 1) * bs]
        self._cache_blocks(req, len(hits))
        result = self._result(req_id, req, hits, new, evicted, len(toks), num_cached=len(hits) * bs)
        self._record(
            f"allocate {req_id} ({len(toks)} tokens): {_hit_text(result.hit_block_ids, bs)}, "
            f"new blocks {list(result.new_block_ids)}{self._evicted_text(evicted)}",
            hits=hits,
            new=new,
            evicted=[b for b, _ in evicted],
        )
        return result

    def append(self, req_id: str, tokens: Sequence[int]) -> AllocationResult:
        """Append decoded ``tokens`` to a running request; blocks that become full are cached at once.

        Raises OutOfBlocksError, having changed nothing, when the pool cannot
        supply the blocks the new tokens need.
        """
        req = self._request(req_id)
        toks = _check_token_ids("tokens", tokens)
        bs = self.block_size
        total = len(req.tokens) + len(toks)
        num_new = -(-total // bs) - len(req.table)
        if num_new > len(self._queue):
            raise OutOfBlocksError(
                f"cannot append {len(toks)} tokens to request {req_id!r}: they need {num_new} new blocks, "
                f"but only {len(self._queue)} are free; free a request or use a larger pool"
            )
        new, evicted = self._take(num_new)
        start = len(req.tokens)
        req.tokens.extend(toks)
        req.table.extend(new)
        for i in range(start // bs, len(req.table)):
            block = req.table[i]
            lo = max(start, i * bs)
            block.tokens.extend(req.tokens[lo : (i + 1) * bs])
        parent = req.hashes[-1] if req.hashes else self._none_hash
        for i in range(len(req.hashes), total // bs):
            parent = hashing.hash_block(
                parent,
                req.tokens[i * bs : (i + 1) * bs],
                salt=req.salt,
                first=i == 0,
                scheme=self.hash_scheme,
            )
            req.hashes.append(parent)
        self._cache_blocks(req, start // bs)
        result = self._result(req_id, req, [], new, evicted, len(toks), num_cached=0)
        self._record(
            f"append {len(toks)} tokens to {req_id}: new blocks {list(result.new_block_ids)}"
            f"{self._evicted_text(evicted)}",
            new=new,
            evicted=[b for b, _ in evicted],
        )
        return result

    def free(self, req_id: str) -> FreeResult:
        """Finish a request: release its blocks in reverse table order (hashed to the back, others to the front)."""
        req = self._request(req_id)
        del self._requests[req_id]
        ordered = req.table[::-1]
        for block in ordered:
            block.ref_count -= 1
        released = [b for b in ordered if b.ref_count == 0]
        unhashed = [b for b in released if b.block_hash is None]
        hashed = [b for b in released if b.block_hash is not None]
        self._queue.prepend_n(unhashed)
        self._queue.append_n(hashed)
        result = FreeResult(
            req_id, tuple(b.block_id for b in req.table), tuple(b.block_id for b in unhashed + hashed)
        )
        where = []
        if unhashed:
            where.append(f"{[b.block_id for b in unhashed]} to the front")
        if hashed:
            where.append(f"{[b.block_id for b in hashed]} to the back")
        self._record(f"free {req_id}: " + (", ".join(where) if where else "no block became free"))
        return result

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> BlockPoolState:
        """The whole state as an immutable ``BlockPoolState`` (hash labels are short hex or ``hash_labels``)."""
        return self._snapshot()

    def _snapshot(
        self, hits: Sequence[Block] = (), new: Sequence[Block] = (), evicted: Sequence[Block] = ()
    ) -> BlockPoolState:
        """The state, marking what the last operation hit, allocated and evicted (for views to highlight)."""
        blocks = tuple(
            BlockState(
                block_id=b.block_id,
                ref_count=b.ref_count,
                tokens=tuple(b.tokens),
                block_hash=None if b.block_hash is None else self.label(b.block_hash),
                ever_used=b.ever_used,
                is_null=b.is_null,
            )
            for b in self._blocks
        )
        return BlockPoolState(
            block_size=self.block_size,
            blocks=blocks,
            tables=tuple((rid, tuple(b.block_id for b in r.table)) for rid, r in self._requests.items()),
            seq_lens=tuple((rid, len(r.tokens)) for rid, r in self._requests.items()),
            free_queue=tuple(self.free_queue()),
            null_block=self.null_block,
            hit_blocks=tuple(b.block_id for b in hits),
            new_blocks=tuple(b.block_id for b in new),
            evicted_blocks=tuple(b.block_id for b in evicted),
        )

    # ------------------------------------------------------------------ internals

    def _hash_prompt(self, toks: list[int], salt: str | None) -> list[bytes]:
        out: list[bytes] = []
        parent = self._none_hash
        bs = self.block_size
        for i in range(len(toks) // bs):
            parent = hashing.hash_block(
                parent, toks[i * bs : (i + 1) * bs], salt=salt, first=i == 0, scheme=self.hash_scheme
            )
            out.append(parent)
        return out

    def _lookup(self, hashes: list[bytes], num_tokens: int) -> list[Block]:
        """The longest run of cached blocks from the start, capped so the last prompt token is computed."""
        hits: list[Block] = []
        for h in hashes[: (num_tokens - 1) // self.block_size]:
            holders = self._cached.get(h)
            if not holders:
                break
            hits.append(next(iter(holders.values())))  # the oldest block cached under h
        return hits

    def _touch(self, hits: list[Block]) -> None:
        for block in hits:
            if block.ref_count == 0:
                self._queue.remove(block)
            block.ref_count += 1

    def _take(self, n: int) -> tuple[list[Block], list[tuple[Block, bytes]]]:
        """Pop ``n`` blocks from the front; evict the cached content of those that had a hash."""
        new = self._queue.popleft_n(n)
        evicted: list[tuple[Block, bytes]] = []
        for block in new:
            h = block.block_hash
            if h is not None:
                holders = self._cached[h]
                del holders[block.block_id]
                if not holders:
                    del self._cached[h]
                block.block_hash = None
                evicted.append((block, h))
            block.ref_count = 1
            block.ever_used = True
            block.tokens = []
        return new, evicted

    def _cache_blocks(self, req: _Request, start: int) -> None:
        """Cache the request's full blocks from index ``start`` (earlier ones are cached already)."""
        for i in range(start, len(req.hashes)):
            block = req.table[i]
            h = req.hashes[i]
            block.block_hash = h
            holders = self._cached.get(h)
            if holders is None:
                self._cached[h] = {block.block_id: block}
            else:
                holders[block.block_id] = block  # no de-duplication, as in vLLM

    def _result(
        self,
        req_id: str,
        req: _Request,
        hits: list[Block],
        new: list[Block],
        evicted: list[tuple[Block, bytes]],
        num_new_tokens: int,
        *,
        num_cached: int,
    ) -> AllocationResult:
        return AllocationResult(
            request_id=req_id,
            num_tokens=len(req.tokens),
            num_new_tokens=num_new_tokens,
            num_cached_tokens=num_cached,
            hit_block_ids=tuple(b.block_id for b in hits),
            new_block_ids=tuple(b.block_id for b in new),
            evicted=tuple(b.block_id for b, _ in evicted),
            evicted_hashes=tuple(h for _, h in evicted),
            block_table=tuple(b.block_id for b in req.table),
        )

    def _evicted_text(self, evicted: list[tuple[Block, bytes]]) -> str:
        if not evicted:
            return ""
        return ", evicting " + ", ".join(f"{self.label(h)} from block {b.block_id}" for b, h in evicted)

    def _record(
        self,
        caption: str,
        *,
        hits: Sequence[Block] = (),
        new: Sequence[Block] = (),
        evicted: Sequence[Block] = (),
    ) -> None:
        if self.history is not None:
            self.history.add(caption, self._snapshot(hits, new, evicted))

    def _request(self, req_id: object) -> _Request:
        if not isinstance(req_id, str):
            raise InvalidArgumentError(
                f"request id must be a string, got {req_id!r} ({type(req_id).__name__})"
            )
        req = self._requests.get(req_id)
        if req is None:
            names = list(self._requests)
            live = ", ".join(map(repr, names[:8])) + (", ..." if len(names) > 8 else "") or "none"
            raise UnknownRequestError(
                f"unknown request {req_id!r} (already freed, or never allocated); live: {live}"
            )
        return req

    def _check_new_id(self, req_id: object) -> None:
        if not isinstance(req_id, str) or not req_id:
            raise InvalidArgumentError(f"request id must be a non-empty string, got {req_id!r}")
        if req_id in self._requests:
            raise DuplicateRequestError(
                f"request {req_id!r} already holds blocks; free it first or pick a new id"
            )

    def _block(self, block_id: object) -> Block:
        check_int("block_id", block_id, minimum=0)
        assert isinstance(block_id, int)
        if block_id >= len(self._blocks):
            raise InvalidArgumentError(
                f"block_id {block_id} is out of range: the pool has {len(self._blocks)} blocks"
            )
        return self._blocks[block_id]


# ---------------------------------------------------------------------- named hashes (example 7)


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
        self.block_size = block_size
        self.scheme = scheme
        self.salt = _check_salt(salt)
        self._run: dict[str, int] = {}  # name -> index of its token run
        self._digest: dict[str, bytes] = {}
        self.names: dict[bytes, str] = {}  # digest -> name, ready for PrefixCache.hash_labels

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


@dataclass(frozen=True)
class Example7:
    """Lesson example 7: which hashes were evicted, the free queue after each finished request, the log."""

    evictions: tuple[str, ...]
    queues: tuple[tuple[int, ...], ...]
    log: tuple[str, ...]
    history: History[BlockPoolState]


def example_7_scenario(block_size: int = 16, *, hash_scheme: str = "lesson") -> dict:
    """Example 7 as a replay scenario: ``{"config": ..., "ops": [...]}`` for ``python -m kvlab replay prefix-cache``.

    Each request's prompt is its named blocks and nothing more (whole blocks),
    so the prompt_len - 1 cap only keeps C from hitting its own last block,
    which misses anyway.
    """
    labels = HashLabels(block_size, scheme=hash_scheme)
    prompts = {rid: labels.tokens(names) for rid, names in EXAMPLE_7_REQUESTS.items()}
    ops: list[dict] = []
    for op, rid in EXAMPLE_7_STEPS:
        ops.append(
            {"op": op, "req": rid, "tokens": prompts[rid]} if op == "alloc" else {"op": op, "req": rid}
        )
    config = {"block_size": block_size, "num_blocks": 6, "null_block": False, "hash": hash_scheme}
    return {"config": config, "ops": ops}


def example_7(block_size: int = 16, *, hash_scheme: str = "lesson") -> Example7:
    """Run lesson example 7 (a pool of 6 blocks, requests A-D) and return its evictions and queues.

    Expected: evictions a3, b2, b1; queues [3, 4, 5, 2, 1, 0] after A,
    [5, 2, 1, 0, 4, 3] after B, and [5, 1, 0] after C.
    """
    labels = HashLabels(block_size, scheme=hash_scheme)
    prompts = {rid: labels.tokens(names) for rid, names in EXAMPLE_7_REQUESTS.items()}
    cache = PrefixCache(6, block_size, hash_scheme=hash_scheme, record=True)
    cache.hash_labels = labels.names
    evictions: list[str] = []
    queues: list[tuple[int, ...]] = []
    log: list[str] = []
    for op, rid in EXAMPLE_7_STEPS:
        if op == "free":
            cache.free(rid)
            queues.append(tuple(cache.free_queue()))
            log.append(f"  {rid} finished; free queue, front first: {list(queues[-1])}")
            continue
        result = cache.allocate(rid, prompts[rid])
        names = EXAMPLE_7_REQUESTS[rid]
        parts = [f"{names[i]} hit in block {b}" for i, b in enumerate(result.hit_block_ids)]
        dropped = dict(zip(result.evicted, result.evicted_hashes, strict=True))
        for i, b in enumerate(result.new_block_ids, start=len(result.hit_block_ids)):
            if b in dropped:
                evictions.append(labels[dropped[b]])
                parts.append(f"{names[i]} into block {b} (evicting {evictions[-1]})")
            else:
                parts.append(f"{names[i]} into block {b}")
        log.append(f"{rid}: " + ", ".join(parts))
    assert cache.history is not None
    return Example7(tuple(evictions), tuple(queues), tuple(log), cache.history)


# ---------------------------------------------------------------------- validation helpers


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")


def _check_salt(salt: object) -> str | None:
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        # vLLM's API rejects an empty cache_salt, and treats a missing one as no salt.
        raise InvalidArgumentError(f"cache_salt must be a non-empty string or None, got {salt!r}")
    return salt


def _check_token_ids(name: str, tokens: object) -> list[int]:
    if isinstance(tokens, (list, tuple)) and tokens and set(map(type, tokens)) == {int}:
        toks = list(tokens)  # the common case, checked at C speed
    else:
        toks = check_tokens(name, tokens)  # numpy ints, or a precise error
    if min(toks) < 0 or max(toks) > MAX_TOKEN_ID:
        i, t = next((i, t) for i, t in enumerate(toks) if not 0 <= t <= MAX_TOKEN_ID)
        raise InvalidArgumentError(f"{name}[{i}] = {t} is not a token id: use 0..{MAX_TOKEN_ID}")
    return toks


def _hit_text(hit_ids: tuple[int, ...], block_size: int) -> str:
    if not hit_ids:
        return "no cache hit"
    return f"hit {len(hit_ids) * block_size} tokens in blocks {list(hit_ids)}"
