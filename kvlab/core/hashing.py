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
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.errors import (
    LIMITS,
    MAX_TOKEN_ID,
    InvalidArgumentError,
    brief,
    check_bool,
    check_choice,
    check_int,
    check_optional_str,
    check_size,
    check_tokens,
)

SCHEMES = ("lesson", "vllm")
DIGEST_BYTES = 32
"""Both schemes are SHA-256 chains: every digest, and so every ``parent``, is 32 bytes."""

LESSON_NONE_HASH = hashlib.sha256(b"NONE").digest()
VLLM_NONE_HASH = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(scheme: str = "lesson") -> bytes:
    """The fixed parent of block 0 under ``scheme``."""
    scheme = check_choice("scheme", scheme, SCHEMES, what="hash scheme")
    return LESSON_NONE_HASH if scheme == "lesson" else VLLM_NONE_HASH


def hash_block(
    parent: bytes | None,
    block_tokens: Sequence[int],
    *,
    salt: str | None = None,
    first: bool = False,
    scheme: str = "lesson",
) -> bytes:
    """Hash one full block given its parent's digest.

    ``parent`` is the previous block's 32-byte digest, or None for block 0 (its parent is then
    ``none_hash(scheme)``). ``block_tokens`` are token ids 0..MAX_TOKEN_ID (so the lesson scheme's
    4-byte signed packing always fits), at least one of them. ``salt`` is a string or None.
    ``first`` says the block is block 0 of its sequence (the vLLM scheme puts the salt into block
    0 only). Anything else is refused with ``InvalidArgumentError``.
    """
    scheme = check_choice("scheme", scheme, SCHEMES, what="hash scheme")
    if parent is None:
        parent = none_hash(scheme)
    elif not isinstance(parent, bytes) or len(parent) != DIGEST_BYTES:
        raise InvalidArgumentError(
            f"parent must be a {DIGEST_BYTES}-byte digest (a previous hash_block result or none_hash()) "
            f"or None for block 0, got {brief(parent)}"
        )
    toks = check_tokens("block_tokens", block_tokens)
    check_size("block_tokens' length", len(toks), "block_size")
    salt = check_salt(salt)
    check_bool("first", first)
    return _hash_block(bytes(parent), toks, salt, first, scheme)


def check_salt(salt: object) -> str | None:
    """A salt is None or a string that UTF-8 can encode (no lone surrogates): the lesson scheme hashes its bytes."""
    salt = check_optional_str("salt", salt)
    if salt is not None:
        try:
            salt.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(
                f"salt {brief(salt)} is not valid text (UTF-8 cannot encode it); use ordinary characters"
            ) from None
    return salt


def _hash_block(
    parent: bytes, block_tokens: Sequence[int], salt: str | None, first: bool, scheme: str
) -> bytes:
    """``hash_block`` on arguments already checked (the models' hot path)."""
    if scheme == "lesson":
        data = parent + struct.pack(f">{len(block_tokens)}i", *block_tokens)
        if salt is not None:
            data += salt.encode("utf-8")
        return _sha256(data).digest()
    extra = (("cache_salt", salt),) if (salt is not None and first) else None
    return _sha256(_dumps((parent, tuple(block_tokens), extra), _PROTOCOL)).digest()


_sha256 = hashlib.sha256
_dumps = pickle.dumps
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _chain(
    parent: bytes, tokens: Sequence[int], block_size: int, salt: str | None, scheme: str, first: bool = True
) -> list[bytes]:
    """The digests of ``tokens``' full blocks, chained from ``parent`` (arguments already checked).

    ``tokens`` start on a block boundary; ``first`` says their first block is block 0
    of its sequence (the vLLM scheme salts only that one). One loop with everything
    bound locally: the models, ``block_hashes`` and the fleet all hash through here,
    so a block costs no more than in vLLM's own ``hash_block_tokens`` chain.
    """
    sha256 = _sha256
    out: list[bytes] = []
    add = out.append
    stop = len(tokens) - block_size + 1
    if scheme == "lesson":
        pack = struct.Struct(f">{block_size}i").pack
        tail = b"" if salt is None else salt.encode("utf-8")
        for at in range(0, stop, block_size):
            parent = sha256(parent + pack(*tokens[at : at + block_size]) + tail).digest()
            add(parent)
        return out
    if stop <= 0:
        return out
    dumps, protocol = _dumps, _PROTOCOL
    keys = tokens if type(tokens) is tuple else tuple(tokens)  # a tuple's slices are the tuples vLLM pickles
    begin = 0
    if first and salt is not None:  # vLLM: the salt is block 0's extra key only
        parent = sha256(dumps((parent, keys[:block_size], (("cache_salt", salt),)), protocol)).digest()
        add(parent)
        begin = block_size
    for at in range(begin, stop, block_size):
        parent = sha256(dumps((parent, keys[at : at + block_size], None), protocol)).digest()
        add(parent)
    return out


