"""Notebook 14's experiment helpers build what they say, measure with kvlab's timing recipe and refuse bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from hostile import hostile_values  # noqa: E402

from kvlab.core.timing import Timing  # noqa: E402
from kvlab.errors import InvalidArgumentError, KvlabError  # noqa: E402
from kvlab.lessons import attention_demo as demo  # noqa: E402


def _error(batch: demo.PagedBatch, impl: str = "torch") -> float:
    expected = demo.dense_attention(batch.query, batch.keys, batch.values)
    return (batch.attend(impl).double() - expected).abs().max().item()


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_paged_batch_matches_dense_attention_shuffled_and_in_order(one_thread, block_size):
    lengths = [1, 17, 100]
    shuffled = demo.paged_batch(lengths, block_size, seed=3)
    in_order = demo.paged_batch(lengths, block_size, seed=3, shuffled=False)
    assert _error(shuffled) < 1e-5 and _error(in_order) < 1e-5
    # the same keys and values, only placed differently
    assert all(torch.equal(a, b) for a, b in zip(shuffled.keys, in_order.keys, strict=True))
    flat = [
        b
        for row, n in zip(in_order.block_tables.tolist(), lengths, strict=True)
        for b in row[: -(-n // block_size)]
    ]
    assert flat == list(range(len(flat))), "in order: the blocks follow each other, sequence after sequence"
    assert in_order.kv_bytes == in_order.key_cache.nbytes * 2


def test_paged_batch_pools_are_head_major_on_the_cpu_and_flex_gets_a_token_major_copy(one_thread):
    """The CPU default is the head-major pool; token_major() is the same batch as flex reads it, same answers."""
    from kvlab.engine import pool_layout

    batch = demo.paged_batch([5, 40, 90], 16, seed=4)
    assert pool_layout(batch.key_cache) == pool_layout(batch.value_cache) == "head-major"
    token = batch.token_major()
    assert pool_layout(token.key_cache) == "token-major" and token.token_major() is token
    assert torch.equal(token.key_cache, batch.key_cache) and torch.equal(token.value_cache, batch.value_cache)
    assert pool_layout(batch.key_cache) == "head-major"  # the copy leaves the batch as it was
    chosen = demo.paged_batch([5, 40, 90], 16, seed=4, layout="token-major")
    assert pool_layout(chosen.key_cache) == "token-major"
    assert torch.equal(chosen.key_cache, batch.key_cache)
    torch.testing.assert_close(batch.attend("torch"), token.attend("torch"), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_flex_runs_in_the_error_table_and_the_timing_on_its_token_major_copy(one_thread):
    """Notebook 14's helpers hand flex the token-major copy of their head-major batches (flex compiles here)."""
    lines = demo.error_table([3, 40], ["reference", "flex"])
    errors = [float(line.split()[-1]) for line in lines[2:]]
    assert len(errors) == 6 and max(errors) < 2e-3
    timed = demo.decode_against_sdpa(
        ["flex"], num_seqs=2, seq_len=64, num_heads=4, num_kv_heads=2, head_dim=16, repeats=2
    )
    assert {"paged, flex", "paged, flex, blocks in order"} <= set(timed.times)


def test_a_shuffled_pool_is_not_in_order(one_thread):
    batch = demo.paged_batch([300, 300], 16, seed=0)
    flat = [b for row in batch.block_tables.tolist() for b in row]
    assert flat != sorted(flat)


def test_error_table_has_a_row_per_block_size_and_dtype(one_thread):
    lines = demo.error_table([1, 7, 40], ["reference", "torch"])
    assert len(lines) == 2 + 6
    errors = [float(x) for line in lines[2:] for x in line.split()[2:]]
    assert max(errors) < 1e-2  # float16 rows included


def test_block_size_sweep_counts_slots_read_and_times_every_size(one_thread):
    sweep = demo.block_size_sweep([10, 40], [4, 64], repeats=3)
    assert sweep.tokens == 50
    assert sweep.held == {4: 12 + 40, 64: 128}
    assert sweep.table == {4: 10, 64: 1}
    assert all(isinstance(t, Timing) and t.repeats == 3 for t in sweep.times.values())
    lines = sweep.lines(per_token=256)
    assert "64-token blocks: 128 slots held for 50 tokens, 2.56x" in lines[-1]
    assert lines[-2].startswith("CPU time: slowest median")


