"""Hostile input for kvlab.core's public functions: kvlab's own error or a normal result, never a crash.

Every argument of hashing, workloads and chat_format gets values from ``tests/hostile.py``; a call
either works (a numpy int or an int subclass is a valid integer) or raises ``KvlabError``, and a
refused call leaves the generator or tokenizer as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hostile import AlwaysEqual, hostile_values
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import hashing
from kvlab.core.chat_format import Message, Tokenizer, as_messages, render, render_text, reply_tokens
from kvlab.core.workloads import JavaRandom, java_list_hash
from kvlab.errors import KvlabError

FAST = settings(max_examples=40, deadline=None)
PARENT = hashing.none_hash()


def kvlab_or_ok(call: Callable[[], Any]) -> bool:
    """Run ``call``: True if it returned, False if kvlab refused it; any other exception fails the test."""
    try:
        call()
    except KvlabError as exc:
        assert str(exc), "a refusal must say what was wrong"
        return False
    return True


# ---------------------------------------------------------------- hashing


@FAST
@given(value=hostile_values(), which=st.sampled_from(["parent", "tokens", "salt", "first", "scheme"]))
def test_hash_block_refuses_hostile_arguments(value, which):
    args: dict[str, Any] = {"parent": PARENT, "tokens": [1, 2, 3, 4], "salt": None, "first": False}
    kwargs = {"scheme": "lesson"}
    if which == "scheme":
        kwargs["scheme"] = value
    else:
        args[which] = value
    kvlab_or_ok(
        lambda: hashing.hash_block(
            args["parent"], args["tokens"], salt=args["salt"], first=args["first"], **kwargs
        )
    )


@FAST
@given(value=hostile_values(), which=st.sampled_from(["tokens", "block_size", "salt", "scheme"]))
def test_block_hashes_and_hash_chain_refuse_hostile_arguments(value, which):
    args: dict[str, Any] = {"tokens": list(range(9)), "block_size": 4, "salt": None, "scheme": "vllm"}
    args[which] = value
    for fn in (hashing.block_hashes, hashing.hash_chain):
        kvlab_or_ok(
            lambda fn=fn: fn(args["tokens"], args["block_size"], salt=args["salt"], scheme=args["scheme"])
        )


@FAST
@given(value=hostile_values())
def test_short_and_none_hash_refuse_hostile_arguments(value):
    kvlab_or_ok(lambda: hashing.short(value))
    kvlab_or_ok(lambda: hashing.short(PARENT, value))
    kvlab_or_ok(lambda: hashing.none_hash(value))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: hashing.hash_block(b"short", [1]), "32-byte digest"),
        (lambda: hashing.hash_block(PARENT, [2**40]), "is not a token id"),
        (lambda: hashing.hash_block(PARENT, [-1]), "is not a token id"),
        (lambda: hashing.hash_block(PARENT, [1], salt=5), "salt must be a string or None"),
        (lambda: hashing.hash_block(PARENT, [1], salt="\ud800"), "not valid text"),
        (lambda: hashing.hash_block(PARENT, []), "is empty"),
        (lambda: hashing.hash_block(PARENT, [1], scheme=np.array(["lesson"])), "unknown hash scheme"),
        (lambda: hashing.hash_block(PARENT, [1], scheme=AlwaysEqual()), "unknown hash scheme"),
        (lambda: hashing.none_hash(AlwaysEqual()), "unknown hash scheme"),
        (lambda: hashing.short("abcd"), "digest must be bytes"),
        (lambda: hashing.short(PARENT, 0), "nbytes must be at least 1"),
        (lambda: hashing.short(PARENT, 10**30), "nbytes must be at most 32"),
        (lambda: hashing.block_hashes([1, 2], 10**30), "LIMITS.block_size"),
    ],
)
def test_hashing_refusals_say_what_is_wrong(call, match):
    with pytest.raises(KvlabError, match=match):
        call()


def test_hash_block_with_no_parent_is_block_0():
    tokens = [5, 6, 7, 8]
    for scheme in hashing.SCHEMES:
        assert (
            hashing.hash_block(None, tokens, first=True, scheme=scheme)
            == hashing.block_hashes(tokens, 4, scheme=scheme)[0]
        )


# ---------------------------------------------------------------- workloads


@FAST
@given(value=hostile_values())
def test_java_random_refuses_hostile_seeds_bits_and_bounds(value):
    kvlab_or_ok(lambda: JavaRandom(value))
    rnd = JavaRandom(5)
    for call in (lambda: rnd.next_bits(value), lambda: rnd.next_int(value), lambda: rnd.shuffle(value)):
        before = rnd._seed
        if not kvlab_or_ok(call):
            assert rnd._seed == before, "a refused draw must draw nothing"
    kvlab_or_ok(lambda: java_list_hash(value))


def test_next_int_bound_past_a_java_int_is_refused_not_an_endless_loop():
    with pytest.raises(KvlabError, match="at most 2,147,483,647"):
        JavaRandom(1).next_int(2**31 + 3)


# ---------------------------------------------------------------- chat_format


@FAST
@given(value=hostile_values())
def test_tokenizer_refuses_hostile_text_and_ids(value):
    tok = Tokenizer()
    tok.encode("hello world")
    for call in (
        lambda: tok.encode(value),
        lambda: tok.split(value),
        lambda: tok.decode(value),
        lambda: tok.piece(value),
        lambda: Tokenizer.piece_id(value),
    ):
        before = dict(tok._pieces)
        if not kvlab_or_ok(call):
            assert tok._pieces == before


@FAST
@given(value=hostile_values(), where=st.sampled_from(["messages", "role", "content", "flag", "tokenizer"]))
def test_render_refuses_hostile_messages(value, where):
    tok = Tokenizer()
    messages: Any = [{"role": "user", "content": "hi"}]
    flag: Any = True
    tokenizer: Any = tok
    if where == "messages":
        messages = value
    elif where == "role":
        messages = [{"role": value, "content": "hi"}]
    elif where == "content":
        messages = [{"role": "user", "content": value}]
    elif where == "flag":
        flag = value
    else:
        tokenizer = value
    kvlab_or_ok(lambda: render(messages, tokenizer, add_generation_prompt=flag))
    kvlab_or_ok(lambda: render_text(messages, add_generation_prompt=flag))
    kvlab_or_ok(lambda: as_messages(messages))
    if where in ("role", "content"):
        kvlab_or_ok(lambda: Message(**messages[0]))


@FAST
@given(value=hostile_values(), where=st.sampled_from(["tokenizer", "prompt", "n"]))
def test_reply_tokens_refuses_hostile_arguments(value, where):
    args: dict[str, Any] = {"tokenizer": Tokenizer(), "prompt": [1, 2, 3], "n": 2}
    args[where] = value
    kvlab_or_ok(lambda: reply_tokens(args["tokenizer"], args["prompt"], args["n"]))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: reply_tokens(Tokenizer(), [1], 10**30), "LIMITS.tokens"),
        (lambda: Tokenizer().encode("a\ud800b"), "not valid text"),
        (lambda: Message(AlwaysEqual(), "x"), "unknown role"),
        (lambda: Message("user", 5), "content must be a string"),
        (lambda: render([{"role": np.array(["user"]), "content": "x"}], Tokenizer()), "unknown role"),
        (lambda: Tokenizer().decode([2**31]), "is not a token id"),
    ],
)
def test_chat_format_refusals_say_what_is_wrong(call, match):
    start = time.perf_counter()
    with pytest.raises(KvlabError, match=match):
        call()
    assert time.perf_counter() - start < 1.0
