"""Request bodies in, error bodies out: the checks every route shares.

Bad input never reaches the engine as a surprise: ``read_json`` bounds the body and
parses it, the ``field_*`` helpers check one field each, and any refusal is an
``ApiError`` that becomes an HTTP 4xx with an OpenAI-style body::

    {"error": {"message": "...", "type": "BadRequestError", "param": "max_tokens", "code": 400}}

(vLLM 0.33.0's ``ErrorResponse``: ``code`` is the HTTP status). llama-server routes use
llama-server's type names (``invalid_request_error``, ``not_supported_error`` ...;
``tools/server/server-common.cpp`` ``format_error_response``) in the same four keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from starlette.requests import ClientDisconnect, Request

from kvlab.core.chat_format import Tokenizer
from kvlab.errors import LIMITS, KvlabError, brief, check_tokens

DEFAULT_MAX_BODY_BYTES = 4 << 20
"""Largest request body (4 MiB): a full 4,096-token context as JSON ids is ~50 KB, text less."""

OPENAI_TYPES = {400: "BadRequestError", 401: "UnauthorizedError", 404: "NotFoundError",
                405: "MethodNotAllowedError", 409: "ConflictError", 413: "RequestEntityTooLargeError",
                501: "NotImplementedError", 503: "ServiceUnavailableError"}  # fmt: skip
LLAMA_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
               501: "not_supported_error", 503: "unavailable_error"}  # fmt: skip


class ApiError(Exception):
    """A refusal the client caused (4xx) or a feature this server lacks (501)."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.kind = kind


def error_body(message: str, status: int, *, param: str | None = None, llama: bool = False,
               kind: str | None = None) -> dict[str, Any]:  # fmt: skip
    types = LLAMA_TYPES if llama else OPENAI_TYPES
    kind = kind or types.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def from_kvlab(exc: KvlabError, param: str | None = None) -> ApiError:
    """A kvlab refusal (bad argument, busy slot, bad slot file) as a 4xx."""
    from kvlab.errors import SlotBusyError

    return ApiError(str(exc), status=409 if isinstance(exc, SlotBusyError) else 400, param=param)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read at most ``limit`` bytes far; anything else is a 4xx."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(f"the request body is over {limit:,} bytes", status=413)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(f"the request body is over {limit:,} bytes", status=413)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError("the client went away before sending the whole body") from None
    raw = b"".join(chunks)
    if not raw:
        raise ApiError("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(f"the request body is not valid JSON: {brief(str(exc), 120)}") from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def field_int(body: Mapping[str, Any], name: str, default: int, *, minimum: int, maximum: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if type(value) is not int:
        raise ApiError(f"{name} must be an integer, got {brief(value)}", param=name)
    if not minimum <= value <= maximum:
        raise ApiError(f"{name} must be between {minimum} and {maximum:,}, got {brief(value)}", param=name)
    return value


def field_number(
    body: Mapping[str, Any], name: str, default: float, *, minimum: float, maximum: float
) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(f"{name} must be a number, got {brief(value)}", param=name)
    try:  # an integer of hundreds of digits is valid JSON but no float
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or not minimum <= number <= maximum:
        raise ApiError(f"{name} must be a number between {minimum} and {maximum}, got {brief(value)}",
                       param=name)  # fmt: skip
    return number


def field_bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be true or false, got {brief(value)}", param=name)
    return value


def field_str(body: Mapping[str, Any], name: str, *, max_chars: int = 4096) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(f"{name} must be a string, got {brief(value)}", param=name)
    if len(value) > max_chars:
        raise ApiError(f"{name} is longer than {max_chars:,} characters", param=name)
    return value


def field_dict(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(f"{name} must be an object, got {brief(value)}", param=name)
    return value


def encode_text(tokenizer: Tokenizer, text: str, name: str) -> list[int]:
    """Tokenize client text; text the tokenizer refuses (too long, lone surrogates) is a 400."""
    try:
        return tokenizer.encode(text)
    except KvlabError as exc:
        raise ApiError(str(exc), param=name) from None


def field_prompt(body: Mapping[str, Any], name: str, tokenizer: Tokenizer) -> list[int]:
    """A prompt given as text or as token ids (a one-element list of either is accepted too)."""
    if name not in body:
        raise ApiError(f"{name} is required", param=name)
    value = body[name]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # OpenAI's batch form with one prompt
    if isinstance(value, str):
        if not value:
            raise ApiError(f"{name} is empty; give some text or token ids", param=name)
        return encode_text(tokenizer, value, name)
    if isinstance(value, list):
        if len(value) > LIMITS.tokens:
            raise ApiError(f"{name} holds more than {LIMITS.tokens:,} tokens", param=name)
        if any(isinstance(t, bool) or not isinstance(t, int) for t in value):
            raise ApiError(f"{name} must be a string or a list of integer token ids (one prompt)", param=name)
        try:
            return check_tokens(name, value)
        except KvlabError as exc:
            raise ApiError(str(exc), param=name) from None
    raise ApiError(f"{name} must be a string or a list of token ids, got {brief(value)}", param=name)


def refuse_unsupported(body: Mapping[str, Any], allowed_defaults: Mapping[str, Any]) -> None:
    """Fields kvlab's greedy engine cannot honour are refused unless they hold their neutral value."""
    for name, neutral in allowed_defaults.items():
        value = body.get(name)
        if value is None or _same(value, neutral) or (neutral is None and (value == [] or value is False)):
            continue
        raise ApiError(f"{name} is not supported by kvlab serve (greedy decoding, one choice)", param=name)


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same kind: ``true`` is not the ``1`` of ``n`` (Python says ``True == 1``)."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral
