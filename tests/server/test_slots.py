import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.chat_format import Message, Tokenizer, render
from kvlab.errors import DuplicateRequestError, InvalidArgumentError, SlotBusyError, UnknownRequestError
from kvlab.lessons.ex10 import (
    EXAMPLE_MESSAGES,
    EXAMPLE_SYSTEM,
    LESSON_APPEND_ONLY,
    LESSON_CLOCK,
    NOTES_APPEND_ONLY,
    arithmetic_report,
    clock_at_ten,
    example_10,
)
from kvlab.server.conversation import predicted_cache_n, replay_chat, tokens_processed
from kvlab.server.slots import MIB, SlotServer, common_prefix
from kvlab.views.text import caption

LESSON_LINES = [
    "turn 1: +34 tokens, predicted cache_n   0, observed   0, processed  34",
    "turn 2: +22 tokens, predicted cache_n  41, observed  41, processed  15",
    "turn 3: +22 tokens, predicted cache_n  63, observed  63, processed  15",
    "turn 4: +22 tokens, predicted cache_n  85, observed  85, processed  15",
    "tokens processed over 4 turns: append-only 79, timestamp in system prompt 283",
]


# ---------------------------------------------------------------- the lesson's recorded values


def test_the_lesson_arithmetic_lines():
    assert arithmetic_report() == LESSON_LINES


def test_the_rule_explains_the_recorded_cache_n():
    sizes = [t.prompt_tokens for t in LESSON_APPEND_ONLY]
    assert predicted_cache_n(sizes, 8) == [0, 41, 63, 85] == [t.cache_n for t in LESSON_APPEND_ONLY]
    notes = [t.prompt_tokens for t in NOTES_APPEND_ONLY]
    assert predicted_cache_n(notes, 8) == [t.cache_n for t in NOTES_APPEND_ONLY] == [0, 83, 141, 191]
    assert tokens_processed(LESSON_APPEND_ONLY) == 79
    assert tokens_processed(LESSON_CLOCK) == 283
    for t in LESSON_APPEND_ONLY + LESSON_CLOCK + NOTES_APPEND_ONLY:
        assert t.prompt_n == t.prompt_tokens - t.cache_n


# ---------------------------------------------------------------- kvlab's own replay


def test_kvlab_replay_follows_the_rule_and_the_clock_collapses_reuse():
    ex = example_10()
    plain, timed = ex.kvlab_append_only, ex.kvlab_clock
    assert plain[0].cache_n == 0
    for prev, t in zip(plain, plain[1:], strict=False):
        assert t.cache_n == prev.prompt_tokens + 8 - 1 == t.predicted_cache_n
        assert t.prompt_n == t.prompt_tokens - t.cache_n
    # turn 1 of the clock run finds only "<|im_start|>system\n" left by the append-only run
    assert timed[0].cache_n == len(Tokenizer().encode("<|im_start|>system\n")) == 3
    # later turns reuse exactly the common prefix of consecutive prompts: template + "Time: 10:0"
    tok = Tokenizer()
    prompts, history = [], []
    for i, (msg, turn) in enumerate(zip(EXAMPLE_MESSAGES, timed, strict=True)):
        p = render([Message("system", clock_at_ten(i) + EXAMPLE_SYSTEM), *history, Message("user", msg)], tok)
        assert len(p) == turn.prompt_tokens
        prompts.append(p.tokens)
        history += [Message("user", msg), Message("assistant", turn.reply)]
    for prev, cur, turn in zip(prompts, prompts[1:], timed[1:], strict=False):
        assert turn.cache_n == common_prefix(prev, cur) == 10
        assert turn.cache_n < turn.predicted_cache_n
    assert tokens_processed([t.counters for t in timed]) > 3 * tokens_processed([t.counters for t in plain])
    rows = ex.rows()
    assert len(rows) == 8 and rows[1]["lesson_cache_n"] == 41 and rows[1]["kvlab_cache_n"] == plain[1].cache_n


# ---------------------------------------------------------------- slot rules


