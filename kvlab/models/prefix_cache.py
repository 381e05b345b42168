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
hits only 2 of its 3 blocks, so ``kvlab.lessons.ex07.example_7`` reproduces the lesson exactly.
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

Names: kvlab's ``PrefixCache`` is vLLM's ``KVCacheManager`` and ``BlockPool``
together; ``request_id`` is vLLM's ``req_id``; ``num_tokens(request_id)`` is
the request's ``num_computed_tokens`` once its tokens are cached;
``allocate`` is ``get_computed_blocks`` + ``allocate_slots`` for a whole
prompt; ``free`` is ``KVCacheManager.free``. The vocabulary (``block_table``,
``free_queue()``, ``requests``, ``AllocationResult``) is the one
``kvlab.models.paged.BlockPool`` uses. With ``record=True`` each call adds a
``prefix_cache.<op>`` ``Event`` (captions: ``kvlab.views.text.block_pool``).
Hash names such as the lesson's "a1" are a display matter
(``kvlab.lessons.ex07.HashLabels``); snapshots and events show short hex.

Cost: each call costs what it brings or changes (its tokens' blocks and hashes), never
the length of a request's table (results carry a ``BlockTableView`` of the append-only
table) nor anything for the history unless recording. A prompt block already cached is
hashed by one dictionary lookup of its key (parent hash, tokens, extra keys), with the
digest vLLM's chain would compute; the digests are the same either way.

Kept as one module (over 500 lines with its docstring): the cache's rules
(lookup, touch, take-and-evict, cache, free) share one state and only make
sense together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core import hashing
from kvlab.core.hashing import check_token_ids
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
    check_optional_str,
    check_size,
)
from kvlab.models.free_queue import Block, FreeBlockQueue
from kvlab.models.paged import AllocationResult, BlockTableView

