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
