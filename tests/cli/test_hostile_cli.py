"""Hostile command lines for ``fleet`` and ``chat``: exit status 2 and one line on stderr, never a traceback.

Every value drawn here is one the options must refuse (another script's digits, ``_`` separators,
floats, words, huge or negative sizes, control characters, surrogate escapes of undecodable bytes),
so no simulation or engine run starts; the CLI refuses it while reading its arguments.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cli import chat, fleet
from kvlab.errors import InvalidArgumentError, check_int_text

never_an_option_value = st.one_of(
    st.sampled_from(
        [
            "\u0661\u0662",
            "\u0968",
            "\uff11",
            "1_000",
            "1e3",
            "4.0",
            "0x10",
            "",
            " ",
            "-",
            "+",
            "nan",
            "inf",
            "\udcff",
            "1\x00",
            "1\n2",
            "\u202e5",
            "9" * 25,
            "-" + "9" * 5000,
            "10**9",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Nd",)), min_size=1, max_size=6),
)
FLEET_OPTIONS = ["--users", "--turns", "--system-tokens", "--block-size", "--replicas", "--tenants"]
CHAT_OPTIONS = ["--turns", "--max-tokens", "--block-size", "--threads"]


def _run(main, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _one_line_refusal(code: int, out: str, err: str, prog: str) -> None:
    assert code == 2, (code, err)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"kvlab {prog}:"), err
    assert "Traceback" not in err


@settings(max_examples=60, deadline=None)
@given(option=st.sampled_from(FLEET_OPTIONS), value=never_an_option_value)
def test_fleet_refuses_every_hostile_option_value_in_one_line(option, value):
    argv = [option, value] + (["--salt", "tenant"] if option == "--tenants" else [])
    _one_line_refusal(*_run(fleet.main, argv), "fleet")


@settings(max_examples=60, deadline=None)
@given(option=st.sampled_from(CHAT_OPTIONS), value=never_an_option_value)
def test_chat_refuses_every_hostile_option_value_in_one_line(option, value):
    _one_line_refusal(*_run(chat.main, [option, value]), "chat")


@pytest.mark.parametrize("text", ["\u0661\u0662", "1_000", " 5\n", "\uff15", "+-5", "5 5"])
def test_an_integer_option_is_read_in_ascii_digits_only(text):
    """Python's int() reads all of these (or most); kvlab refuses them rather than guess."""
    with pytest.raises(InvalidArgumentError, match="digits 0-9"):
        check_int_text("--users", text)


@pytest.mark.parametrize("text, value", [("5", 5), ("-3", -3), ("+7", 7), (" 12 ", 12), ("0", 0)])
def test_plain_integers_read_as_before(text, value):
    assert check_int_text("--users", text) == value
