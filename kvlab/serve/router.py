"""kvlab's own router: a small ASGI proxy that sends each request to a replica by its prompt's prefix.

Used by ``python -m kvlab fleet-up --router kvlab`` where sglang-router cannot run (it is a Rust
wheel), and said so when used. Policies:

``cache_aware``
    Lesson 002's idea: a hit only happens on the replica that holds the blocks. The router keeps,
    per replica, the chained hashes of the prompts it sent there (64-character chunks of text,
    each hash chained to its parent's and started from the request's ``cache_salt``, so equal
    hashes mean equal prefixes and tenants stay apart). A request goes to the replica whose
    table matches its longest run of leading chunks; on a tie (a new user matches only the
    shared system prompt, which every replica has), to the one with the fewest requests in
    flight, then the fewest chunks recorded. If the chosen replica has more than
    ``balance_abs`` requests in flight beyond the least busy one, load wins (as sglang-router's
    ``balance_abs_threshold``, but sized for a handful of requests rather than 64). The table is
    approximate, like sglang-router's tree: it never sees the replica evict, and it forgets the
    oldest chunks past ``max_chunks`` per replica.
``round_robin``
    Request i to replica ``i % n``: the lesson's round-robin.
``random``
    A seeded random replica.

A replica that refuses the connection or answers 5xx is skipped for ``cooldown`` seconds and the
request goes to the next choice (fail over), at most once per replica. Responses carry
``x-kvlab-replica`` (the replica's URL). ``/workers`` lists the replicas the way sglang-router
does, so ``kvlab.serve.load`` finds their ``/metrics`` behind either router.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from kvlab.errors import InvalidArgumentError, brief, check_choice, check_int, check_size

POLICIES = ("cache_aware", "round_robin", "random")
CHUNK_CHARS = 64
MAX_BODY_BYTES = 16 << 20  # a request body larger than this gets 413
FORWARDED = ("/v1/completions", "/v1/chat/completions", "/completion")


def chunk_hashes(text: str, salt: str | None = None, *, chunk_chars: int = CHUNK_CHARS) -> list[bytes]:
    """Chained hashes of ``text``'s full ``chunk_chars``-character chunks, started from ``salt``."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a string, got {type(text).__name__}")
    chunk_chars = check_size("chunk_chars", chunk_chars, "tokens", minimum=1)
    parent = hashlib.blake2b((salt or "").encode("utf-8", "replace"), digest_size=16).digest()
    out = []
    for i in range(0, len(text) - len(text) % chunk_chars, chunk_chars):
        chunk = text[i : i + chunk_chars].encode("utf-8", "replace")
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        out.append(parent)
    return out


@dataclass
class Replica:
    """What the router knows of one replica: its chunk table, its load, its health."""

    url: str
    chunks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    in_flight: int = 0
    down_until: float = 0.0
    routed: int = 0

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading chunks of the prompt this replica was sent before (a miss ends the run)."""
        n = 0
        for h in hashes:
            if h not in self.chunks:
                break
            n += 1
        return n


class PrefixRouter:
    """The routing decisions, apart from HTTP, so they can be read and tested on their own."""

    def __init__(
        self,
        urls: Sequence[str],
        policy: str = "cache_aware",
        *,
        balance_abs: int = 2,
        max_chunks: int = 1 << 16,
        cooldown: float = 5.0,
        seed: int = 0,
    ) -> None:
        if isinstance(urls, (str, bytes)) or not urls:
            raise InvalidArgumentError(f"urls must be a non-empty list of replica URLs, got {brief(urls)}")
        self.replicas = [Replica(str(u).rstrip("/")) for u in urls]
        self.policy = check_choice("policy", policy, POLICIES)
        self.balance_abs = check_int("balance_abs", balance_abs, minimum=0)
        self.max_chunks = check_int("max_chunks", max_chunks, minimum=1)
        if isinstance(cooldown, bool) or not isinstance(cooldown, (int, float)) or not 0 <= cooldown <= 3600:
            raise InvalidArgumentError(f"cooldown must be seconds in [0, 3600], got {brief(cooldown)}")
        self.cooldown = float(cooldown)
        self._next = 0
        self._random = random.Random(seed)

    def order(self, text: str, salt: str | None = None, *, now: float | None = None) -> list[int]:
        """Replica indices to try, best first: the policy's choice, then the rest as fail-over."""
        now = time.monotonic() if now is None else now
        up = [i for i, r in enumerate(self.replicas) if r.down_until <= now]
        down = [i for i, r in enumerate(self.replicas) if r.down_until > now]
        if not up:
            return down
        if self.policy == "round_robin":
            first = up[self._next % len(up)]
            self._next += 1
        elif self.policy == "random":
            first = self._random.choice(up)
        else:
            first = self._cache_aware(up, chunk_hashes(text, salt))
        rest = sorted((i for i in up if i != first), key=self._load_key)
        return [first, *rest, *down]

    def _load_key(self, i: int) -> tuple[int, int, int]:
        r = self.replicas[i]
        return (r.in_flight, len(r.chunks), i)

    def _cache_aware(self, up: list[int], hashes: list[bytes]) -> int:
        matches = {i: self.replicas[i].match(hashes) for i in up}
        best = max(up, key=lambda i: (matches[i], *(-k for k in self._load_key(i))))
        least = min(up, key=self._load_key)
        if self.replicas[best].in_flight - self.replicas[least].in_flight > self.balance_abs:
            return least
        return best

    def record(self, index: int, text: str, salt: str | None = None) -> None:
        """Remember that ``text`` went to replica ``index`` (its chunks now count as cached there)."""
        replica = self.replicas[index]
        replica.routed += 1
        if self.policy != "cache_aware":
            return
        table = replica.chunks
        for h in chunk_hashes(text, salt):
            table[h] = None
            table.move_to_end(h)
        while len(table) > self.max_chunks:
            table.popitem(last=False)

    def mark_down(self, index: int, *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.replicas[index].down_until = now + self.cooldown


def request_text(body: object) -> tuple[str, str | None]:
    """(the text a request is routed on, its cache_salt): the prompt, or the messages' contents joined."""
    if not isinstance(body, dict):
        return "", None
    salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, salt
    if isinstance(prompt, list):
        return " ".join(str(p) for p in prompt), salt
    messages = body.get("messages")
    parts: list[str] = []
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [
                    p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                ]
    return "\n".join(parts), salt


def _error(status: int, message: str, kind: str = "invalid_request_error") -> object:
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
    )


