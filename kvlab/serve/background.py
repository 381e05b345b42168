"""Start ``kvlab serve`` in the background (a notebook's server), or use the one ``KVLAB_SERVER_URL`` names.

``start_server(cache="slot", slots=1)`` runs ``python -m kvlab serve --port 0`` as a
child process bound to 127.0.0.1, waits for it to print its address and answer
``/health``, and stops it when the kernel exits (or at ``handle.stop()``). When the
environment variable ``KVLAB_SERVER_URL`` is set (a real vLLM or llama-server, or a
kvlab server started by hand), ``start_server`` starts nothing and returns a handle
to that URL, so the same cells run against either.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import InvalidArgumentError, KvlabError

SERVER_URL_ENV = "KVLAB_SERVER_URL"
START_TIMEOUT_S = 120.0


@dataclass
class ServerHandle:
    """A running server: its ``url``; ``process`` is None when the server is not ours to stop."""

    url: str
    process: subprocess.Popen | None = None
    log: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    api_key: str | None = None

    @property
    def external(self) -> bool:
        return self.process is None

    def _headers(self) -> dict[str, str]:
        return {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}

    def get(self, path: str, *, timeout: float = 60.0) -> Any:
        """``GET url+path``; the JSON answer (or the text of a non-JSON one, such as ``/metrics``)."""
        import httpx

        r = httpx.get(self.url + path, headers=self._headers(), timeout=timeout)
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text

    def post(self, path: str, body: dict[str, Any] | None = None, *, timeout: float = 60.0) -> Any:
        """``POST url+path`` with a JSON body; returns the JSON answer, raising on an HTTP error."""
        import httpx

        r = httpx.post(self.url + path, json=body or {}, headers=self._headers(), timeout=timeout)
        if r.status_code >= 400:
            raise KvlabError(f"{path} answered {r.status_code}: {r.text[:300]}")
        return (
            r.json()
            if r.content and r.headers.get("content-type", "").startswith("application/json")
            else None
        )

    def metrics(self) -> dict[str, float]:
        """``/metrics`` parsed: each sample's value by ``name{labels}``, and by name (summed over labels)."""
        from kvlab.serve.metrics import parse_metrics

        return parse_metrics(self.get("/metrics"))

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop our server (SIGTERM, then SIGKILL after ``timeout``); returns its exit status."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        return proc.returncode

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_args(**options: Any) -> list[str]:
    """``kvlab serve`` options from keywords: ``cache="slot", slots=2`` -> ``--cache slot --slots 2``."""
    args: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def start_server(*, use_env: bool = True, timeout: float = START_TIMEOUT_S, **options: Any) -> ServerHandle:
    """A server to talk to: ``KVLAB_SERVER_URL``'s if set (and ``use_env``), else a new ``kvlab serve``.

    ``options`` are ``kvlab serve``'s (``cache``, ``slots``, ``block_size``, ``num_blocks``,
    ``max_num_seqs``, ``slot_save_path``, ``api_key`` ...). The new server listens on a free
    127.0.0.1 port and is stopped when this Python process exits.
    """
    url = os.environ.get(SERVER_URL_ENV) if use_env else None
    if url:
        return ServerHandle(url.rstrip("/"), api_key=options.get("api_key"))
    if "port" in options or "host" in options:
        raise InvalidArgumentError("start_server picks a free 127.0.0.1 port itself; leave out host and port")
    cmd = [sys.executable, "-m", "kvlab", "serve", "--port", "0", *server_args(**options)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    handle = ServerHandle("", proc, api_key=options.get("api_key"))
    found = threading.Event()

    def drain() -> None:  # read the child's output for good, so it never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            handle.log.append(line.rstrip())
            if not found.is_set() and "listening on " in line:
                handle.url = line.split("listening on ", 1)[1].strip()
                found.set()
        found.set()

    threading.Thread(target=drain, daemon=True).start()
    atexit.register(handle.stop)
    if not found.wait(timeout) or not handle.url:
        handle.stop()
        raise KvlabError("kvlab serve did not start:\n" + "\n".join(handle.log))
    _wait_healthy(handle, timeout)
    return handle


def _wait_healthy(handle: ServerHandle, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(handle.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    handle.stop()
    raise KvlabError(f"kvlab serve at {handle.url} did not become healthy in {timeout:.0f} s")
