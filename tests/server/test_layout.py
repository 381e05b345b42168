import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import InvalidArgumentError
from kvlab.lessons.ex09 import example_9
from kvlab.server.layout import (
    SCHEMES,
    AgentSession,
    Segment,
    chained_hashes,
    fixed,
    history,
    new_message,
    per_turn,
    run_layout,
    system_prompt,
    timestamp,
    tool_definitions,
)

LESSON_LINES = [
    "stable prefix          prompt tokens  13700, cached  11696, hit rate  85.4%",
    "timestamp first        prompt tokens  13800, cached      0, hit rate   0.0%",
    "tools in random order  prompt tokens  13700, cached   2736, hit rate  20.0%",
]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_lesson_figures_with_every_hash_chain(scheme):
    runs = example_9(scheme)
    assert [r.line() for r in runs.values()] == LESSON_LINES
    stable = runs["stable prefix"]
    assert (stable.total_tokens, stable.cached_tokens) == (13_700, 11_696)
    assert f"{100 * stable.hit_rate:.1f}" == "85.4"


def test_stable_layout_reuses_the_previous_prompt_up_to_its_last_full_block():
    turns = example_9()["stable prefix"].turns
    assert turns[0].cached_tokens == 0
    for prev, t in zip(turns, turns[1:], strict=False):
        assert t.cached_tokens == prev.prompt_tokens // 16 * 16
        assert t.first_change == prev.prompt_tokens and t.changed_segment == "history"
    assert [s.name for s in turns[3].segments] == ["system prompt", "tools", "history", "new message"]
    assert [(s.start, s.length) for s in turns[3].segments] == [(0, 300), (300, 500), (800, 360), (1160, 30)]


def test_a_leading_timestamp_misses_everything():
    for t in example_9()["timestamp first"].turns[1:]:
        assert t.cached_tokens == 0 and t.first_change == 0 and t.changed_segment == "timestamp"
        assert t.first_miss_segment == "timestamp"


def test_shuffled_tools_keep_only_the_blocks_before_the_first_moved_tool():
    turns = example_9()["tools in random order"].turns
    for t in turns[1:]:
        assert t.changed_segment == "tools"
        assert t.cached_tokens >= 288  # the system prompt's full blocks always hit
        assert t.first_miss_segment in ("system prompt", "tools")
    assert sum(t.cached_tokens for t in turns) == 2736


def test_a_layout_of_your_own():
    layout = [
        fixed("rules", range(1000, 1100)),
        per_turn("date", lambda turn: [7000 + turn]),
        history(),
        new_message(),
    ]
    run = run_layout(layout, name="date after rules", turns=5)
    assert [t.cached_tokens for t in run.turns] == [0, 96, 96, 96, 96]
    assert all(t.changed_segment == "date" for t in run.turns[1:])
    better = run_layout(
        [fixed("rules", range(1000, 1100)), history(), per_turn("date", lambda t: [7000 + t])], turns=5
    )
    assert better.hit_rate > run.hit_rate
    custom = Segment("notes", lambda session, turn: session.system()[:20])
    assert run_layout([custom], turns=2).turns[1].cached_tokens == 16


def test_java_chain_is_the_lessons_long_arithmetic():
    # h = 17 * 1_000_003 + hashCode([0..15]) as a Java long
    h = 1
    for v in range(16):
        h = (31 * h + v) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    assert chained_hashes(list(range(20)), 16, "java") == [(17 * 1_000_003 + h) % (1 << 64)]


@pytest.mark.parametrize(
    "call",
    [
        lambda: run_layout([]),
        lambda: run_layout(system_prompt()),
        lambda: run_layout(["system"]),
        lambda: run_layout([system_prompt()], turns=0),
        lambda: run_layout([system_prompt()], block_size=0),
        lambda: run_layout([system_prompt()], scheme="md5"),
        lambda: run_layout([system_prompt()], session="s"),
        lambda: run_layout([system_prompt()], name=3),
        lambda: run_layout([per_turn("bad", lambda t: "abc")]),
        lambda: run_layout([per_turn("boom", lambda t: 1 / 0)]),
        lambda: run_layout([fixed("big", [2**40])], scheme="java"),
        lambda: run_layout([fixed("big", [2**40])], scheme="lesson"),
        lambda: Segment("", lambda s, t: []),
        lambda: Segment("x", 5),
        lambda: fixed("x", "abc"),
        lambda: per_turn("x", 5),
        lambda: tool_definitions(shuffled="yes"),
        lambda: AgentSession(system_tokens=-1),
        lambda: AgentSession(tool_tokens=101),
        lambda: chained_hashes([1, 2], 16, "sha1"),
    ],
)
def test_bad_inputs(call):
    with pytest.raises(InvalidArgumentError) as exc:
        call()
    assert str(exc.value)


def test_a_failed_run_leaves_the_session_untouched():
    session = AgentSession()
    before = session.random.next_int(), session.history[:]
    session = AgentSession()
    with pytest.raises(InvalidArgumentError, match="turn 3"):
        run_layout(
            [tool_definitions(shuffled=True), history(), per_turn("bad", lambda t: [1] if t < 3 else 1 / 0)],
            session=session,
        )
    assert (session.random.next_int(), session.history) == before


parts = st.sampled_from(["system", "tools", "shuffled", "history", "message", "timestamp", "rules"])
MAKERS = {
    "system": system_prompt,
    "tools": tool_definitions,
    "shuffled": lambda: tool_definitions(shuffled=True),
    "history": history,
    "message": new_message,
    "timestamp": timestamp,
    "rules": lambda: fixed("rules", range(64)),
}


@settings(max_examples=40, deadline=None)
@given(st.lists(parts, min_size=1, max_size=6), st.sampled_from([8, 16, 32]), st.integers(2, 6))
def test_cached_tokens_are_whole_blocks_and_at_least_the_common_prefix(names, block_size, turns):
    run = run_layout([MAKERS[n]() for n in names], turns=turns, block_size=block_size)
    prev = None
    for t in run.turns:
        assert t.cached_tokens % block_size == 0 and 0 <= t.cached_tokens <= t.prompt_tokens
        if prev is not None:
            # every block of the common prefix with the previous prompt was cached then
            assert t.cached_tokens >= min(t.first_change, prev.prompt_tokens) // block_size * block_size
        prev = t


def test_a_str_subclass_whose_methods_raise_or_lie_is_read_as_its_plain_text():
    """A name, a segment name or a scheme that is a hostile str subclass: kvlab reads its plain text."""
    from hostile import LyingList, LyingStr

    from kvlab.errors import InvalidArgumentError
    from kvlab.server import layout

    segments = [layout.system_prompt(), layout.Segment(LyingStr("tools"), lambda s, t: s.tools()[0])]
    run = layout.run_layout(segments, name=LyingStr("custom"), turns=2, scheme=LyingStr("lesson"))
    assert type(run.name) is str and run.name == "custom"
    assert type(run.scheme) is str and run.line().startswith("custom")
    assert [span.name for span in run.turns[0].segments] == ["system prompt", "tools"]
    with pytest.raises(InvalidArgumentError, match="segments"):
        layout.run_layout(LyingList([layout.system_prompt()]), turns=1)
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        layout.Segment(LyingStr(""), lambda s, t: [])
