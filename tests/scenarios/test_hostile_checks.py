"""The scenario checks take hostile values from the Python API: kvlab's error, nothing applied."""

from __future__ import annotations

import pytest
from hostile import LyingDict, LyingList, LyingStr, all_hostile_values, kvlab_or_ok
from hypothesis import given, settings

from kvlab import scenarios
from kvlab.errors import KvlabError, ScenarioError
from kvlab.scenarios import checks

FAST = settings(max_examples=40, deadline=None)
CONFIG = {"block_size": 4, "num_blocks": 8}


@FAST
@given(config=all_hostile_values(), key=all_hostile_values(), other=all_hostile_values())
def test_the_config_helpers_refuse_hostile_values(config, key, other):
    kvlab_or_ok(lambda: checks.config_size(config, "num_blocks"))
    kvlab_or_ok(lambda: checks.config_size(CONFIG, key))
    kvlab_or_ok(lambda: checks.config_size(CONFIG, "num_blocks", other))
    kvlab_or_ok(lambda: checks.config_flag(config, "null_block", False))
    kvlab_or_ok(lambda: checks.config_flag({"null_block": other}, "null_block", False))
    kvlab_or_ok(lambda: checks.config_flag(CONFIG, "null_block", other))
    kvlab_or_ok(lambda: checks.config_hash(config))
    kvlab_or_ok(lambda: checks.config_hash({"hash": other}))
    kvlab_or_ok(lambda: checks.check_config_keys(config, "prefix-cache", ("block_size", "num_blocks")))
    kvlab_or_ok(lambda: checks.check_config_keys(CONFIG, key, other))


def test_the_config_helpers_read_plain_configs_as_before():
    assert checks.config_size(CONFIG, "num_blocks") == 8
    assert checks.config_flag(CONFIG, "null_block", True) is True
    assert checks.config_hash({"hash": "vllm"}) == "vllm"
    with pytest.raises(ScenarioError, match="config 'num_blocks' is too large"):
        checks.config_size({"num_blocks": 10**9}, "num_blocks")
    with pytest.raises(ScenarioError, match="unknown limit"):
        checks.config_size(CONFIG, "num_blocks", "no-such-limit")


class KeyStr(str):
    """A str key that hashes like its text but lies when compared or printed."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        return True

    def __format__(self, spec: str) -> str:
        raise RuntimeError("format refused")


@pytest.mark.parametrize("model", ["prefix-cache", "block-pool", "radix"])
def test_ops_and_configs_whose_methods_raise_are_read_plainly_or_refused(model):
    config = {"page_size": 1} if model == "radix" else dict(CONFIG)
    # a dict subclass is read through dict's own methods: its overrides never run
    assert (
        scenarios.start(model, LyingDict(config)).model.snapshot()
        == scenarios.start(model, config).model.snapshot()
    )
    run = scenarios.start(model, config)
    before = run.model.snapshot()
    for op in (
        LyingDict(op="free", req="A"),
        {"op": LyingStr("free"), "req": "A"},
        {"op": "alloc", "req": LyingStr("A"), "tokens": LyingList([1])},
        {KeyStr("op"): "insert", "tokens": [1]},
    ):
        try:
            run.apply(op, 0)
        except KvlabError as exc:
            assert str(exc)
            assert run.model.snapshot() == before
    with pytest.raises(ScenarioError, match="index"):
        run.apply({"op": "free", "req": "A"}, LyingStr("0"))


def test_a_dict_subclass_with_plain_behaviour_replays_like_a_dict():
    class Plain(dict):
        pass

    ops = [Plain(op="alloc", req="A", tokens=[1, 2, 3, 4, 5]), {"op": "free", "req": "A"}]
    assert scenarios.replay("prefix-cache", Plain(CONFIG), LyingList(ops)) == scenarios.replay(
        "prefix-cache", CONFIG, [dict(op) for op in ops]
    )
