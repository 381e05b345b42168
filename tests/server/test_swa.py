import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.snapshots import EMPTY, Checkpoint
from kvlab.errors import InvalidArgumentError, KvlabError
from kvlab.lessons.ex12 import example_12, example_12_chat
from kvlab.server.swa import (
    SwaConfig,
    SwaRing,
    SwaSlot,
    checkpoint_plan,
    checkpoint_usable,
    swa_cache_cells,
)
from kvlab.views.text import captions


@pytest.fixture(scope="module")
def ex():
    return example_12()


def spans(cps):
    return [(c.pos_min, c.pos_max, c.n_tokens) for c in cps]


def test_swa_cache_size():
    assert swa_cache_cells(128) == 768  # pad256(128 + 512)
    assert swa_cache_cells(128, swa_full=True) == 4096
    assert swa_cache_cells(1024, n_ctx=65536) == 1536
    assert swa_cache_cells(4096, n_ctx=4096) == 4096  # capped at the context
    assert swa_cache_cells(128, n_seq=4) == 1024
    assert SwaConfig().cells == 768 and SwaConfig(swa_full=True).cells == 4096


def test_checkpoint_placement_matches_the_real_build():
    # notes: 1,800 tokens -> n_tokens 1284 and 1796, covering the 768 cells before each
    assert spans(checkpoint_plan(1800)) == [(516, 1283, 1284), (1028, 1795, 1796)]
    # lesson: 1,841 tokens -> created context checkpoints [557, 1324] at 1325 and [1069, 1836] at 1837
    assert spans(checkpoint_plan(1841)) == [(557, 1324, 1325), (1069, 1836, 1837)]
    assert checkpoint_plan(1841, SwaConfig(ctx_checkpoints=0)) == []
    assert checkpoint_plan(1841, SwaConfig(swa_full=True)) == []


def test_the_lesson_servers(ex):
    for name in ("ctxcp0", "default", "swa_full"):
        long_rec = getattr(ex, name)[0]
        assert (long_rec.prompt_tokens, long_rec.cache_n, long_rec.prompt_n) == (1841, 0, 1841)
    short = ex.default[1]
    assert short.common_prefix == 350 and short.threshold == 222 and short.ring_pos_min == 1073
    assert [(c.pos_min, c.pos_max, c.usable) for c in short.checks] == [
        (1069, 1836, False),
        (557, 1324, False),
    ]
    assert short.forced_full and (short.cache_n, short.prompt_n) == (0, 354)
    assert spans(short.erased) == [(557, 1324, 1325), (1069, 1836, 1837)]
    off = ex.ctxcp0[1]
    assert off.checks == () and off.forced_full and (off.cache_n, off.prompt_n) == (0, 354)
    full = ex.swa_full[1]
    assert not full.forced_full and (full.cache_n, full.prompt_n) == (350, 4)


def test_append_only_follow_up_reuses_everything(ex):
    f = ex.follow_up
    assert (f.threshold, f.ring_pos_min, f.cache_n) == (1713, 1073, 1841)
    assert f.checks == () and not f.forced_full


def test_the_lesson_report(ex):
    assert ex.report() == [
        "position 350 needs SWA entries from 222; SWA cache starts at 1073",
        "checkpoint [1069, 1836]: not usable",
        "checkpoint [557, 1324]: not usable",
        "forcing full prompt re-processing: cache_n = 0",
        "append-only follow-up: needs SWA entries from 1713, cache starts at 1073 -> reuse all 1841 tokens",
    ]


def test_the_ring_after_the_long_prompt_holds_its_last_768_positions(ex):
    after_long = [s.state for s in ex.slots["follow_up"].history if s.state.n_tokens == 1841][-1]
    assert sorted(after_long.cells) == list(range(1073, 1841))
    assert (after_long.pos_min, after_long.pos_max) == (1073, 1840)


def test_the_lesson_rule_on_its_checkpoints():
    for cp in (Checkpoint(557, 1324, 1325), Checkpoint(1069, 1836, 1837)):
        assert not checkpoint_usable(cp, 350, 128)
        assert checkpoint_usable(cp, 1841, 128)
    assert checkpoint_usable(Checkpoint(0, 344, 345), 350, 128)  # starts at 0


def test_chat_endpoint_restores_the_last_user_message_checkpoint():
    a, b, slot = example_12_chat()
    assert spans(a.created) == [(0, 344, 345), (516, 1283, 1284), (1028, 1795, 1796)]
    assert (b.restored.pos_min, b.restored.pos_max, b.restored.n_tokens) == (0, 344, 345)
    assert (b.cache_n, b.prompt_n) == (344, 42)
    assert spans(b.erased) == [(516, 1283, 1284), (1028, 1795, 1796)]
    assert [c.usable for c in b.checks] == [False, False, True]
    # new checkpoints for the new request; the restored checkpoint's data held only its last n_swa
    # positions (llama_kv_cache::state_write skips masked cells), so the ring starts at 344 - 128 + 1
    assert b.created and all(c.pos_min == 217 for c in b.created)
    assert any(s.state.restored is not None for s in slot.history)


def test_a_repeated_prompt_reprocesses_its_last_token():
    slot = SwaSlot()
    slot.complete(list(range(300)))
    rec = slot.complete(list(range(300)))
    assert (rec.cache_n, rec.prompt_n) == (299, 1)


