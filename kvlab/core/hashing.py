"""Chained block hashes: the key a prefix cache looks blocks up by.

Each full block's hash covers its parent's hash, its own token ids and any
extra keys (here, a cache salt), so one hash names the whole prefix up to and
including that block. Partial blocks are never hashed: their content still
changes as tokens are appended.

Two schemes give byte-exact digests:

``"lesson"``
    The lesson's SHA-256 chain: block 0's parent is ``sha256(b"NONE")``; a block
    hashes ``parent || token ids as 4-byte big-endian signed ints || salt as UTF-8``
    (the salt on every block).
``"vllm"``
    vLLM v1's default ``sha256`` scheme: ``NONE_HASH`` is
    ``sha256(pickle.dumps("vllm-none-hash"))`` and each block is
    ``sha256(pickle.dumps((parent, tuple(token_ids), extra_keys)))`` with the
    highest pickle protocol; ``extra_keys`` is ``None``, or
    ``(("cache_salt", salt),)`` on block 0 only (later blocks inherit the salt
    through the chain).
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Sequence

from kvlab.errors import InvalidArgumentError, check_int, check_tokens

SCHEMES = ("lesson", "vllm")

LESSON_NONE_HASH = hashlib.sha256(b"NONE").digest()
VLLM_NONE_HASH = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(scheme: str = "lesson") -> bytes:
    """The fixed parent of block 0 under ``scheme``."""
    _check_scheme(scheme)
    return LESSON_NONE_HASH if scheme == "lesson" else VLLM_NONE_HASH


def hash_block(
    parent: bytes,
    block_tokens: Sequence[int],
    *,
    salt: str | None = None,
    first: bool = False,
    scheme: str = "lesson",
) -> bytes:
    """Hash one full block given its parent's digest.

    ``first`` says the block is block 0 of its sequence (the vLLM scheme puts
    the salt into block 0 only).
    """
    if scheme == "lesson":
        data = parent + struct.pack(f">{len(block_tokens)}i", *block_tokens)
        if salt is not None:
            data += salt.encode("utf-8")
        return hashlib.sha256(data).digest()
    extra = (("cache_salt", salt),) if (salt is not None and first) else None
    payload = (parent, tuple(block_tokens), extra)
    return hashlib.sha256(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def block_hashes(
    tokens: Sequence[int], block_size: int, *, salt: str | None = None, scheme: str = "lesson"
) -> list[bytes]:
    """One digest per full block of ``tokens``; a trailing partial block gets none."""
    toks = check_tokens("tokens", tokens, allow_empty=True)
    check_int("block_size", block_size, minimum=1)
    _check_scheme(scheme)
    if salt is not None and not isinstance(salt, str):
        raise InvalidArgumentError(f"salt must be a string or None, got {type(salt).__name__}")
    if scheme == "lesson":
        for t in toks:
            if not -(2**31) <= t < 2**31:
                raise InvalidArgumentError(
                    f"token id {t} does not fit the lesson scheme's 4-byte signed ints; use scheme='vllm'"
                )
    out: list[bytes] = []
    parent = none_hash(scheme)
    for start in range(0, len(toks) - block_size + 1, block_size):
        parent = hash_block(
            parent, toks[start : start + block_size], salt=salt, first=start == 0, scheme=scheme
        )
        out.append(parent)
    return out


def short(digest: bytes, nbytes: int = 4) -> str:
    """The first ``nbytes`` bytes as hex, the way the lesson prints a hash."""
    return digest[:nbytes].hex()


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise InvalidArgumentError(f"unknown hash scheme {scheme!r}: use one of {', '.join(SCHEMES)}")


LESSON_EXAMPLE_6_BASE = (11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42)


def example_6(scheme: str = "lesson") -> dict[str, list[bytes]]:
    """The lesson's example 6: chains for a base sequence, a late edit (token 9),
    an early edit (token 1) and the base with salt ``"tenant-b"``, 4-token blocks."""
    base = list(LESSON_EXAMPLE_6_BASE)
    late, early = list(base), list(base)
    late[9] = 99
    early[1] = 99
    return {
        "base": block_hashes(base, 4, scheme=scheme),
        "late edit": block_hashes(late, 4, scheme=scheme),
        "early edit": block_hashes(early, 4, scheme=scheme),
        "cache salt": block_hashes(base, 4, salt="tenant-b", scheme=scheme),
    }
