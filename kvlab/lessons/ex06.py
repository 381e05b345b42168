"""Lesson example 6: one edit changes every hash from its block on; a salt changes all of them.

Four chains of 4-token blocks over the same 14 tokens (so three full blocks and a partial one that
gets no hash): the base, an edit of token 9 (block 2 on differ), an edit of token 1 (every block
differs) and the base with cache salt ``"tenant-b"`` (every block differs). ``LESSON_CHAINS`` holds
the first 4 bytes of each hash as the lesson printed them, the figures notebook 06 compares with.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.hashing import HashChain, block_hashes, hash_chain
from kvlab.errors import InvalidArgumentError, check_items

LESSON_EXAMPLE_6_BASE = (11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42)
BLOCK_SIZE = 4
SALT = "tenant-b"

LESSON_CHAINS: dict[str, tuple[str, ...]] = {
    "base": ("6cfd527e", "9f569157", "e0297480"),
    "late edit": ("6cfd527e", "9f569157", "6417173d"),
    "early edit": ("f896424a", "becafd48", "11e3be4a"),
    "cache salt": ("6057b827", "793c15f6", "099ad05f"),
}
"""The first 4 bytes of each block hash, as the lesson printed them (SHA-256, its own payload)."""


def example_6_variants() -> dict[str, list[int]]:
    """The lesson's three token sequences: the base, a late edit (token 9) and an early edit (token 1)."""
    base = list(LESSON_EXAMPLE_6_BASE)
    late, early = list(base), list(base)
    late[9] = 99
    early[1] = 99
    return {"base": base, "late edit": late, "early edit": early}


def _inputs() -> dict[str, tuple[list[int], str | None]]:
    """Each of the lesson's four chains as (tokens, salt): the three sequences, then the salted base."""
    variants = example_6_variants()
    out: dict[str, tuple[list[int], str | None]] = {name: (tokens, None) for name, tokens in variants.items()}
    out["cache salt"] = (variants["base"], SALT)
    return out


def example_6(scheme: str = "lesson") -> dict[str, list[bytes]]:
    """The lesson's example 6: chains for a base sequence, a late edit (token 9),
    an early edit (token 1) and the base with salt ``"tenant-b"``, 4-token blocks."""
    return {
        name: block_hashes(tokens, BLOCK_SIZE, salt=salt, scheme=scheme)
        for name, (tokens, salt) in _inputs().items()
    }


def example_6_links(scheme: str = "lesson") -> dict[str, HashChain]:
    """The same four chains with the blocks they cover and the unhashed tail, for ``hash_chain_figure``."""
    return {
        name: hash_chain(tokens, BLOCK_SIZE, salt=salt, scheme=scheme)
        for name, (tokens, salt) in _inputs().items()
    }


def changed_blocks(chain: Sequence[bytes], reference: Sequence[bytes]) -> list[int]:
    """Indices of the blocks whose hash differs from ``reference`` at the same place."""
    ours = check_items("chain", chain, what="a list of block hashes")
    theirs = check_items("reference", reference, what="a list of block hashes")
    if len(ours) != len(theirs) or not all(type(h) is bytes for h in ours + theirs):
        raise InvalidArgumentError("chain and reference must be lists of bytes digests of the same length")
    return [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
