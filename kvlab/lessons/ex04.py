"""Lesson example 4: a 40-token prompt forked into three samples; each writes one token at position 40.

The fork shares blocks [0, 1, 2] three ways; samples 0 and 1 copy the partial
block 2 (8 entries) to blocks 3 and 4, sample 2 writes in place: 5 blocks
instead of 9 (the lesson's figures; ``tests/test_paged.py`` pins them). ``fork_rows`` and
``write_rows`` line kvlab's figures up with the lesson's, for ``compare_table``.

``child_requests`` takes vLLM's route to the same sharing (vLLM 0.30.0 as the lesson describes it,
and 0.33.0, which kvlab's ``PrefixCache`` is checked against): ``n`` child requests of one prompt,
each allocated in a prefix cache, so the later children hit the first one's full blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import LIMITS, InvalidArgumentError, cdiv, check_size
from kvlab.models.paged import AllocationResult, AppendResult, BlockPool
from kvlab.models.prefix_cache import PrefixCache

PROMPT_START = 1000  # the prompt's token ids are 1000, 1001, ...

LESSON_AFTER_FORK = {
    "tables after the fork": [[0, 1, 2], [0, 1, 2], [0, 1, 2]],
    "ref counts after the fork": {0: 3, 1: 3, 2: 3},
}
"""The state after the fork, as the lesson's program printed it."""

LESSON_WRITES = ("copy 2 -> 3, 8 entries", "copy 2 -> 4, 8 entries", "in place")
"""What each sample's first write did, in the words of ``describe_write``, as the lesson printed it."""

LESSON_AFTER_WRITES = {
    "final tables": [[0, 1, 3], [0, 1, 4], [0, 1, 2]],
    "final ref counts": {0: 3, 1: 3, 2: 1, 3: 1, 4: 1},
    "blocks in use": 5,
    "blocks for three private copies": 9,
}
"""The state after the three writes, as the lesson's program printed it."""


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
    prompt_len: int = 0  # each sample's first generated token goes to this position


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
        pool.num_used_blocks, n * prompt_blocks, pool.history, prompt_len,
    )  # fmt: skip


def example_4() -> Example4:
    """Lesson example 4: a 40-token prompt, n = 3, 16-token blocks."""
    return parallel_sampling(40, 3, block_size=16)


def _check_example(lesson: object) -> Example4:
    if not isinstance(lesson, Example4):
        raise InvalidArgumentError(f"expected the result of parallel_sampling, got {type(lesson).__name__}")
    return lesson


def describe_write(write: AppendResult) -> str:
    """A write in a few words: ``"in place"``, or which block was copied where and how many entries."""
    if not isinstance(write, AppendResult):
        raise InvalidArgumentError(
            f"expected an AppendResult from BlockPool.append, got {type(write).__name__}"
        )
    if write.copy is None:
        return "in place"
    return f"copy {write.copy.source} -> {write.copy.target}, {write.copy.num_tokens} entries"


def fork_rows(lesson: Example4) -> list[tuple[str, object, object]]:
    """The tables and counts after the fork, kvlab's beside the lesson's."""
    lesson = _check_example(lesson)
    ours = {
        "tables after the fork": [list(t) for t in lesson.tables_after_fork],
        "ref counts after the fork": lesson.ref_counts_after_fork,
    }
    return [(what, ours[what], figure) for what, figure in LESSON_AFTER_FORK.items()]


def write_rows(lesson: Example4) -> list[tuple[str, object, object]]:
    """What each sample's first write did and the state after all of them, kvlab's beside the lesson's."""
    lesson = _check_example(lesson)
    writes = [
        (f"{w.request_id} writes position {lesson.prompt_len}", describe_write(w), figure)
        for w, figure in zip(lesson.writes, LESSON_WRITES, strict=False)
    ]
    ours = {
        "final tables": [list(t) for t in lesson.tables],
        "final ref counts": lesson.ref_counts,
        "blocks in use": lesson.blocks_used,
        "blocks for three private copies": lesson.blocks_without_sharing,
    }
    return writes + [(what, ours[what], figure) for what, figure in LESSON_AFTER_WRITES.items()]


@dataclass(frozen=True)
class ChildRequests:
    """vLLM's route to parallel sampling: ``n`` child requests of one prompt in a prefix cache."""

    children: tuple[AllocationResult, ...]
    ref_counts: dict[int, int]  # every block in use and its count
    blocks_in_use: int
    log: tuple[str, ...]  # one line per child: its table, tokens reused and computed


def child_requests(prompt_len: int = 40, n: int = 3, *, block_size: int = 16) -> ChildRequests:
    """Allocate the same ``prompt_len``-token prompt for ``n`` child requests in a ``PrefixCache``.

    The bounds are those of ``parallel_sampling``, and ``n × prompt_len`` at most
    ``LIMITS.total_tokens``. As in vLLM, each child is a request of its own:
    the first computes the whole prompt, the others hit its full blocks and compute the partial
    last block again, where the lesson's samples copied it.
    """
    prompt_len = check_size("prompt_len", prompt_len, "tokens", minimum=1)
    n = check_size("n", n, "slots", minimum=1)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    if n * prompt_len > LIMITS.total_tokens:
        raise InvalidArgumentError(
            f"n × prompt_len = {n * prompt_len:,} tokens is more than kvlab admits in one cache "
            f"({LIMITS.total_tokens:,}, LIMITS.total_tokens); lower n or prompt_len"
        )
    cache = PrefixCache(n * cdiv(prompt_len, block_size), block_size)
    prompt = list(range(PROMPT_START, PROMPT_START + prompt_len))
    children = tuple(cache.allocate(f"child {i}", prompt) for i in range(n))
    counts = {b: cache.ref_count(b) for b in range(cache.num_blocks) if cache.ref_count(b)}
    log = tuple(
        f"{c.request_id}: table {list(c.block_table)}, reused {c.num_cached_tokens} tokens, "
        f"computed {c.num_computed_tokens}"
        for c in children
    )
    return ChildRequests(children, counts, cache.num_blocks - cache.num_free_blocks, log)


def child_request_rows(route: ChildRequests) -> list[tuple[str, object, object]]:
    """The counts and blocks of vLLM's route beside the lesson's copy-on-write result."""
    if not isinstance(route, ChildRequests):
        raise InvalidArgumentError(f"expected the result of child_requests, got {type(route).__name__}")
    return [
        ("ref counts", route.ref_counts, LESSON_AFTER_WRITES["final ref counts"]),
        ("blocks in use", route.blocks_in_use, LESSON_AFTER_WRITES["blocks in use"]),
    ]