def build_app(router: PrefixRouter, *, request_timeout: float = 600.0) -> object:
    """The ASGI app: forwards the OpenAI and llama-server generation endpoints through ``router``."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    timeout = httpx.Timeout(request_timeout, connect=5.0)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    client = httpx.AsyncClient(timeout=timeout, limits=limits)

    async def forward(request: Request) -> object:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and len(declared) < 20 and int(declared) > MAX_BODY_BYTES:
            return _error(
                413, f"request body over {MAX_BODY_BYTES} bytes"
            )  # from the header: no waiting for it
        raw = bytearray()
        async for chunk in request.stream():  # a chunked body is counted as it comes
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return _error(413, f"request body over {MAX_BODY_BYTES} bytes")
        raw = bytes(raw)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return _error(400, "request body is not valid JSON")
        text, salt = request_text(body)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        last_error = "no replica answered"
        for index in router.order(text, salt):
            replica = router.replicas[index]
            replica.in_flight += 1
            try:
                upstream = client.build_request(
                    "POST", replica.url + request.url.path, content=raw, headers=headers
                )
                resp = await client.send(upstream, stream=True)
            except httpx.HTTPError as exc:
                replica.in_flight -= 1
                router.mark_down(index)
                last_error = f"{replica.url}: {type(exc).__name__}"
                continue
            if resp.status_code >= 500:
                await resp.aclose()
                replica.in_flight -= 1
                router.mark_down(index)
                last_error = f"{replica.url}: HTTP {resp.status_code}"
                continue
            router.record(index, text, salt)

            async def done(resp: httpx.Response = resp, replica: Replica = replica) -> None:
                await resp.aclose()
                replica.in_flight -= 1

            out_headers = {"x-kvlab-replica": replica.url}
            if "content-type" in resp.headers:
                out_headers["content-type"] = resp.headers["content-type"]
            return StreamingResponse(
                resp.aiter_raw(),
                status_code=resp.status_code,
                headers=out_headers,
                background=BackgroundTask(done),
            )
        return _error(503, f"no replica could serve the request ({last_error})", "service_unavailable")

    async def health(request: Request) -> object:
        up = [r for r in router.replicas if r.down_until <= time.monotonic()]
        return PlainTextResponse("ok" if up else "no replica up", status_code=200 if up else 503)

    async def workers(request: Request) -> object:
        rows = [
            {
                "url": r.url,
                "is_healthy": r.down_until <= time.monotonic(),
                "load": r.in_flight,
                "routed": r.routed,
            }
            for r in router.replicas
        ]
        return JSONResponse({"workers": rows, "total": len(rows), "policy": router.policy, "router": "kvlab"})

    async def models(request: Request) -> object:
        for r in router.replicas:
            try:
                resp = await client.get(r.url + "/v1/models", timeout=5.0)
            except httpx.HTTPError:
                continue
            return JSONResponse(resp.json(), status_code=resp.status_code)
        return _error(503, "no replica answered /v1/models", "service_unavailable")

    routes = [Route(path, forward, methods=["POST"]) for path in FORWARDED]
    routes += [Route("/health", health), Route("/workers", workers), Route("/v1/models", models)]

    @contextlib.asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=routes, lifespan=lifespan)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvlab.serve.router --worker-urls URL ... --policy P --host H --port N`` (sglang-router's flags)."""
    parser = argparse.ArgumentParser(prog="python -m kvlab.serve.router", description=__doc__.splitlines()[0])
    parser.add_argument("--worker-urls", nargs="+", required=True)
    parser.add_argument("--policy", choices=POLICIES, default="cache_aware")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--balance-abs-threshold", type=int, default=2)
    parser.add_argument("--max-chunks", type=int, default=1 << 16)
    parser.add_argument("--request-timeout-secs", type=float, default=600.0)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    import uvicorn

    router = PrefixRouter(
        args.worker_urls, args.policy, balance_abs=args.balance_abs_threshold, max_chunks=args.max_chunks
    )
    app = build_app(router, request_timeout=args.request_timeout_secs)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
