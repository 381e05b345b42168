"""Lesson example 5: two requests with the same 70-token system prompt share its 4 full blocks.

Request 1 (70 + 20 tokens) takes blocks 0-5; request 2 (70 + 33) reuses blocks
0-3 (64 tokens) and computes 39: 9 blocks in use instead of 13 (the lesson's
figures; ``tests/test_paged.py`` pins them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import MAX_TOKEN_ID, InvalidArgumentError, cdiv, check_int, check_size, check_tokens
from kvlab.models.paged import AllocationResult, BlockPool

SYSTEM_PROMPT_START = 1000  # the system prompt's token ids are 1000, 1001, ...


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
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
        raise InvalidArgumentError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    prompts = [check_tokens(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
    if not prompts:
        raise InvalidArgumentError("prompts is empty: give at least one prompt")
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    without_sharing = sum(cdiv(len(p), block_size) for p in prompts)
    pool = BlockPool(without_sharing, block_size, share_prefixes=True, record=True)
    results = tuple(pool.allocate(f"request {i + 1}", p) for i, p in enumerate(prompts))
    assert pool.history is not None
    return Example5(results, pool.ref_counts, pool.num_used_blocks, without_sharing, pool.history)


def example_5() -> Example5:
    """Lesson example 5: a 70-token system prompt, then 20- and 33-token questions."""
    return shared_prefix(
        [system_prompt_request(70, 20, 5000), system_prompt_request(70, 33, 6000)], block_size=16
    )
