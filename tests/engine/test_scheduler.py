"""Continuous batching: the scheduler's tokens are the one-at-a-time engine's, its steps are batched,
a tight pool makes requests wait (never preempt), cancellation frees blocks, and slot files round-trip."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from kvlab.engine import Engine  # noqa: E402
from kvlab.engine.scheduler import Scheduler  # noqa: E402
from kvlab.errors import InvalidArgumentError, SlotFileError  # noqa: E402
from kvlab.models.prefix_cache import PrefixCache  # noqa: E402

rng = random.Random(7)
SHARED = [rng.randrange(16, 9000) for _ in range(40)]
PROMPTS = [SHARED[: rng.randrange(0, 40)] + [rng.randrange(16, 9000) for _ in range(rng.randrange(1, 30))]
           for _ in range(12)]  # fmt: skip


@pytest.fixture(scope="module")
def serial():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CI cores: one thread avoids OpenMP stalls on tiny ops
    try:
        engine = Engine(cache="off", max_model_len=128)
        return [engine.generate(p, max_tokens=6).output_tokens for p in PROMPTS]
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize(
    ("cache", "slots", "num_blocks"), [("blocks", 1, None), ("off", 1, None), ("slot", 3, 24)]
)
def test_batched_serving_gives_the_serial_tokens(one_thread, serial, cache, slots, num_blocks):
    sched = Scheduler(Engine(cache=cache, max_model_len=128, num_blocks=num_blocks), slots=slots)
    reqs = [sched.submit(p, max_tokens=6) for p in PROMPTS]
    sched.run_until_idle()
    assert [tuple(r.output) for r in reqs] == serial
    assert sched.counters.decoded_sequences == 12 * 5
    assert sched.counters.decode_steps < sched.counters.decoded_sequences  # several sequences per pass
    assert sched.kv_cache_usage() == 0 or cache == "slot"


def test_blocks_counters_are_the_prefix_cache_models(one_thread):
    sched = Scheduler(
        Engine(cache="blocks", max_model_len=128), max_num_seqs=1
    )  # one at a time: serial order
    model = PrefixCache(sched.num_blocks, sched.block_size)
    reqs = [sched.submit(p, max_tokens=4) for p in PROMPTS]
    sched.run_until_idle()
    for req in reqs:
        assert req.cache_n == model.allocate(req.request_id, req.prompt).num_cached_tokens
        for token in req.output[:-1]:
            model.append(req.request_id, [token])
        model.free(req.request_id)
    assert sched.counters.prefix_cache_hits == sum(r.cache_n for r in reqs) > 0
    assert sched.counters.prefix_cache_queries == sum(len(p) for p in PROMPTS)


def test_a_tight_pool_makes_requests_wait_and_never_preempts(one_thread, serial):
    # 16 blocks of 16 tokens: about three of these requests fit at a time
    sched = Scheduler(Engine(cache="blocks", max_model_len=128, num_blocks=16, block_size=16))
    reqs = [sched.submit(p, max_tokens=6) for p in PROMPTS]
    sched.step()
    assert 0 < len(sched.running) < len(PROMPTS) and len(sched.waiting) == len(PROMPTS) - len(sched.running)
    most = 0
    while sched.has_work():
        sched.step()
        most = max(most, len(sched.running))
    assert [tuple(r.output) for r in reqs] == serial
    assert most < len(PROMPTS) and sched.counters.num_preemptions == 0


def test_max_num_seqs_caps_the_batch(one_thread):
    sched = Scheduler(Engine(cache="off", max_model_len=128), max_num_seqs=2)
    for p in PROMPTS[:5]:
        sched.submit(p, max_tokens=3)
    sched.step()
    assert len(sched.running) == 2 and len(sched.waiting) == 3


def test_cancel_frees_the_blocks_of_a_running_request(one_thread):
    sched = Scheduler(Engine(cache="blocks", max_model_len=128))
    req = sched.submit(PROMPTS[0], max_tokens=50)
    sched.step()
    assert sched.kv_cache_usage() > 0
    sched.cancel(req.request_id)
    sched.run_until_idle()
    assert req.finish_reason == "abort" and len(req.output) < 50
    assert sched.kv_cache_usage() == 0 and sched.engine.prefix_cache.requests == ()


def test_refused_requests_change_nothing(one_thread):
    sched = Scheduler(Engine(cache="slot", max_model_len=64))
    for bad in ({"max_tokens": 0}, {"max_tokens": 64}, {"cache_salt": "x"}, {"id_slot": 1}):
        with pytest.raises(InvalidArgumentError):
            sched.submit(PROMPTS[0], **bad)
    assert not sched.has_work()


def test_slot_save_and_restore_round_trip_the_real_kv(one_thread, tmp_path):
    sched = Scheduler(Engine(cache="slot", max_model_len=128, num_blocks=16), slots=2)
    first = sched.submit(PROMPTS[1], max_tokens=4, id_slot=0)
    sched.run_until_idle()
    saved = sched.save_slot(0, "one.bin", str(tmp_path))
    assert saved["n_saved"] == len(PROMPTS[1]) + 3
    restored = sched.restore_slot(1, "one.bin", str(tmp_path))
    assert restored["n_restored"] == saved["n_saved"]
    again = sched.submit(PROMPTS[1], max_tokens=4, id_slot=1)
    sched.run_until_idle()
    assert again.cache_n == len(PROMPTS[1]) - 1 and again.output == first.output
    (tmp_path / "bad.bin").write_bytes(b"KVLABSLT" + b"\1" * 60)
    before = sched.slot_server.slot_tokens(0)
    with pytest.raises(SlotFileError):
        sched.restore_slot(0, "bad.bin", str(tmp_path))
    assert sched.slot_server.slot_tokens(0) == before