__all__ = ["AllocationResult", "FreeResult", "PrefixCache", "ProbeResult"]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What a lookup found: ``num_cached_tokens`` tokens in ``hit_block_ids``; nothing was allocated."""

    num_tokens: int
    num_cached_tokens: int
    hit_block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FreeResult:
    """``block_table`` is the table the request had; ``released`` the blocks that became free, in queue order."""

    request_id: str
    block_table: tuple[int, ...]
    released: tuple[int, ...]


class _Request:
    __slots__ = ("tokens", "ids", "num_hashed", "last_hash", "salt")

    def __init__(
        self, tokens: list[int], ids: list[int], num_hashed: int, last_hash: bytes | None, salt: str | None
    ) -> None:
        self.tokens = tokens  # only grows: its blocks read their tokens from it
        self.ids = ids  # the block table; append-only, as in vLLM, so results hold views of it
        self.num_hashed = num_hashed  # every full block is hashed and cached; the chain goes on from
        self.last_hash = last_hash  # the last one's hash
        self.salt = salt


class PrefixCache:
    """vLLM v1's prefix cache over ``num_blocks`` blocks of ``block_size`` tokens.

    ``null_block=True`` reserves block 0 the way vLLM does (``num_blocks - 1``
    blocks are usable and ids match vLLM's); the default numbers blocks from 0
    as the lesson does. ``hash_scheme`` picks the ``kvlab.core.hashing`` digest
    ("lesson" or "vllm"); the cache's behaviour does not depend on it.
    ``record=True`` keeps a ``History`` with one step per successful call,
    probes included; a call that raises records nothing, like it changes nothing.

    Bounds (``kvlab.errors.LIMITS``): ``num_blocks`` at most ``LIMITS.num_blocks`` and
    ``block_size`` at most ``LIMITS.block_size`` (every block is built at once), and one call
    brings at most ``LIMITS.tokens`` token ids, each in 0..MAX_TOKEN_ID.
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
        block_size = check_size("block_size", block_size, "block_size", minimum=1)
        num_blocks = check_size("num_blocks", num_blocks, "num_blocks", minimum=1)
        check_bool("null_block", null_block)
        check_bool("record", record)
        hash_scheme = check_choice("hash_scheme", hash_scheme, hashing.SCHEMES, what="hash scheme")
        self.block_size = block_size
        self.hash_scheme = hash_scheme
        self._none_hash = hashing.none_hash(hash_scheme)
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._queue = self.free_queue_class(self._blocks)
        self._cached: dict[bytes, dict[int, Block]] = {}
        # the key (parent, tokens, extra) of every hash in the map, both ways: a prompt's block that is
        # cached already is hashed by one lookup (hashing._chain_known), with the same digest
        self._known: dict[tuple, bytes] = {}
        self._key_of: dict[bytes, tuple] = {}
        self._requests: dict[str, _Request] = {}
        self.null_block: int | None = None
        if null_block:
            (reserved,) = self._queue.popleft_n(1)  # vLLM: BlockPool.__init__ pops block 0 for good
            reserved.is_null = True
            self.null_block = reserved.block_id
        self.history: History[BlockPoolState] | None = None
        if record:
            self.history = History()
            event = Event.of("prefix_cache.init", num_free_blocks=len(self._queue), block_size=block_size,
                             null_block=self.null_block)  # fmt: skip
            self.history.add(event, self.snapshot())

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

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._request(request_id).ids)

    def num_tokens(self, request_id: str) -> int:
        return len(self._request(request_id).tokens)

    def ref_count(self, block_id: int) -> int:
        return self._block(block_id).ref_count

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash a block is cached under, or None (never full, or evicted)."""
        return self._block(block_id).block_hash

    def cached_blocks(self) -> dict[bytes, tuple[int, ...]]:
        """A copy of the hash map: each hash with the blocks cached under it, the one a hit returns first."""
        return {h: tuple(holders) for h, holders in self._cached.items()}

    def lookup(self, tokens: Sequence[int], cache_salt: str | None = None) -> ProbeResult:
        """What ``tokens`` would hit as a new prompt; changes nothing and records no step.

        vLLM: ``KVCacheManager.get_computed_blocks`` (``find_longest_cache_hit``).
        """
        return self._probe(tokens, cache_salt)[0]

    def probe(self, tokens: Sequence[int], cache_salt: str | None = None) -> ProbeResult:
        """``lookup``, recorded as a step when the cache records: allocates and changes nothing."""
        result, hits = self._probe(tokens, cache_salt)
        if self.history is not None:
            event = Event.of("prefix_cache.probe", num_tokens=result.num_tokens,
                             num_cached_tokens=result.num_cached_tokens,
                             hit_block_ids=result.hit_block_ids)  # fmt: skip
            self._record(event, hits=hits)
        return result

    def _probe(self, tokens: Sequence[int], cache_salt: str | None) -> tuple[ProbeResult, list[Block]]:
        toks = check_token_ids("tokens", tokens)
        salt = _check_salt(cache_salt)
        hashes, _ = self._hash(self._none_hash, toks, salt, True)
        hits = self._lookup(hashes, len(toks))
        return ProbeResult(len(toks), len(hits) * self.block_size, tuple([b.block_id for b in hits])), hits

    # ------------------------------------------------------------------ operations

    def allocate(
        self, request_id: str, tokens: Sequence[int], cache_salt: str | None = None
    ) -> AllocationResult:
        """Admit a new request: reuse its cached prefix, allocate blocks for the rest, cache full blocks.

        Raises OutOfBlocksError, having changed nothing, when the free queue
        cannot supply the new blocks plus the free blocks the hit takes out of it.
        """
        request_id = self._check_new_id(request_id)
        toks = check_token_ids("tokens", tokens)
        salt = _check_salt(cache_salt)
        bs = self.block_size
        hashes, keys = self._hash(self._none_hash, toks, salt, True)
        hits = self._lookup(hashes, len(toks))
        num_hits = len(hits)
        num_new = cdiv(len(toks), bs) - num_hits
        num_free_hits = 0
        for block in hits:
            if block.ref_count == 0:
                num_free_hits += 1
        if num_new + num_free_hits > len(self._queue):
            held = f" plus the {num_free_hits} free cached blocks it hits" if num_free_hits else ""
            raise OutOfBlocksError(
                f"cannot allocate request {request_id!r}: it needs {num_new} new blocks{held}, "
                f"but only {len(self._queue)} blocks are free; free a request or use a larger pool"
            )
        self._touch(hits)
        new, evicted, evicted_hashes = self._take(num_new)
        at = num_hits * bs
        for block in new:
            block.source = toks
            block.start = at
            at += bs
            block.stop = at
        hit_ids = [b.block_id for b in hits]
        new_ids = [b.block_id for b in new]
        ids = hit_ids + new_ids
        self._cache_blocks(new, hashes, keys, num_hits)
        last = hashes[-1] if hashes else None
        self._requests[request_id] = _Request(toks, ids, len(hashes), last, salt)
        result = AllocationResult(
            request_id, len(toks), len(toks), num_hits * bs, tuple(hit_ids), tuple(new_ids), tuple(evicted),
            tuple(evicted_hashes), BlockTableView(ids, len(ids)),
        )  # fmt: skip
        if self.history is not None:
            self._record(self._event("allocate", result), hits=hits, new=new, evicted=self._by_id(evicted))
        return result

    def append(self, request_id: str, tokens: Sequence[int]) -> AllocationResult:
        """Append decoded ``tokens`` to a running request; blocks that become full are cached at once.

        Costs what the tokens add (their blocks and hashes), not the length of the request.
        Raises OutOfBlocksError, having changed nothing, when the pool cannot
        supply the blocks the new tokens need.
        """
        req = self._request(request_id)
        request_id = str.__str__(request_id)
        toks = check_token_ids("tokens", tokens)
        bs = self.block_size
        start = len(req.tokens)
        total = start + len(toks)
        num_new = cdiv(total, bs) - len(req.ids)
        if num_new > len(self._queue):
            raise OutOfBlocksError(
                f"cannot append {len(toks)} tokens to request {request_id!r}: they need {num_new} new blocks, "
                f"but only {len(self._queue)} are free; free a request or use a larger pool"
            )
        new, evicted, evicted_hashes = self._take(num_new)
        req_tokens = req.tokens
        req_tokens.extend(toks)  # the last block, if partial, reads its new tokens from here
        ids = req.ids
        at = len(ids) * bs
        for block in new:
            block.source = req_tokens
            block.start = at
            at += bs
            block.stop = at
        new_ids = [b.block_id for b in new]
        ids.extend(new_ids)
        done, full = req.num_hashed, total // bs
        if full > done:
            parent = self._none_hash if req.last_hash is None else req.last_hash
            hashes, keys = self._hash(parent, req_tokens[done * bs : full * bs], req.salt, done == 0)
            self._cache_blocks([self._blocks[i] for i in ids[done:full]], hashes, keys, 0)
            req.num_hashed = full
            req.last_hash = hashes[-1]
        ids = req.ids
        result = AllocationResult(
            request_id, total, len(toks), 0, (), tuple(new_ids), tuple(evicted), tuple(evicted_hashes),
            BlockTableView(ids, len(ids)),
        )  # fmt: skip
        if self.history is not None:
            self._record(self._event("append", result), new=new, evicted=self._by_id(evicted))
        return result

    def free(self, request_id: str) -> FreeResult:
        """Finish a request: release its blocks in reverse table order (hashed to the back, others to the front)."""
        req = self._request(request_id)
        request_id = str.__str__(request_id)
        del self._requests[request_id]
        unhashed: list[Block] = []
        hashed: list[Block] = []
        blocks = self._blocks
        for block_id in reversed(req.ids):  # a table never holds one block twice
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                (unhashed if block.block_hash is None else hashed).append(block)
        self._queue._prepend_n(unhashed)
        self._queue._append_n(hashed)
        to_front = [b.block_id for b in unhashed]
        to_back = [b.block_id for b in hashed]
        result = FreeResult(request_id, tuple(req.ids), tuple(to_front + to_back))
        if self.history is not None:
            event = Event.of("prefix_cache.free", request_id=request_id, block_table=result.block_table,
                             to_front=tuple(to_front), to_back=tuple(to_back))  # fmt: skip
            self._record(event)
        return result

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> BlockPoolState:
        """The whole state as an immutable ``BlockPoolState`` (block hashes shown as short hex)."""
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
                block_hash=None if b.block_hash is None else hashing.short(b.block_hash),
                ever_used=b.ever_used,
                is_null=b.is_null,
            )
            for b in self._blocks
        )
        return BlockPoolState(
            block_size=self.block_size,
            blocks=blocks,
            tables=tuple((rid, tuple(r.ids)) for rid, r in self._requests.items()),
            token_counts=tuple((rid, len(r.tokens)) for rid, r in self._requests.items()),
            free_queue=tuple(self.free_queue()),
            null_block=self.null_block,
            hit_block_ids=tuple(b.block_id for b in hits),
            new_block_ids=tuple(b.block_id for b in new),
            evicted_block_ids=tuple(b.block_id for b in evicted),
        )

    # ------------------------------------------------------------------ internals

    def _lookup(self, hashes: list[bytes], num_tokens: int) -> list[Block]:
        """The longest run of cached blocks from the start, capped so the last prompt token is computed."""
        hits: list[Block] = []
        add = hits.append
        cached = self._cached
        for i in range(min(len(hashes), (num_tokens - 1) // self.block_size)):
            holders = cached.get(hashes[i])
            if holders is None:  # a hash whose last block was evicted leaves the map
                break
            for block in holders.values():  # the oldest block cached under the hash
                add(block)
                break
        return hits

    def _touch(self, hits: list[Block]) -> None:
        for block in hits:
            if block.ref_count == 0:
                self._queue.remove(block)
            block.ref_count += 1

    def _take(self, n: int) -> tuple[list[Block], list[int], list[bytes]]:
        """Pop ``n`` blocks from the front; evict the cached content of those that had a hash.

        Returns the blocks, then the ids and hashes of the evicted ones, in the order they were taken.
        """
        new = self._queue._popleft_n(n)
        evicted: list[int] = []
        evicted_hashes: list[bytes] = []
        cached = self._cached
        for block in new:
            h = block.block_hash
            if h is not None:
                holders = cached[h]
                del holders[block.block_id]
                if not holders:
                    del cached[h]
                    del self._known[self._key_of.pop(h)]
                block.block_hash = None
                evicted.append(block.block_id)
                evicted_hashes.append(h)
            block.ref_count = 1
            block.ever_used = True
        return new, evicted, evicted_hashes

    def _hash(
        self, parent: bytes, tokens: list[int], salt: str | None, first: bool
    ) -> tuple[list[bytes], list[tuple]]:
        """The chained hashes of ``tokens``' full blocks (and their keys), reusing those of cached blocks."""
        return hashing._chain_known(
            parent, tokens, self.block_size, salt, self.hash_scheme, first, self._known
        )

    def _cache_blocks(self, blocks: list[Block], hashes: list[bytes], keys: list[tuple], start: int) -> None:
        """Cache full blocks: ``blocks[i - start]`` under ``hashes[i]`` (key ``keys[i]``) for every ``i`` from ``start``."""
        cached = self._cached
        for i in range(start, len(hashes)):
            block = blocks[i - start]
            h = hashes[i]
            block.block_hash = h
            holders = cached.get(h)
            if holders is None:
                cached[h] = {block.block_id: block}
                self._known[keys[i]] = h
                self._key_of[h] = keys[i]
            else:
                holders[block.block_id] = block  # no de-duplication, as in vLLM

    def _by_id(self, block_ids: list[int]) -> list[Block]:
        return [self._blocks[i] for i in block_ids]

    @staticmethod
    def _event(op: str, result: AllocationResult) -> Event:
        """The event of an allocate or append; built only while recording."""
        return Event.of(
            f"prefix_cache.{op}",
            request_id=result.request_id,
            num_tokens=result.num_tokens,
            num_new_tokens=result.num_new_tokens,
            num_cached_tokens=result.num_cached_tokens,
            hit_block_ids=result.hit_block_ids,
            new_block_ids=result.new_block_ids,
            evicted=result.evicted,
            evicted_hashes=tuple(hashing.short(h) for h in result.evicted_hashes),
        )

    def _record(
        self,
        event: Event,
        *,
        hits: Sequence[Block] = (),
        new: Sequence[Block] = (),
        evicted: Sequence[Block] = (),
    ) -> None:
        assert self.history is not None  # callers build the event only while recording
        self.history.add(event, self._snapshot(hits, new, evicted))

    def _request(self, request_id: object) -> _Request:
        if not isinstance(request_id, str):
            raise InvalidArgumentError(
                f"request id must be a string, got {brief(request_id)} ({type(request_id).__name__})"
            )
        request_id = str.__str__(request_id)
        req = self._requests.get(request_id)
        if req is None:
            names = list(self._requests)
            live = ", ".join(map(repr, names[:8])) + (", ..." if len(names) > 8 else "") or "none"
            raise UnknownRequestError(
                f"unknown request {request_id!r} (already freed, or never allocated); live: {live}"
            )
        return req

    def _check_new_id(self, request_id: object) -> str:
        request_id = check_id("request id", request_id)
        if request_id in self._requests:
            raise DuplicateRequestError(
                f"request {request_id!r} already holds blocks; free it first or pick a new id"
            )
        return request_id

    def _block(self, block_id: object) -> Block:
        block_id = check_int("block_id", block_id, minimum=0)
        if block_id >= len(self._blocks):
            raise InvalidArgumentError(
                f"block_id {block_id} is out of range: the pool has {len(self._blocks)} blocks"
            )
        return self._blocks[block_id]


# ---------------------------------------------------------------------- validation helpers


def _check_salt(salt: object) -> str | None:
    # vLLM's API rejects an empty cache_salt, and treats a missing one as no salt.
    if salt is None:
        return None
    salt = check_optional_str("cache_salt", salt, allow_empty=False)
    return None if salt is None else hashing.check_salt(salt)
