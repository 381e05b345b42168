"""The engine's own thread, and the asyncio side the HTTP routes await on.

All model work runs in one thread (``EngineRunner``) stepping a
``kvlab.engine.scheduler.Scheduler``; the HTTP layer stays thin: a route submits a
request, then awaits its tokens on an ``asyncio.Queue`` the engine thread feeds
through ``loop.call_soon_threadsafe``. Gauges (running, waiting, KV use) are
read by the engine thread after every step, so ``/metrics`` never reads state
the engine is changing.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass

from starlette.requests import Request

from kvlab.engine.scheduler import Scheduler, ServeRequest

DISCONNECT_POLL_S = 0.2
"""How often a non-streaming request checks whether its client went away."""


@dataclass(frozen=True)
class Gauges:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0


class Pending:
    """One submitted request seen from the event loop: its tokens as they come, then its record."""

    def __init__(self, runner: EngineRunner, loop: asyncio.AbstractEventLoop) -> None:
        self.runner = runner
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        self.request: ServeRequest | None = None
        self.finished = False

    def on_token(self, req: ServeRequest, token: int) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("token", token))

    def on_finish(self, req: ServeRequest) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("done", req))

    async def tokens(self) -> AsyncIterator[int]:
        """Each sampled token as soon as the engine has it; a client that stops reading cancels the request."""
        try:
            while True:
                kind, value = await self.queue.get()
                if kind == "done":
                    self.finished = True
                    return
                yield value  # type: ignore[misc]
        finally:
            if not self.finished:
                self.cancel()

    async def wait(self, request: Request | None = None) -> ServeRequest:
        """The finished record; if ``request``'s client disconnects first, the request is cancelled.

        The client is checked every ``DISCONNECT_POLL_S`` whether or not tokens arrive meanwhile: a
        request decoding a token a millisecond never leaves the queue idle for that long.
        """
        loop = asyncio.get_running_loop()
        next_check = loop.time() + DISCONNECT_POLL_S
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    kind, value = "idle", None
                if kind == "done":
                    self.finished = True
                    assert isinstance(value, ServeRequest)
                    return value
                if request is not None and loop.time() >= next_check:
                    next_check = loop.time() + DISCONNECT_POLL_S
                    if await request.is_disconnected():
                        self.cancel()
                        raise asyncio.CancelledError
        finally:
            if not self.finished:
                self.cancel()

    def cancel(self) -> None:
        if self.request is not None and not self.finished:
            self.runner.scheduler.cancel(self.request.request_id)


class EngineRunner:
    """Steps the scheduler in a daemon thread until ``stop``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.gauges = Gauges()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvlab-engine", daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.scheduler.wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def submit(self, prompt: list[int], **options: object) -> Pending:
        """Queue a request (refusals raise before anything is queued) and return its ``Pending``."""
        pending = Pending(self, asyncio.get_running_loop())
        pending.request = self.scheduler.submit(
            prompt,
            on_token=pending.on_token,
            on_finish=pending.on_finish,
            **options,  # type: ignore[arg-type]
        )
        return pending

    async def call(self, run: Callable[[], object], *, ready: Callable[[], bool] | None = None,
                   blocks_admission: bool = False) -> object:  # fmt: skip
        """Run ``run`` on the engine thread between steps (when ``ready()`` holds) and await its result."""
        fut: Future = self.scheduler.defer(run, ready=ready, blocks_admission=blocks_admission)
        return await asyncio.wrap_future(fut)

    def _loop(self) -> None:
        sched = self.scheduler
        while not self._stop.is_set():
            sched.wakeup.clear()
            if not sched.has_work():
                self._update_gauges()
                sched.wakeup.wait(0.5)
                continue
            try:
                sched.step()
            except Exception:  # a bug, not a client's fault: say it, fail the requests, keep serving
                self.error = traceback.format_exc()
                print(f"kvlab serve: engine step failed:\n{self.error}", file=sys.stderr)
                for req in list(sched.running) + list(sched.waiting):
                    req.finish_reason = "error"
                    if req.on_finish is not None:
                        req.on_finish(req)
                sched.running.clear()
                sched.waiting.clear()
            self._update_gauges()

    def _update_gauges(self) -> None:
        sched = self.scheduler
        self.gauges = Gauges(len(sched.running), len(sched.waiting), sched.kv_cache_usage())
