"""kvlab.traces against kvlab serve: a trace the client records predicts every counter the server reported.

Each test starts its own ``kvlab serve`` (a subprocess on a free 127.0.0.1 port), so no other test's
requests are in its cache; the client records the exchanges with ``TraceRecorder`` and the trace is
read back and predicted with kvlab's models.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from kvlab.serve import start_server  # noqa: E402
from kvlab.traces import predict_trace, read_trace  # noqa: E402
from kvlab.traces.record import ServerError, TraceRecorder  # noqa: E402

SYSTEM = "You are a careful assistant who explains caches. " * 12


@pytest.fixture(scope="module")
def blocks_server():
    server = start_server(use_env=False, cache="blocks", block_size=16, num_blocks=64, max_model_len=1024)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def slot_server():
    server = start_server(use_env=False, cache="slot", slots=2, max_model_len=1024)
    yield server
    assert server.stop() == 0


def test_chat_trace_from_kvlab_serve_predicted_exactly(blocks_server):
    with TraceRecorder(blocks_server.url) as rec:
        before = rec.metrics()
        for tenant in ("alice", "bob"):
            messages = [{"role": "system", "content": SYSTEM}]
            for turn in range(3):
                messages.append({"role": "user", "content": f"{tenant} asks question {turn} about blocks"})
                reply = rec.chat(messages, max_tokens=5, cache_salt=tenant)
                messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        rec.complete(SYSTEM + " a plain completion", max_tokens=3)
        # a long unrelated prompt: with 64 blocks the pool must evict cached blocks (LRU)
        rec.complete(" ".join(f"filler{i}" for i in range(500)), max_tokens=2)
        rec.complete(SYSTEM + " a plain completion", max_tokens=3)
        after = rec.metrics()
        text = rec.text()
    assert after["vllm:prefix_cache_queries_total"] > before.get("vllm:prefix_cache_queries_total", 0)
    report = predict_trace(read_trace(text), server="vllm", block_size=16, num_blocks=64)
    assert [r.match for r in report.rows] == [True] * len(report.rows), [
        r.as_dict() for r in report.rows if not r.match
    ]
    assert report.rows[1].predicted["cached_tokens"] > 0  # a tenant's second turn hits its first
    assert report.rows[3].predicted["cached_tokens"] == 0  # bob's first turn: alice's salt keeps them apart
    assert [c.match for c in report.checkpoints] == [True]


def test_slot_trace_from_kvlab_serve_predicted_exactly(slot_server):
    with TraceRecorder(slot_server.url) as rec:
        for i in range(8):
            rec.completion(SYSTEM + f" user {i % 3} asks question {i}", n_predict=4, return_tokens=True)
        rec.completion(" ".join(f"other{i}" for i in range(40)), n_predict=2, return_tokens=True)
        rec.slots()
        text = rec.text()
    report = predict_trace(read_trace(text))
    assert report.server == "llama"
    assert all(r.match for r in report.rows), [r.as_dict() for r in report.rows if not r.match]
    assert len({r.predicted["slot"] for r in report.rows}) == 2


def test_recorder_refuses_bad_input_and_unreachable_servers():
    with pytest.raises(ServerError):
        TraceRecorder("http://127.0.0.1:9", timeout=2).chat([{"role": "user", "content": "hi"}])
    for bad in ("ftp://x", "", 5):
        with pytest.raises(Exception) as info:
            TraceRecorder(bad)
        assert type(info.value).__module__.startswith("kvlab")


def test_the_recorded_sample_is_what_kvlab_serve_reports_today():
    """Exercise 16.1 is checked on the sample; notebook 16 reveals a live run: they must be the same chat."""
    from kvlab.lessons.capstone import sample_trace_path, two_tenant_chat

    server = start_server(use_env=False, cache="blocks", block_size=16, num_blocks=64, max_model_len=1024)
    try:
        with TraceRecorder(server.url) as rec:
            two_tenant_chat(rec)
            live = read_trace(rec.text())
    finally:
        assert server.stop() == 0
    sample = read_trace(sample_trace_path())
    assert [e.prompt for e in live.exchanges] == [e.prompt for e in sample.exchanges]
    assert [e.output for e in live.exchanges] == [e.output for e in sample.exchanges]
    assert [e.reported for e in live.exchanges] == [e.reported for e in sample.exchanges]