def test_decode_against_sdpa_times_each_layout_and_a_copy(one_thread):
    result = demo.decode_against_sdpa(
        ["torch"], num_seqs=2, seq_len=64, num_heads=4, num_kv_heads=2, head_dim=8, repeats=2
    )
    assert set(result.times) == {
        "paged, torch",
        "paged, torch, blocks in order",
        "contiguous, torch SDPA",
        "memory copy",
    }
    lines = result.lines()
    assert lines[0].startswith("this CPU: 2 sequences × 64 tokens")
    assert any(line.startswith("paged torch / SDPA, in time:") for line in lines)
    assert any("shuffled blocks / the same blocks in order" in line for line in lines)
    copy = lines[-1]
    assert copy.startswith("against the memory copy's bandwidth: paged torch ") and ", SDPA " in copy
    copy_rate = 2 * result.copy_bytes / result.times["memory copy"].cpu_median_ms
    sdpa_share = result.kv_bytes / result.times["contiguous, torch SDPA"].cpu_median_ms / copy_rate
    assert f"SDPA {100 * sdpa_share:.0f}%" in copy, "the shares are computed from the printed times"


def test_predicted_cached_follows_vllms_rounding():
    assert demo.predicted_cached(64, False) == 0
    assert demo.predicted_cached(64, True) == 48  # the last block holds the last prompt token
    assert demo.predicted_cached(205, True) == 192


def test_verdicts_come_from_the_spreads():
    fast = Timing((1.0, 1.0, 1.1, 1.0), (1.0, 1.0, 1.0, 1.0))
    slow = Timing((3.0, 3.1, 3.0, 3.2), (3.0, 3.0, 3.0, 3.0))
    noisy = Timing((0.5, 4.0, 0.6, 3.9), (1.0, 1.0, 1.0, 1.0))
    assert "clearly faster" in demo._verdict(fast, slow, "a", "b")
    assert "no clear difference" in demo._verdict(noisy, slow, "a", "b")
    sweep = {1: slow, 2: fast, 4: fast, 8: fast}
    lines = demo.sweep_lines(sweep, fit=4)
    assert "2 clients against 1: clearly more" in "\n".join(lines)
    assert "4 clients against 2: not clearly more" in "\n".join(lines)
    assert (
        lines[-2]
        == "against one client, in this run: 2, 4 and 8 clients clearly more throughput than one client"
    )
    assert lines[-1] == (
        "doubling by doubling, in this run some doublings up to 4 clients clearly raised the throughput, not all; "
        "past the pool's 4 requests no doubling clearly raised it"
    )
    mixed = demo.sweep_lines({1: slow, 2: noisy, 4: fast}, fit=4)
    assert mixed[-2] == (
        "against one client, in this run: 4 clients clearly more throughput than one client; 2 clients not clearly more"
    )
    assert "one client's" not in lines[0], "one client is not compared with itself"


def test_sweep_conclusion_follows_every_verdict():
    assert demo._sweep_conclusion({2: True, 4: True, 8: False}, 4).startswith("in this run every doubling")
    assert demo._sweep_conclusion({2: False, 4: False, 8: True}, 4) == (
        "in this run no doubling up to 4 clients clearly raised the throughput; "
        "past the pool's 4 requests a doubling still clearly raised it"
    )
    with_factors = demo._sweep_conclusion({2: True, 4: True, 8: True}, 4, {2: 1.6, 4: 1.5, 8: 1.02})
    assert with_factors.endswith(
        "clearly raised it, by 1.02x at most, against 1.60x for the doubling to 2 clients"
    )


def test_goal_line_is_decided_round_by_round():
    sdpa = Timing((1.0, 1.0, 1.0, 1.0), (1.0,) * 4)
    assert "met in this run" in demo.goal_line(Timing((1.1,) * 4, (1.1,) * 4), sdpa, "paged torch")
    assert "not met in this run" in demo.goal_line(Timing((1.3,) * 4, (1.3,) * 4), sdpa, "paged torch")
    straddle = Timing((1.0, 1.1, 1.3, 1.4), (1.0,) * 4)
    assert "undecided in this run" in demo.goal_line(straddle, sdpa, "paged torch")
    loaded = Timing((1.1, 2.2, 1.1, 3.3), (1.0,) * 4)  # rounds 2 and 4 slowed both calls alike
    assert "met in this run" in demo.goal_line(
        loaded, Timing((1.0, 2.0, 1.0, 3.0), (1.0,) * 4), "paged torch"
    )


