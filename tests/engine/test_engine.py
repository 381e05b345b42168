import pytest

torch = pytest.importorskip("torch")

from kvlab.core.chat_format import Message, render  # noqa: E402
from kvlab.engine import Engine, ModelConfig, run_chat, tenant_probe, tenant_probe_demo  # noqa: E402
from kvlab.errors import DuplicateRequestError, InvalidArgumentError  # noqa: E402
from kvlab.server.slots import SlotServer  # noqa: E402

SHARED = list(range(5000, 5090))  # a 90-token common prefix
FIRST = SHARED + [11, 12, 13]
SECOND = SHARED + [21, 22, 23, 24, 25]


def served(engine, prompt, **kw):
    return engine.generate(prompt, max_tokens=5, record_logits=True, **kw)


def assert_same_run(a, b):
    assert a.output_tokens == b.output_tokens
    assert len(a.logits) == len(b.logits) == 5
    for x, y in zip(a.logits, b.logits, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=0)


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("cache", ["blocks", "slot"])
def test_a_prefix_hit_gives_the_same_logits_and_tokens_as_no_cache(cache, block_size):
    cached = Engine(cache=cache, block_size=block_size, max_model_len=128)
    cold = Engine(cache="off", block_size=block_size, max_model_len=128)
    cached.generate(FIRST, max_tokens=3)
    hit = served(cached, SECOND)
    expected_hit = 90 if cache == "slot" else 90 // block_size * block_size
    assert hit.cache_n == expected_hit > 0
    assert hit.prompt_n == len(SECOND) - expected_hit
    miss = served(cold, SECOND)
    assert miss.cache_n == 0
    assert_same_run(hit, miss)


