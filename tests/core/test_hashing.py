"""Chained block hashes: the lesson's example 6 digests and vLLM's sha256 scheme, byte for byte."""

from __future__ import annotations

import hashlib
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.hashing import block_hashes, hash_block, none_hash, short
from kvlab.errors import InvalidArgumentError

BASE = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42]


def _edited(position: int) -> list[int]:
    tokens = list(BASE)
    tokens[position] = 99
    return tokens


def _short_chain(tokens, salt=None, scheme="lesson"):
    return [short(h) for h in block_hashes(tokens, 4, salt=salt, scheme=scheme)]


def test_example_6_base():
    assert _short_chain(BASE) == ["6cfd527e", "9f569157", "e0297480"]


def test_example_6_late_edit_keeps_earlier_blocks():
    assert _short_chain(_edited(9)) == ["6cfd527e", "9f569157", "6417173d"]


def test_example_6_early_edit_changes_every_block():
    assert _short_chain(_edited(1)) == ["f896424a", "becafd48", "11e3be4a"]


def test_example_6_cache_salt():
    assert _short_chain(BASE, salt="tenant-b") == ["6057b827", "793c15f6", "099ad05f"]


def test_example_6_partial_block_not_hashed():
    assert len(block_hashes(BASE, 4)) == 3  # 14 tokens: 3 full blocks, the last 2 tokens get no hash
    assert len(block_hashes(BASE[:12], 4)) == 3
    assert len(block_hashes(BASE[:11], 4)) == 2
    assert block_hashes(BASE[:3], 4) == []
    assert block_hashes([], 4) == []
    # appending to the partial block never changes an existing hash
    assert block_hashes(BASE + [43, 44], 4)[:3] == block_hashes(BASE, 4)


def _lesson_reference(tokens, block_size, salt=None):
    """The lesson's chain rebuilt from hashlib and int.to_bytes."""
    parent = hashlib.sha256(b"NONE").digest()
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = parent + b"".join(
            t.to_bytes(4, "big", signed=True) for t in tokens[start : start + block_size]
        )
        if salt is not None:
            data += salt.encode()
        parent = hashlib.sha256(data).digest()
        out.append(parent)
    return out


def _vllm_reference(tokens, block_size, salt=None):
    """vLLM's sha256 block hash as the issue defines it, rebuilt from pickle and hashlib."""
    proto = pickle.HIGHEST_PROTOCOL
    parent = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=proto)).digest()
    out = []
    for i, start in enumerate(range(0, len(tokens) - block_size + 1, block_size)):
        extra = (("cache_salt", salt),) if salt is not None and i == 0 else None
        payload = (parent, tuple(tokens[start : start + block_size]), extra)
        parent = hashlib.sha256(pickle.dumps(payload, protocol=proto)).digest()
        out.append(parent)
    return out


def test_vllm_none_hash():
    expected = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert none_hash("vllm") == expected
    assert none_hash("lesson") == hashlib.sha256(b"NONE").digest()


def test_vllm_scheme_salt_only_in_block_0():
    salted = block_hashes(BASE, 4, salt="tenant-b", scheme="vllm")
    assert salted == _vllm_reference(BASE, 4, salt="tenant-b")
    # block 1 with the salted parent equals an unsalted hash of block 1 on that parent: the salt is not repeated
    assert salted[1] == hash_block(salted[0], BASE[4:8], scheme="vllm")
    assert salted[0] != block_hashes(BASE, 4, scheme="vllm")[0]


def test_schemes_differ():
    assert block_hashes(BASE, 4, scheme="vllm") != block_hashes(BASE, 4, scheme="lesson")


tokens_st = st.lists(st.integers(0, 2**31 - 1), max_size=40)
salt_st = st.none() | st.text(max_size=8)


@settings(max_examples=60, deadline=None)
@given(tokens=tokens_st, block_size=st.integers(1, 9), salt=salt_st)
def test_vllm_scheme_matches_reference(tokens, block_size, salt):
    assert block_hashes(tokens, block_size, salt=salt, scheme="vllm") == _vllm_reference(
        tokens, block_size, salt
    )


@settings(max_examples=60, deadline=None)
@given(tokens=tokens_st, block_size=st.integers(1, 9), salt=salt_st)  # ids 0..MAX_TOKEN_ID, the one range
def test_lesson_scheme_matches_reference(tokens, block_size, salt):
    assert block_hashes(tokens, block_size, salt=salt) == _lesson_reference(tokens, block_size, salt)


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, 1000), min_size=8, max_size=40), data=st.data())
def test_an_edit_changes_its_block_and_every_later_one(tokens, data):
    block_size = 4
    position = data.draw(st.integers(0, len(tokens) - 1))
    edited = list(tokens)
    edited[position] += 1
    before, after = block_hashes(tokens, block_size), block_hashes(edited, block_size)
    edited_block = position // block_size
    assert before[:edited_block] == after[:edited_block]
    assert all(a != b for a, b in zip(before[edited_block:], after[edited_block:], strict=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": "1234"}, "list of integer token ids"),
        ({"tokens": 5}, "list of integer token ids"),
        ({"tokens": [1, 2.0, 3, 4]}, r"tokens\[1\] must be an integer"),
        ({"tokens": [1, True, 3, 4]}, r"tokens\[1\] must be an integer"),
        ({"block_size": 0}, "block_size must be at least 1"),
        ({"block_size": 4.0}, "block_size must be an integer"),
        ({"scheme": "md5"}, "unknown hash scheme 'md5'"),
        ({"salt": 7}, "salt must be a string or None"),
        ({"tokens": [1, 2, 3, 2**31]}, r"tokens\[3\] = 2147483648 is not a token id"),
        ({"tokens": [1, 2, 3, -5]}, r"tokens\[3\] = -5 is not a token id"),
    ],
)
def test_bad_input(kwargs, message):
    args = {"tokens": BASE, "block_size": 4, **kwargs}
    tokens, block_size = args.pop("tokens"), args.pop("block_size")
    with pytest.raises(InvalidArgumentError, match=message):
        block_hashes(tokens, block_size, **args)


def test_token_ids_have_one_range_in_both_schemes():
    # ids are 0..MAX_TOKEN_ID everywhere (issue 11): the vLLM scheme no longer takes 2**40
    for scheme in ("lesson", "vllm"):
        with pytest.raises(InvalidArgumentError, match="is not a token id"):
            block_hashes([2**40, 1, 2, 3], 4, scheme=scheme)
    tokens = [2**31 - 1, 0, 2, 3]
    assert block_hashes(tokens, 4, scheme="vllm") == _vllm_reference(tokens, 4)


def test_none_hash_bad_scheme():
    with pytest.raises(InvalidArgumentError, match="unknown hash scheme"):
        none_hash("sha1")


def test_short():
    digest = bytes(range(32))
    assert short(digest) == "00010203"
    assert short(digest, 2) == "0001"


def test_example_6_runner_reproduces_the_lesson() -> None:
    from kvlab.core.hashing import short
    from kvlab.lessons.ex06 import example_6

    chains = {name: [short(h) for h in hashes] for name, hashes in example_6().items()}
    assert chains == {
        "base": ["6cfd527e", "9f569157", "e0297480"],
        "late edit": ["6cfd527e", "9f569157", "6417173d"],
        "early edit": ["f896424a", "becafd48", "11e3be4a"],
        "cache salt": ["6057b827", "793c15f6", "099ad05f"],
    }