class _LyingGoal(float):
    __le__ = __ge__ = lambda self, other: True

    def __format__(self, spec):
        raise RuntimeError("the goal's own formatting ran")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("a", "b"), "low must be a ratio"),
        ((None, None), "low must be a ratio"),
        ((math.nan, math.nan), "low must be a ratio of at least 0"),
        ((1.0, 1.1, "1.2"), "goal must be a ratio from 1 to 100"),
        ((1.0, 1.1, math.nan), "goal must be a ratio from 1 to 100"),
        ((1.0, 1.1, -5), "goal must be a ratio from 1 to 100"),
        ((1.0, 1.1, math.inf), "goal must be a ratio from 1 to 100"),
        ((True, True, True), "goal must be a ratio from 1 to 100"),
        ((5.0, 1.0), "must be at most high"),
    ],
)
def test_goal_verdict_refuses_what_is_not_two_quartiles_and_a_goal(args, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        demo.goal_verdict(*args)


def test_goal_verdict_reads_infinite_quartiles_and_goals_by_value():
    assert demo.goal_verdict(0.5, math.inf) == "undecided"
    assert demo.goal_verdict(1.3, math.inf) == "not met"
    sdpa = Timing((1.0,) * 4, (1.0,) * 4)
    for lie in (_LyingGoal(1000.0), _LyingGoal(math.nan)):
        with pytest.raises(InvalidArgumentError, match="goal must be a ratio from 1 to 100"):
            demo.goal_line(sdpa, sdpa, "paged torch", lie)
    assert "at most 1.2x SDPA: met" in demo.goal_line(sdpa, sdpa, "paged torch", _LyingGoal(1.2))


def test_requests_per_step_counts_the_schedulers_batches(one_thread):
    from kvlab.engine.chat import system_prompt

    prompts = [f"Request {i}:" + system_prompt(80) for i in range(8)]
    counts = demo.requests_per_step(prompts, (1, 2, 4), requests_per_client=1, max_tokens=32)
    assert [counts[c].most_at_once for c in (1, 2, 4)] == [1, 2, 4]  # 8 blocks each: 4 fit the 32-block pool
    assert all(b.per_step == c for c, b in counts.items())
    assert counts == demo.requests_per_step(prompts, (1, 2, 4), requests_per_client=1, max_tokens=32)
    capped = demo.requests_per_step(prompts, (8,), requests_per_client=1, max_tokens=32)[8]
    assert capped.most_at_once == 4 and capped.per_step == 4.0
    lines = demo.batching_lines({**counts, 8: capped}, fit=4)
    assert lines[-1].startswith("with more than 4 clients the largest decode batch is 4: the 4 kvlab's model")


def _cold(*medians: float) -> dict:
    from kvlab.engine.chat import ChatTurnResult

    def turn(m: float) -> ChatTurnResult:
        t = Timing((m * 0.99, m, m * 1.01), (m, m, m))
        return ChatTurnResult(1, 500, 0, 500, m, "", t)

    return {mode: [turn(m)] for mode, m in zip(("slot", "blocks", "off"), medians, strict=True)}


def test_cold_turns_line_has_three_outcomes():
    assert "agree within their IQRs" in demo.cold_turns_line(_cold(100.0, 100.5, 100.2))
    assert "within 5% of each other (slot fastest, off slowest" in demo.cold_turns_line(
        _cold(100.0, 102.0, 105.0)
    )
    assert "slot was clearly faster than blocks (1.50x)" in demo.cold_turns_line(_cold(100.0, 150.0, 101.0))


def test_ttft_by_mode_interleaves_the_modes_and_compares_with_off(one_thread):
    runs = demo.ttft_by_mode(40, repeats=2, turns=2)
    assert list(runs) == ["slot", "blocks", "off"]
    assert all(t.ttft.repeats == 2 for turns in runs.values() for t in turns)
    assert [t.cache_n for t in runs["off"]] == [0, 0] and runs["slot"][1].cache_n > 0
    assert len({turns[0].prompt_tokens for turns in runs.values()}) == 1  # the same turn 1 everywhere
    lines = demo.ttft_lines(runs)
    assert lines[5].startswith("turn 1 prefills all")
    assert any("off's turn 2" in line for line in lines)
    assert demo.least_speedup(runs) > 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: demo.paged_batch([], 16),
        lambda: demo.paged_batch([0], 16),
        lambda: demo.paged_batch([10], 0),
        lambda: demo.paged_batch([10], 16, device="tpu"),
        lambda: demo.paged_batch([10], 16, num_heads=6, num_kv_heads=4),
        lambda: demo.paged_batch([10], 16, shuffled=1),
        lambda: demo.paged_batch([1 << 21] * 64, 16, num_kv_heads=8, head_dim=128, num_heads=8),
        lambda: demo.error_table([4], ["fast"]),
        lambda: demo.block_size_sweep([4], [0]),
        lambda: demo.decode_against_sdpa(["reference"]),
        lambda: demo.predicted_cached(0, True),
        lambda: demo.predicted_cached(10, 1),
        lambda: demo.pool_bytes(object()),
        lambda: demo.sync_for("gpu"),
        lambda: demo.clock_for("tpu"),
        lambda: demo.on_clock(Timing((1.0,), (1.0,)), "sundial"),
        lambda: demo.ttft_by_mode(0),
        lambda: demo.ttft_by_mode(1_000_000),  # 18 engines of a 1M-token context: refused before any is built
        lambda: demo.ttft_lines(None),
        lambda: demo.cold_turns_line({"slot": []}),
        lambda: demo.least_speedup(None),
        lambda: demo.goal_line(None, None, "x"),
        lambda: demo.goal_line(Timing((1.0,), (1.0,)), Timing((1.0,), (1.0,)), "x", goal=0),
        lambda: demo.dense_attention(None, None, None),
        lambda: demo.paged_batch([4], 4, dtype="float32"),
        lambda: demo.paged_batch([4], 4, layout="NHD"),
        lambda: demo.paged_batch([4], 4, layout=None),
        lambda: demo.ttft_by_mode(10, repeats=0),
        lambda: demo.ttft_by_mode(10, device="tpu"),
        lambda: demo.requests_per_step(["a prompt"], (2,)),
        lambda: demo.requests_per_step(["a prompt"], (0,)),
        lambda: demo.requests_per_step("a prompt"),
    ],
)
def test_bad_input_is_refused_with_kvlabs_error(call):
    with pytest.raises(KvlabError):
        call()


