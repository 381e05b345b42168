"""Read what a real deployment leaves behind: JSON lines of request/response exchanges, or a chat transcript.

The input of record is JSON lines, one exchange per line, in the order the requests were sent::

    {"request": {...the body sent...}, "response": {...the body received...}, "endpoint": "/completion"}

``endpoint`` is optional (it is inferred from the bodies). Two other kinds of line may sit between
exchanges: ``{"metrics": "<a /metrics scrape, Prometheus text>"}`` and ``{"slots": [...llama-server's
GET /slots...]}``. Both are checkpoints: the counters they show are compared with what the exchanges
before them predict.

A plain *transcript* is one JSON list instead: each item is one request, either a list of
``{"role", "content"}`` messages (as the OpenAI and Anthropic APIs take them) or an object
``{"messages": [...], "token_counts": [n, ...]}`` that gives each message's token count, for a
transcript whose tokenizer kvlab does not have.

What each exchange says is read into an ``Exchange`` of plain values: the prompt's token ids (from
the request, from ``prompt_token_ids`` in the response, or by kvlab's tokenizer from the text, noted
in ``tokenized_by``), the sampled tokens, the salt, the slot asked for, and what the server reported.
Every refusal is a ``TraceError`` naming the line, and nothing is read past ``LIMITS``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvlab.core.chat_format import Tokenizer, render
from kvlab.core.jsonio import read_json
from kvlab.errors import LIMITS, MAX_TOKEN_ID, KvlabError, brief, check_tokens

ENDPOINTS = ("/completion", "/v1/completions", "/v1/chat/completions")


class TraceError(KvlabError, ValueError):
    """A trace file kvlab cannot read: the message names the line and what to fix."""


@dataclass(frozen=True)
class Reported:
    """The counters one response reported; ``None`` where the server did not say."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # llama-server timings.cache_n, vLLM usage...cached_tokens
    prompt_n: int | None = None  # llama-server timings.prompt_n
    tokens_cached: int | None = None  # llama-server: tokens the slot holds after the request
    slot_id: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Exchange:
    """One request and what came back, as plain data."""

    index: int
    line: int
    endpoint: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    max_tokens: int
    cache_salt: str | None = None
    id_slot: int = -1
    cache_prompt: bool = True
    tokenized_by: str = "the request"  # where the prompt's token ids came from
    reported: Reported | None = None

    @property
    def server(self) -> str:
        return "llama" if self.endpoint == "/completion" else "openai"


@dataclass(frozen=True)
class Checkpoint:
    """A ``/metrics`` scrape or a ``/slots`` dump between exchanges: ``after`` exchanges came before it."""

    line: int
    after: int
    metrics: dict[str, float] | None = None
    slots: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Trace:
    exchanges: tuple[Exchange, ...]
    checkpoints: tuple[Checkpoint, ...] = ()
    reported_by: str = "a server"  # "llama-server", "an OpenAI-compatible server" or "a transcript"
    notes: tuple[str, ...] = field(default=())


# ---------------------------------------------------------------- small readers


def _err(line: int, message: str) -> TraceError:
    return TraceError(f"line {line}: {message}")


def _int(
    line: int,
    where: str,
    value: object,
    *,
    minimum: int = 0,
    maximum: int | None = None,
    optional: bool = True,
) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int or value < minimum:
        raise _err(line, f"{where} must be an integer of at least {minimum}, got {brief(value)}")
    if maximum is not None and value > maximum:
        raise _err(line, f"{where} must be at most {maximum:,}, got {brief(value)}")
    return value


