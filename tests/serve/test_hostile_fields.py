"""Hostile field values a server must refuse with a 4xx and its error body, changing nothing.

Numbers too big for a float, slot ids written in non-ASCII digits, ``true`` for ``n``, two
``Authorization`` headers: each once reached a 500 or was let through. One small slot server
with an API key serves the whole module.
"""

from __future__ import annotations

import socket

import httpx
import pytest
from serve_settings import TIMEOUT

from kvlab.serve import start_server

KEY = "hostile-key"
HUGE = "1" + "0" * 400  # valid JSON, an int no float can hold


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    slot_dir = tmp_path_factory.mktemp("hostile-slots")
    handle = start_server(use_env=False, cache="slot", slots=2, max_model_len=128, num_layers=1, d_model=32,
                          slot_save_path=str(slot_dir), api_key=KEY)  # fmt: skip
    handle.slot_dir = slot_dir
    yield handle
    assert handle.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _counters(client: httpx.Client) -> list[str]:
    return [line for line in client.get("/metrics").text.splitlines() if "_total" in line]


def _assert_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


@pytest.mark.parametrize("name", ["temperature", "top_p"])
def test_a_number_too_big_for_a_float_is_a_400(client, name):
    before = _counters(client)
    raw = f'{{"prompt": "hi", "max_tokens": 2, "{name}": {HUGE}}}'.encode()
    error = _assert_error(client.post("/v1/completions", content=raw))
    assert error["param"] == name and "between" in error["message"]
    assert _counters(client) == before


def test_a_huge_max_tokens_is_named_briefly(client):
    error = _assert_error(client.post("/v1/completions", content=b'{"prompt": "hi", "max_tokens": 1e308}'))
    assert error["param"] == "max_tokens" and len(error["message"]) < 200


@pytest.mark.parametrize("value", ["true", "1.5", '"1"'])
def test_unsupported_fields_are_refused_unless_truly_neutral(client, value):
    raw = f'{{"prompt": "hi", "max_tokens": 2, "n": {value}}}'.encode()
    assert _assert_error(client.post("/v1/completions", content=raw))["param"] == "n"
    ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 1, "stop": []})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("slot", ["\u00b2", "\u0661", "\uff10", "0x1", "+1", " 1"])
def test_slot_ids_in_other_digits_are_refused(client, server, slot):
    before = sorted(p.name for p in server.slot_dir.iterdir())
    r = client.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": "tricky.bin"})
    assert _assert_error(r)["param"] == "id_slot"
    assert sorted(p.name for p in server.slot_dir.iterdir()) == before


def _raw_get(url: str, headers: list[str]) -> bytes:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    request = "GET /slots HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(request.encode())
        return sock.recv(200)


def test_two_authorization_headers_are_refused_in_either_order(server):
    good, bad = f"Authorization: Bearer {KEY}", "Authorization: Bearer wrong"
    assert _raw_get(server.url, [good]).startswith(b"HTTP/1.1 200")
    for pair in ([good, bad], [bad, good], [good, good]):
        assert _raw_get(server.url, pair).startswith(b"HTTP/1.1 401"), pair


def test_the_server_still_serves(client):
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 2})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