@settings(max_examples=40, deadline=None)
@given(hostile_values())
def test_hostile_lengths_and_block_sizes_are_refused_or_handled(value):
    for call in (lambda: demo.paged_batch(value, 16), lambda: demo.paged_batch([5], value)):
        try:
            batch = call()
        except KvlabError:
            continue
        assert batch.seq_lens.numel() >= 1


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=4), st.sampled_from([1, 16, 64]))
def test_any_small_batch_matches_dense_attention(lengths, block_size):
    assert _error(demo.paged_batch(lengths, block_size)) < 1e-5


@pytest.mark.parametrize(
    "call",
    [
        lambda: demo.ttft_by_mode(20_000),  # past the stated prefill work bound
        lambda: demo.error_table([4], ["torch", "torch"]),  # an implementation named twice
        lambda: demo.block_size_sweep([4], [4, 4]),  # a block size named twice
    ],
    ids=["ttft work bound", "impls twice", "block sizes twice"],
)
def test_bounds_are_refused_before_any_work(call):
    with pytest.raises(KvlabError):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_with_kvlabs_error():
    with pytest.raises(KvlabError, match="cpu"):
        demo.paged_batch([4], 4, device="cuda")


def test_the_scattering_line_says_where_the_gap_to_sdpa_is():
    ordered = Timing((1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0))
    small = Timing((1.05, 1.08, 1.06, 1.07), (1.0, 1.0, 1.0, 1.0))
    large = Timing((1.4, 1.5, 1.45, 1.5), (1.0, 1.0, 1.0, 1.0))
    same = Timing((0.98, 0.99, 0.97, 0.99), (1.0, 1.0, 1.0, 1.0))
    slow_sdpa = Timing((0.8, 0.8, 0.8, 0.8), (1.0, 1.0, 1.0, 1.0))  # in-order is 1.25x SDPA
    line = demo._scattering_line(small, ordered, slow_sdpa)
    assert "at most 7% of the in-order time" in line and "on blocks in order, is 1.25x SDPA" in line
    assert "most of the gap to SDPA is the kernel's own work" in line
    assert "most of the gap to SDPA is the scattering" in demo._scattering_line(large, ordered, slow_sdpa)
    assert "nothing measurable" in demo._scattering_line(same, ordered, slow_sdpa)
    assert "lost nothing" in demo._scattering_line(same, ordered, ordered)
    near = Timing((0.93, 0.94, 0.92, 0.95), (1.0, 1.0, 1.0, 1.0))  # in-order about 1.07x SDPA, like small
    assert "cannot tell which of the two costs more" in demo._scattering_line(small, ordered, near)


def test_an_iqr_under_one_percent_is_never_printed_as_zero():
    """39.4-39.6 ms around 39.5 is a 0.5% spread: the cold-turn line says 0.5%, not 0%."""
    from kvlab.core.timing import Timing
    from kvlab.lessons.attention_demo import _percent

    assert _percent(Timing((39.4, 39.4, 39.5, 39.6, 39.6), (1.0,) * 5)) == "0.5%"
    assert _percent(Timing((10.0, 11.0, 12.0, 13.0, 14.0), (1.0,) * 5)) == "17%"