def test_the_slot_keeps_the_prompt_and_all_but_the_last_sampled_token():
    s = SlotServer(cache_ram_mib=0)
    rec = s.complete([1, 2, 3, 4], max_tokens=8, generated=[9, 8, 7, 6, 5, 4, 3, 2])
    assert rec.n_generated == 8
    assert s.slot_tokens(0) == (1, 2, 3, 4, 9, 8, 7, 6, 5, 4, 3)
    assert s.complete([1, 2, 3, 4], max_tokens=0).cache_n == 3  # everything cached: the last token again
    assert s.slot_tokens(0) == (1, 2, 3, 4)


def test_a_fully_cached_prompt_still_processes_one_token():
    s = SlotServer(cache_ram_mib=0)
    s.complete(list(range(50)), max_tokens=1)
    rec = s.complete(list(range(50)), max_tokens=1)
    assert (rec.cache_n, rec.prompt_n) == (49, 1)


def test_cache_prompt_off_processes_everything():
    s = SlotServer(cache_ram_mib=0)
    s.complete(list(range(50)), max_tokens=4)
    assert s.complete(list(range(60)), cache_prompt=False).cache_n == 0
    t = SlotServer(cache_ram_mib=0, cache_prompt=False)
    t.complete(list(range(50)))
    assert t.complete(list(range(60))).cache_n == 0


def test_generation_stops_when_the_slot_is_full():
    s = SlotServer(n_ctx=10, cache_ram_mib=0)
    rec = s.complete(list(range(7)), max_tokens=8)
    assert rec.n_generated == 3 and len(s.slot_tokens(0)) == 9


def test_lru_tie_goes_to_the_last_slot_and_lcp_keeps_conversations_on_their_slots():
    s = SlotServer(2, cache_ram_mib=0)
    a = list(range(100, 200))
    b = list(range(500, 600))
    r1 = s.complete(a, max_tokens=4)
    assert (r1.slot_id, r1.selected_by) == (1, "lru")  # no slot used yet: the server's <= picks the last
    r2 = s.complete(b, max_tokens=4)
    assert (r2.slot_id, r2.selected_by) == (0, "lru")
    for turn in range(2):
        ra = s.complete(a + list(range(300, 320 + turn)), max_tokens=4)
        rb = s.complete(b + list(range(700, 720 + turn)), max_tokens=4)
        assert (ra.slot_id, ra.selected_by, rb.slot_id, rb.selected_by) == (1, "lcp", 0, "lcp")
        expect = 100 if turn == 0 else 120 + 3  # then the previous prompt + max_tokens - 1
        assert ra.cache_n == rb.cache_n == min(expect, 120)


def test_similarity_must_be_strictly_above_the_threshold():
    s = SlotServer(2, cache_ram_mib=0)
    s.complete(list(range(10)), max_tokens=1)  # slot 1
    # 10 shared tokens of a 100-token prompt: similarity exactly 0.10, not above it
    rec = s.complete(list(range(10)) + list(range(1000, 1090)))
    assert rec.selected_by == "lru" and rec.slot_id == 0 and rec.cache_n == 0
    rec = s.complete(list(range(10)) + list(range(2000, 2089)))  # 10/99 > 0.10 on both slots
    # equal similarity: the first slot found keeps it (the server compares with >)
    assert rec.selected_by == "lcp" and rec.slot_id == 0 and rec.similarity == pytest.approx(10 / 99)
    off = SlotServer(2, cache_ram_mib=0, slot_prompt_similarity=0.0)
    off.complete(list(range(20)))
    assert off.complete(list(range(20))).selected_by == "lru"


def test_ram_cache_brings_back_a_conversation_that_lost_its_slot():
    a = list(range(100, 300))
    b = list(range(1000, 1200))
    for ram, expect in ((0, 0), (8192, 200)):
        s = SlotServer(1, cache_ram_mib=ram)
        s.complete(a, max_tokens=1)
        rb = s.complete(b, max_tokens=1)  # unrelated: LRU pick, a is saved to RAM first
        assert rb.selected_by == "lru" and rb.ram_saved == (ram > 0)
        ra = s.complete(a + [7, 8], max_tokens=1)
        assert ra.cache_n == expect and ra.ram_loaded == (ram > 0)
    st_ = s.state()
    assert [len(e.tokens) for e in st_.ram_cache] == [200]  # b was saved, a moved into the slot