def test_swa_full_takes_the_window_out_of_the_reuse_threshold():
    # server-context.cpp sets n_swa = 0 when --swa-full is on, so the threshold is n_past itself and
    # no checkpoint is searched: the real server answers cache_n 100 here (kvlab used to force 0)
    slot = SwaSlot(SwaConfig(swa_full=True, ctx_checkpoints=0))
    slot.complete(list(range(300)))
    rec = slot.complete(list(range(100)) + [9999])
    assert rec.threshold == 100 and not rec.forced_full and rec.cache_n == 100
    slot = SwaSlot(SwaConfig(swa_full=True, ctx_checkpoints=0))
    slot.complete(list(range(300)))
    rec = slot.complete(list(range(200)) + [9999])
    assert rec.threshold == 200 and (rec.cache_n, rec.forced_full) == (200, False)


def test_checkpoint_limit_drops_the_oldest():
    slot = SwaSlot(SwaConfig(ctx_checkpoints=1))
    rec = slot.complete(list(range(1841)))
    assert spans(rec.created) == [(557, 1324, 1325), (1069, 1836, 1837)]
    assert spans(slot.checkpoints) == [(1069, 1836, 1837)]


def test_history_shows_each_batch_and_checkpoint(ex):
    caps = captions(ex.slots["default"].history)
    assert caps[0] == "empty slot: 768 SWA cells"
    assert "decoded batch [1325, 1837); checkpoint [557, 1324] at 1325 tokens" in caps
    assert any("forcing full prompt re-processing" in c for c in caps)


def test_ring_refuses_a_ubatch_it_cannot_hold():
    ring = SwaRing(4, n_swa=8)
    ring.place(range(4))
    with pytest.raises(KvlabError, match="no room"):
        ring.place([4])
    ring.remove_from(2)
    assert ring.cells == [0, 1, EMPTY, EMPTY] and ring.head == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_swa": 0},
        {"n_ctx": 1},
        {"n_ubatch": 1024, "n_batch": 512},
        {"ctx_checkpoints": -1},
        {"swa_full": 1},
        {"checkpoint_min_step": -5},
    ],
)
def test_bad_config(kwargs):
    with pytest.raises(InvalidArgumentError):
        SwaConfig(**kwargs)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.complete([]),
        lambda s: s.complete("text"),
        lambda s: s.complete(list(range(4096))),
        lambda s: s.complete([1, 2, 3], user_starts=[5]),
        lambda s: s.complete([1, 2, 3], user_starts=[2, 1]),
        lambda s: s.complete([1, 2, 3], max_tokens=-1),
        lambda s: s.complete([1, 2, 3], max_tokens=2, generated=[1, 2, 3]),
        lambda s: s.complete([1, 2, 3], cache_prompt="no"),
        lambda s: checkpoint_plan(0),
        lambda s: checkpoint_usable((1, 2), 3, 4),
        lambda s: SwaSlot("config"),
    ],
)
def test_bad_requests_change_nothing(call):
    slot = SwaSlot()
    slot.complete(list(range(900)), user_starts=[100])
    before = (
        list(slot.ring.cells),
        slot.ring.head,
        list(slot.tokens),
        list(slot.checkpoints),
        len(slot.history),
    )
    with pytest.raises(InvalidArgumentError) as exc:
        call(slot)
    assert str(exc.value)
    assert before == (
        list(slot.ring.cells),
        slot.ring.head,
        list(slot.tokens),
        list(slot.checkpoints),
        len(slot.history),
    )


prompts = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 700), st.integers(0, 3)),  # (family, length, max_tokens)
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(prompts, st.sampled_from([(64, 128), (16, 32)]), st.booleans())
def test_ring_and_counters_stay_consistent(reqs, windows, swa_full):
    n_swa, n_ubatch = windows
    cfg = SwaConfig(n_swa=n_swa, n_ubatch=n_ubatch, n_batch=256, n_ctx=1024, swa_full=swa_full)
    slot = SwaSlot(cfg)
    for family, length, max_tokens in reqs:
        prompt = [family * 10_000 + i for i in range(length)]
        held = list(slot.tokens)
        rec = slot.complete(prompt, max_tokens=max_tokens, user_starts=[length // 2] if length > 2 else [])
        assert rec.cache_n + rec.prompt_n == length and 0 <= rec.cache_n <= length - 1
        lcp = next(
            (i for i, (a, b) in enumerate(zip(held, prompt, strict=False)) if a != b), min(len(held), length)
        )
        assert rec.cache_n <= lcp
        if swa_full and rec.threshold > 0:  # every position is kept: reuse is the plain common prefix
            assert rec.cache_n == min(lcp, length - 1)
        # the ring holds every position the next token's window needs, each once, none from the future.
        # It need not be contiguous: llama.cpp's find_slot reuses masked cells in scan order from its
        # head, so an older masked position can outlive a newer one that was overwritten first.
        n = len(slot.tokens)
        assert slot.tokens[:length] == prompt
        held_pos = sorted(p for p in slot.ring.cells if p != EMPTY)
        assert len(held_pos) == len(set(held_pos)) and all(0 <= p < n for p in held_pos)
        assert set(range(max(0, n - n_swa + 1), n)) <= set(held_pos)  # is_masked_swa: n - p >= n_swa
        for cp in slot.checkpoints:
            assert cp.pos_max == cp.n_tokens - 1 and cp.pos_max - cp.pos_min < cfg.cells
