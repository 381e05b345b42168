"""Hostile input for the Playground and the Stepper: every method works or refuses with kvlab's error,
and a refused call leaves the widget exactly as it was (its ops, refusals, model state and step)."""

from __future__ import annotations

import json

import pytest
from hostile import LyingDict, LyingStr, all_hostile_values, kvlab_or_ok
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError, ScenarioError
from kvlab.lessons import ex07
from kvlab.views import Playground, Stepper

FAST = settings(max_examples=25, deadline=None)


def _playground() -> Playground:
    pg = Playground(num_blocks=8, block_size=4)
    pg.allocate("A", 6, 0)
    pg.allocate("B", 5, 4)
    return pg


PLAYGROUND = _playground()
STEPPER = Stepper(ex07.example_7().history)


def _widget_state(pg: Playground) -> tuple:
    return json.dumps(pg.scenario()), dict(pg.refused), pg.model.snapshot(), len(pg.history)


def _refused_or_ok(pg: Playground, call) -> None:
    before = _widget_state(pg)
    try:
        call(pg)
    except KvlabError as exc:
        assert str(exc)
        assert _widget_state(pg) == before, "a refused call changed the playground"
    else:
        pg.undo()  # keep the shared playground as it was for the next example


@FAST
@given(value=all_hostile_values(), other=st.one_of(all_hostile_values(), st.sampled_from(["A", "C", 3, 0])))
def test_every_playground_method_refuses_hostile_values(value, other):
    pg = PLAYGROUND
    _refused_or_ok(pg, lambda p: p.allocate(value, 4))
    _refused_or_ok(pg, lambda p: p.allocate("C", value))
    _refused_or_ok(pg, lambda p: p.allocate("C", 4, value))
    _refused_or_ok(pg, lambda p: p.allocate("C", 4, 0, value))
    _refused_or_ok(pg, lambda p: p.append(value, other))
    _refused_or_ok(pg, lambda p: p.free(value))
    _refused_or_ok(pg, lambda p: p.fork(value, other))
    _refused_or_ok(pg, lambda p: p.apply(value))
    _refused_or_ok(pg, lambda p: p.apply({"op": "alloc", "req": value, "tokens": [1, 2]}))
    _refused_or_ok(pg, lambda p: p.apply({"op": value, "req": "C", "tokens": [1]}))
    before = _widget_state(pg)
    with pytest.raises(KvlabError):
        pg.load(value)
    assert _widget_state(pg) == before
    kvlab_or_ok(lambda: Playground(value))
    kvlab_or_ok(lambda: Playground(num_blocks=value))
    kvlab_or_ok(lambda: Playground(hash_scheme=value))
    kvlab_or_ok(lambda: Playground.from_scenario(pg.scenario(), model=value))
    kvlab_or_ok(lambda: Playground.from_scenario(value))


def test_an_applied_op_is_a_copy_the_caller_cannot_change_afterwards():
    pg = Playground(num_blocks=8, block_size=4)
    op = {"op": "alloc", "req": "A", "tokens": [1, 2, 3]}
    pg.apply(op)
    op["tokens"].append(99)
    op["req"] = "Z"
    assert pg.scenario()["ops"] == [{"op": "alloc", "req": "A", "tokens": [1, 2, 3]}]


def test_a_dict_subclass_op_whose_methods_raise_is_refused_and_recorded_nowhere():
    pg = _playground()
    before = _widget_state(pg)
    with pytest.raises(ScenarioError):
        pg.apply(LyingDict(op="free", req="A"))
    assert _widget_state(pg) == before


def test_a_lying_string_request_id_is_read_as_its_plain_text():
    pg = Playground(num_blocks=8, block_size=4)
    pg.allocate(LyingStr("A"), 4)
    assert pg.scenario()["ops"][0]["req"] == "A"
    assert type(pg.scenario()["ops"][0]["req"]) is str


@FAST
@given(value=all_hostile_values())
def test_every_stepper_method_refuses_hostile_values(value):
    st_ = STEPPER
    before = st_.index
    for call in (
        lambda: st_.go_to(value),
        lambda: st_.step(value),
        lambda: st_.spec(value, 0),
        lambda: st_.spec(0, value),
    ):
        try:
            call()
        except KvlabError as exc:
            assert str(exc)
            assert st_.index == before, "a refused call moved the stepper"
        st_.go_to(before)
    kvlab_or_ok(lambda: Stepper(value))
    kvlab_or_ok(lambda: Stepper(ex07.example_7().history, value))
    kvlab_or_ok(lambda: Stepper(ex07.example_7().history, highlight=value))
