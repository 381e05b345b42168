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

import array
import functools
import hashlib
import operator
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat

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


def _blocks(tokens: Sequence[int], block_size: int) -> zip:
    """The full blocks of ``tokens`` as tuples, cut at C speed (``zip`` drops a partial last block)."""
    return zip(*[iter(tokens)] * block_size)  # noqa: B905 (a partial last block is dropped)


def _chain(
    parent: bytes, tokens: Sequence[int], block_size: int, salt: str | None, scheme: str, first: bool = True
) -> list[bytes]:
    """The digests of ``tokens``' full blocks, chained from ``parent`` (arguments already checked).

    ``tokens`` start on a block boundary; ``first`` says their first block is block 0
    of its sequence (the vLLM scheme salts only that one). The blocks are cut by
    ``zip`` and the chain runs in one comprehension with everything bound locally, so
    a block costs one pickle (or pack) and one SHA-256, as in vLLM's ``hash_block_tokens``.
    """
    sha256 = _sha256
    blocks = _blocks(tokens, block_size)
    if scheme == "lesson":
        pack = struct.Struct(f">{block_size}i").pack
        tail = b"" if salt is None else salt.encode("utf-8")
        return [parent := sha256(parent + pack(*block) + tail).digest() for block in blocks]
    dumps, protocol = _dumps, _PROTOCOL
    out: list[bytes] = []
    if first and salt is not None:  # vLLM: the salt is block 0's extra key only
        block = next(blocks, None)
        if block is None:
            return out
        parent = sha256(dumps((parent, block, (("cache_salt", salt),)), protocol)).digest()
        out.append(parent)
    out += [parent := sha256(dumps((parent, block, None), protocol)).digest() for block in blocks]
    return out


def key_digester(scheme: str, block_size: int) -> Callable[[tuple], bytes]:
    """The digest of one block from its key ``(parent, block tokens, extra keys)`` (arguments already checked).

    A block's key is everything its digest depends on under one scheme: the parent's
    digest, the block's token ids as a tuple and its extra keys (``block_key_extra``).
    Under the vLLM scheme the key is exactly what vLLM's ``hash_block_tokens`` pickles, so
    a prefix cache can look blocks up by key and hash only the ones it has never seen.
    """
    sha256 = _sha256
    if scheme == "lesson":
        pack = struct.Struct(f">{block_size}i").pack

        def lesson_digest(key: tuple) -> bytes:
            parent, block, salt = key
            data = parent + pack(*block)
            return sha256(data if salt is None else data + salt.encode("utf-8")).digest()

        return lesson_digest
    dumps, protocol = _dumps, _PROTOCOL

    def vllm_digest(key: tuple) -> bytes:
        return sha256(dumps(key, protocol)).digest()

    return vllm_digest


def block_key_extra(salt: str | None, scheme: str, first: bool) -> tuple[object, object]:
    """The extra keys of a chain's first block and of every later one (arguments already checked).

    The lesson scheme hashes the salt into every block; vLLM's puts ``(("cache_salt", salt),)``
    into block 0 only (``first``: the chain starts at block 0) and ``None`` everywhere else.
    """
    if scheme == "lesson":
        return salt, salt
    return ((("cache_salt", salt),) if first and salt is not None else None), None


def block_hashes(
    tokens: Sequence[int], block_size: int, *, salt: str | None = None, scheme: str = "lesson"
) -> list[bytes]:
    """One digest per full block of ``tokens``; a trailing partial block gets none.

    ``tokens`` are ids 0..MAX_TOKEN_ID, at most ``LIMITS.tokens`` of them; ``block_size`` is at
    most ``LIMITS.block_size``. Each argument is checked once, here; a plain list of ints is
    checked at C speed (``plain_token_ids``) and hashed as it is, without a copy.
    """
    if type(block_size) is not int or not 0 < block_size <= LIMITS.block_size:
        block_size = check_size("block_size", block_size, "block_size", minimum=1)
    if type(scheme) is not str or scheme not in SCHEMES:
        scheme = check_choice("scheme", scheme, SCHEMES, what="hash scheme")
    if salt is not None:
        salt = check_salt(salt)
    # the tokens last: checking the other arguments may run a caller's code, which could change the list
    if not plain_token_ids(tokens):
        tokens = check_token_ids("tokens", tokens, allow_empty=True)
    return _chain(
        LESSON_NONE_HASH if scheme == "lesson" else VLLM_NONE_HASH, tokens, block_size, salt, scheme
    )


