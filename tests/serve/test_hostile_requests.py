"""Malformed and hostile requests get a 4xx with an OpenAI-style error body, never a 500; the server keeps
serving. With --api-key, requests without it get 401. The server stops cleanly."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_settings import TIMEOUT

from kvlab.serve import start_server

DEEP = "[" * 100_000 + "]" * 100_000

BAD_JSON = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b""),
    ("/v1/completions", b"[1, 2, 3]"),
    ("/v1/completions", b'{"prompt": NaN}'),
    ("/v1/completions", DEEP.encode()),
    ("/v1/completions", b"\xff\xfe\x00garbage"),
    ("/completion", b'"just a string"'),
    ("/v1/chat/completions", b"null"),
]

BAD_FIELDS = [
    ("/v1/completions", {"max_tokens": 5}),  # no prompt
    ("/v1/completions", {"prompt": "hi", "model": "gpt-5"}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**30}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "12"}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4096}),  # prompt + max_tokens over the context
    ("/v1/completions", {"prompt": "word " * 5000, "max_tokens": 1}),  # a prompt over the context
    ("/v1/completions", {"prompt": [1, -5, 3]}),
    ("/v1/completions", {"prompt": [1, 2**40]}),
    ("/v1/completions", {"prompt": [1.5, 2]}),
    ("/v1/completions", {"prompt": {"a": 1}}),
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": "hi", "n": 3}),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}),
    ("/v1/completions", {"prompt": "hi", "cache_salt": 7}),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}),
    ("/v1/completions", {"prompt": "hi", "logprobs": 5}),
    ("/v1/completions", {"prompt": "hi", "stream_options": [1]}),
    ("/v1/completions", {"prompt": "\ud800 lone surrogate"}),
    ("/v1/chat/completions", {"messages": "hello"}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/chat/completions", {"messages": [7]}),
    ("/completion", {"prompt": "hi", "n_predict": -1}),
    ("/completion", {"prompt": "hi", "id_slot": "zero"}),
    ("/completion", {"prompt": "hi", "cache_prompt": "no"}),
    ("/tokenize", {"content": 5}),
    ("/detokenize", {"tokens": [99]}),  # never produced by the tokenizer
    ("/detokenize", {"tokens": "abc"}),
]


def assert_error_body(r: httpx.Response, status: int | None = None) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status is not None:
        assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == r.status_code
    assert "Traceback" not in error["message"]


def still_serving(client) -> None:
    r = client.post("/v1/completions", json={"prompt": "are you there", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(("path", "raw"), BAD_JSON)
def test_malformed_bodies_get_400(client, path, raw):
    assert_error_body(client.post(path, content=raw, headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize(("path", "body"), BAD_FIELDS)
def test_bad_fields_get_4xx(client, path, body):
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert_error_body(client.post(path, content=raw, headers={"content-type": "application/json"}))


def test_unknown_routes_methods_and_models(client):
    assert_error_body(client.get("/v2/everything"), 404)
    assert_error_body(client.get("/v1/completions"), 405)
    assert_error_body(client.post("/v1/completions", json={"prompt": "hi", "model": "llama"}), 404)


def test_a_body_over_the_limit_gets_413_even_without_a_length(client):
    big = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'
    assert_error_body(client.post("/v1/completions", content=big), 413)

    def chunks():
        yield b'{"prompt": "'
        for _ in range(80):
            yield b"b" * 65536
        yield b'"}'

    assert_error_body(client.post("/v1/completions", content=chunks()), 413)  # chunked: no content-length
    still_serving(client)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.dictionaries(st.sampled_from(["prompt", "max_tokens", "stream", "cache_salt", "n", "model",
                                             "messages", "temperature", "stream_options"]),
                            st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                                         | st.text(max_size=20),
                                         lambda inner: st.lists(inner, max_size=4)
                                         | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                                         max_leaves=8)))  # fmt: skip
def test_random_bodies_never_get_a_500(client, body):
    for path in ("/v1/completions", "/v1/chat/completions", "/completion"):
        body = {**body, "max_tokens": 2} if isinstance(body.get("max_tokens"), int) else body
        r = client.post(path, json=body)
        assert r.status_code < 500, r.text
        if r.status_code >= 400:
            assert_error_body(r)


def test_the_server_still_answers_after_all_that(client):
    still_serving(client)


def test_api_key_guards_every_route_but_health_and_the_server_stops_cleanly():
    server = start_server(use_env=False, api_key="sesame", num_layers=1, max_model_len=256)
    try:
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
            assert c.get("/health").status_code == 200
            for path in ("/v1/models", "/metrics", "/slots"):
                assert_error_body(c.get(path), 401)
            assert_error_body(c.post("/v1/completions", json={"prompt": "hi"}), 401)
            wrong = {"Authorization": "Bearer open"}
            assert_error_body(c.post("/v1/completions", json={"prompt": "hi"}, headers=wrong), 401)
            right = {"Authorization": "Bearer sesame"}
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=right)
            assert r.status_code == 200
    finally:
        status = server.stop()
    assert status == 0
    host, port = server.url.removeprefix("http://").split(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()