def _chain_known(
    parent: bytes,
    tokens: Sequence[int],
    block_size: int,
    salt: str | None,
    scheme: str,
    first: bool,
    known: dict[tuple, bytes],
) -> tuple[list[bytes], list[tuple]]:
    """``_chain`` that skips the digests ``known`` already holds; returns the digests and their keys.

    A block's key is everything its digest depends on under one scheme: the parent's
    digest, the block's token ids and its extra keys (the vLLM scheme's salt on block
    0, the lesson scheme's salt on every block). ``known`` maps keys to digests (a
    prefix cache keeps the keys of the blocks it holds), so a block already cached
    costs a dictionary lookup instead of a pickle and a SHA-256, with the same digest.
    """
    sha256 = _sha256
    digests: list[bytes] = []
    keys: list[tuple] = []
    add, add_key, get = digests.append, keys.append, known.get
    stop = len(tokens) - block_size + 1
    if stop <= 0:
        return digests, keys
    ids = tokens if type(tokens) is tuple else tuple(tokens)
    lesson = scheme == "lesson"
    pack = struct.Struct(f">{block_size}i").pack if lesson else None
    tail = b"" if salt is None else salt.encode("utf-8")
    dumps, protocol = _dumps, _PROTOCOL
    extra = (("cache_salt", salt),) if (first and salt is not None) else None
    for at in range(0, stop, block_size):
        block = ids[at : at + block_size]
        key = (parent, block, salt) if lesson else (parent, block, extra)
        digest = get(key)
        if digest is None:
            if lesson:
                digest = sha256(parent + pack(*block) + tail).digest()  # type: ignore[misc]
            else:
                digest = sha256(dumps(key, protocol)).digest()
        add(digest)
        add_key(key)
        parent = digest
        extra = None
    return digests, keys


def block_hashes(
    tokens: Sequence[int], block_size: int, *, salt: str | None = None, scheme: str = "lesson"
) -> list[bytes]:
    """One digest per full block of ``tokens``; a trailing partial block gets none.

    ``tokens`` are ids 0..MAX_TOKEN_ID, at most ``LIMITS.tokens`` of them; ``block_size`` is at
    most ``LIMITS.block_size``.
    """
    toks = check_token_ids("tokens", tokens, allow_empty=True)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    scheme = check_choice("scheme", scheme, SCHEMES, what="hash scheme")
    salt = check_salt(salt)
    return _chain(none_hash(scheme), toks, block_size, salt, scheme)


def check_token_ids(name: str, tokens: object, *, allow_empty: bool = False) -> list[int]:
    """``kvlab.errors.check_tokens`` with a fast path: a list or tuple of plain ints in range is checked at C speed.

    The range test packs the ids as 32-bit signed ints (``array("i")`` refuses anything past
    2**31 - 1 = MAX_TOKEN_ID) and looks for a sign bit among the packed bytes. Anything else
    (numpy ints, bad values, the limits) goes through ``check_tokens``, which says what is wrong.
    """
    if (
        type(tokens) in (list, tuple)
        and 0 < len(tokens) <= LIMITS.tokens  # type: ignore[arg-type]
        and set(map(type, tokens)) == _JUST_INT  # type: ignore[call-overload]
    ):
        try:
            packed = array("i", tokens)  # type: ignore[arg-type]
        except OverflowError:
            pass
        else:
            if packed.tobytes()[_SIGN_BYTES].isascii():  # no byte >= 0x80 where the sign bits are: all >= 0
                return list(tokens)  # type: ignore[call-overload]
    return check_tokens(name, tokens, allow_empty=allow_empty)


_SIGN_BYTES = slice(3, None, 4) if sys.byteorder == "little" else slice(0, None, 4)
assert array("i").itemsize == 4 and MAX_TOKEN_ID == 2**31 - 1, "the fast token check packs ids as int32"
_JUST_INT = {int}


def short(digest: bytes, nbytes: int = 4) -> str:
    """The first ``nbytes`` bytes (1..32) of a digest as hex, the way the lesson prints a hash."""
    if not isinstance(digest, bytes):
        raise InvalidArgumentError(f"digest must be bytes (a block hash), got {brief(digest)}")
    check_int("nbytes", nbytes, minimum=1, maximum=DIGEST_BYTES)
    return bytes(digest[:nbytes]).hex()


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
    toks = check_tokens("tokens", tokens, allow_empty=True)
    scheme = check_choice("scheme", scheme, SCHEMES, what="hash scheme")
    salt = check_salt(salt)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    digests = block_hashes(toks, block_size, salt=salt, scheme=scheme)
    hashed = len(digests) * block_size
    blocks = tuple(tuple(toks[i : i + block_size]) for i in range(0, hashed, block_size))
    return HashChain(tuple(digests), blocks, tuple(toks[hashed:]), block_size, scheme, salt)
