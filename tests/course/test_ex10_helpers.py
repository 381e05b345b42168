"""Notebook 10's helpers (kvlab.lessons.ex10) replay what they say, print what the notebook reads and refuse bad input."""

from __future__ import annotations

import pytest

from kvlab.core.chat_format import Message, Tokenizer, render
from kvlab.errors import KvlabError
from kvlab.lessons import ex10
from kvlab.server.conversation import replay_chat
from kvlab.server.slots import SlotServer

MESSAGES = ["List the files in src.", "Open the config.", "Run the tests.", "Show the diff."]


@pytest.fixture(scope="module")
def both_runs() -> tuple[SlotServer, Tokenizer]:
    """Part two's server: the append-only run, then the clock run on the slot it left behind."""
    server, tokenizer = SlotServer(1, cache_ram_mib=0), Tokenizer()
    replay_chat(MESSAGES, system=ex10.EXAMPLE_SYSTEM, server=server, tokenizer=tokenizer, max_tokens=8)
    replay_chat(MESSAGES, system=ex10.EXAMPLE_SYSTEM, server=server, tokenizer=tokenizer, max_tokens=8,
                clock=ex10.clock_at_ten)  # fmt: skip
    return server, tokenizer


def test_two_agents_have_different_system_prompts_and_three_turns_each():
    assert set(ex10.TWO_AGENTS) == {"coder", "planner"}
    (coder, coder_texts), (planner, planner_texts) = ex10.TWO_AGENTS.values()
    assert coder != planner and len(coder_texts) == len(planner_texts) == 3


def test_take_turns_alternates_the_agents_coder_first():
    run = ex10.take_turns(SlotServer(2, cache_ram_mib=0))
    assert [name for name, _ in run] == ["coder", "planner"] * 3
    system, texts = ex10.TWO_AGENTS["coder"]
    first = render([Message("system", system), Message("user", texts[0])], Tokenizer())
    assert run[0][1].prompt_tokens == len(first.tokens)
    # on two slots each agent keeps its own slot from its second turn on
    assert {r.slot_id for name, r in run[2:] if name == "coder"} == {run[0][1].slot_id}


def test_three_servers_and_the_lines_the_notebook_prints():
    results = ex10.two_agents_on_three_servers()
    assert list(results) == ["-np 1", "-np 2", "-np 1 + RAM cache"]
    assert all(r.cache_n == 3 for _, r in results["-np 1"][1:])  # only <|im_start|>system\n survives
    lines = ex10.agent_lines(results)
    assert "longest common prefix" in lines[0]
    assert any("by similarity 0.7" in line for line in lines)
    assert "lcp" not in "\n".join(lines)
    compared = ex10.compare_runs(results["-np 2"], results["-np 1 + RAM cache"], "-np 2", "RAM")
    assert compared == [
        "RAM: cache_n and prompt_n equal -np 2's from request 3 on",
        "  request 2 (planner) differs: cache_n 3, prompt_n 35 against 0 and 38",
    ]


def test_same_counters_from():
    run = ex10.take_turns(SlotServer(2, cache_ram_mib=0))
    assert ex10.same_counters_from(run, run) == 1
    other = ex10.take_turns(SlotServer(1, cache_ram_mib=0))
    assert ex10.same_counters_from(run, other) is None  # they differ up to the last request
    with pytest.raises(KvlabError):
        ex10.same_counters_from(run, run[:2])


def test_where_matches_stop_numbers_requests_from_one(both_runs):
    server, tokenizer = both_runs
    lines = ex10.where_matches_stop(server, tokenizer, requests=(2, 6))
    assert lines[0] == "request 2: cache_n 41 of 56 tokens"
    assert lines[3] == "request 6: cache_n 10 of 68 tokens"
    assert lines[4].endswith("Time: 10:0'")  # the match stops at the minute digit
    assert lines[1] == "  end of the reused part: 'assistant\\n next tests a run reads error returns'", (
        "the snippet starts at a token boundary"
    )
    with pytest.raises(KvlabError):
        ex10.where_matches_stop(server, tokenizer, requests=(9,))
    with pytest.raises(KvlabError):
        ex10.where_matches_stop(server, tokenizer, requests=(0,))


def test_counter_steps_follow_the_servers_history(both_runs):
    server, _ = both_runs
    steps = ex10.counter_steps(server)
    assert len(steps) == len(server.history)
    last = steps[-1].state
    assert [r.cache_n for r in last["append-only"]] == [0, 41, 63, 85]
    assert [r.cache_n for r in last["clock in the system prompt"]] == [3, 10, 10, 10]
    assert steps[0].state["clock in the system prompt"] == [(0, 0)] * 4  # nothing sent yet
    captions = [step.event for step in steps]
    assert captions[1] == "request 1 on slot 0 (the least recently used): cache_n 0, prompt_n 34"
    assert captions[2] == "request 1 done: 8 sampled, slot 0 keeps 41 tokens"
    assert captions[3] == "request 2 on slot 0 (chosen by similarity): cache_n 41, prompt_n 15"
    # request 8 reuses 10 of 112 tokens, 0.089, not above the 0.10 threshold: the server falls back
    assert captions[-2] == "request 8 on slot 0 (the least recently used): cache_n 10, prompt_n 102"
    assert not any("req-" in c or "(lru)" in c or "(lcp)" in c for c in captions)


def test_refusal_line_names_the_modelled_slot():
    real = [{"slot": 1}, {"refused": True}, {"slot": 1}]
    ours = [{"slot": 1}, {"refused": True, "slot": 0}, {"slot": 1}]
    line = ex10.refusal_line(real, ours)
    assert "placed it on slot 0" in line and line.endswith("went to slot 1 | 1")
    with pytest.raises(KvlabError):
        ex10.refusal_line(real, ours[:2])


def test_chat_over_http_agrees_with_kvlab_serve():
    from kvlab.serve import start_server

    server = start_server(cache="slot", slots=1)
    try:
        rows = ex10.chat_over_http(server, MESSAGES[:2])
    finally:
        server.stop()
    assert rows == [("turn 1: cache_n, prompt_n", [0, 34], [0, 34]),
                    ("turn 2: cache_n, prompt_n", [41, 15], [41, 15])]  # fmt: skip


@pytest.mark.parametrize(
    "call",
    [
        lambda: ex10.take_turns("server"),
        lambda: ex10.take_turns(SlotServer(1), max_tokens=0),
        lambda: ex10.counter_steps(SlotServer(1), turns=0),
        lambda: ex10.where_matches_stop(object(), Tokenizer()),
        lambda: ex10.compare_runs([], [], "a", "b"),
        lambda: ex10.chat_over_http(object(), ["hi"]),
        lambda: ex10.arithmetic_report(append_only="abc"),
        lambda: ex10.clock_at_ten(-1),
        lambda: ex10.agent_lines([1]),
        lambda: ex10.agent_lines({"-np 1": [("coder", 3)]}),
        lambda: ex10.same_counters_from(iter([1]), iter([1])),
        lambda: ex10.compare_runs([1], [2], "a", "b"),
        lambda: ex10.where_matches_stop(SlotServer(1), None),
        lambda: ex10.arithmetic_report(append_only=[1, 2]),
    ],
)
def test_bad_input_is_refused_with_kvlabs_error(call):
    with pytest.raises(KvlabError):
        call()
