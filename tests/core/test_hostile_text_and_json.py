"""Text taken from a user is read as its plain value; JSON that names a key twice is refused, naming it."""

from __future__ import annotations

import json

import pytest
from hostile import LyingDict, LyingList, LyingStr

from kvlab.core import jsonio
from kvlab.errors import InvalidArgumentError, KvlabError, ScenarioError, check_choice, check_text


def test_check_text_copies_a_lying_str_to_plain_text():
    plain = check_text("name", LyingStr("lesson"))
    assert type(plain) is str and plain == "lesson"
    assert check_choice("scheme", LyingStr("vllm"), ("lesson", "vllm")) == "vllm"
    with pytest.raises(InvalidArgumentError, match="must be a non-empty string"):
        check_text("name", LyingStr(""), allow_empty=False)
    for value in (b"x", None, 3, ["a"]):
        with pytest.raises(InvalidArgumentError, match="must be a string"):
            check_text("name", value)


@pytest.mark.parametrize(
    "text, key, where",
    [
        ('{"a": 1, "a": 2}', "a", "line 1, column 1"),
        ('{"ops": [{"op": "alloc",\n  "op": "free"}]}', "op", "line 1, column 10"),
        (
            '{"config": {"block_size": 4, "num_blocks": 8, "block_size": 16}, "ops": []}',
            "block_size",
            "line 1, column 12",
        ),
        ('{"a": 1, "\\u0061": 2}', "a", "line 1"),  # the same key, once written as an escape
        ('{"a": {"b": 1, "b": 1}, "c": ]', "b", "line 1, column 7"),  # found before the syntax error after it
    ],
)
def test_a_key_named_twice_is_refused_naming_it_and_where(text, key, where):
    with pytest.raises(ScenarioError, match=f"names the key '{key}' twice in the object at {where}"):
        jsonio.read_json(text)


def test_a_scenario_with_a_duplicate_key_is_refused_by_the_replay_cli(tmp_path, capsys):
    from kvlab.cli.replay import main

    path = tmp_path / "dup.json"
    path.write_text(
        '{"config": {"block_size": 4, "num_blocks": 4}, "ops": [{"op": "free", "req": "A", "req": "B"}]}'
    )
    assert main(["prefix-cache", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "'req' twice" in err


def test_distinct_keys_and_nested_objects_read_exactly_as_json_does():
    text = json.dumps({"config": {"a": 1, "b": [{"x": 1}, {"x": 2}]}, "ops": [{"op": "a", "k": {"op": 1}}]})
    assert jsonio.read_json(text) == json.loads(text)


def test_a_byte_order_mark_is_refused_with_what_to_do():
    with pytest.raises(ScenarioError, match="byte-order mark.*save it without one"):
        jsonio.read_json(b'\xef\xbb\xbf{"ops": []}')


@pytest.mark.parametrize("value", [LyingDict(a=1), [LyingDict(a=1)], {"a": LyingList([1])}])
def test_dumps_refuses_containers_whose_methods_raise(value):
    with pytest.raises(KvlabError, match="cannot be written as JSON"):
        jsonio.dumps(value)


def test_the_reader_and_writer_refuse_what_is_not_a_file():
    with pytest.raises(KvlabError, match="file open for reading"):
        jsonio.read_limited(None)
    with pytest.raises(KvlabError, match="file open for writing"):
        jsonio.write_json([1], None)
    with pytest.raises(KvlabError, match="kvlab error class"):
        jsonio.read_json("[]", "x", ValueError)