def _encode(line: int, where: str, tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """Text through kvlab's tokenizer; a refusal (too long, lone surrogates) names the line."""
    try:
        return tuple(tokenizer.encode(text))
    except KvlabError as exc:
        raise _err(line, f"{where}: {exc}") from None


def _token_ids(line: int, where: str, value: object) -> tuple[int, ...]:
    """kvlab's one token-id check (``check_tokens``), its refusal naming the line."""
    if not isinstance(value, list):
        raise _err(line, f"{where} must be a list of token ids, got {brief(value)}")
    try:
        return tuple(check_tokens(where, value, allow_empty=True))
    except KvlabError as exc:
        raise _err(line, str(exc)) from None


def _text(line: int, where: str, value: object) -> str:
    if type(value) is not str:
        raise _err(line, f"{where} must be text, got {brief(value)}")
    return value


def _object(line: int, where: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _err(line, f"{where} must be a JSON object, got {brief(value)}")
    return value


def _messages(line: int, where: str, value: object) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _err(line, f"{where} must be a non-empty list of {{'role', 'content'}} messages")
    out = []
    for i, m in enumerate(value):
        m = _object(line, f"{where}[{i}]", m)
        role = _text(line, f"{where}[{i}].role", m.get("role"))
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI / Anthropic content parts: keep the text parts
            content = "".join(
                _text(line, f"{where}[{i}].content[{j}].text", p.get("text", ""))
                for j, p in enumerate(content)
                if isinstance(p, dict)
            )
        out.append({"role": role, "content": _text(line, f"{where}[{i}].content", content)})
    return out


# ---------------------------------------------------------------- exchanges


def _endpoint(line: int, given: object, request: dict, response: dict) -> str:
    if given is not None:
        given = _text(line, "endpoint", given)
        for name in ENDPOINTS:
            if given.rstrip("/").endswith(name):
                return name
        raise _err(line, f"endpoint {brief(given)} is not one kvlab reads: use one of {', '.join(ENDPOINTS)}")
    if "messages" in request:
        return "/v1/chat/completions"
    if response.get("object") == "text_completion" or "choices" in response:
        return "/v1/completions"
    return "/completion"


def _prompt(
    line: int, endpoint: str, request: dict, response: dict, tokenizer: Tokenizer
) -> tuple[tuple[int, ...], str]:
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    for holder in (response, first):
        if isinstance(holder, dict) and holder.get("prompt_token_ids") is not None:
            return _token_ids(line, "response prompt_token_ids", holder["prompt_token_ids"]), "the response"
    if endpoint == "/v1/chat/completions":
        msgs = _messages(line, "request messages", request.get("messages"))
        try:
            return render(msgs, tokenizer).tokens, "kvlab's tokenizer and chat template"
        except KvlabError as exc:
            raise _err(line, f"request messages: {exc}") from None
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return _token_ids(line, "request prompt", prompt), "the request"
    if isinstance(prompt, list) and len(prompt) == 1:  # a batch of one prompt
        prompt = prompt[0]
        if isinstance(prompt, list):
            return _token_ids(line, "request prompt[0]", prompt), "the request"
    text = _text(line, "request prompt", prompt)
    if len(text) > LIMITS.tokens:
        raise _err(line, f"request prompt is longer than {LIMITS.tokens:,} characters (LIMITS.tokens)")
    return _encode(line, "request prompt", tokenizer, text), "kvlab's tokenizer"


def _output(line: int, endpoint: str, response: dict, tokenizer: Tokenizer) -> tuple[int, ...] | None:
    if response.get("tokens") and endpoint == "/completion":
        return _token_ids(line, "response tokens", response["tokens"])
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        if first.get("token_ids") is not None:
            return _token_ids(line, "response choices[0].token_ids", first["token_ids"])
        text = first.get("text")
        if text is None and isinstance(first.get("message"), dict):
            text = first["message"].get("content")
        if isinstance(text, str) and text:
            return _encode(line, "response choices[0] text", tokenizer, text)
    content = response.get("content")
    if isinstance(content, str) and content:
        return _encode(line, "response content", tokenizer, content)
    return None


def _reported(line: int, endpoint: str, response: dict) -> Reported:
    error = response.get("error")
    if error is not None:
        what = (
            error.get("type") or error.get("code") or error.get("message")
            if isinstance(error, dict)
            else error
        )
        return Reported(error=str(what)[:200])
    slot = _int(line, "response id_slot", response.get("id_slot"), minimum=-1, maximum=LIMITS.slots - 1)
    timings = response.get("timings")
    if isinstance(timings, dict):
        cache_n = _int(line, "response timings.cache_n", timings.get("cache_n"))
        prompt_n = _int(line, "response timings.prompt_n", timings.get("prompt_n"))
        total = None if cache_n is None or prompt_n is None else cache_n + prompt_n
        tokens_cached = _int(line, "response tokens_cached", response.get("tokens_cached"))
        return Reported(total, cache_n, prompt_n, tokens_cached, slot)
    usage = response.get("usage")
    if isinstance(usage, dict):
        prompt_tokens = _int(line, "response usage.prompt_tokens", usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = None
        if isinstance(details, dict):
            cached = _int(
                line, "response usage.prompt_tokens_details.cached_tokens", details.get("cached_tokens")
            )
        return Reported(prompt_tokens, cached, None, None, slot)
    raise _err(
        line,
        f"the response to {endpoint} has neither 'timings' (llama-server) nor 'usage' (OpenAI API): "
        "record the whole response body",
    )


def _max_tokens(line: int, request: dict, output: tuple[int, ...] | None, response: dict) -> int:
    for key in ("n_predict", "max_tokens", "max_completion_tokens"):
        if request.get(key) is not None:
            value = _int(line, f"request {key}", request[key], minimum=-1)
            if value is not None and value >= 0:
                return value
    timings = response.get("timings") if isinstance(response.get("timings"), dict) else {}
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    for value in (
        timings.get("predicted_n"),
        response.get("tokens_predicted"),
        usage.get("completion_tokens"),
    ):
        if type(value) is int and value >= 0:
            return value
    return len(output or ())


def _exchange(line: int, index: int, row: dict, tokenizer: Tokenizer) -> Exchange:
    request = _object(line, "request", row.get("request"))
    response = _object(line, "response", row.get("response"))
    endpoint = _endpoint(line, row.get("endpoint"), request, response)
    prompt, tokenized_by = _prompt(line, endpoint, request, response, tokenizer)
    if not prompt:
        raise _err(line, "the request's prompt is empty")
    output = _output(line, endpoint, response, tokenizer)
    max_tokens = _max_tokens(line, request, output, response)
    salt = request.get("cache_salt")
    if salt is not None:
        salt = _text(line, "request cache_salt", salt)
    id_slot = _int(line, "request id_slot", request.get("id_slot", -1), minimum=-1, maximum=LIMITS.slots - 1,
                   optional=False)  # fmt: skip
    cache_prompt = request.get("cache_prompt", True)
    if type(cache_prompt) is not bool:
        raise _err(line, f"request cache_prompt must be true or false, got {brief(cache_prompt)}")
    return Exchange(
        index=index,
        line=line,
        endpoint=endpoint,
        prompt=prompt,
        output=output if output is not None else (),
        max_tokens=max_tokens,
        cache_salt=salt,
        id_slot=id_slot,
        cache_prompt=cache_prompt,
        tokenized_by=tokenized_by,
        reported=_reported(line, endpoint, response),
    )


# ---------------------------------------------------------------- checkpoints


def parse_metrics(text: str, line: int = 0) -> dict[str, float]:
    """Prometheus text exposition -> {metric name: value summed over its label sets}."""
    if type(text) is not str:
        raise _err(line, f"metrics must be the Prometheus text of a /metrics scrape, got {brief(text)}")
    out: dict[str, float] = {}
    for raw in text.splitlines():
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        name_part, _, rest = raw.partition(" ") if "{" not in raw.split(" ", 1)[0] else raw.partition("} ")
        name = name_part.split("{", 1)[0]
        fields = rest.split()
        if not name or not fields:
            raise _err(line, f"metrics: cannot read the sample {brief(raw)}")
        try:
            value = float(fields[0])
        except ValueError:
            raise _err(line, f"metrics: {brief(fields[0])} is not a number in {brief(raw)}") from None
        out[name] = out.get(name, 0.0) + value
    return out


def _slots(line: int, value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise _err(line, f"slots must be the list GET /slots returns, got {brief(value)}")
    if len(value) > LIMITS.slots:
        raise _err(line, f"slots lists more than {LIMITS.slots} slots (LIMITS.slots)")
    return tuple(_object(line, f"slots[{i}]", s) for i, s in enumerate(value))


# ---------------------------------------------------------------- files


def _transcript(items: list, tokenizer: Tokenizer) -> Trace:
    exchanges = []
    for i, item in enumerate(items):
        where = f"transcript[{i}]"
        if isinstance(item, list):
            msgs, counts = _messages(1, where, item), None
        else:
            item = _object(1, where, item)
            msgs = _messages(1, f"{where}.messages", item.get("messages"))
            counts = item.get("token_counts")
        if counts is None:
            try:
                tokens = render(msgs, tokenizer).tokens
            except KvlabError as exc:
                raise _err(1, f"{where}: {exc}") from None
            by = "kvlab's tokenizer and chat template"
        else:
            tokens = _counted_tokens(where, msgs, counts)
            by = "the token counts given (one id per message content)"
        exchanges.append(Exchange(i, 1, "/v1/chat/completions", tokens, (), 0, tokenized_by=by))
    return Trace(tuple(exchanges), reported_by="a transcript")


def _counted_tokens(where: str, msgs: list[dict[str, str]], counts: object) -> tuple[int, ...]:
    """Stand-in ids for a message of n tokens: the same message content gives the same ids."""
    if not isinstance(counts, list) or len(counts) != len(msgs):
        raise _err(1, f"{where}.token_counts must list one token count per message ({len(msgs)})")
    tokens: list[int] = []
    for j, (m, n) in enumerate(zip(msgs, counts, strict=True)):
        n = _int(1, f"{where}.token_counts[{j}]", n, minimum=1, optional=False)
        if len(tokens) + n > LIMITS.tokens:
            raise _err(1, f"{where} has more than {LIMITS.tokens:,} tokens (LIMITS.tokens)")
        seed = hashlib.sha256(f"{m['role']}\x00{m['content']}".encode()).digest()
        base = int.from_bytes(seed[:4], "little") % (MAX_TOKEN_ID - LIMITS.tokens)
        tokens.extend(base + k for k in range(n))
    return tuple(tokens)


def _lines(data: bytes) -> Iterable[tuple[int, bytes]]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            yield number, raw


def read_trace(source: object, *, tokenizer: Tokenizer | None = None) -> Trace:
    """Read a trace from a path, bytes, text or an open binary file; refuse bad input with ``TraceError``."""
    tokenizer = tokenizer or Tokenizer()
    if not isinstance(tokenizer, Tokenizer):
        raise TraceError("tokenizer must be a kvlab.core.chat_format.Tokenizer")
    data = _read_bytes(source)
    if data.lstrip()[:1] == b"[":
        items = read_json(data, "the transcript", TraceError)
        if len(items) > LIMITS.ops:
            raise TraceError(f"the transcript has more than {LIMITS.ops:,} requests (LIMITS.ops)")
        return _transcript(items, tokenizer)
    exchanges: list[Exchange] = []
    checkpoints: list[Checkpoint] = []
    for number, raw in _lines(data):
        if len(exchanges) + len(checkpoints) >= LIMITS.ops:
            raise _err(number, f"the trace has more than {LIMITS.ops:,} lines (LIMITS.ops)")
        try:
            row = read_json(raw, f"line {number}", TraceError)
        except TraceError as exc:
            partial = (
                " (a partial last line? the file may have been cut off)" if not raw.endswith(b"}") else ""
            )
            raise TraceError(f"{exc}{partial}") from None
        row = _object(number, "each line", row)
        if "metrics" in row:
            checkpoints.append(
                Checkpoint(number, len(exchanges), metrics=parse_metrics(row["metrics"], number))
            )
        elif "slots" in row:
            checkpoints.append(Checkpoint(number, len(exchanges), slots=_slots(number, row["slots"])))
        elif "request" in row and "response" in row:
            exchanges.append(_exchange(number, len(exchanges), row, tokenizer))
        else:
            raise _err(
                number,
                'each line must be {"request": ..., "response": ...}, {"metrics": ...} or '
                f'{{"slots": ...}}; this one has the keys {brief(sorted(row))}',
            )
    if not exchanges and not checkpoints:
        raise TraceError("the trace is empty: write one JSON object per line")
    timings = [e for e in exchanges if e.reported is not None and e.reported.prompt_n is not None]
    reported_by = "llama-server" if timings else "an OpenAI-compatible server" if exchanges else "a server"
    return Trace(tuple(exchanges), tuple(checkpoints), reported_by)


def _read_bytes(source: object) -> bytes:
    from kvlab.core.jsonio import read_limited

    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    elif isinstance(source, str) and ("\n" in source or source.lstrip()[:1] in ("{", "[")):
        data = source.encode("utf-8", "surrogatepass")
    elif isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as fh:
                data = read_limited(fh, "the trace", TraceError)
        except OSError as exc:
            raise TraceError(f"cannot read the trace {brief(str(source))}: {exc.strerror or exc}") from None
    elif hasattr(source, "read"):
        data = read_limited(source, "the trace", TraceError)  # type: ignore[arg-type]
    else:
        raise TraceError(f"a trace is a path, bytes, text or a binary file, got {brief(source)}")
    if len(data) > LIMITS.scenario_bytes:
        raise TraceError(f"the trace is larger than {LIMITS.scenario_bytes:,} bytes (LIMITS.scenario_bytes)")
    return data
