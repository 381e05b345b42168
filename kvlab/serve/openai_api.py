"""The OpenAI-compatible routes, shaped as vLLM 0.33.0 serves them (``vllm/entrypoints/openai``).

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (also as server-sent
events: one ``data: {...}`` chunk per token, the finish reason on the last token's
chunk, a usage-only chunk with empty ``choices`` when ``stream_options.include_usage``,
then ``data: [DONE]``). ``usage.prompt_tokens_details.cached_tokens`` is always given
(vLLM gives it with ``--enable-prompt-tokens-details``). ``cache_salt`` is vLLM's
extra field: blocks hashed under one salt are never hit by another.

Decoding is greedy whatever ``temperature`` / ``top_p`` say (kvlab's engine has one
sampler); fields it cannot honour (``n`` > 1, ``logprobs``, ``stop``, ``echo``, ``best_of``,
``tools``) are refused with a 400 rather than ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from kvlab.core.chat_format import ROLES, render
from kvlab.errors import LIMITS, KvlabError, brief
from kvlab.serve.protocol import (
    ApiError,
    field_bool,
    field_dict,
    field_int,
    field_number,
    field_prompt,
    field_str,
    from_kvlab,
    read_json,
    refuse_unsupported,
)
from kvlab.serve.state import ServerState, get_state

router = APIRouter()

UNSUPPORTED = {"n": 1, "best_of": 1, "logprobs": None, "top_logprobs": 0, "echo": False, "stop": None,
               "suffix": None, "tools": None, "tool_choice": "none", "response_format": None}  # fmt: skip


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    st = get_state(request)
    card = {"id": st.config.model_name, "object": "model", "created": st.started, "owned_by": "kvlab",
            "root": st.config.model_name, "parent": None, "max_model_len": st.config.max_model_len,
            "permission": []}  # fmt: skip
    return JSONResponse({"object": "list", "data": [card]})


def _check_model(st: ServerState, body: dict[str, Any]) -> None:
    model = body.get("model")
    if model is None:
        return
    if model != st.config.model_name:
        raise ApiError(f"The model `{brief(model)}` does not exist.", status=404, param="model")


def _common(st: ServerState, body: dict[str, Any]) -> dict[str, Any]:
    """The options both routes share, checked; returns the scheduler's keyword arguments and stream flags."""
    _check_model(st, body)
    refuse_unsupported(body, UNSUPPORTED)
    field_number(body, "temperature", 0.0, minimum=0.0, maximum=2.0)
    field_number(body, "top_p", 1.0, minimum=0.0, maximum=1.0)
    default = 16
    limit = st.config.max_model_len
    max_tokens = field_int(body, "max_tokens", default, minimum=1, maximum=limit)
    if "max_completion_tokens" in body:
        max_tokens = field_int(body, "max_completion_tokens", default, minimum=1, maximum=limit)
    options = field_dict(body, "stream_options")
    return {
        "max_tokens": max_tokens,
        "cache_salt": field_str(body, "cache_salt"),
        "stream": field_bool(body, "stream", False),
        "include_usage": field_bool(options, "include_usage", False),
    }


def _usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    st = get_state(request)
    body = await read_json(request, st.config.max_body_bytes)
    opts = _common(st, body)
    prompt = field_prompt(body, "prompt", st.tokenizer)
    return await _serve(st, request, prompt, opts, chat=False)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError("messages must be a non-empty list of {role, content} objects", param="messages")
    if len(raw) > LIMITS.count:
        raise ApiError(f"more than {LIMITS.count:,} messages", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ApiError(f"messages[{i}] must be an object with role and content", param="messages")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise ApiError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {brief(role)}",
                           param="messages")  # fmt: skip
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # content parts: only text parts
            texts = []
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise ApiError(f"messages[{i}].content parts must be {{type: text, text: ...}}",
                                   param="messages")  # fmt: skip
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ApiError(f"messages[{i}].content must be a string, got {brief(content)}", param="messages")
        out.append({"role": role, "content": content})
    return out


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    st = get_state(request)
    body = await read_json(request, st.config.max_body_bytes)
    opts = _common(st, body)
    messages = _messages(body)
    add_generation_prompt = field_bool(body, "add_generation_prompt", True)
    try:
        prompt = list(render(messages, st.tokenizer, add_generation_prompt=add_generation_prompt).tokens)
    except KvlabError as exc:
        raise from_kvlab(exc, "messages") from None
    return await _serve(st, request, prompt, opts, chat=True)


async def _serve(
    st: ServerState, request: Request, prompt: list[int], opts: dict[str, Any], *, chat: bool
) -> Any:
    try:
        pending = st.runner.submit(prompt, max_tokens=opts["max_tokens"], cache_salt=opts["cache_salt"])
    except KvlabError as exc:
        raise from_kvlab(exc) from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    model = st.config.model_name
    if opts["stream"]:
        stream = _chat_stream if chat else _completion_stream
        return StreamingResponse(stream(st, pending, rid, created, model, opts["include_usage"]),
                                 media_type="text/event-stream")  # fmt: skip
    req = await pending.wait(request)
    _check_served(req)
    text = st.tokenizer.decode(req.output)
    usage = _usage(len(req.prompt), len(req.output), req.cache_n)
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                          "tool_calls": []},
                  "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}  # fmt: skip
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                  "stop_reason": None, "prompt_logprobs": None}  # fmt: skip
        obj = "text_completion"
    return JSONResponse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                         "usage": usage, "system_fingerprint": None})  # fmt: skip


def _check_served(req: Any) -> None:
    if req.finish_reason == "error":
        raise ApiError("the engine failed on this request; see the server's log", status=503)


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _chat_stream(st: ServerState, pending: Any, rid: str, created: int, model: str,
                       include_usage: bool) -> AsyncIterator[str]:  # fmt: skip
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]})  # fmt: skip
    req = pending.request
    count = 0
    async for token in pending.tokens():
        count += 1
        last = count == req.max_tokens
        yield _sse({**head, "choices": [{"index": 0, "delta": {"content": st.tokenizer.piece(token)},
                                         "logprobs": None, "finish_reason": "length" if last else None}]})  # fmt: skip
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(len(req.prompt), len(req.output), req.cache_n)})
    yield "data: [DONE]\n\n"


async def _completion_stream(st: ServerState, pending: Any, rid: str, created: int, model: str,
                             include_usage: bool) -> AsyncIterator[str]:  # fmt: skip
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    req = pending.request
    count = 0
    async for token in pending.tokens():
        count += 1
        last = count == req.max_tokens
        yield _sse({**head, "choices": [{"index": 0, "text": st.tokenizer.piece(token), "logprobs": None,
                                         "finish_reason": "length" if last else None, "stop_reason": None}]})  # fmt: skip
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(len(req.prompt), len(req.output), req.cache_n)})
    yield "data: [DONE]\n\n"
