"""A client that sends a long non-streamed request and hangs up gets its request cancelled.

The disconnect was once checked only when no token had arrived for 0.2 s, which never happens
while a request decodes: a hung-up client's request ran to its last token. One small server with
a 2,048-token context (long enough that a request outlives its client) serves the module.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from kvlab.serve import start_server

ABORTED = 'vllm:request_success_total{engine="0",model_name="kvlab-tiny",finished_reason="abort"}'
MAX_TOKENS = 2000


@pytest.fixture(scope="module")
def server():
    handle = start_server(use_env=False, max_model_len=2048, num_layers=2, d_model=128, num_blocks=256)
    yield handle
    assert handle.stop() == 0


def _hang_up_after(server, seconds: float, body: dict) -> None:
    host, port = server.url.split("//", 1)[1].rsplit(":", 1)
    raw = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + raw)
        time.sleep(seconds)


def _settled(server, timeout: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = server.metrics()
        if metrics["vllm:num_requests_running"] == 0 and metrics["vllm:num_requests_waiting"] == 0:
            return metrics
        time.sleep(0.2)
    raise AssertionError("the server still runs the request a minute later")


def test_a_client_that_hangs_up_cancels_its_request(server):
    before = _settled(server)
    _hang_up_after(server, 0.3, {"prompt": "hi", "max_tokens": MAX_TOKENS})
    after = _settled(server)
    assert after[ABORTED] == before[ABORTED] + 1
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < MAX_TOKENS


def test_the_server_still_serves(server):
    assert (
        server.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})["usage"]["completion_tokens"] == 3
    )
