"""A real llama-server next to kvlab's prediction, for notebooks 10-12, when one is built.

``python tools/conformance/llama_harness.py --build`` builds llama-server at llama.cpp commit
0c1e57098 (CPU only) into ``$KVLAB_LLAMA_CACHE`` (default ``~/.cache/kvlab-llama``) and writes two
tiny random-weight models there: a 4-layer llama (2 KV heads of 32, F16: the lessons' tiny model)
and a 6-layer gemma3 with a 128-token sliding window. ``$KVLAB_LLAMA_SERVER`` may name another
llama-server binary built at that commit.

A lesson runs the same requests on both: each request goes to a fresh server on 127.0.0.1 (a
free port, its own process group, stopped on every path: context manager, ``finally`` and
``atexit``) as token ids to ``POST /completion``, and kvlab's model gets the same prompt and the
tokens the real model sampled. Without the binary nothing runs and ``missing_line`` says how to
get it. The conformance harness (``tools/conformance/llama_harness.py``) drives its servers with
this module too.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMIT = "0c1e57098"
BUILD_COMMAND = "python tools/conformance/llama_harness.py --build"
HTTP_TIMEOUT = 180.0  # a 2,600-token prompt with -ub 128 on a loaded 2-core machine takes over a minute
START_TIMEOUT = 60.0
MODEL_FILES = {"llama": "tiny-llama-v1.gguf", "gemma3": "tiny-gemma3-v1.gguf"}


def cache_root() -> Path:
    """Where the harness builds llama-server and writes its models."""
    return Path(os.environ.get("KVLAB_LLAMA_CACHE", Path.home() / ".cache" / "kvlab-llama"))


def server_path() -> Path:
    """``$KVLAB_LLAMA_SERVER``, or the harness's build in the cache folder."""
    env = os.environ.get("KVLAB_LLAMA_SERVER")
    return Path(env) if env else cache_root() / "build" / "bin" / "llama-server"


def find_server() -> Path | None:
    """The llama-server binary, or None when it is not built."""
    p = server_path()
    return p if p.is_file() and os.access(p, os.X_OK) else None


def model_path(kind: str) -> Path | None:
    """The tiny ``llama`` or ``gemma3`` model the harness wrote, or None."""
    p = cache_root() / "models" / MODEL_FILES[kind]
    return p if p.is_file() else None


def available(kind: str) -> bool:
    """True when the binary and the ``kind`` model are both there."""
    return find_server() is not None and model_path(kind) is not None


def _need(kind: str) -> Path:
    path = model_path(kind)
    if path is None or find_server() is None:
        raise FileNotFoundError(missing_line("its counters"))
    return path


def missing_line(shows: str) -> str:
    """The one line a lesson cell prints without the binary."""
    return (
        f"no llama-server here (build it with `{BUILD_COMMAND}`, about 7 minutes, or set KVLAB_LLAMA_SERVER): "
        f"this cell would run the same requests on it and show {shows}"
    )


# ---------------------------------------------------------------------- processes

_RUNNING: set[subprocess.Popen] = set()


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    _RUNNING.discard(proc)


