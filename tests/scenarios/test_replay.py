"""The replay CLI's shared front end: scenario shape and the optional 'model' field."""

from __future__ import annotations

import io
import json
import sys

import pytest

from kvlab.cli.replay import main


def run_cli(model: str, scenario: object, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(scenario)))
    code = main([model])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_scenario_naming_its_own_model_replays(monkeypatch, capsys) -> None:
    scenario = {
        "model": "prefix-cache",
        "config": {"block_size": 4, "num_blocks": 4},
        "ops": [{"op": "alloc", "req": "A", "tokens": [1, 2, 3, 4, 5]}],
    }
    code, out, err = run_cli("prefix-cache", scenario, monkeypatch, capsys)
    assert code == 0 and err == ""
    assert json.loads(out)[0]["block_table"] == [0, 1]


@pytest.mark.parametrize(
    ("named", "words"),
    [("block-pool", "Playground.from_scenario"), ("radix", "replay it as 'radix'")],
)
def test_a_scenario_for_another_model_is_refused_clearly(named, words, monkeypatch, capsys) -> None:
    scenario = {"model": named, "config": {"block_size": 4, "num_blocks": 4}, "ops": []}
    code, out, err = run_cli("prefix-cache", scenario, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert words in err and err.count("\n") == 1


def test_an_unknown_model_is_refused(monkeypatch, capsys) -> None:
    code, _, err = run_cli("lru", {"config": {}, "ops": []}, monkeypatch, capsys)
    assert code == 2 and "unknown model 'lru'" in err


# ---------------------------------------------------------------------- the scenario layer (kvlab.scenarios)


def test_every_scenario_module_has_the_same_interface() -> None:
    from kvlab import scenarios

    for model in scenarios.MODULES:
        module = scenarios.module(model)
        assert model == module.NAME
        assert callable(module.replay) and callable(module.Run.apply) and module.OP_FIELDS
    assert set(scenarios.CLI_MODELS) < set(scenarios.MODULES)


def test_block_pool_scenarios_fork_and_refuse_like_the_playground() -> None:
    from kvlab.errors import ScenarioError
    from kvlab.scenarios import block_pool
    from kvlab.views import Playground

    config = {"block_size": 4, "num_blocks": 3, "share_prefixes": True, "hash": "lesson"}
    ops = [
        {"op": "alloc", "req": "A", "tokens": [1, 2, 3, 4, 5, 6]},
        {"op": "fork", "req": "A", "child": "B"},
        {"op": "alloc", "req": "C", "tokens": list(range(100, 140))},  # more than the pool holds
        {"op": "append", "req": "B", "tokens": [7]},  # copy-on-write of the shared partial block
        {"op": "free", "req": "A"},
    ]
    records = block_pool.replay(config, ops)
    assert [r["ok"] for r in records] == [True, True, False, True, True]
    assert records[1]["child"] == "B" and records[1]["block_table"] == [0, 1]
    assert records[3]["block_table"] == [0, 2] and records[3]["new_block_ids"] == []
    assert records[4]["block_table"] == [0, 1] and records[4]["free_queue"] == [1]
    pg = Playground.from_scenario({"model": "block-pool", "config": config, "ops": ops})
    states = [step.state for step in pg.history.steps[1:]]
    assert [list(s.free_queue) for s in states] == [r["free_queue"] for r in records if r["ok"]]
    assert list(pg.refused) == [2]
    for bad, words in [
        ({"op": "fork", "req": "A", "child": "A"}, "op 1: request 'A' is already allocated"),
        ({"op": "fork", "req": "Z", "child": "B"}, "op 1: unknown request 'Z'"),
        ({"op": "probe", "tokens": [1]}, "op 1: unknown op 'probe'"),
    ]:
        with pytest.raises(ScenarioError, match=words):
            block_pool.replay(config, [ops[0], bad])
