"""Exercises of notebook 06, hash chains (lesson example 6).

The expected answers come from ``kvlab.core.hashing`` and ``kvlab.models.prefix_cache``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.core.hashing import block_hashes
from kvlab.errors import brief
from kvlab.exercises.core import NotYet, all_whole, call, call_for_list, exercise
from kvlab.lessons.ex06 import LESSON_EXAMPLE_6_BASE
from kvlab.models.prefix_cache import PrefixCache

EDITED_POSITION = 6  # exercise 06.1: this token of the base sequence becomes 99


def _edited() -> list[int]:
    tokens = list(LESSON_EXAMPLE_6_BASE)
    tokens[EDITED_POSITION] = 99
    return tokens


@exercise(
    "06.1",
    title="Which hashes change?",
    assesses="predicting the effect of an edit on a hash chain: the block that holds it and every block after it",
    minutes=4,
    answer_type="list",
    points=1,
    difficulty="intro",
    prerequisites=["05.1"],
    hints=[
        "Token 6 is in block 6 // 4 = 1. Its hash covers its tokens, so it changes.",
        "Every later block's hash covers its parent's hash. Remember the base sequence has 3 full blocks (0, 1, 2).",
    ],
)
def changed_blocks(answer: list[Any]) -> str:
    base = block_hashes(LESSON_EXAMPLE_6_BASE, 4)
    edited = block_hashes(_edited(), 4)
    expected = [i for i, (a, b) in enumerate(zip(base, edited, strict=True)) if a != b]
    if not all_whole(answer):
        raise NotYet("Give block indices as whole numbers, e.g. [0, 2].")
    if sorted(answer) == expected:
        return (
            f"Block {expected[0]} holds the edit and every later hash covers it; blocks before it keep their "
            f"hashes, so a lookup still finds {expected[0] * 4} tokens."
        )
    if sorted(answer) == expected[:1]:
        raise NotYet("Block 1's hash changes, but it is also the parent of block 2's hash.")
    if 3 in answer:
        raise NotYet("The last two tokens form a partial block, which has no hash at all.")
    if 0 in answer:
        raise NotYet(
            "Block 0 is hashed before the edit: its tokens and its parent (the fixed seed) are unchanged."
        )
    missing = [i for i in expected if i not in answer]
    extra = sorted({i for i in answer if i not in expected})
    if extra:
        raise NotYet(
            f"{_blocks(extra, 'is not a full block', 'are not full blocks')} of the sequence: it has "
            f"{len(base)} full blocks, numbered from 0."
        )
    if not missing:
        raise NotYet("Name each block once: the list has a block index twice.")
    raise NotYet(
        f"{_blocks(missing, 'is missing', 'are missing')}: token {EDITED_POSITION} is in block "
        f"{EDITED_POSITION // 4}, and every block from that one on gets a different hash."
    )


def _blocks(indices: list[int], one: str, several: str) -> str:
    """Block indices in a sentence: "Block 2 is ...", "Blocks 1 and 2 are ..."."""
    if len(indices) == 1:
        return f"Block {indices[0]} {one}"
    words = [str(i) for i in indices]
    return f"Blocks {', '.join(words[:-1])} and {words[-1]} {several}"


def _chain_cases(rng: random.Random | None) -> list[tuple[list[int], int]]:
    """The notebook's sequences; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [
        (list(LESSON_EXAMPLE_6_BASE), 4),
        (_edited(), 4),
        (list(range(1000, 1070)), 16),
        ([5, 6, 7], 4),
        ([1, 2, 3, 4, 5, 6, 7, 8], 4),
        (list(range(10)), 1),
    ]
    for _ in range(8 if rng else 0):
        tokens = [rng.randrange(50_000) for _ in range(rng.randint(0, 80))]
        cases.append((tokens, rng.choice([1, 2, 3, 4, 8, 16])))
    return cases


@exercise(
    "06.2",
    title="Build the chain",
    assesses="writing the chaining rule: each full block hashed with its parent's hash, block 0 with the fixed seed, partial blocks skipped",
    minutes=8,
    answer_type="function",
    cases=_chain_cases,
    points=2,
    difficulty="core",
    prerequisites=["06.1"],
    hints=[
        "Start with parent = none_hash(). For each full block, parent = hash_block(parent, its tokens), and keep it.",
        "Stop before a block that has fewer than block_size tokens: range(0, len(tokens) - block_size + 1, block_size).",
    ],
)
def chain(answer: Any, cases: list[tuple[list[int], int]]) -> str:
    for tokens, block_size in cases:
        expected = block_hashes(tokens, block_size)
        got = call_for_list(answer, "a list of digests (bytes), one per full block", list(tokens), block_size)
        if got == expected:
            continue
        shown = f"chain({brief(tokens, 40)}, {block_size})"
        if len(got) != len(expected):
            raise NotYet(f"{shown} returned {len(got)} hashes; the sequence has {len(expected)} full blocks.")
        if got and got[0] == expected[0]:
            raise NotYet(
                f"{shown}: block 0 is right, a later one is not. Is each block hashed with the previous hash?"
            )
        raise NotYet(f"{shown}: block 0's hash differs. Its parent is the fixed seed none_hash().")
    return f"It matches kvlab's block_hashes on {len(cases)} sequences, the lesson's base and a partial-only one."


def _cap_cases(rng: random.Random | None) -> list[tuple[int, int]]:
    """The notebook's prompts; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [(64, 16), (65, 16), (90, 16), (15, 16), (16, 16), (17, 16), (1, 4), (48, 4)]
    cases += [(rng.randint(1, 400), rng.choice([1, 2, 4, 8, 16, 32])) for _ in range(8 if rng else 0)]
    return cases


@exercise(
    "06.3",
    title="vLLM never hits the whole prompt",
    assesses="applying vLLM's prompt_len - 1 cap to whole-block hits",
    minutes=6,
    answer_type="function",
    cases=_cap_cases,
    points=2,
    difficulty="core",
    prerequisites=["06.2"],
    hints=[
        "At most prompt_len - 1 tokens may come from the cache, because the last one must be computed for the logits.",
        "Hits are whole blocks: round prompt_len - 1 down to a multiple of block_size.",
    ],
)
def max_cached_tokens(answer: Any, cases: list[tuple[int, int]]) -> str:
    for prompt_len, block_size in cases:
        cache = PrefixCache(2 * (prompt_len // block_size + 1), block_size)
        tokens = list(range(100, 100 + prompt_len))
        cache.allocate("first", tokens)
        cache.free("first")
        expected = cache.allocate("again", tokens).num_cached_tokens
        got = call(answer, prompt_len, block_size)
        if got != expected:
            hint = ""
            if got == (prompt_len // block_size) * block_size:
                hint = " That counts every full block; vLLM keeps the last prompt token for itself."
            raise NotYet(
                f"max_cached_tokens({prompt_len}, {block_size}) returned {got!r}; kvlab's vLLM prefix cache "
                f"finds a different number when the same prompt is sent twice.{hint}"
            )
    return f"It agrees with kvlab's PrefixCache on {len(cases)} prompts: a 64-token prompt reuses 48, a 65-token one 64."