@atexit.register
def _kill_all() -> None:
    for proc in list(_RUNNING):
        _kill(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpError(Exception):
    def __init__(self, status: int, body: dict) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


@dataclass
class LlamaServer:
    """One llama-server process on 127.0.0.1; use as a context manager.

    ``slot_dir`` is its ``--slot-save-path`` (a fresh temporary folder when None, removed at the end).
    """

    model: Path
    args: list[str]
    slot_dir: Path | None = None
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    _tmp: str | None = None
    _log_seen: int = field(default=0, repr=False)

    def __enter__(self) -> LlamaServer:
        exe = find_server()
        if exe is None:
            raise FileNotFoundError(f"no llama-server at {server_path()}: run {BUILD_COMMAND}")
        self._tmp = tempfile.mkdtemp(prefix="kvlab-llama-")
        self.log_path = Path(self._tmp) / "server.log"
        self.port = free_port()
        slots = str(self.slot_dir) if self.slot_dir is not None else self._tmp
        cmd = [str(exe), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", "2", "--no-webui", "--seed", "0", "-lv", "4", "--slot-save-path", slots, *self.args]  # fmt: skip
        log = open(self.log_path, "wb")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log.close()
        _RUNNING.add(self.proc)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {self.log_tail()}")
                with contextlib.suppress(OSError, HttpError, ValueError):
                    if self.get("/health", timeout=2).get("status") == "ok":
                        return self
                if time.monotonic() > deadline:
                    raise TimeoutError(f"llama-server not healthy after {START_TIMEOUT} s: {self.log_tail()}")
                time.sleep(0.1)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _kill(self.proc)
        if self._tmp is not None and os.environ.get("KVLAB_LLAMA_KEEP_LOGS") is None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def log_text(self) -> str:
        assert self.log_path is not None
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_log(self, marker: str, count: int, timeout: float = 5.0) -> str:
        """The log once ``marker`` occurs ``count`` times (the server logs from a worker thread)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_text()
            if text.count(marker) >= count or time.monotonic() > deadline:
                return text
            time.sleep(0.02)

    def log_tail(self, n: int = 2000) -> str:
        return self.log_text()[-n:]

    def _call(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                payload = json.loads(e.read() or b"{}")
            except ValueError:
                payload = {}
            raise HttpError(e.code, payload) from None

    def get(self, path: str, timeout: float = HTTP_TIMEOUT) -> Any:
        return self._call("GET", path, None, timeout)

    def post(self, path: str, body: dict, timeout: float = HTTP_TIMEOUT) -> Any:
        return self._call("POST", path, body, timeout)

    def complete(self, prompt: list[int], n_predict: int, id_slot: int = -1, **extra: Any) -> dict:
        """One greedy ``/completion``: {refused, slot, cache_n, prompt_n, n_generated, tokens} or the 400.

        ``extra`` goes into the body as is (``message_delimiters``, for instance).
        """
        body: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": True,
                                "temperature": 0, "top_k": 1, "ignore_eos": True, "return_tokens": True, **extra}  # fmt: skip
        if id_slot != -1:
            body["id_slot"] = id_slot
        try:
            d = self.post("/completion", body)
        except HttpError as e:
            if e.status == 400:
                return {"refused": True, "error": e.body.get("error", {}).get("type")}
            raise
        t = d["timings"]
        return {"refused": False, "slot": d["id_slot"], "cache_n": t["cache_n"], "prompt_n": t["prompt_n"],
                "n_generated": t["predicted_n"], "tokens": d["tokens"]}  # fmt: skip


# ---------------------------------------------------------------------- lesson runs


@dataclass(frozen=True)
class Request:
    """One request of a lesson run: ``tokens`` alone, or appended to the previous prompt and its reply."""

    tokens: tuple[int, ...]
    n_predict: int = 1
    id_slot: int = -1
    after_previous: bool = False


def resolve(requests: list[Request], replies: list[list[int]]) -> list[int]:
    """The prompt of request ``len(replies)``: its tokens, after the previous prompt and reply if asked."""
    req = requests[len(replies)]
    if not req.after_previous or not replies:
        return list(req.tokens)
    prev = resolve(requests[: len(replies)], replies[:-1])
    return prev + replies[-1] + list(req.tokens)


def run_slots(
    requests: list[Request],
    *,
    n_slots: int = 1,
    n_ctx: int = 512,
    similarity: float = 0.1,
    cache_ram_mib: int = 0,
) -> tuple[list[dict], list[dict]]:
    """The requests on a real server (``-np``, ``-c n_ctx x n_slots``) and on ``SlotServer``: (real, kvlab) rows."""
    from kvlab.server.slots import SlotServer

    path = _need("llama")
    args = ["-np", str(n_slots), "-c", str(n_ctx * n_slots), "--slot-prompt-similarity", str(similarity),
            "--cache-ram", str(cache_ram_mib)]  # fmt: skip
    ours = SlotServer(n_slots, n_ctx=n_ctx, slot_prompt_similarity=similarity, cache_ram_mib=cache_ram_mib,
                      state_bytes_per_token=1036, state_header_bytes=124 + 4 * n_slots, record=False)  # fmt: skip
    real_rows: list[dict] = []
    kvlab_rows: list[dict] = []
    replies: list[list[int]] = []
    with LlamaServer(path, args) as srv:
        for req in requests:
            prompt = resolve(requests, replies)
            real = srv.complete(prompt, req.n_predict, req.id_slot)
            gen = real.get("tokens") or []
            rec = ours.complete(prompt, max_tokens=req.n_predict, generated=gen, id_slot=req.id_slot)
            replies.append(list(gen))
            real_rows.append({"prompt": len(prompt), **{k: v for k, v in real.items() if k != "tokens"}})
            kvlab_rows.append({"prompt": len(prompt), "refused": rec.error is not None, "slot": rec.slot_id,
                               "cache_n": rec.cache_n, "prompt_n": rec.prompt_n, "n_generated": rec.n_generated})  # fmt: skip
    return real_rows, kvlab_rows


def run_swa(
    requests: list[Request], *, ctx_checkpoints: int = 32, swa_full: bool = False
) -> tuple[list[dict], list[dict]]:
    """The requests on the real gemma3 server (window 128, ``-c 4096``) and on ``SwaSlot``: (real, kvlab) rows."""
    import re

    from kvlab.server.swa import SwaConfig, SwaSlot

    created = re.compile(
        r"created context checkpoint \d+ of \d+ \(pos_min = (-?\d+), pos_max = (-?\d+), n_tokens = (\d+)"
    )
    path = _need("gemma3")
    args = ["-np", "1", "-c", "4096", "--cache-ram", "0", "-ctxcp", str(ctx_checkpoints)]
    if swa_full:
        args.append("--swa-full")
    slot = SwaSlot(SwaConfig(n_swa=128, n_ctx=4096, swa_full=swa_full, ctx_checkpoints=ctx_checkpoints))
    real_rows: list[dict] = []
    kvlab_rows: list[dict] = []
    replies: list[list[int]] = []
    with LlamaServer(path, args) as srv:
        for i, req in enumerate(requests, 1):
            prompt = resolve(requests, replies)
            mark = len(srv.log_text())
            real = srv.complete(prompt, req.n_predict)
            log = srv.wait_log("stop processing", i)[mark:]
            gen = real.get("tokens") or []
            rec = slot.complete(prompt, max_tokens=req.n_predict, generated=gen)
            replies.append(list(gen))
            spans = [f"[{a}, {b}] at {c}" for a, b, c in created.findall(log)]
            real_rows.append({"prompt": len(prompt), "cache_n": real["cache_n"], "prompt_n": real["prompt_n"],
                              "checkpoints": ", ".join(spans) or "-"})  # fmt: skip
            ours = ", ".join(f"[{c.pos_min}, {c.pos_max}] at {c.n_tokens}" for c in rec.created) or "-"
            kvlab_rows.append({"prompt": len(prompt), "cache_n": rec.cache_n, "prompt_n": rec.prompt_n,
                               "checkpoints": ours})  # fmt: skip
    return real_rows, kvlab_rows


def side_by_side(title: str, real_rows: list[dict], kvlab_rows: list[dict], columns: list[str]) -> list[str]:
    """Lines of a small table: each request's real value next to kvlab's, column by column."""
    lines = [f"{title} (llama-server {COMMIT}, real | kvlab)"]
    agree = 0
    for i, (real, ours) in enumerate(zip(real_rows, kvlab_rows, strict=True), 1):
        if real.get("refused") or ours.get("refused"):
            same = bool(real.get("refused")) == bool(ours.get("refused"))
            r, k = ("refused" if x.get("refused") else "served" for x in (real, ours))
            cells = [f"{r} | {k}" + ("" if same else "  <- differs")]
        else:
            cells = [
                f"{col} {real.get(col)} | {ours.get(col)}"
                + ("" if real.get(col) == ours.get(col) else "  <- differs")
                for col in columns
            ]
        agree += all(not c.endswith("differs") for c in cells)
        lines.append(f"  request {i} ({real['prompt']} tokens): " + "; ".join(cells))
    lines.append(f"  kvlab agrees on {agree} of {len(real_rows)} requests")
    return lines


def run_slot_file(prefix: list[int], n_new: list[int]) -> dict:
    """Save a slot holding ``prefix`` on a real server, restore it in a new one, send ``prefix + n_new``.

    Returns the save's ``n_saved``/``n_written``, the restore's ``n_restored`` and the last request's
    ``cache_n``/``prompt_n``, as the real server reported them.
    """
    path = _need("llama")
    args = ["-np", "1", "-c", "2048", "--cache-ram", "0"]
    with tempfile.TemporaryDirectory(prefix="kvlab-slots-") as d:
        with LlamaServer(path, args, slot_dir=Path(d)) as first:
            first.complete(prefix, 0)
            saved = first.post("/slots/0?action=save", {"filename": "agent-prefix.bin"})
        with LlamaServer(path, args, slot_dir=Path(d)) as restarted:
            restored = restarted.post("/slots/0?action=restore", {"filename": "agent-prefix.bin"})
            after = restarted.complete(prefix + n_new, 1)
    return {"n_saved": saved["n_saved"], "n_written": saved["n_written"], "n_restored": restored["n_restored"],
            "cache_n": after["cache_n"], "prompt_n": after["prompt_n"]}  # fmt: skip