def test_ram_cache_makes_room_oldest_first_and_skips_a_state_over_the_limit():
    s = SlotServer(1, cache_ram_mib=1, state_bytes_per_token=MIB // 100)  # 100 tokens fit in 1 MiB
    for base in (0, 1000, 2000):
        s.complete(list(range(base, base + 60)), max_tokens=1)
    assert [e.tokens[0] for e in s.state().ram_cache] == [1000]
    # server_prompt_cache::alloc at llama.cpp 0c1e57098: a state larger than --cache-ram is not stored
    big = SlotServer(1, cache_ram_mib=1, state_bytes_per_token=MIB // 10)
    big.complete(list(range(60)), max_tokens=1)
    big.complete(list(range(100, 160)), max_tokens=1)
    assert big.state().ram_cache == ()


def test_room_is_made_when_saving_before_an_entry_is_loaded():
    """Seen on the real server (-np 1 -c 1024 --cache-ram 1): A's entry was dropped to make room."""
    s = SlotServer(1, n_ctx=1024, cache_ram_mib=1, state_bytes_per_token=1036)
    a = list(range(400))
    s.complete(a, max_tokens=1)
    s.complete(list(range(1000, 1400)), max_tokens=1)
    s.complete(list(range(2000, 2700)), max_tokens=1)
    assert s.complete(a[:200] + list(range(5000, 5050)), max_tokens=1).cache_n == 0


def test_idle_slots_are_saved_to_the_ram_cache_after_a_task_starts():
    """--cache-idle-slots (on with --cache-ram): the real server answers cache_n 45 here."""
    s = SlotServer(3, slot_prompt_similarity=0)
    x = list(range(98))
    s.complete(x, max_tokens=1)  # slot 2 (the last of the equally unused slots)
    s.complete(list(range(500, 530)), max_tokens=1)  # slot 1; idle slot 2 (x) is saved to RAM
    rec = s.complete(x[:45] + list(range(900, 912)), max_tokens=1)  # slot 0 by LRU, loads x's entry
    assert (rec.slot_id, rec.cache_n) == (0, 45)
    off = SlotServer(3, slot_prompt_similarity=0, cache_idle_slots=False)
    off.complete(x, max_tokens=1)
    off.complete(list(range(500, 530)), max_tokens=1)
    assert off.complete(x[:45] + list(range(900, 912)), max_tokens=1).cache_n == 0


def test_a_prompt_over_the_context_is_refused_after_a_slot_was_chosen_and_stamped():
    """llama-server refuses it (HTTP 400) in update_slots, after get_available_slot and the launch:
    the refused request's slot counts as just used, so the next request goes elsewhere."""
    s = SlotServer(2, n_ctx=512, cache_ram_mib=0)
    assert s.complete(list(range(10)), max_tokens=1).slot_id == 1
    refused = s.complete(list(range(1000, 1300)) * 2, max_tokens=1)
    assert refused.error == "exceed_context_size" and refused.slot_id == 0
    assert (refused.cache_n, refused.prompt_n, refused.finished) == (0, 0, True)
    assert s.complete(list(range(2000, 2012)), max_tokens=1).slot_id == 1


def test_lcp_pick_that_keeps_under_half_of_the_slot_saves_it():
    s = SlotServer(1)
    s.complete(list(range(400)), max_tokens=1)
    rec = s.complete(list(range(100)) + [5000], max_tokens=1)  # sim 0.99, keeps 100/400 of the slot
    assert rec.selected_by == "lcp" and rec.ram_saved and rec.cache_n == 100


def test_start_and_finish_model_busy_slots():
    s = SlotServer(2, cache_ram_mib=0)
    s.start([1, 2, 3], request_id="a")
    s.start([4, 5, 6], request_id="b")
    before = s.state()
    with pytest.raises(SlotBusyError, match="all 2 slots are busy"):
        s.start([7, 8])
    assert s.state() == before
    s.finish("a")
    with pytest.raises(InvalidArgumentError, match="already finished"):
        s.finish("a")
    with pytest.raises(SlotBusyError):
        s.load_tokens(0, [1])  # b runs on slot 0
    assert s.records[0].finished and not s.records[1].finished


def test_history_records_every_start_and_finish():
    s = SlotServer(1, cache_ram_mib=0)
    s.complete([1, 2, 3])
    s.complete([1, 2, 4])
    assert len(s.history) == 5 and caption(s.history[0]) == "start"
    assert s.history[-1].state.last.cache_n == 2
    assert SlotServer(record=False).history is None


def test_each_step_records_an_event_and_its_caption():
    s = SlotServer(2, cache_ram_mib=0)
    s.complete([1, 2, 3], max_tokens=2, generated=[7, 8])
    s.load_tokens(1, [5, 6])
    s.erase(1)
    assert [step.event.kind for step in s.history] == [
        "slots.init",
        "slots.place",
        "slots.finish",
        "slots.restore",
        "slots.erase",
    ]
    assert [caption(step) for step in s.history] == [
        "start",
        "request 1 on slot 1 (the least recently used): cache_n 0, prompt_n 3",
        "request 1 done: 2 sampled, slot 1 keeps 4 tokens",
        "slot 1 restored with 2 tokens",
        "slot 1 erased (2 tokens)",
    ]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda s: s.complete([]), InvalidArgumentError),
        (lambda s: s.complete("abc"), InvalidArgumentError),
        (lambda s: s.complete([1.5]), InvalidArgumentError),
        (lambda s: s.complete([1], max_tokens=-1), InvalidArgumentError),
        (lambda s: s.complete([1], id_slot=5), InvalidArgumentError),
        (lambda s: s.complete([1], id_slot=-2), InvalidArgumentError),
        (lambda s: s.complete([1], max_tokens=2, generated=[1, 2, 3]), InvalidArgumentError),
        (lambda s: s.complete([1], max_tokens=2, generated=[]), InvalidArgumentError),
        (lambda s: s.complete([1], cache_prompt="yes"), InvalidArgumentError),
        (lambda s: s.complete([1], request_id="r0"), DuplicateRequestError),
        (lambda s: s.complete([1], request_id=""), InvalidArgumentError),
        (lambda s: s.finish("nope"), UnknownRequestError),
        (lambda s: s.slot_tokens(3), InvalidArgumentError),
        (lambda s: s.load_tokens(0, list(range(100))), InvalidArgumentError),
        (lambda s: s.erase(-1), InvalidArgumentError),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(call, error, refuses):
    s = SlotServer(2, n_ctx=64)
    s.complete([1, 2, 3], request_id="r0")
    refuses(s, call, error)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_slots": 0},
        {"n_ctx": 1},
        {"cache_ram_mib": -2},
        {"state_header_bytes": -1},
        {"state_bytes_per_token": 0},
        {"slot_prompt_similarity": 1.5},
        {"slot_prompt_similarity": "0.1"},
        {"cache_prompt": 1},
        {"reply": 5},
    ],
)
def test_bad_server_settings(kwargs):
    with pytest.raises(InvalidArgumentError):
        SlotServer(**kwargs)


