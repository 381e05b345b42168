"""llama-server's own routes, as llama.cpp (commit 0c1e57098) ``tools/server`` answers them.

* ``POST /completion``: ``prompt`` (text or token ids), ``n_predict`` (kvlab's default 16;
  0 samples one token, as llama-server does; its -1, "until the context is full", is refused), ``cache_prompt``,
  ``id_slot``, ``return_tokens``, ``stream``. The answer has ``content``, ``tokens``,
  ``id_slot``, ``tokens_predicted``, ``tokens_evaluated``, ``tokens_cached`` (prompt +
  generated - 1: the last sampled token is never decoded) and ``timings`` with
  ``cache_n`` / ``prompt_n`` and their milliseconds. With ``--cache blocks`` the reuse is
  vLLM's and ``id_slot`` is -1.
* ``POST /tokenize`` (``content``, ``with_pieces``) and ``POST /detokenize`` (``tokens``).
* ``GET /slots`` and ``POST /slots/{id}?action=save|restore|erase`` (body
  ``{"filename": ...}``) through ``kvlab.server.slot_files`` in ``--slot-save-path``: the
  file holds the slot's real K/V, and a restored slot's tokens are hit by the next
  request. Refusals are the slot-file API's (bad names, wrong model shape, corrupt or
  truncated files: 400). As llama-server does, an action on a busy slot waits until the slot is idle.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from kvlab.engine.scheduler import ServeRequest
from kvlab.errors import LIMITS, KvlabError, brief, check_tokens
from kvlab.serve.protocol import (
    ApiError,
    encode_text,
    field_bool,
    field_int,
    field_prompt,
    field_str,
    from_kvlab,
    read_json,
)
from kvlab.serve.state import ServerState, get_state

router = APIRouter()


def _timings(req: ServeRequest) -> dict[str, float]:
    prompt_ms = (req.t_first_token - req.t_admitted) * 1e3
    predicted_ms = (req.t_finished - req.t_first_token) * 1e3
    n = len(req.output)
    return {
        "cache_n": req.cache_n,
        "prompt_n": req.prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(req.prompt_n, 1),
        "prompt_per_second": 1e3 * req.prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(n, 1),
        "predicted_per_second": 1e3 * n / predicted_ms if predicted_ms > 0 else 0.0,
    }


def _final(st: ServerState, req: ServeRequest, return_tokens: bool) -> dict[str, Any]:
    return {
        "index": 0,
        "content": st.tokenizer.decode(req.output),
        "tokens": list(req.output) if return_tokens else [],
        "id_slot": req.slot_id,
        "stop": True,
        "model": st.config.model_name,
        "tokens_predicted": len(req.output),
        "tokens_evaluated": len(req.prompt),
        "generation_settings": {
            "n_predict": req.max_tokens,
            "cache_prompt": req.cache_prompt,
            "temperature": 0.0,
            "id_slot": req.id_slot,
        },  # fmt: skip
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": req.tokens_cached,
        "timings": _timings(req),
    }


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request) -> Any:
    st = get_state(request)
    body = await read_json(request, st.config.max_body_bytes)
    prompt = field_prompt(body, "prompt", st.tokenizer)
    n_predict = field_int(body, "n_predict", 16, minimum=-1, maximum=st.config.max_model_len)
    if n_predict < 0:
        raise ApiError(
            "n_predict must be at least 0 (kvlab needs a bound; -1, no limit, is not supported)",
            param="n_predict",
        )
    # llama-server (0c1e57098, process_token) samples one token even with n_predict 0: kvlab does the same
    n_predict = max(n_predict, 1)
    cache_prompt = field_bool(body, "cache_prompt", True)
    id_slot = field_int(body, "id_slot", -1, minimum=-1, maximum=LIMITS.slots)
    return_tokens = field_bool(body, "return_tokens", False)
    stream = field_bool(body, "stream", False)
    if st.config.cache == "slot" and id_slot >= st.config.slots:
        raise ApiError(
            f"id_slot {id_slot} does not exist: this server has {st.config.slots} slot(s)", param="id_slot"
        )
    options: dict[str, Any] = {"max_tokens": n_predict, "cache_prompt": cache_prompt}
    if st.config.cache == "slot":
        options["id_slot"] = id_slot
    try:
        pending = st.runner.submit(prompt, **options)
    except KvlabError as exc:
        raise from_kvlab(exc) from None
    if stream:
        return StreamingResponse(_stream(st, pending, return_tokens), media_type="text/event-stream")
    req = await pending.wait(request)
    if req.finish_reason == "error":
        raise ApiError("the engine failed on this request; see the server's log", status=503)
    return JSONResponse(_final(st, req, return_tokens))


async def _stream(st: ServerState, pending: Any, return_tokens: bool) -> AsyncIterator[str]:
    req = pending.request
    async for token in pending.tokens():
        chunk = {"index": 0, "content": st.tokenizer.piece(token), "tokens": [token] if return_tokens else [],
                 "stop": False, "id_slot": req.slot_id}  # fmt: skip
        yield f"data: {json.dumps(chunk)}\n\n"
    yield f"data: {json.dumps(_final(st, req, return_tokens))}\n\n"


@router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    st = get_state(request)
    body = await read_json(request, st.config.max_body_bytes)
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(f"content must be a string, got {brief(content)}", param="content")
    with_pieces = field_bool(body, "with_pieces", False)
    field_bool(body, "add_special", False)
    ids = encode_text(st.tokenizer, content, "content") if content else []
    if with_pieces:
        return JSONResponse({"tokens": [{"id": t, "piece": st.tokenizer.piece(t)} for t in ids]})
    return JSONResponse({"tokens": ids})


@router.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    st = get_state(request)
    body = await read_json(request, st.config.max_body_bytes)
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
        raise ApiError("tokens must be a list of integer token ids", param="tokens")
    try:
        return JSONResponse(
            {"content": st.tokenizer.decode(check_tokens("tokens", tokens, allow_empty=True))}
        )
    except KvlabError as exc:
        raise from_kvlab(exc, "tokens") from None


def _need_slots(st: ServerState) -> None:
    if st.config.cache != "slot":
        raise ApiError(
            "slots exist only with --cache slot (llama-server's slots)",
            status=501,
            kind="not_supported_error",
        )


@router.get("/slots")
async def slots(request: Request) -> JSONResponse:
    st = get_state(request)
    _need_slots(st)
    sched = st.runner.scheduler

    def read() -> list[dict[str, Any]]:
        assert sched.slot_server is not None
        busy = {r.slot_id: r for r in sched.running}
        rows = []
        for i in range(sched.n_slots):
            req = busy.get(i)
            rows.append({"id": i, "id_task": -1 if req is None else int(req.request_id.split("-")[1]),
                         "n_ctx": st.config.max_model_len, "speculative": False, "is_processing": req is not None,
                         "n_tokens": len(sched.slot_server.slot_tokens(i))})  # fmt: skip
        return rows

    return JSONResponse(await st.runner.call(read))


@router.post("/slots/{id_slot}")
async def slot_action(request: Request, id_slot: str) -> JSONResponse:
    st = get_state(request)
    _need_slots(st)
    if not st.config.slot_save_path:
        raise ApiError("This server does not support slots action. Start it with `--slot-save-path`",
                       status=501, kind="not_supported_error")  # fmt: skip
    if not (id_slot.isascii() and id_slot.isdigit()) or len(id_slot) > 6 or int(id_slot) >= st.config.slots:
        raise ApiError("Invalid slot ID", param="id_slot")
    slot = int(id_slot)
    action = request.query_params.get("action")
    if action not in ("save", "restore", "erase"):
        raise ApiError("Invalid action", param="action")
    sched = st.runner.scheduler
    directory = st.config.slot_save_path
    started = time.perf_counter()
    if action == "erase":
        run = lambda: sched.erase_slot(slot)  # noqa: E731
    else:
        body = await read_json(request, st.config.max_body_bytes)
        filename = field_str(body, "filename", max_chars=1024)
        if not filename:
            raise ApiError("filename is required", param="filename")
        if action == "save":
            run = lambda: sched.save_slot(slot, filename, directory)  # noqa: E731
        else:
            run = lambda: sched.restore_slot(slot, filename, directory)  # noqa: E731
    try:
        result = await st.runner.call(run, ready=lambda: not sched.slot_busy(slot))
    except KvlabError as exc:
        raise from_kvlab(exc, "filename") from None
    assert isinstance(result, dict)
    if action != "erase":
        result["timings"] = {f"{action}_ms": (time.perf_counter() - started) * 1e3}
    return JSONResponse(result)
