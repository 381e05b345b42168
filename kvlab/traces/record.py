"""A client that keeps a trace: every request it sends and the response it gets, as one JSON line.

``TraceRecorder(url)`` talks to any server with llama-server's or the OpenAI API (``kvlab serve``,
llama-server, vLLM) and keeps ``{"endpoint", "request", "response"}`` lines, the form
``kvlab.traces.read_trace`` reads; ``metrics()`` and ``slots()`` add checkpoint lines. The
requests go one at a time, in order, so the trace is exactly what the server saw.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.errors import InvalidArgumentError, KvlabError, brief, check_text

MAX_RESPONSE_BYTES = 64 << 20  # one response; a trace line past this is a mistake


class ServerError(KvlabError):
    """The server could not be reached, or answered with something that is not JSON."""


class TraceRecorder:
    """Send requests to ``base_url`` and keep the trace of what was sent and received."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 120.0) -> None:
        import httpx

        base_url = check_text("base_url", base_url, allow_empty=False).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(f"base_url must start with http:// or https://, got {brief(base_url)}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            raise InvalidArgumentError(f"timeout must be seconds between 0 and 3600, got {brief(timeout)}")
        headers = {"Authorization": f"Bearer {check_text('api_key', api_key)}"} if api_key else {}
        self.base_url = base_url
        self.lines: list[str] = []
        self._client = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)

    # ------------------------------------------------------------------ requests

    def post(self, endpoint: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``endpoint``; keep the exchange (an error response too) and return the response."""
        endpoint = _check_endpoint(endpoint)
        if not isinstance(body, Mapping):
            raise InvalidArgumentError(f"body must be a JSON object (a dict), got {brief(body)}")
        request = _plain_json(body)
        response = self._json(self._send("POST", endpoint, request))
        self.lines.append(json.dumps({"endpoint": endpoint, "request": request, "response": response}))
        return response

    def completion(self, prompt: str | list[int], **fields: Any) -> dict[str, Any]:
        """llama-server's ``/completion`` (``n_predict``, ``cache_prompt``, ``id_slot``, ...)."""
        return self.post("/completion", {"prompt": prompt, **fields})

    def chat(
        self, messages: list[Mapping[str, str]], *, model: str = "kvlab-tiny", **fields: Any
    ) -> dict[str, Any]:
        """The OpenAI API's ``/v1/chat/completions``."""
        return self.post("/v1/chat/completions", {"model": model, "messages": list(messages), **fields})

    def complete(
        self, prompt: str | list[int], *, model: str = "kvlab-tiny", **fields: Any
    ) -> dict[str, Any]:
        """The OpenAI API's ``/v1/completions``."""
        return self.post("/v1/completions", {"model": model, "prompt": prompt, **fields})

    def metrics(self) -> dict[str, float]:
        """Scrape ``/metrics`` (Prometheus text) into the trace, as a checkpoint; return the parsed values."""
        from kvlab.traces.read import parse_metrics

        text = self._send("GET", "/metrics").text
        self.lines.append(json.dumps({"metrics": text}))
        return parse_metrics(text)

    def slots(self) -> list[dict[str, Any]]:
        """llama-server's ``GET /slots`` into the trace, as a checkpoint."""
        slots = self._json(self._send("GET", "/slots"))
        if not isinstance(slots, list):
            raise ServerError(f"GET /slots did not return a list: {brief(slots)}")
        self.lines.append(json.dumps({"slots": slots}))
        return slots

    # ------------------------------------------------------------------ the trace

    def text(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.text(), encoding="utf-8")
        return path

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _send(self, method: str, endpoint: str, body: Any = None):
        import httpx

        try:
            response = self._client.request(method, endpoint, json=body)
        except httpx.HTTPError as exc:
            raise ServerError(
                f"cannot reach {self.base_url}{endpoint}: {type(exc).__name__}: {exc}"
            ) from None
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise ServerError(
                f"{endpoint} answered {len(response.content):,} bytes, more than {MAX_RESPONSE_BYTES:,}"
            )
        return response

    @staticmethod
    def _json(response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ServerError(
                f"{response.request.url} answered HTTP {response.status_code} with something that is not JSON: "
                f"{brief(response.text)}"
            ) from None


def _check_endpoint(endpoint: object) -> str:
    """A path under ``base_url``: no ``.`` or ``..`` segment that would climb out of it."""
    endpoint = check_text("endpoint", endpoint, allow_empty=False)
    if not endpoint.startswith("/"):
        raise InvalidArgumentError(f"endpoint must start with '/', got {brief(endpoint)}")
    path = endpoint.split("?", 1)[0]
    if any(seg in (".", "..") for seg in path.split("/")) or any(c in path for c in "#\\") or "//" in path:
        raise InvalidArgumentError(
            f"endpoint must be a plain path such as '/completion' (no '.', '..', '//', '#' or backslash), "
            f"got {brief(endpoint)}"
        )
    return endpoint


def _plain_json(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as the plain JSON values sent: NaN, sets, cycles and runaway nesting are refused here."""
    try:
        return json.loads(json.dumps(dict(body), allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentError(f"body must hold plain JSON values: {brief(str(exc), 120)}") from None
