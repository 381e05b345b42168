"""Lesson example 5: two requests with the same 70-token system prompt share its 4 full blocks.

Request 1 (70 + 20 tokens) takes blocks 0-5; request 2 (70 + 33) reuses blocks
0-3 (64 tokens) and computes 39: 9 blocks in use instead of 13 (the lesson's
figures; ``tests/test_paged.py`` pins them). ``example_5_rows`` lines kvlab's figures up with the
lesson's (``LESSON_FIGURES``), for ``compare_table``; ``in_prefix_cache`` admits the same two
prompts into kvlab's vLLM-style ``PrefixCache`` (checked against vLLM 0.33.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import (
    LIMITS,
    MAX_TOKEN_ID,
    InvalidArgumentError,
    cdiv,
    check_int,
    check_items,
    check_size,
    check_tokens,
)
from kvlab.models.paged import AllocationResult, BlockPool
from kvlab.models.prefix_cache import PrefixCache

SYSTEM_PROMPT_START = 1000  # the system prompt's token ids are 1000, 1001, ...

LESSON_FIGURES = {
    "request 1 (90 tokens): block table": [0, 1, 2, 3, 4, 5],
    "request 1: tokens reused, computed": [0, 90],
    "request 2 (103 tokens): block table": [0, 1, 2, 3, 6, 7, 8],
    "request 2: tokens reused, computed": [64, 39],
    "blocks with ref count 2": [0, 1, 2, 3],
    "blocks with ref count 1": [4, 5, 6, 7, 8],
    "blocks in use": 9,
    "blocks without sharing": 13,
}
"""The figures the lesson's program printed, by the name of their row."""


@dataclass(frozen=True)
class Example5:
    """Two requests with the same system prompt and different questions."""

    requests: tuple[AllocationResult, ...]
    ref_counts: dict[int, int]
    blocks_in_use: int
    blocks_without_sharing: int
    history: History[BlockPoolState]


def system_prompt_request(system_len: int, question_len: int, question_start: int) -> list[int]:
    """Token ids of a request: system prompt 1000, 1001, ... then question ``question_start``, ...

    Lengths are at most ``LIMITS.tokens``; every id stays in 0..MAX_TOKEN_ID.
    """
    system_len = check_size("system_len", system_len, "tokens")
    question_len = check_size("question_len", question_len, "tokens")
    question_start = check_int(
        "question_start", question_start, minimum=0, maximum=MAX_TOKEN_ID + 1 - question_len
    )
    assert SYSTEM_PROMPT_START + system_len <= MAX_TOKEN_ID  # LIMITS.tokens is far below 2**31
    system = list(range(SYSTEM_PROMPT_START, SYSTEM_PROMPT_START + system_len))
    return system + list(range(question_start, question_start + question_len))


def shared_prefix(prompts: Sequence[Sequence[int]], *, block_size: int = 16) -> Example5:
    """Admit ``prompts`` in order into a pool that shares full-prefix blocks; nothing is freed."""
    items = check_items("prompts", prompts, what="a list of token-id lists")
    if not items:
        raise InvalidArgumentError("prompts is empty: give at least one prompt")
    prompts, total = [], 0
    for i, prompt in enumerate(items):
        prompts.append(check_tokens(f"prompts[{i}]", prompt))
        total += len(prompts[-1])
        if total > LIMITS.total_tokens:
            raise InvalidArgumentError(
                f"prompts hold more than {LIMITS.total_tokens:,} tokens in all (kvlab's limit "
                "LIMITS.total_tokens); for a deliberately larger run use kvlab.errors.raised_limits(total_tokens=...)"
            )
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    without_sharing = sum(cdiv(len(p), block_size) for p in prompts)
    pool = BlockPool(without_sharing, block_size, share_prefixes=True, record=True)
    results = tuple(pool.allocate(f"request {i + 1}", p) for i, p in enumerate(prompts))
    assert pool.history is not None
    return Example5(results, pool.ref_counts, pool.num_used_blocks, without_sharing, pool.history)


def example_5() -> Example5:
    """Lesson example 5: a 70-token system prompt, then 20- and 33-token questions."""
    return shared_prefix(lesson_prompts(), block_size=16)


def lesson_prompts() -> list[list[int]]:
    """The lesson's two prompts: the 70-token system prompt, then questions of 20 and 33 tokens."""
    return [system_prompt_request(70, 20, 5000), system_prompt_request(70, 33, 6000)]


def example_5_rows(lesson: Example5) -> list[tuple[str, object, object]]:
    """Both requests' tables, reuse and the pool's counts, kvlab's beside the lesson's."""
    if not isinstance(lesson, Example5) or len(lesson.requests) != 2:
        raise InvalidArgumentError(f"expected the result of example_5(), got {type(lesson).__name__}")
    first, second = lesson.requests
    counts = lesson.ref_counts
    ours = {
        "request 1 (90 tokens): block table": list(first.block_table),
        "request 1: tokens reused, computed": [first.num_cached_tokens, first.num_computed_tokens],
        "request 2 (103 tokens): block table": list(second.block_table),
        "request 2: tokens reused, computed": [second.num_cached_tokens, second.num_computed_tokens],
        "blocks with ref count 2": sorted(b for b, n in counts.items() if n == 2),
        "blocks with ref count 1": sorted(b for b, n in counts.items() if n == 1),
        "blocks in use": lesson.blocks_in_use,
        "blocks without sharing": lesson.blocks_without_sharing,
    }
    return [(what, ours[what], figure) for what, figure in LESSON_FIGURES.items()]


def in_prefix_cache(*, block_size: int = 16) -> tuple[AllocationResult, ...]:
    """The lesson's two prompts admitted in order into kvlab's vLLM-style ``PrefixCache``."""
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    prompts = lesson_prompts()
    cache = PrefixCache(sum(cdiv(len(p), block_size) for p in prompts), block_size)
    return tuple(cache.allocate(f"request {i + 1}", p) for i, p in enumerate(prompts))


def prefix_cache_rows(results: Sequence[AllocationResult]) -> list[tuple[str, object, object]]:
    """Request 2's reuse and table in the prefix cache, beside the lesson's figures."""
    shape = "the two AllocationResults of in_prefix_cache()"
    items = check_items("results", results, what=shape)
    if len(items) != 2 or not all(isinstance(r, AllocationResult) for r in items):
        raise InvalidArgumentError(f"results must be {shape}, got {len(items)} items")
    second = items[1]
    return [
        (
            "request 2: tokens reused, computed",
            [second.num_cached_tokens, second.num_computed_tokens],
            LESSON_FIGURES["request 2: tokens reused, computed"],
        ),
        (
            "request 2: block table",
            list(second.block_table),
            LESSON_FIGURES["request 2 (103 tokens): block table"],
        ),
    ]