@pytest.mark.parametrize(
    "call",
    [
        lambda: predicted_cache_n([34, 0], 8),
        lambda: predicted_cache_n([34], 0),
        lambda: arithmetic_report([], LESSON_CLOCK),
        lambda: replay_chat("hi", system="s", server=SlotServer(), tokenizer=Tokenizer()),
        lambda: replay_chat(["hi"], system=3, server=SlotServer(), tokenizer=Tokenizer()),
        lambda: replay_chat(["hi"], system="s", server=None, tokenizer=Tokenizer()),
        lambda: replay_chat(["hi"], system="s", server=SlotServer(), tokenizer=Tokenizer(), max_tokens=0),
        lambda: replay_chat(["hi"], system="s", server=SlotServer(), tokenizer=Tokenizer(), clock="10:00"),
    ],
)
def test_bad_helper_arguments(call):
    with pytest.raises(InvalidArgumentError):
        call()


# ---------------------------------------------------------------- invariants

requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=30),  # small alphabet: many shared prefixes
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(1, 3), st.sampled_from([0, 1]), st.sampled_from([0.0, 0.1, 0.5]))
def test_counters_and_slot_contents_hold_for_any_request_sequence(reqs, n_slots, ram, sim):
    s = SlotServer(
        n_slots, n_ctx=64, cache_ram_mib=ram, slot_prompt_similarity=sim, state_bytes_per_token=MIB // 40
    )
    for prompt, max_tokens in reqs:
        held = {i: s.slot_tokens(i) for i in range(n_slots)}
        ram_before = [e.tokens for e in s.state().ram_cache]
        rec = s.complete(prompt, max_tokens=max_tokens)
        assert rec.cache_n + rec.prompt_n == rec.prompt_tokens == len(prompt)
        assert 0 <= rec.cache_n <= len(prompt) - 1
        # what was reused came from the chosen slot or from a RAM entry
        sources = [held[rec.slot_id], *ram_before]
        assert rec.cache_n <= max(common_prefix(src, prompt) for src in sources)
        n_cached = len(prompt) + max(0, rec.n_generated - 1)
        assert s.slot_tokens(rec.slot_id)[: len(prompt)] == tuple(prompt)
        assert len(s.slot_tokens(rec.slot_id)) == n_cached
        state = s.state()
        assert state.ram_bytes <= state.ram_limit_bytes or len(state.ram_cache) == 1


