"""vLLM's free block queue: a doubly linked list threaded through the blocks themselves.

vLLM names (``vllm/v1/core/kv_cache_utils.py``): ``Block`` is ``KVCacheBlock``
(``block_id``, ``ref_cnt`` -> ``ref_count``, ``block_hash``, ``is_null``,
``prev_free_block``/``next_free_block`` -> ``prev_free``/``next_free``);
``FreeBlockQueue`` is ``FreeKVCacheBlockQueue`` (same method names:
``popleft_n``, ``remove``, ``append_n``, ``prepend_n``; vLLM's
``get_all_free_blocks`` is iterating the queue). ``tokens`` and ``ever_used``
are kvlab's own, kept for the pictures.

The invariant: a block is in the queue exactly when its ``prev_free`` is set,
and the queue's order is the order blocks are handed out (front first), which
is also the order cached content is evicted. Links live in the blocks, so a
cache hit on a free block leaves the queue from the middle in O(1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


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