@pytest.mark.parametrize("block_size", [1, 16])
def test_the_same_prompt_again_reuses_all_but_what_must_be_computed(block_size):
    """vLLM caps a hit at prompt - 1 tokens in whole blocks; llama-server takes one token back."""
    blocks = Engine(cache="blocks", block_size=block_size, max_model_len=128)
    slot = Engine(cache="slot", block_size=block_size, max_model_len=128)
    cold = served(Engine(cache="off", block_size=block_size, max_model_len=128), FIRST)
    for engine, expected in ((blocks, (len(FIRST) - 1) // block_size * block_size), (slot, len(FIRST) - 1)):
        assert engine.generate(FIRST, max_tokens=2).cache_n == 0
        again = served(engine, FIRST)
        assert again.cache_n == expected
        assert_same_run(again, cold)


def test_generated_tokens_are_cached_except_the_last_one():
    """A follow-up that extends prompt + reply reuses up to prompt + max_tokens - 1 (lesson example 10)."""
    engine = Engine(cache="slot", max_model_len=256)
    first = engine.generate(FIRST, max_tokens=6)
    follow = FIRST + list(first.output_tokens) + [31, 32]
    assert engine.slot_tokens == FIRST + list(first.output_tokens[:-1])
    assert engine.generate(follow, max_tokens=1).cache_n == len(FIRST) + 6 - 1

    blocks = Engine(cache="blocks", block_size=4, max_model_len=256)
    first = blocks.generate(FIRST, max_tokens=6)
    follow = FIRST + list(first.output_tokens) + [31, 32]
    assert blocks.generate(follow, max_tokens=1).cache_n == (len(FIRST) + 6 - 1) // 4 * 4


def test_salts_keep_tenants_apart():
    engine = Engine(cache="blocks", block_size=16, max_model_len=112)
    engine.generate(FIRST, max_tokens=1, cache_salt="a")
    assert engine.generate(FIRST, max_tokens=1, cache_salt="b").cache_n == 0
    assert engine.generate(FIRST, max_tokens=1, cache_salt="a").cache_n == 80
    assert engine.generate(FIRST, max_tokens=1).cache_n == 0


def test_after_partial_eviction_what_is_reused_is_still_exact():
    """7 blocks: tenant b's request evicts a's chain from the tail, so a's next request keeps only block 0."""
    engine = Engine(cache="blocks", block_size=16, max_model_len=112, num_blocks=7)
    engine.generate(FIRST, max_tokens=1, cache_salt="a")
    engine.generate(FIRST, max_tokens=1, cache_salt="b")
    again = served(engine, FIRST, cache_salt="a")
    assert again.cache_n == 16
    cold = served(Engine(cache="off", block_size=16, max_model_len=112), FIRST)
    assert_same_run(again, cold)


def test_reference_and_torch_attention_give_the_same_model():
    ref = served(Engine(cache="blocks", attention="reference", max_model_len=128), SECOND)
    fast = served(Engine(cache="blocks", attention="torch", max_model_len=128), SECOND)
    assert_same_run(ref, fast)


def test_weights_follow_the_seed():
    a = served(Engine(cache="off", max_model_len=128, config=ModelConfig(seed=1)), FIRST)
    b = served(Engine(cache="off", max_model_len=128, config=ModelConfig(seed=1)), FIRST)
    c = served(Engine(cache="off", max_model_len=128, config=ModelConfig(seed=2)), FIRST)
    assert_same_run(a, b)
    assert not torch.allclose(a.logits[0], c.logits[0])


def test_slot_counters_match_the_slot_model_on_a_real_conversation():
    """The engine's slot reuse gives kvlab.server.slots's cache_n for the same prompts and sampled tokens."""
    engine = Engine(cache="slot", max_model_len=512)
    server = SlotServer(1, cache_ram_mib=0)
    history = []
    for i, text in enumerate(["List the files.", "Open the main file.", "Run the tests.", "Fix it."]):
        msgs = [
            Message("system", f"Time: 10:0{i // 2}:00. You are an agent."),
            *history,
            Message("user", text),
        ]
        prompt = list(render(msgs, engine.tokenizer).tokens)
        got = engine.generate(prompt, max_tokens=4)
        want = server.complete(prompt, max_tokens=4, generated=list(got.output_tokens))
        assert (got.prompt_tokens, got.cache_n, got.prompt_n) == (
            want.prompt_tokens,
            want.cache_n,
            want.prompt_n,
        )
        history += [Message("user", text), Message("assistant", engine.decode_text(got.output_tokens))]


def test_run_chat_counters_follow_the_rules():
    turns = run_chat(Engine(cache="slot", max_model_len=512), turns=3, max_tokens=8)
    assert [t.cache_n for t in turns] == [0] + [t.prompt_tokens + 8 - 1 for t in turns[:-1]]
    assert all(t.prompt_n == t.prompt_tokens - t.cache_n for t in turns)
    assert turns[0].prompt_tokens == 34  # the lesson's first prompt: same template, same system prompt
    blocks = run_chat(Engine(cache="blocks", block_size=16, max_model_len=512), turns=3, max_tokens=8)
    assert [t.cache_n for t in blocks] == [0] + [(t.prompt_tokens + 7) // 16 * 16 for t in blocks[:-1]]
    assert [t.text for t in blocks] == [t.text for t in turns]  # reuse never changes a reply
    clock = run_chat(Engine(cache="slot", max_model_len=512), turns=3, max_tokens=8, clock=True)
    assert [t.cache_n for t in clock] == [0, 10, 10]


def test_run_chat_repeats_time_every_turn_from_the_same_state():
    """Each turn's TTFT comes from ``repeats`` engines in lockstep; counters and replies are the one run's."""
    plain = run_chat(Engine(cache="blocks", block_size=16, max_model_len=256), turns=3, max_tokens=4)
    engine = Engine(cache="blocks", block_size=16, max_model_len=256)
    timed = run_chat(engine, turns=3, max_tokens=4, repeats=3, warmup=1)
    assert [(t.cache_n, t.prompt_n, t.text) for t in timed] == [
        (t.cache_n, t.prompt_n, t.text) for t in plain
    ]
    assert all(t.ttft is not None and t.ttft.repeats == 3 for t in timed)
    assert all(t.ttft_ms == t.ttft.median_ms for t in timed)
    assert plain[0].ttft is not None and plain[0].ttft.repeats == 1
    assert set(timed[0].as_dict()) == {"turn", "prompt_tokens", "cache_n", "prompt_n", "ttft_ms", "text"}
    assert engine.prefix_cache.requests == ()  # the given engine served the chat itself
    assert engine.prefix_cache.cached_blocks()


def test_run_chat_repeats_need_an_engine_that_served_nothing():
    engine = Engine(cache="slot", max_model_len=256)
    engine.generate([1, 2, 3], max_tokens=1)
    before = list(engine.slot_tokens)
    with pytest.raises(InvalidArgumentError, match="served no request"):
        run_chat(engine, turns=2, repeats=2)
    with pytest.raises(InvalidArgumentError, match="repeats"):
        run_chat(Engine(cache="off", max_model_len=256), turns=1, repeats=0)
    with pytest.raises(InvalidArgumentError, match="warmup"):
        run_chat(Engine(cache="off", max_model_len=256), turns=1, warmup=-1)
    assert engine.slot_tokens == before  # refused: nothing ran
    run_chat(engine, turns=1)  # one run, as before, is fine on a used engine


def test_tenant_probe_counters_show_the_leak_and_the_salt_closes_it():
    """The counters (not the times) say what the timing verdicts rely on: see tests/engine/test_probe.py."""
    runs = tenant_probe_demo(form_tokens=64, candidates=("alice", "dana", "emeka"), repeats=1, calibration=1)
    shared, salted = runs["shared cache"], runs["per-tenant salt"]
    hit = next(r for r in shared.guesses if r.is_secret)
    assert hit.cache_n >= hit.prompt_tokens - 16 and hit.cache_hit
    assert all(r.cache_n == 0 for r in shared.guesses if not r.is_secret)
    assert all(r.cache_n == 0 and not r.cache_hit for r in salted.guesses)
    rows = shared.as_rows()
    assert {"salted", "name", "cache_n", "ttft_ms", "threshold_ms", "classified_hit"} <= set(rows[0])
    assert shared.ttft_ratio() > 0


# ---------------------------------------------------------------- bad input


def test_bad_engine_and_request_arguments():
    with pytest.raises(InvalidArgumentError, match="unknown cache mode"):
        Engine(cache="radix")
    with pytest.raises(InvalidArgumentError, match="block_size"):
        Engine(block_size=0)
    with pytest.raises(InvalidArgumentError, match="num_blocks"):
        Engine(max_model_len=64, block_size=16, num_blocks=3)
    with pytest.raises(InvalidArgumentError, match="multiple of num_kv_heads"):
        ModelConfig(num_kv_heads=3)
    with pytest.raises(InvalidArgumentError, match="even size"):
        ModelConfig(d_model=24, num_heads=8)
    engine = Engine(cache="slot", max_model_len=64)
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        engine.generate(list(range(60)), max_tokens=8)
    with pytest.raises(InvalidArgumentError, match="needs cache='blocks'"):
        engine.generate([1, 2, 3], cache_salt="t")
    with pytest.raises(InvalidArgumentError, match="token id"):
        engine.generate([1, "two"])
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        engine.generate([1, 2], max_tokens=0)
    assert engine.slot_tokens == []  # rejected requests changed nothing
    engine.generate([1, 2, 3], max_tokens=1, request_id="r")
    with pytest.raises(DuplicateRequestError):
        engine.generate([1, 2, 3], max_tokens=1, request_id="r")
    with pytest.raises(InvalidArgumentError, match="secret"):
        tenant_probe(salted=False, secret="two words")
    with pytest.raises(InvalidArgumentError, match="salted"):
        tenant_probe(salted="yes")


def test_every_request_frees_its_blocks_and_one_request_always_fits():
    """num_blocks must cover max_model_len, and requests run one at a time, so the pool never runs out."""
    engine = Engine(cache="blocks", block_size=16, max_model_len=64, num_blocks=4)
    for start in (0, 100, 200):
        engine.generate(list(range(start, start + 60)), max_tokens=4)
        assert engine.prefix_cache.requests == ()
        assert engine.prefix_cache.num_free_blocks == 4


@pytest.mark.parametrize("cache", ["blocks", "slot", "off"])
def test_a_twin_is_built_alike_and_starts_empty(cache):
    engine = Engine(cache=cache, block_size=16, max_model_len=128)
    first = served(engine, FIRST)
    twin = engine.twin()
    assert (twin.cache_mode, twin.block_size, twin.max_model_len) == (cache, 16, 128)
    assert twin.pool.num_blocks == engine.pool.num_blocks
    again = served(twin, FIRST)
    assert again.cache_n == 0  # the twin never saw the first request
    assert_same_run(first, again)  # same weights: the same tokens and logits


def test_a_saved_cache_state_comes_back_exactly():
    engine = Engine(cache="blocks", block_size=16, max_model_len=128)
    engine.generate(FIRST, max_tokens=3)
    state = engine.save_cache_state()
    hit = served(engine, SECOND)
    engine.generate(list(range(300, 390)), max_tokens=3)  # another prompt takes more blocks
    engine.restore_cache_state(state)
    again = served(engine, SECOND)
    assert again.cache_n == hit.cache_n > 0
    assert_same_run(hit, again)


def test_restoring_refuses_a_state_of_another_engine_and_changes_nothing():
    engine = Engine(cache="blocks", block_size=16, max_model_len=128)
    other = engine.twin()
    engine.generate(FIRST, max_tokens=3)
    before = engine.prefix_cache
    with pytest.raises(InvalidArgumentError, match="another engine"):
        engine.restore_cache_state(other.save_cache_state())
    with pytest.raises(InvalidArgumentError, match="CacheState"):
        engine.restore_cache_state({"prefix_cache": None})
    with pytest.raises(InvalidArgumentError, match="needs cache='blocks'"):
        Engine(cache="slot", max_model_len=128).save_cache_state()  # a slot overwrites its K/V in place
    assert engine.prefix_cache is before
    assert engine.generate(FIRST, max_tokens=1).cache_n == 80


@pytest.mark.parametrize("max_model_len", [2, 17, 4096])
@pytest.mark.parametrize("block_size", [1, 16])
def test_the_warm_up_leaves_nothing_behind(max_model_len, block_size):
    engine = Engine(cache="blocks", block_size=block_size, max_model_len=max_model_len)
    assert engine.prefix_cache.num_free_blocks == engine.pool.num_blocks
    assert engine.prefix_cache.cached_blocks() == {}
    assert engine.generate([5], max_tokens=1).cache_n == 0
