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
        # the ring holds every position the next token's window needs, each once, none from the future,
        # and no gaps: apply_ubatch purges every position older than one it overwrites
        n = len(slot.tokens)
        assert slot.tokens[:length] == prompt
        held_pos = sorted(p for p in slot.ring.cells if p != EMPTY)
        assert len(held_pos) == len(set(held_pos)) and all(0 <= p < n for p in held_pos)
        assert set(range(max(0, n - n_swa + 1), n)) <= set(held_pos)  # is_masked_swa: n - p >= n_swa
        assert not held_pos or held_pos == list(range(held_pos[0], held_pos[-1] + 1))
        for cp in slot.checkpoints:
            assert cp.pos_max == cp.n_tokens - 1 and cp.pos_max - cp.pos_min < cfg.cells
        assert len({cp.n_tokens for cp in slot.checkpoints}) == len(slot.checkpoints)  # superseded


def seq(start, n):
    """The harness's deterministic token runs (``llama_harness._seq`` with the tiny 512-token vocabulary)."""
    return [3 + (start + 7 * i) % 509 for i in range(n)]


def test_overwriting_a_cell_purges_every_older_position():
    # apply_ubatch: "all positions between [pos_min, pos_max] ... will be present", so reusing the
    # cell of position 2 frees positions 0 and 1 too, although find_slot did not pick them
    ring = SwaRing(4, 2)
    ring.cells, ring.head = [0, 2, 3, 1], 1
    ring.place([4])
    assert ring.cells == [EMPTY, 4, 3, EMPTY] and ring.head == 2
    ring.place([5])  # position 3 (cell 2, at the head) has left the window: reused, nothing older left
    assert ring.cells == [EMPTY, 4, 5, EMPTY] and ring.head == 3
    # a restored copy keeps only its last n_swa positions, read back in the copy's cell order from
    # the head seq_rm left (the first cell it freed)
    ring.load([3, 0, 1, 2])
    assert ring.cells == [EMPTY, 3, 2, EMPTY] and ring.head == 3


def test_a_checkpoint_made_after_a_restore_matches_the_real_server():
    # llama_harness (0c1e57098, gemma3 window 128, -c 4096): without the purge kvlab said pos_min 248
    a = seq(2071, 903)
    b = a[:375] + seq(26923, 276)
    c = b + seq(14498, 388)
    slot = SwaSlot(SwaConfig(ctx_checkpoints=32))
    assert spans(slot.complete(a, max_tokens=1).created) == [(0, 386, 387), (131, 898, 899)]
    rec = slot.complete(b, max_tokens=1)
    assert rec.cache_n == 375 and spans(rec.created) == [(135, 374, 375), (248, 646, 647)]
    rec = slot.complete(c, max_tokens=1)
    assert rec.cache_n == 651 and spans(rec.created) == [(248, 650, 651), (394, 1034, 1035)]


@pytest.mark.parametrize(
    ("min_step", "after"),
    [
        # default spacing (8192): the list is nearly full, so the earlier request's second checkpoint
        # is "too close" to its first and goes; the first always stays
        (8192, [(0, 483, 484), (1016, 1783, 1784), (1528, 2295, 2296)]),
        # 300 tokens apart is far enough: only the oldest goes
        (300, [(828, 1595, 1596), (1016, 1783, 1784), (1528, 2295, 2296)]),
    ],
)
def test_checkpoints_too_close_to_an_earlier_one_are_erased_when_the_list_fills(min_step, after):
    # create_checkpoint, checked on the real server with -ctxcp 3 (tools/conformance)
    a = seq(1, 1000)
    b = a + seq(2, 600)
    slot = SwaSlot(SwaConfig(ctx_checkpoints=3, checkpoint_min_step=min_step))
    slot.complete(a, max_tokens=1)
    slot.complete(b, max_tokens=1)
    first = [(0, 483, 484), (316, 1083, 1084), (828, 1595, 1596)]
    assert spans(slot.checkpoints) == (first if min_step == 8192 else [(228, 995, 996), *first[1:]])
    rec = slot.complete(b + seq(3, 700), max_tokens=1)
    assert rec.cache_n == 1600 and spans(slot.checkpoints) == after


def test_n_predict_zero_still_samples_one_token():
    # the real server answers n_predict 0 with one token (predicted_n 1); it is never cached
    slot = SwaSlot()
    rec = slot.complete(list(range(300)), max_tokens=0)
    assert rec.n_generated == 1 and slot.tokens == list(range(300))
    rec = slot.complete(list(range(300)), max_tokens=0, generated=[])
    assert rec.n_generated == 1 and rec.cache_n == 299


def test_the_too_close_scan_stops_once_the_list_has_room():
    # create_checkpoint re-tests the size on every step: with -ctxcp 5 the third request's first
    # checkpoint erases [0, 610] (too close to [0, 98]) and stops, so [0, 713] stays; checked on the
    # real server (tools/conformance, llama.cpp 0c1e57098)
    a = seq(197, 615)
    b = a + seq(2167, 103)
    slot = SwaSlot(SwaConfig(ctx_checkpoints=5))
    slot.complete(a, max_tokens=1)
    slot.complete(b, max_tokens=1)
    assert spans(slot.checkpoints) == [(0, 98, 99), (0, 610, 611), (0, 614, 615), (0, 713, 714)]
    slot.complete(b + seq(2168, 30), max_tokens=1)
    assert spans(slot.checkpoints) == [(0, 98, 99), (0, 713, 714), (0, 717, 718), (0, 743, 744)]
