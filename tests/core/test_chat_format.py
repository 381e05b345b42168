import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.chat_format import (
    SPECIAL_TOKENS,
    Message,
    Tokenizer,
    as_messages,
    render,
    render_text,
    reply_tokens,
)
from kvlab.errors import InvalidArgumentError


def test_special_tokens_have_fixed_ids():
    tok = Tokenizer()
    assert tok.encode("<|im_start|>system\n")[0] == SPECIAL_TOKENS["<|im_start|>"] == 1
    assert tok.encode("<|im_end|>") == [2]
    assert tok.decode([0, 1, 2]) == "<|endoftext|><|im_start|><|im_end|>"


def test_digits_are_single_tokens_and_a_clock_differs_in_one_digit():
    tok = Tokenizer()
    assert Tokenizer.split("Time: 10:01:00.") == [
        "Time",
        ":",
        " ",
        "1",
        "0",
        ":",
        "0",
        "1",
        ":",
        "0",
        "0",
        ".",
    ]
    a, b = tok.encode("Time: 10:00:00."), tok.encode("Time: 10:01:00.")
    first_diff = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    assert first_diff == 7  # "Time", ":", " ", "1", "0", ":", "0" match, then the minute digit


def test_ids_do_not_depend_on_call_order_or_instance():
    a, b = Tokenizer(), Tokenizer()
    a.encode("warm up with other words")
    assert a.encode("read Main.java") == b.encode("read Main.java")


def test_ids_are_the_same_in_a_new_process():
    code = "from kvlab.core.chat_format import Tokenizer; print(Tokenizer().encode('open the file, then run tests 42'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(Tokenizer().encode("open the file, then run tests 42"))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decode_inverts_encode(text):
    tok = Tokenizer()
    assert tok.decode(tok.encode(text)) == text
    assert "".join(Tokenizer.split(text)) == text


def test_render_is_chatml():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert (
        render_text(msgs)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_text(msgs, add_generation_prompt=False).endswith("hi<|im_end|>\n")


roles = st.sampled_from(["system", "user", "assistant", "tool"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(roles, st.text(max_size=40)), min_size=1, max_size=6))
def test_rendering_per_message_equals_tokenizing_the_whole_text(pairs):
    tok = Tokenizer()
    msgs = [Message(r, c) for r, c in pairs]
    rp = render(msgs, tok)
    assert list(rp.tokens) == tok.encode(render_text(msgs))
    for span, m in zip(rp.spans, msgs, strict=True):
        assert rp.tokens[span.start] == SPECIAL_TOKENS["<|im_start|>"]
        assert tok.decode(rp.tokens[span.start : span.start + span.length]) == render_text(
            [m], add_generation_prompt=False
        )
    assert rp.user_starts == tuple(s.start for s in rp.spans if s.role == "user")


def test_a_reply_tokenizes_back_to_the_same_ids_inside_the_history():
    tok = Tokenizer()
    prompt = render([Message("user", "List the files.")], tok)
    gen = reply_tokens(tok, prompt.tokens, 8)
    assert len(gen) == 8
    assert reply_tokens(tok, prompt.tokens, 8) == gen  # greedy: same prompt, same reply
    text = tok.decode(gen)
    nxt = render(
        [Message("user", "List the files."), Message("assistant", text), Message("user", "next")], tok
    )
    assert nxt.tokens[: len(prompt) + 8] == prompt.tokens + tuple(gen)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.encode(123),
        lambda t: t.encode(b"bytes"),
        lambda t: t.decode("abc"),
        lambda t: t.decode([12345]),
        lambda t: t.decode([1.5]),
        lambda t: t.piece(True),
        lambda t: render([{"role": "robot", "content": "x"}], t),
        lambda t: render([{"role": "user"}], t),
        lambda t: render([{"role": "user", "content": 5}], t),
        lambda t: render("hello", t),
        lambda t: render([42], t),
        lambda t: render([], t, add_generation_prompt=False),
        lambda t: render([Message("user", "x")], "not a tokenizer"),
        lambda t: reply_tokens(t, [1, 2], -1),
        lambda t: reply_tokens(t, [], 3),
    ],
)
def test_bad_inputs_raise_clear_errors_and_leave_the_tokenizer_unchanged(call):
    tok = Tokenizer()
    tok.encode("known words")
    before = dict(tok._pieces)
    with pytest.raises(InvalidArgumentError) as exc:
        call(tok)
    assert str(exc.value)
    assert tok._pieces == before


class _RaisingKeys(dict):
    def __iter__(self):
        raise RuntimeError("no keys for you")


class _EndlessKeys(dict):
    def __iter__(self):
        n = 0
        while True:
            n += 1
            yield f"k{n}"


class _RaisingLookup(dict):
    def __getitem__(self, key):
        raise KeyError(key)


@pytest.mark.parametrize(
    "message",
    [
        _RaisingKeys(role="user", content="hi"),
        _EndlessKeys(role="user", content="hi"),
        _RaisingLookup(role="user", content="hi"),
    ],
)
def test_a_message_dict_whose_keys_or_lookup_misbehave_is_refused_with_kvlab_s_error(message):
    """A dict subclass that raises, or lists keys without end, is refused; none of it runs unbounded."""
    with pytest.raises(InvalidArgumentError, match=r"messages\[0\]"):
        as_messages([message])
