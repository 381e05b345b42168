"""/metrics counters add up across requests; 64 concurrent streaming clients get the tokens of serial runs,
served in batched decode steps; a client that goes away frees its blocks."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest
from serve_settings import BLOCK_SIZE, TIMEOUT

from kvlab.serve.metrics import parse_metrics


def metrics(client) -> dict[str, float]:
    return parse_metrics(client.get("/metrics").text)


def wait_idle(client, timeout: float = TIMEOUT) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(client)
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError("the server did not go idle")


def test_counters_add_up_across_requests(client):
    before = wait_idle(client)
    sent = []
    base = f"count me {uuid.uuid4().hex} " * 6
    for i in range(5):
        r = client.post("/v1/completions", json={"prompt": base + f"request {i}", "max_tokens": 3 + i})
        sent.append(r.json()["usage"])
    after = wait_idle(client)

    def delta(name: str) -> float:
        return after[name] - before[name]

    assert delta("vllm:prefix_cache_queries_total") == sum(u["prompt_tokens"] for u in sent)
    assert delta("vllm:prefix_cache_hits_total") == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in sent
    )
    assert delta("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in sent)
    assert (
        delta("vllm:generation_tokens_total")
        == sum(u["completion_tokens"] for u in sent)
        == 3 + 4 + 5 + 6 + 7
    )
    assert delta("vllm:request_success_total") == 5
    assert delta("vllm:time_to_first_token_seconds_count") == 5
    assert sum(u["prompt_tokens_details"]["cached_tokens"] for u in sent) > 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0 and after["vllm:num_preemptions_total"] == 0


async def _stream(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> list[str]:
    pieces = []
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    return pieces


def test_64_concurrent_streams_match_serial_runs_in_batched_steps(blocks_server, client):
    torch = pytest.importorskip("torch")
    from kvlab.engine import Engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared CI cores: one thread avoids OpenMP stalls on tiny ops
    tag = int(uuid.uuid4().int % 10_000) * 1000
    prompts = [[100_000 + tag + (i * 7 + j) % 97 for j in range(8 + i % 23)] for i in range(64)]
    engine = Engine(
        cache="off", block_size=BLOCK_SIZE, max_model_len=64
    )  # the served model: same seeded weights
    serial = [engine.generate(p, max_tokens=6).output_tokens for p in prompts]
    torch.set_num_threads(threads)
    before = wait_idle(client)

    async def run_all() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=blocks_server.url, timeout=TIMEOUT,
                                     limits=httpx.Limits(max_connections=64)) as c:  # fmt: skip
            return await asyncio.gather(*(_stream(c, p, 6) for p in prompts))

    streamed = asyncio.run(run_all())
    after = wait_idle(client)
    assert [len(s) for s in streamed] == [6] * 64
    assert ["".join(s) for s in streamed] == [engine.decode_text(t) for t in serial]
    steps = after["kvlab:decode_steps_total"] - before["kvlab:decode_steps_total"]
    seqs = after["kvlab:decoded_sequences_total"] - before["kvlab:decoded_sequences_total"]
    assert seqs == 64 * 5  # every token after the first came from a decode step
    assert steps < seqs / 4  # ... and the steps were batched: many sequences per forward pass


def test_a_client_that_goes_away_frees_its_blocks(blocks_server, client):
    before = wait_idle(client)
    body = {"prompt": f"long reply {uuid.uuid4().hex}", "max_tokens": 3000, "stream": True}
    with (
        httpx.Client(base_url=blocks_server.url, timeout=TIMEOUT) as c,
        c.stream("POST", "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        deadline = time.monotonic() + TIMEOUT  # gauges are read after each engine step: poll
        while metrics(client)["vllm:kv_cache_usage_perc"] == 0:
            assert time.monotonic() < deadline, "the running request holds no blocks"
            time.sleep(0.01)
    after = wait_idle(client)  # the server noticed, cancelled the request and freed its blocks
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    assert after['vllm:request_success_total{engine="0",model_name="kvlab-tiny",finished_reason="abort"}'] == (
        before['vllm:request_success_total{engine="0",model_name="kvlab-tiny",finished_reason="abort"}'] + 1)  # fmt: skip
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 3000


def test_client_helpers_measure_ttft_and_concurrent_throughput(blocks_server):
    from kvlab.serve.client import first_token_ms, run_concurrent, served_model

    model = served_model(blocks_server.url)
    assert model == "kvlab-tiny"
    assert first_token_ms(blocks_server.url, f"how fast {uuid.uuid4().hex}", model=model) > 0
    prompts = [f"prompt {i} {uuid.uuid4().hex}" for i in range(8)]
    run = run_concurrent(blocks_server.url, prompts, clients=4, max_tokens=3, model=model)
    assert (run.requests, run.output_tokens) == (8, 24) and run.tokens_per_s > 0
