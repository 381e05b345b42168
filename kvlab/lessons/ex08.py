"""Lesson example 8: three prompts share a system prompt in a radix tree; a match, a lock, an eviction.

The three inserts leave the shared run ``1..6`` in one node with two branches below it; the new
request matches 9 of its 10 tokens (``1..6`` then ``20, 21, 22``) and locks that path; evicting 1
token frees the least recently used unlocked leaf, ``[30, 31]``: 2 tokens, as eviction takes whole
leaves only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.snapshots import History, RadixState
from kvlab.models.radix import RadixTree


@dataclass(frozen=True)
class Example8:
    """What example 8 shows, step by step."""

    tree_after_inserts: RadixState
    token_entries: int  # tokens stored in the tree after the three inserts
    prompt_tokens: int  # tokens in the three prompts
    matched_len: int
    evicted_runs: tuple[tuple[int, ...], ...]
    evicted_tokens: int
    evictable_size: int
    protected_size: int
    tree_after_evict: RadixState
    history: History[RadixState]


EXAMPLE_8_PROMPTS = (
    (1, 2, 3, 4, 5, 6, 10, 11),  # system prompt 1..6 + question A
    (1, 2, 3, 4, 5, 6, 20, 21, 22),  # the same system prompt + question B
    (1, 2, 3, 4, 5, 6, 10, 11, 30, 31),  # turn 2 of conversation A
)
EXAMPLE_8_REQUEST = (1, 2, 3, 4, 5, 6, 20, 21, 22, 40)


def example_8() -> Example8:
    """Three inserts, a match, a lock of its path, and an eviction of 1 token."""
    tree = RadixTree(page_size=1, record=True)
    for prompt in EXAMPLE_8_PROMPTS:
        tree.insert(prompt)
    after_inserts = tree.snapshot()
    hit = tree.match(EXAMPLE_8_REQUEST)
    tree.lock(hit.node)
    runs = tree.evict(1)
    assert tree.history is not None
    return Example8(
        tree_after_inserts=after_inserts,
        token_entries=after_inserts.total_tokens,
        prompt_tokens=sum(len(p) for p in EXAMPLE_8_PROMPTS),
        matched_len=hit.matched_len,
        evicted_runs=tuple(runs),
        evicted_tokens=sum(len(r) for r in runs),
        evictable_size=tree.evictable_size,
        protected_size=tree.protected_size,
        tree_after_evict=tree.snapshot(),
        history=tree.history,
    )
