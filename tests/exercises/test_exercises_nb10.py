"""Notebook 10's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.core.chat_format import Tokenizer
from kvlab.exercises.nb10 import MESSAGES, _first_requests
from kvlab.lessons.ex10 import EXAMPLE_SYSTEM, LESSON_APPEND_ONLY
from kvlab.server.conversation import replay_chat
from kvlab.server.slots import SlotServer


def test_notebook_10_has_three_exercises():
    assert [e.id for e in ex.exercises("10")] == ["10.1", "10.2", "10.3"]


def test_the_notebooks_messages_give_the_lessons_prompt_sizes():
    turns = replay_chat(
        MESSAGES, system=EXAMPLE_SYSTEM, server=SlotServer(1, cache_ram_mib=0), tokenizer=Tokenizer()
    )
    assert [t.counters for t in turns] == list(LESSON_APPEND_ONLY)


def test_turn_five(feedback):
    feedback("10.1", [107, 15], "7 of the 8", [
        ([108, 14], "last sampled token"),
        ([100, 22], "more than the prompt"),
        ([122, 0], "size of turn 5's prompt"),
        ([107, 22], "prompt_n is the rest"),
        ([107], "[cache_n, prompt_n]"),
        ([106, 16], "only the very last was never read back"),
        ([90, 32], "turn 4's whole 100-token prompt"),
        ([115, 7], "Too many"),
        ([130, 0], "has only 122"),
    ])  # fmt: skip


def test_turn_five_hints_never_give_the_whole_rule():
    from kvlab.exercises.nb10 import turn_five  # noqa: F401  (registers 10.1)

    hints = ex.exercises("10")[0].hints
    assert len(hints) == 3
    assert not any("max_tokens − 1" in h or "max_tokens - 1" in h for h in hints)


def test_the_token_that_is_never_cached():
    assert ex.check("10.2", 60).right
    assert "never computed" in ex.check("10.2", 61).message
    assert "whole new prompt" in ex.check("10.2", 71).message
    assert "*whole* prompt" in ex.check("10.2", 59).message
    assert "Too few" in ex.check("10.2", 40).message
    assert "was its KV ever computed" in ex.check("10.2", 65).message
    assert "more than the second prompt's 71" in ex.check("10.2", 80).message


def test_which_slot_the_second_agent_gets():
    records = _first_requests()
    assert (records["coder"].slot_id, records["coder"].prompt_tokens) == (1, 42)
    assert (records["planner"].selected_by, records["planner"].prompt_tokens) == ("lcp", 41)
    result = ex.check("10.3", [1, 6])
    assert result.right and "0.15" in result.message
    assert "similarity first" in ex.check("10.3", [0, 0]).message
    assert "share nothing" in ex.check("10.3", [1, 0]).message
    assert "Count the shared tokens again" in ex.check("10.3", [1, 3]).message
    assert "two slots" in ex.check("10.3", [2, 6]).message
