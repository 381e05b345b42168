"""vLLM's free block queue: a doubly linked list threaded through the blocks themselves.

vLLM names (``vllm/v1/core/kv_cache_utils.py``): ``Block`` is ``KVCacheBlock``
(``block_id``, ``ref_cnt`` -> ``ref_count``, ``block_hash``, ``is_null``,
``prev_free_block``/``next_free_block`` -> ``prev_free``/``next_free``);
``FreeBlockQueue`` is ``FreeKVCacheBlockQueue`` (same method names:
``popleft_n``, ``remove``, ``append_n``, ``prepend_n``; vLLM's
``get_all_free_blocks`` is iterating the queue). ``tokens`` and ``ever_used``
are kvlab's own, kept for the pictures: a block reads its tokens from the token
list of the request that wrote it (``source[start:stop]``, the list only ever
grows), so filling a block copies nothing.

The invariant: a block is in the queue exactly when its ``prev_free`` is set,
and the queue's order is the order blocks are handed out (front first), which
is also the order cached content is evicted. Links live in the blocks, so a
cache hit on a free block leaves the queue from the middle in O(1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvlab.errors import InvalidArgumentError, brief, check_int


class Block:
    """One physical block's metadata; ``prev_free``/``next_free`` link it into the free queue."""

    __slots__ = (
        "block_id",
        "ref_count",
        "block_hash",
        "source",
        "start",
        "stop",
        "ever_used",
        "is_null",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = check_int("block_id", block_id, minimum=-1)  # -1: the queue's sentinels
        self.ref_count = 0
        self.block_hash: bytes | None = None
        self.source: Sequence[int] = ()  # the writing request's tokens; the block holds source[start:stop]
        self.start = 0
        self.stop = 0
        self.ever_used = False
        self.is_null = False
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    @property
    def tokens(self) -> list[int]:
        """The token ids written into this block so far (a copy)."""
        return list(self.source[self.start : self.stop])

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_count={self.ref_count}, hashed={self.block_hash is not None})"


class FreeBlockQueue:
    """Free blocks in hand-out order, as a doubly linked list between two sentinels.

    Every operation touches only the blocks it moves: ``remove`` of a block in
    the middle (a cache hit on a free block) is O(1), which a Python list or
    deque cannot do.
    """

    def __init__(self, blocks: Sequence[Block]) -> None:
        if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__len__"):
            raise InvalidArgumentError(f"blocks must be a list of Block, got {type(blocks).__name__}")
        try:
            blocks = list(blocks)
        except Exception:  # a 0-d array, a sequence whose iteration raises
            raise InvalidArgumentError(
                f"blocks must be a list of Block, got {type(blocks).__name__}"
            ) from None
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
        return isinstance(block, Block) and block.prev_free is not None

    def popleft_n(self, n: int) -> list[Block]:
        """Take ``n`` blocks from the front; more than the queue holds is refused, taking none."""
        return self._popleft_n(check_int("n", n, minimum=0, maximum=self._len))

    def remove(self, block: Block) -> None:
        """Unlink ``block`` from wherever it is in the queue; a block not in the queue is refused."""
        if not isinstance(block, Block) or block.prev_free is None or block.next_free is None:
            raise InvalidArgumentError(f"{brief(block)} is not a block in the free queue")
        prev, nxt = block.prev_free, block.next_free
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def append_n(self, blocks: Sequence[Block]) -> None:
        """Put ``blocks`` at the back, in the given order."""
        self._link_after(self._tail.prev_free, self._checked(blocks))

    def prepend_n(self, blocks: Sequence[Block]) -> None:
        """Put ``blocks`` at the front, in the given order (``blocks[0]`` becomes the front)."""
        self._link_after(self._head, self._checked(blocks))

    # The cache's own calls, on blocks it knows are outside the queue (``PrefixCache`` checks its
    # arguments once, at its public methods); a subclass that keeps the queue otherwise overrides these.

    def _popleft_n(self, n: int) -> list[Block]:
        """``popleft_n`` of an ``n`` known to be 0..len(self)."""
        out: list[Block] = []
        add = out.append
        node, tail = self._head.next_free, self._tail
        for _ in range(n):
            assert node is not None and node is not tail, "free queue underflow"
            add(node)
            nxt = node.next_free
            node.prev_free = node.next_free = None
            node = nxt
        assert node is not None
        self._head.next_free = node
        node.prev_free = self._head
        self._len -= n
        return out

    def _append_n(self, blocks: list[Block]) -> None:
        """``append_n`` of blocks known to be outside the queue, each once."""
        self._link_after(self._tail.prev_free, blocks)

    def _prepend_n(self, blocks: list[Block]) -> None:
        """``prepend_n`` of blocks known to be outside the queue, each once."""
        self._link_after(self._head, blocks)

    @staticmethod
    def _checked(blocks: object) -> list[Block]:
        """``blocks`` as a list, if every one is a real ``Block`` outside the queue, each once; else refused."""
        if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
            raise InvalidArgumentError(f"blocks must be a list of Block, got {type(blocks).__name__}")
        blocks = list(blocks)  # type: ignore[call-overload]
        ids = set()
        for b in blocks:
            if not isinstance(b, Block) or b.prev_free is not None or b.block_id < 0 or id(b) in ids:
                raise InvalidArgumentError(
                    f"{brief(b)} is not a block outside the free queue; nothing was linked"
                )
            ids.add(id(b))
        return blocks

    def _link_after(self, anchor: Block | None, blocks: list[Block]) -> None:
        """Link ``blocks`` after ``anchor``, in order."""
        if not blocks:
            return
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
