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
table) nor anything for the history unless recording. Arguments are checked once, at the
public methods (a prompt's token ids in C-level passes; the ids its hit blocks cover equal
cached ids, so only the rest get a range check); the internals trust them. Blocks are
cached under their key (parent hash, tokens, extra keys: what vLLM's ``hash_block_tokens``
pickles), so a prompt block already cached is found by one dictionary lookup and never
hashed again, and only new blocks cost a pickle and a SHA-256; the digests are the ones
vLLM's chain computes. A full block reads its tokens from its key's tuple, so a freed
request's token list does not outlive it.

Kept as one module (over 500 lines with its docstring): the cache's rules
(lookup, touch, take-and-evict, cache, free) share one state and only make
sense together.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from kvlab.core import hashing
from kvlab.core.hashing import _blocks, _exact_ints, _ids_in_range, check_token_ids
from kvlab.core.snapshots import BlockPoolState, BlockState, Event, History
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownRequestError,
    brief,
    check_bool,
    check_choice,
    check_id,
    check_int,
    check_optional_str,
    check_size,
    check_tokens,
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
        self, tokens: list[int], ids: list[int], num_hashed: int, last_hash: bytes, salt: str | None
    ) -> None:
        self.tokens = tokens  # only grows: its blocks read their tokens from it
        self.ids = ids  # the block table; append-only, as in vLLM, so results hold views of it
        self.num_hashed = num_hashed  # every full block is hashed and cached; the chain goes on from
        self.last_hash = last_hash  # the last one's hash (the scheme's none hash before block 0)
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
        # blocks are cached under their key (parent hash, tokens, extra keys: hashing.key_digester), so a
        # prompt block already cached is found by one lookup and never hashed again, with the same digest;
        # a key holds one block, or (vLLM's BlockHashToBlockMap) a dict of them by id, oldest first
        self._cached: dict[tuple, Block | dict[int, Block]] = {}
        self._keys: list[tuple | None] = [None] * num_blocks  # each cached block's key
        self._digest = hashing.key_digester(hash_scheme, block_size)
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
        out: dict[bytes, tuple[int, ...]] = {}
        for entry in self._cached.values():
            if type(entry) is Block:
                out[entry.block_hash] = (entry.block_id,)  # type: ignore[index]
            else:
                out[_oldest(entry).block_hash] = tuple(entry)  # type: ignore[arg-type,index]
        return out

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
        toks, in_range = _prompt_ids(tokens)
        salt = None if cache_salt is None else _check_salt(cache_salt)
        bs = self.block_size
        hits = self._hits(islice(_blocks(toks, bs), (len(toks) - 1) // bs), salt)[0]
        _check_uncached_ids(toks, in_range, len(hits) * bs)
        return ProbeResult(len(toks), len(hits) * bs, tuple([b.block_id for b in hits])), hits

    # ------------------------------------------------------------------ operations

    def allocate(
        self, request_id: str, tokens: Sequence[int], cache_salt: str | None = None
    ) -> AllocationResult:
        """Admit a new request: reuse its cached prefix, allocate blocks for the rest, cache full blocks.

        Raises OutOfBlocksError, having changed nothing, when the free queue
        cannot supply the new blocks plus the free blocks the hit takes out of it.
        """
        if type(request_id) is not str or not request_id or request_id in self._requests:
            request_id = self._check_new_id(request_id)
        toks, in_range = _prompt_ids(tokens)
        salt = None if cache_salt is None else _check_salt(cache_salt)
        bs = self.block_size
        num_tokens = len(toks)
        blocks = list(_blocks(toks, bs))  # the full blocks, as tuples
        hits, parent, num_free_hits = self._hits(islice(blocks, (num_tokens - 1) // bs), salt)
        num_hits = len(hits)
        _check_uncached_ids(toks, in_range, num_hits * bs)
        num_new = -(-num_tokens // bs) - num_hits
        queue = self._queue
        if num_new + num_free_hits > len(queue):
            held = f" plus the {num_free_hits} free cached blocks it hits" if num_free_hits else ""
            raise OutOfBlocksError(
                f"cannot allocate request {request_id!r}: it needs {num_new} new blocks{held}, "
                f"but only {len(queue)} blocks are free; free a request or use a larger pool"
            )
        for block in hits:  # touch: a free hit leaves the queue
            if block.ref_count == 0:
                queue.remove(block)
            block.ref_count += 1
        new, new_ids, evicted, evicted_hashes = self._take(num_new, toks, num_hits * bs)
        hit_ids = [b.block_id for b in hits]
        ids = hit_ids + new_ids
        last = self._cache_full(parent, new, blocks[num_hits:], salt, not hits)
        self._requests[request_id] = _Request(toks, ids, len(blocks), last, salt)
        result = AllocationResult(
            request_id, num_tokens, num_tokens, num_hits * bs, tuple(hit_ids), tuple(new_ids), evicted,
            evicted_hashes, BlockTableView(ids, len(ids)),
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
        req = self._requests.get(request_id) if type(request_id) is str else None
        if req is None:
            req = self._request(request_id)
            request_id = str.__str__(request_id)
        toks = check_token_ids("tokens", tokens)
        bs = self.block_size
        req_tokens = req.tokens
        total = len(req_tokens) + len(toks)
        ids = req.ids
        num_new = -(-total // bs) - len(ids)
        if num_new > len(self._queue):
            raise OutOfBlocksError(
                f"cannot append {len(toks)} tokens to request {request_id!r}: they need {num_new} new blocks, "
                f"but only {len(self._queue)} are free; free a request or use a larger pool"
            )
        new, new_ids, evicted, evicted_hashes = self._take(num_new, req_tokens, len(ids) * bs)
        req_tokens.extend(toks)  # the last block, if partial, reads its new tokens from here
        ids.extend(new_ids)
        done, full = req.num_hashed, total // bs
        if full > done:
            blocks = self._blocks
            req.last_hash = self._cache_full(
                req.last_hash, [blocks[i] for i in ids[done:full]],
                _blocks(req_tokens[done * bs : full * bs], bs), req.salt, done == 0,
            )  # fmt: skip
            req.num_hashed = full
        result = AllocationResult(
            request_id, total, len(toks), 0, (), tuple(new_ids), evicted, evicted_hashes,
            BlockTableView(ids, len(ids)),
        )  # fmt: skip
        if self.history is not None:
            self._record(self._event("append", result), new=new, evicted=self._by_id(evicted))
        return result

    def free(self, request_id: str) -> FreeResult:
        """Finish a request: release its blocks in reverse table order (hashed to the back, others to the front)."""
        req = self._requests.get(request_id) if type(request_id) is str else None
        if req is None:
            req = self._request(request_id)
            request_id = str.__str__(request_id)
        del self._requests[request_id]
        unhashed: list[Block] = []  # the partial last block: to the front, it can never be hit
        hashed: list[Block] = []  # to the back, tail first, so a chain's head is evicted last
        to_front, to_back = unhashed.append, hashed.append
        blocks = self._blocks
        ids = req.ids
        for block_id in reversed(ids):  # a table never holds one block twice
            block = blocks[block_id]
            left = block.ref_count - 1
            block.ref_count = left
            if not left:
                if block.block_hash is None:
                    to_front(block)
                else:
                    to_back(block)
        self._queue._prepend_n(unhashed)
        self._queue._append_n(hashed)
        result = FreeResult(request_id, tuple(ids), tuple([b.block_id for b in unhashed + hashed]))
        if self.history is not None:
            front = result.released[: len(unhashed)]
            event = Event.of("prefix_cache.free", request_id=request_id, block_table=result.block_table,
                             to_front=front, to_back=result.released[len(unhashed) :])  # fmt: skip
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

    def _hits(self, blocks: Iterable[tuple[int, ...]], salt: str | None) -> tuple[list[Block], bytes, int]:
        """The cached run of a prompt's first full ``blocks``: the oldest block under each, stopping at a miss.

        Returns the hit blocks, the last one's hash (the chain goes on from it) and how
        many hits are free (taking them out of the queue uses up free capacity). Blocks
        are found by key, so a hit costs one lookup and no SHA-256.
        """
        get = self._cached.get
        parent = self._none_hash
        extra, later = hashing.block_key_extra(salt, self.hash_scheme, True)
        hits: list[Block] = []
        add = hits.append
        num_free = 0
        for block in blocks:
            oldest = get((parent, block, extra))
            if oldest is None:  # a key whose last block was evicted leaves the map
                break
            if type(oldest) is not Block:
                oldest = _oldest(oldest)  # type: ignore[arg-type]
            add(oldest)  # type: ignore[arg-type]
            if oldest.ref_count == 0:  # type: ignore[union-attr]
                num_free += 1
            parent = oldest.block_hash  # type: ignore[assignment,union-attr]
            extra = later
        return hits, parent, num_free

    def _take(
        self, n: int, source: list[int], start: int
    ) -> tuple[list[Block], list[int], tuple[int, ...], tuple[bytes, ...]]:
        """Pop ``n`` blocks from the front for the tokens ``source[start:]``; evict the content of those with a hash.

        Returns the blocks and their ids, then the ids and hashes of the evicted ones, in
        the order they were taken. Block ``i`` reads its tokens from ``source``, block ``i``
        of the tokens from ``start`` on (the list only grows, so nothing is copied).
        """
        if not n:
            return [], [], (), ()
        new = self._queue._popleft_n(n)
        new_ids: list[int] = []
        evicted: list[int] = []
        evicted_hashes: list[bytes] = []
        cached, keys_of = self._cached, self._keys
        bs = self.block_size
        for block in new:
            block_id = block.block_id
            h = block.block_hash
            if h is not None:
                key = keys_of[block_id]
                entry = cached[key]  # type: ignore[index]
                if type(entry) is Block:
                    del cached[key]  # type: ignore[arg-type]
                else:
                    del entry[block_id]  # type: ignore[union-attr]
                    if not entry:
                        del cached[key]  # type: ignore[arg-type]
                keys_of[block_id] = None
                block.block_hash = None
                evicted.append(block_id)
                evicted_hashes.append(h)
            block.ref_count = 1
            block.ever_used = True
            block.source = source
            block.start = start
            start += bs
            block.stop = start
            new_ids.append(block_id)
        return new, new_ids, tuple(evicted), tuple(evicted_hashes)

    def _cache_full(
        self, parent: bytes, blocks: Sequence[Block], token_blocks: Iterable[tuple[int, ...]],
        salt: str | None, first: bool,
    ) -> bytes:  # fmt: skip
        """Hash and cache the full blocks among ``blocks`` (``blocks[i]`` holds ``token_blocks[i]``), chained from ``parent``.

        ``first``: the blocks start at block 0. Returns the last full block's hash (``parent``
        when none is full). Each block is looked up and cached under its key in one step: a
        key that is new gets its digest, one cached already gives the digest of the blocks
        under it (vLLM keeps every copy: no de-duplication). A full block then reads its tokens
        from its key's tuple, so a request's token list lives only as long as the request and
        its partial last block.
        """
        cached, keys_of, digest_of, bs = self._cached, self._keys, self._digest, self.block_size
        setdefault = cached.setdefault
        extra, later = hashing.block_key_extra(salt, self.hash_scheme, first)
        for block, tokens in zip(blocks, token_blocks):  # noqa: B905 (blocks may end with a partial one)
            key = (parent, tokens, extra)
            entry = setdefault(key, block)
            if entry is block:
                parent = digest_of(key)
            elif type(entry) is Block:
                parent = entry.block_hash  # type: ignore[assignment]
                cached[key] = {entry.block_id: entry, block.block_id: block}
            else:
                parent = _oldest(entry).block_hash  # type: ignore[arg-type,assignment]
                entry[block.block_id] = block  # type: ignore[index]
            block.block_hash = parent
            block.source = tokens  # a full block reads its tokens from its key: the request's list can go
            block.start = 0
            block.stop = bs
            keys_of[block.block_id] = key
            extra = later
        return parent

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


def _prompt_ids(tokens: object) -> tuple[list[int], bool]:
    """A prompt's ids as a new list, and whether their range is checked yet.

    A list or tuple of exact ints is copied with its range unchecked: the ids its hit blocks
    cover equal a cached block's ids (exact ints on both sides, so ``==`` is plain value
    equality and runs no item's code), so only the rest needs ``_ids_in_range``, checked
    before anything changes. Anything else goes through ``check_tokens``, which converts what
    it accepts and says what is wrong with what it refuses.
    """
    if _exact_ints(tokens):
        return list(tokens), False  # type: ignore[call-overload]
    return check_tokens("tokens", tokens), True


def _check_uncached_ids(tokens: list[int], in_range: bool, start: int) -> None:
    """Refuse ``tokens`` (``_prompt_ids``' list) when an id past the first ``start``, which cache hits vouch for, is out of range."""
    if not in_range and not _ids_in_range(tokens, start):
        check_tokens("tokens", tokens)  # raises, naming the id out of range


def _oldest(holders: dict[int, Block]) -> Block:
    """The block a lookup returns among those cached under one key: the oldest (first inserted)."""
    for block in holders.values():
        return block
    raise AssertionError("an entry of the map is never empty")


# ---------------------------------------------------------------------- validation helpers


def _check_salt(salt: object) -> str | None:
    # vLLM's API rejects an empty cache_salt, and treats a missing one as no salt.
    if salt is None:
        return None
    salt = check_optional_str("cache_salt", salt, allow_empty=False)
    return None if salt is None else hashing.check_salt(salt)
