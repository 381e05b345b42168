import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import InvalidArgumentError
from kvlab.lessons.ex13 import example_13
from kvlab.server.agents import AppendOnly, HistoryPolicy, KeepLast, SummarizeOnce, run_agent
from kvlab.server.slots import SlotServer

LESSON_LINES = [
    "append-only                        processed  10000 tokens, worst turn  2400, final prompt 10000",
    "keep only the last 5 tool results  processed  34000 tokens, worst turn  2400, final prompt  4000",
    "append-only, one summary at 12     processed  10300 tokens, worst turn  2400, final prompt  5500",
]


def test_the_lesson_figures():
    assert [r.line() for r in example_13().values()] == LESSON_LINES


def test_the_same_figures_through_the_llama_server_slot_model():
    assert [r.line() for r in example_13(server_ctx=16_384).values()] == LESSON_LINES


def test_per_turn_records():
    runs = example_13()
    assert [t.processed_tokens for t in runs["append-only"].turns] == [2400] + [400] * 19
    keep = runs["keep only the last 5 tool results"].turns
    assert [t.processed_tokens for t in keep] == [2400] + [400] * 4 + [2000] * 15
    assert all(t.common_prefix == 2000 for t in keep[5:])  # diverges right after the fixed prefix
    summary = runs["append-only, one summary at 12"].turns
    # the lesson's text says 1,100 for turn 13, but its own output (10,300 in all) needs 300 + 400
    assert [t.processed_tokens for t in summary] == [2400] + [400] * 11 + [700] + [400] * 7
    assert [t.prompt_tokens for t in summary][11:14] == [6800, 2700, 3100]
    for t in summary:
        assert t.cached_tokens + t.processed_tokens == t.prompt_tokens


def test_a_policy_of_your_own():
    def keep_first_and_last(prefix, results):
        kept = results[:1] + results[-1:] if len(results) > 1 else results
        return [*prefix, *(t for r in kept for t in r)]

    assert isinstance(keep_first_and_last, HistoryPolicy)
    run = run_agent(keep_first_and_last, turns=4, prefix_tokens=100, result_tokens=10)
    assert run.name == "keep_first_and_last"
    assert [t.processed_tokens for t in run.turns] == [110, 10, 10, 10]


@pytest.mark.parametrize(
    "call",
    [
        lambda: run_agent(5),
        lambda: run_agent(AppendOnly(), turns=0),
        lambda: run_agent(AppendOnly(), result_tokens=0),
        lambda: run_agent(AppendOnly(), first_result_id=10),
        lambda: run_agent(AppendOnly(), name=7),
        lambda: run_agent(AppendOnly(), server="llama"),
        lambda: run_agent(lambda p, r: "text"),
        lambda: run_agent(lambda p, r: []),
        lambda: run_agent(lambda p, r: 1 / 0),
        lambda: KeepLast(0),
        lambda: SummarizeOnce(after=0),
        lambda: SummarizeOnce(summary_tokens=-1),
    ],
)
def test_bad_inputs(call):
    with pytest.raises(InvalidArgumentError) as exc:
        call()
    assert str(exc.value)


def test_a_prompt_too_long_for_the_server_changes_nothing():
    server = SlotServer(1, n_ctx=5000, cache_ram_mib=0)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        run_agent(AppendOnly(), server=server)
    assert server.records == [] and len(server.history) == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.integers(0, 300), st.integers(1, 80), st.integers(2, 12))
def test_policies_pay_the_prompt_minus_the_reused_prefix(keep, after, prefix, result, turns):
    for policy in (AppendOnly(), KeepLast(keep), SummarizeOnce(after, summary_tokens=50)):
        plain = run_agent(policy, turns=turns, prefix_tokens=prefix, result_tokens=result)
        served = run_agent(
            policy,
            turns=turns,
            prefix_tokens=prefix,
            result_tokens=result,
            server=SlotServer(1, n_ctx=20_000, cache_ram_mib=0),
        )
        for a, b in zip(plain.turns, served.turns, strict=True):
            assert a.processed_tokens == a.prompt_tokens - a.common_prefix
            assert b.processed_tokens == a.prompt_tokens - min(a.common_prefix, a.prompt_tokens - 1)
        if isinstance(policy, AppendOnly):
            assert plain.total_processed == prefix + turns * result
