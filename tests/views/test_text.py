"""kvlab.views.text: one caption module per model, named for its events' prefix."""

from __future__ import annotations

import pytest

from kvlab.core.snapshots import Event, History, Step
from kvlab.errors import InvalidArgumentError
from kvlab.views import text


def test_every_event_kind_is_described_in_the_module_named_for_its_prefix():
    text._load()
    assert text._DESCRIBE, "no captions registered"
    for kind, describe in text._DESCRIBE.items():
        prefix = kind.rpartition(".")[0]
        assert describe.__module__ == f"kvlab.views.text.{prefix}", kind


def test_caption_of_a_hand_written_step_is_its_text_and_unknown_kinds_are_refused():
    assert text.caption(Step(0, "start", None)) == "start"
    with pytest.raises(InvalidArgumentError, match="no caption is registered"):
        text.caption(Event.of("nowhere.op"))
    with pytest.raises(InvalidArgumentError, match="Step or Event"):
        text.caption(42)


def test_history_find_names_the_kinds_it_has_when_nothing_matches():
    history = History()
    history.add(Event.of("paged.init", num_blocks=4, block_size=16), None)
    history.add(Event.of("paged.free", request_id="A", freed=(1,)), None)
    assert history.find("paged.free", request_id="A").index == 1
    with pytest.raises(InvalidArgumentError, match=r"\['paged.free', 'paged.init'\]"):
        history.find("paged.free", request_id="B")
