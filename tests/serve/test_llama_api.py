"""The llama-server routes: counters over /completion, turn by turn, as kvlab's slot model predicts them;
tokenize/detokenize; /slots; saving and restoring a slot's real KV through slot files."""

from __future__ import annotations

import uuid

import pytest
from serve_settings import SLOTS

from kvlab.core.chat_format import Tokenizer, render
from kvlab.server.slots import SlotServer


def complete(client, prompt, **fields):
    r = client.post("/completion", json={"prompt": prompt, "return_tokens": True, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def test_counters_turn_by_turn_match_the_slot_model(slot_client):
    tokenizer = Tokenizer()
    model = SlotServer(SLOTS, n_ctx=1024, cache_ram_mib=0, cache_idle_slots=False, record=False)
    for i in range(SLOTS):  # the server's slots may hold other tests' tokens: start both from empty
        assert slot_client.post(f"/slots/{i}?action=erase").status_code == 200
    messages = [{"role": "system", "content": f"agent {uuid.uuid4().hex}"}]
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}: open the module and check the error"})
        prompt = list(render(messages, tokenizer).tokens)
        got = complete(slot_client, prompt, n_predict=8)
        want = model.complete(prompt, max_tokens=8, generated=got["tokens"])
        assert (got["timings"]["cache_n"], got["timings"]["prompt_n"], got["id_slot"]) == (
            want.cache_n, want.prompt_n, want.slot_id)  # fmt: skip
        assert got["tokens_cached"] == len(prompt) + 8 - 1 == len(model.slot_tokens(want.slot_id))
        assert got["tokens_evaluated"] == len(prompt) and got["tokens_predicted"] == 8
        assert tokenizer.encode(got["content"]) == got["tokens"]  # the reply text gives its ids back
        messages.append({"role": "assistant", "content": got["content"]})
    assert got["timings"]["cache_n"] > 0


def test_cache_prompt_false_and_id_slot_are_honoured(slot_client):
    text = f"pin me {uuid.uuid4().hex} to a slot"
    first = complete(slot_client, text, id_slot=1, n_predict=3)
    again = complete(slot_client, text, id_slot=1, n_predict=3)
    cold = complete(slot_client, text, id_slot=1, n_predict=3, cache_prompt=False)
    assert first["id_slot"] == again["id_slot"] == cold["id_slot"] == 1
    n = first["tokens_evaluated"]
    assert again["timings"]["cache_n"] == n - 1  # the whole prompt is cached; one token is evaluated again
    assert cold["timings"]["cache_n"] == 0
    assert first["tokens"] == again["tokens"] == cold["tokens"]


def test_tokenize_and_detokenize_round_trip(slot_client):
    ids = slot_client.post("/tokenize", json={"content": "fix the import error"}).json()["tokens"]
    assert len(ids) == 4
    pieces = slot_client.post("/tokenize", json={"content": "fix it", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["fix", " it"]
    assert slot_client.post("/detokenize", json={"tokens": ids}).json() == {"content": "fix the import error"}


def test_slots_list_every_slot(slot_client):
    rows = slot_client.get("/slots").json()
    assert [r["id"] for r in rows] == list(range(SLOTS))
    assert all(r["is_processing"] is False and r["n_ctx"] == 1024 for r in rows)


def test_save_erase_restore_round_trip_gives_the_saved_cache_back(slot_client, slot_dir):
    text = f"a long agent prompt {uuid.uuid4().hex} " + "then calls a helper to parse each line " * 6
    before = complete(slot_client, text, id_slot=0, n_predict=4)
    saved = slot_client.post("/slots/0?action=save", json={"filename": "agent.bin"}).json()
    assert saved["n_saved"] == before["tokens_cached"]
    assert saved["n_written"] == (slot_dir / "agent.bin").stat().st_size
    erased = slot_client.post("/slots/0?action=erase").json()
    assert erased == {"id_slot": 0, "n_erased": before["tokens_cached"]}
    restored = slot_client.post("/slots/0?action=restore", json={"filename": "agent.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
    after = complete(slot_client, text, id_slot=0, n_predict=4)
    assert after["timings"]["cache_n"] == before["tokens_evaluated"] - 1  # the restored tokens are reused
    assert after["tokens"] == before["tokens"]  # and their restored K/V give the same reply


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        ("../escape.bin", None, 400),
        ("missing.bin", None, 400),
        ("corrupt.bin", b"KVLABSLT" + b"\0" * 40, 400),
    ],
)
def test_slot_file_refusals_are_the_slot_file_apis(slot_client, slot_dir, name, body, status):
    if body is not None:
        (slot_dir / name).write_bytes(body)
    before = slot_client.get("/slots").json()
    r = slot_client.post("/slots/1?action=restore", json={"filename": name})
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert slot_client.get("/slots").json() == before  # a refused restore changed nothing


def test_bad_slot_actions_are_refused(slot_client, client):
    assert slot_client.post("/slots/7?action=save", json={"filename": "x.bin"}).status_code == 400
    assert slot_client.post("/slots/0?action=fly", json={"filename": "x.bin"}).status_code == 400
    assert client.get("/slots").status_code == 501  # a vLLM-style server has no slots