# ---------------------------------------------------------------- checked on a real llama-server (0c1e57098)
# Each case below was run with tools/conformance/llama_harness.py's tiny llama (1,036 state bytes per
# token, a 128-byte entry header at -np 1); the expected values are the real server's.


def harness_seq(start, n):
    return [3 + (start + 7 * i) % 509 for i in range(n)]


def tiny(cache_ram_mib, n_ctx=512, header=128):
    return SlotServer(
        1,
        n_ctx=n_ctx,
        cache_ram_mib=cache_ram_mib,
        state_bytes_per_token=1036,
        state_header_bytes=header,
        record=False,
    )


@pytest.mark.parametrize(("cache_ram_mib", "cache_n"), [(8192, 300), (-1, 0)])
def test_unlimited_cache_ram_keeps_at_most_the_whole_context_in_tokens(cache_ram_mib, cache_n):
    # --cache-ram -1: no byte limit, but update() drops the oldest entries while the cache holds more
    # tokens than -c (512 here): three 300-token prompts do not fit, the first one is gone
    s = tiny(cache_ram_mib)
    a, b, c = harness_seq(1, 300), harness_seq(2, 300), harness_seq(3, 300)
    for p in (a, b, c):
        s.complete(p, max_tokens=1)
    assert s.complete(a + harness_seq(4, 20), max_tokens=1).cache_n == cache_n
    if cache_ram_mib == -1:
        assert s.prompt_cache.n_tokens() <= 512 and s.ram_enabled and s.ram_limit_bytes == 0


@pytest.mark.parametrize(("second", "cache_n"), [(512, 0), (511, 500)])
def test_the_entry_header_decides_what_fits(second, cache_n):
    # 1 MiB holds 500 + 512 tokens of state (1,048,432 bytes) but not their two 128-byte headers: saving
    # the second prompt evicts the first, so it is not there to load back
    s = tiny(1, n_ctx=1024)
    s.complete(harness_seq(5, 500), max_tokens=1)
    s.complete(harness_seq(6, second), max_tokens=1)
    assert s.complete(harness_seq(5, 500) + harness_seq(8, 20), max_tokens=1).cache_n == cache_n
    without = tiny(1, n_ctx=1024, header=0)  # the model without the header keeps both
    without.complete(harness_seq(5, 500), max_tokens=1)
    without.complete(harness_seq(6, second), max_tokens=1)
    assert without.complete(harness_seq(5, 500) + harness_seq(8, 20), max_tokens=1).cache_n == 500


def test_n_predict_zero_samples_one_token_that_is_never_cached():
    s = tiny(0)
    a = harness_seq(1, 300)
    rec = s.complete(a, max_tokens=0, generated=[])
    assert (rec.n_generated, s.slot_tokens(0)) == (1, tuple(a))  # predicted_n 1 on the real server
    rec = s.complete(a + harness_seq(2, 5), max_tokens=0)
    assert (rec.cache_n, rec.prompt_n, rec.n_generated) == (300, 5, 1)
    with pytest.raises(InvalidArgumentError):
        s.complete(a, max_tokens=0, generated=[7, 8])  # one token at most


def test_prompt_cache_entry_size_and_token_limit():
    from kvlab.server.prompt_cache import PromptCache

    cache = PromptCache(0, 10, limit_tokens=5, header_bytes=3)
    assert cache.save([1, 2, 3]) and cache.entries[0].size_bytes == 33
    assert cache.save([4, 5, 6])  # no byte limit: stored, the token limit waits for update()
    cache.update()
    assert [e.tokens for e in cache.entries] == [(4, 5, 6)]