def check_token_ids(name: str, tokens: object, *, allow_empty: bool = False) -> list[int]:
    """``kvlab.errors.check_tokens`` with a fast path: a list or tuple of plain ints in range is checked at C speed.

    The fast path is ``plain_token_ids``; anything it does not vouch for (numpy ints, int
    subclasses, bad values, the limits) goes through ``check_tokens``, which converts what it
    accepts to plain ints and says what is wrong with what it refuses.
    """
    if plain_token_ids(tokens):
        return list(tokens)  # type: ignore[call-overload]
    return check_tokens(name, tokens, allow_empty=allow_empty)


def plain_token_ids(tokens: object) -> bool:
    """True when a list or tuple (exactly those types) holds 1..``LIMITS.tokens`` plain ``int`` ids, each in 0..MAX_TOKEN_ID.

    ``_exact_ints`` then ``_ids_in_range``: two C-level passes, no Python code per id and
    none of the items' own code (a few ids, a decode step's, get both checks in
    ``_exact_ints``' one loop). False means "not vouched for", not "refused":
    ``check_tokens`` then decides.
    """
    return _exact_ints(tokens) and (len(tokens) <= _FEW or _ids_in_range(tokens, 0))  # type: ignore[arg-type]


def _exact_ints(tokens: object) -> bool:
    """True when a list or tuple (exactly those types) holds 1..``LIMITS.tokens`` items, every one an exact ``int``.

    One C-level pass compares each item's type with ``int`` by identity: ``type`` reads an
    object's type without asking it, and ``operator.is_`` asks nothing either (``==`` would
    ask a metaclass's ``__eq__``, which may say yes), so a bool, an int subclass, a numpy
    int or an object whose ``__index__`` says it is an integer all fail, and no item's own
    code runs. The ids'
    range is ``_ids_in_range``'s to check (a prefix cache checks only the ids its cached
    blocks do not vouch for); a few ids (a decode step) get both checks in one plain loop.
    """
    # exactly these types: a subclass may lie about its items
    if type(tokens) is not list and type(tokens) is not tuple:
        return False
    n = len(tokens)
    if n <= _FEW:  # a plain loop costs less than the C passes' setup
        for t in tokens:
            if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
                return False
        return 0 < n <= LIMITS.tokens
    return n <= LIMITS.tokens and all(map(_is, map(type, tokens), repeat(int)))


def _ids_in_range(tokens: Sequence[int], start: int) -> bool:
    """True when the exact ints ``tokens[start:]`` (``_exact_ints`` said so) are all in 0..MAX_TOKEN_ID.

    One C-level pass: converting plain ints to a C ``unsigned int`` array refuses a negative
    id or one past 32 bits (``OverflowError``) and runs no code but the conversion; an id past
    MAX_TOKEN_ID (2**31 - 1) then shows as a set top bit in its top byte.
    """
    rest = tokens[start:] if start else tokens
    if len(rest) <= _FEW:
        return all([0 <= t <= MAX_TOKEN_ID for t in rest])
    try:
        ids = _uint32_array(rest)
    except OverflowError:  # a negative id, or one past 32 bits
        return False
    return ids.tobytes()[_TOP_BYTE::4].isascii()  # no id has bit 31 set


_FEW = 24
_is = operator.is_
_uint32_array = functools.partial(array.array, "I")
_TOP_BYTE = 3 if sys.byteorder == "little" else 0
assert array.array("I").itemsize == 4, "the fast token check reads ids as 4-byte unsigned ints"
assert MAX_TOKEN_ID == 2**31 - 1, "the fast token check reads an id past MAX_TOKEN_ID from bit 31"


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
