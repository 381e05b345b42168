"""Lesson example 4: a 40-token prompt forked into three samples; each writes one token at position 40.

The fork shares blocks [0, 1, 2] three ways; samples 0 and 1 copy the partial
block 2 (8 entries) to blocks 3 and 4, sample 2 writes in place: 5 blocks
instead of 9 (the lesson's figures; ``tests/test_paged.py`` pins them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import cdiv, check_size
from kvlab.models.paged import AppendResult, BlockPool


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
    """Fork a prompt into ``n`` samples and let each write its first generated token (copy-on-write).

    ``prompt_len`` is at most ``LIMITS.tokens``, ``n`` at most ``LIMITS.slots`` (parallel samples of
    one request), ``block_size`` at most ``LIMITS.block_size``; the pool they need is bounded by
    ``LIMITS.num_blocks`` as every ``BlockPool`` is.
    """
    prompt_len = check_size("prompt_len", prompt_len, "tokens", minimum=1)
    n = check_size("n", n, "slots", minimum=1)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    prompt_blocks = cdiv(prompt_len, block_size)
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
