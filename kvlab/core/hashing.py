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

``hash_block`` is one link, vLLM's ``hash_block_tokens`` (``vllm/v1/core/kv_cache_utils.py``);
``block_hashes`` runs the chain over a whole request, as the hasher from vLLM's
``get_request_block_hasher`` does. The lesson's four example chains are ``kvlab.lessons.ex06``.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.errors import InvalidArgumentError, check_choice, check_int, check_tokens

SCHEMES = ("lesson", "vllm")

LESSON_NONE_HASH = hashlib.sha256(b"NONE").digest()
VLLM_NONE_HASH = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(scheme: str = "lesson") -> bytes:
    """The fixed parent of block 0 under ``scheme``."""
    check_choice("scheme", scheme, SCHEMES, what="hash scheme")
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
    scheme = check_choice("scheme", scheme, SCHEMES, what="hash scheme")
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


@dataclass(frozen=True)
class HashChain:
    """One request's chained block hashes, with the tokens each one covers.

    ``digests[i]`` is block ``i``'s hash (it covers blocks 0..i); ``blocks[i]``
    are that block's token ids; ``tail`` holds the tokens of a trailing partial
    block, which has no hash (its content still changes as tokens are appended).
    ``kvlab.views.hash_chain_figure`` draws a few of these side by side.
    """

    digests: tuple[bytes, ...]
    blocks: tuple[tuple[int, ...], ...]
    tail: tuple[int, ...]
    block_size: int
    scheme: str = "lesson"
    salt: str | None = None


def hash_chain(
    tokens: Sequence[int], block_size: int, *, salt: str | None = None, scheme: str = "lesson"
) -> HashChain:
    """``block_hashes(tokens, block_size, ...)`` together with the blocks they cover and the unhashed tail."""
    digests = block_hashes(tokens, block_size, salt=salt, scheme=scheme)
    toks = [int(t) for t in tokens]
    hashed = len(digests) * block_size
    blocks = tuple(tuple(toks[i : i + block_size]) for i in range(0, hashed, block_size))
    return HashChain(tuple(digests), blocks, tuple(toks[hashed:]), block_size, scheme, salt)
