"""Lesson example 6: one edit changes every hash from its block on; a salt changes all of them.

Four chains of 4-token blocks over the same 14 tokens (so three full blocks and a partial one that
gets no hash): the base, an edit of token 9 (block 2 on differ), an edit of token 1 (every block
differs) and the base with cache salt ``"tenant-b"`` (every block differs).
"""

from __future__ import annotations

from kvlab.core.hashing import block_hashes

LESSON_EXAMPLE_6_BASE = (11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42)
BLOCK_SIZE = 4
SALT = "tenant-b"


def example_6(scheme: str = "lesson") -> dict[str, list[bytes]]:
    """The lesson's example 6: chains for a base sequence, a late edit (token 9),
    an early edit (token 1) and the base with salt ``"tenant-b"``, 4-token blocks."""
    base = list(LESSON_EXAMPLE_6_BASE)
    late, early = list(base), list(base)
    late[9] = 99
    early[1] = 99
    return {
        "base": block_hashes(base, BLOCK_SIZE, scheme=scheme),
        "late edit": block_hashes(late, BLOCK_SIZE, scheme=scheme),
        "early edit": block_hashes(early, BLOCK_SIZE, scheme=scheme),
        "cache salt": block_hashes(base, BLOCK_SIZE, salt=SALT, scheme=scheme),
    }
