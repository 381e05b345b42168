"""The OpenAI routes through the real ``openai`` client: multi-turn chats whose cached_tokens the model predicts."""

from __future__ import annotations

import uuid

import pytest
from serve_settings import BLOCK_SIZE, BLOCKS_POOL, TIMEOUT

from kvlab.core.chat_format import Tokenizer, render
from kvlab.models.prefix_cache import PrefixCache

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def oai(blocks_server):
    return openai.OpenAI(base_url=blocks_server.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def predict(cache: PrefixCache, prompt: list[int], output: list[int], salt: str | None = None) -> int:
    """vLLM's prefix cache (kvlab's model) serving one request: cached tokens of its prompt."""
    rid = uuid.uuid4().hex
    hit = cache.allocate(rid, prompt, cache_salt=salt).num_cached_tokens
    for token in output[:-1]:  # each sampled token but the last enters the cache
        cache.append(rid, [token])
    cache.free(rid)
    return hit


def test_models_lists_the_served_model(oai):
    (model,) = oai.models.list().data
    assert model.id == "kvlab-tiny"


def test_multi_turn_chat_cached_tokens_match_the_prefix_cache_model(oai):
    tokenizer = Tokenizer()
    model = PrefixCache(BLOCKS_POOL, BLOCK_SIZE)
    messages = [{"role": "system", "content": f"You are a careful agent {uuid.uuid4().hex}. " * 8}]
    seen = []
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}: read the file and fix the tests please"})
        reply = oai.chat.completions.create(model="kvlab-tiny", messages=messages, max_tokens=12)
        text = reply.choices[0].message.content
        prompt = list(render(messages, tokenizer).tokens)
        assert reply.usage.prompt_tokens == len(prompt)
        assert reply.usage.completion_tokens == 12
        assert reply.choices[0].finish_reason == "length"
        expected = predict(model, prompt, tokenizer.encode(text))
        assert reply.usage.prompt_tokens_details.cached_tokens == expected
        seen.append(expected)
        messages.append({"role": "assistant", "content": text})
    assert seen[0] == 0 and all(
        b > a for a, b in zip(seen, seen[1:], strict=False)
    )  # the history is reused, turn by turn


def test_streamed_chat_gives_the_same_tokens_and_usage_in_the_last_chunk(oai):
    messages = [{"role": "user", "content": f"stream this {uuid.uuid4().hex}"}]
    whole = oai.chat.completions.create(model="kvlab-tiny", messages=messages, max_tokens=6)
    chunks = list(oai.chat.completions.create(model="kvlab-tiny", messages=messages, max_tokens=6, stream=True,
                                              stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    usage = chunks[-1].usage  # the second send of the prompt hits its full blocks
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completions_take_text_or_token_ids_and_stream(oai, client):
    ids = client.post(
        "/tokenize", json={"content": f"open main {uuid.uuid4().hex} and run the build"}
    ).json()["tokens"]
    by_ids = oai.completions.create(model="kvlab-tiny", prompt=ids, max_tokens=5)
    streamed = oai.completions.create(model="kvlab-tiny", prompt=ids, max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == by_ids.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_cache_salt_keeps_tenants_apart(oai):
    tokenizer = Tokenizer()
    prompt_text = f"shared system prompt {uuid.uuid4().hex} " + "with many words " * 20
    prompt = tokenizer.encode(prompt_text)

    def cached(salt: str | None) -> int:
        body = {"cache_salt": salt} if salt is not None else {}
        r = oai.completions.create(model="kvlab-tiny", prompt=prompt_text, max_tokens=2, extra_body=body)
        return r.usage.prompt_tokens_details.cached_tokens

    full = (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert cached("tenant-a") == 0
    assert cached("tenant-a") == full  # the same tenant hits
    assert cached("tenant-b") == 0  # another salt never does
    assert cached(None) == 0  # nor does no salt
    assert cached("tenant-b") == full


def test_reset_prefix_cache_forgets_every_prefix(oai, client):
    text = f"remember me {uuid.uuid4().hex} " * 10
    oai.completions.create(model="kvlab-tiny", prompt=text, max_tokens=2)
    again = oai.completions.create(model="kvlab-tiny", prompt=text, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert client.post("/reset_prefix_cache").status_code == 200
    after = oai.completions.create(model="kvlab-tiny", prompt=text, max_tokens=2)
    assert after.usage.prompt_tokens_details.cached_tokens == 0
    assert after.choices[0].text == again.choices[0].text


def test_sglang_info_routes_answer_json(client):
    info = client.get("/server_info").json()
    assert info["page_size"] == BLOCK_SIZE and info["model_path"] == "kvlab-tiny"
    assert client.get("/model_info").json()["is_generation"] is True
    assert client.get("/health").json() == {"status": "ok"}
