"""Replay lesson 002's chat traffic as real HTTP requests through a router, and read back the hits.

The lesson's fleet is simulated in one process (``kvlab.fleet.simulate``); here the same users,
turns, shared system prompt and salts go over HTTP to a router in front of real ``kvlab serve``
replicas, and the hit rates come back from each replica's ``/metrics`` (vLLM's
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` counters, in tokens).

How the lesson's token ids travel as text. A router sees text, not token ids (sglang-router's
cache-aware tree matches characters, and it refuses a ``prompt`` of integers), so each lesson token
id becomes one word (``token_word``): a space and letters, which kvlab's tokenizer reads back as
exactly one token. A prompt of the lesson's n tokens is then n tokens on the server too.

What is sent. Turn k of user u sends ``system + history + message`` to ``/v1/completions``, with
the user's ``cache_salt`` when the config salts (``kvlab.fleet.config.salt_of``) and the lesson's
timestamp where ``FleetConfig.header`` puts it. The answer is the server's own reply of
``answer_tokens`` tokens, which joins the user's history as a chat client's would; the lesson's
answers (50 to 400 tokens) are cut to that length so a replay stays small.
``simulated_traffic`` builds the very same traffic for the simulation, answers of the same lengths,
so the two sides compare like for like.

Bounded on every side: ``concurrency`` requests in flight, a user's next turn only after its
previous one came back (it needs the reply), each request under ``request_timeout`` seconds and
the whole replay under ``deadline`` seconds; a request that fails (a replica died, a timeout, an
HTTP error) is recorded with its error and the user's chat goes on without that turn.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvlab.errors import MAX_TOKEN_ID, InvalidArgumentError, brief, check_choice, check_int, check_size
from kvlab.fleet import ChatTraffic, FleetConfig, FleetResult, UserTurn, chat_traffic, simulate
from kvlab.fleet.config import salt_of
from kvlab.fleet.traffic import prompt_lengths, timestamp_tokens
from kvlab.serve.client import run_async

LETTERS = "abcdefghijklmnopqrstuvwxyz"
MODEL = "kvlab-tiny"
QUERIES = "vllm:prefix_cache_queries"  # vLLM's counter names (v0.33.0): prompt tokens looked up ...
HITS = "vllm:prefix_cache_hits"  # ... and the tokens of them found cached


def token_word(token: int) -> str:
    """One lesson token id as one word: a space, a capital, then letters (``7`` -> ``" H"``).

    The letters are the id in base 26, least significant first, so distinct ids give distinct
    words; kvlab's tokenizer reads a space and letters as one token, and the capital keeps these
    words apart from the tiny model's lowercase reply words.
    """
    token = check_int("token", token, minimum=0, maximum=MAX_TOKEN_ID)
    letters = []
    while True:
        token, digit = divmod(token, 26)
        letters.append(LETTERS[digit])
        if not token:
            break
    return " " + letters[0].upper() + "".join(letters[1:])


def tokens_text(tokens: Sequence[int]) -> str:
    """Token ids as text, one ``token_word`` each."""
    return "".join(token_word(t) for t in tokens)


@dataclass(frozen=True)
class LiveRequest:
    """One request as it went over HTTP (or failed to): who sent it and what came back."""

    clock: int
    user: int
    turn: int
    ok: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    replica: str | None = None  # the replica's URL, when the router says (kvlab's router does)
    error: str | None = None


@dataclass(frozen=True)
class ReplicaCounters:
    """A replica's prefix-cache counters over one replay: the change in its ``/metrics``."""

    url: str
    queries: int
    hits: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class LiveResult:
    """One replay: every request, the wall time, and each replica's counters (when readable)."""

    config: FleetConfig
    answer_tokens: int
    concurrency: int
    wall_s: float
    requests: tuple[LiveRequest, ...]
    replicas: tuple[ReplicaCounters, ...] = ()
    label: str = ""

    @property
    def ok(self) -> tuple[LiveRequest, ...]:
        return tuple(r for r in self.requests if r.ok)

    @property
    def failed(self) -> tuple[LiveRequest, ...]:
        return tuple(r for r in self.requests if not r.ok)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.ok)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.ok)

    @property
    def hit_rate(self) -> float:
        """Cached share of prompt tokens: from the replicas' ``/metrics`` if read, else from the responses."""
        if self.replicas:
            queries = sum(r.queries for r in self.replicas)
            return sum(r.hits for r in self.replicas) / queries if queries else 0.0
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def requests_per_s(self) -> float:
        return len(self.ok) / self.wall_s if self.wall_s > 0 else 0.0

    def row(self) -> dict[str, object]:
        return {
            "run": self.label,
            "requests": len(self.requests),
            "failed": len(self.failed),
            "hit_rate": round(self.hit_rate, 4),
            "requests_per_s": round(self.requests_per_s, 2),
            "replica_hit_rates": [round(r.hit_rate, 4) for r in self.replicas],
            "replica_queries": [r.queries for r in self.replicas],
        }


# ---------------------------------------------------------------- the traffic


def check_live_config(config: object) -> FleetConfig:
    """A ``FleetConfig`` a live fleet can replay: the replicas and routing are the fleet's, not the config's."""
    if not isinstance(config, FleetConfig):
        raise InvalidArgumentError(f"config must be a FleetConfig, got {type(config).__name__}")
    if config.block_size != 16:
        raise InvalidArgumentError(
            f"a live replay keeps kvlab serve's block size of 16 tokens, got block_size={config.block_size}"
        )
    return config


def simulated_traffic(config: FleetConfig, answer_tokens: int) -> ChatTraffic:
    """The lesson's traffic for ``config`` with every answer cut to ``answer_tokens`` tokens.

    The simulation of a live replay: what the server replies differs from the lesson's answers,
    but a user's history holds an answer of the same length, which is all a prefix cache sees.
    """
    config = check_live_config(config)
    answer_tokens = check_size("answer_tokens", answer_tokens, "tokens", minimum=1)
    full = chat_traffic(config.users, config.turns, config.seed, config.system_tokens)
    return replace(
        full,
        requests=tuple(UserTurn(t.clock, t.user, t.message, t.answer[:answer_tokens]) for t in full.requests),
    )


def context_needed(config: FleetConfig, answer_tokens: int) -> int:
    """The longest prompt + answer of a live replay, in tokens: what each replica's context must hold."""
    traffic = simulated_traffic(config, answer_tokens)
    return max(p + a for p, a in prompt_lengths(traffic, config.header))


def simulate_live(
    config: FleetConfig, answer_tokens: int, *, replicas: int, routing: str, engine: bool = True
) -> FleetResult:
    """The simulation's numbers for a live replay: the same traffic, ``replicas`` replicas, ``routing``.

    ``config.capacity_blocks`` is the whole fleet's cache, split equally (each replica's
    ``--num-blocks``); ``engine=True`` runs vLLM's pool model, as ``kvlab serve`` does.
    """
    config = check_live_config(config)
    routing = check_choice("routing", routing, ("round-robin", "user-hash"))
    replicas = check_size("replicas", replicas, "replicas", minimum=1)
    traffic = simulated_traffic(config, answer_tokens)
    scenario = replace(config, replicas=replicas, routing=routing)
    return simulate(scenario, engine=engine, traffic=traffic, scenario=f"simulated {routing} x{replicas}")


# ---------------------------------------------------------------- the replay


def replay(
    router_url: str,
    config: FleetConfig,
    *,
    answer_tokens: int = 8,
    concurrency: int = 8,
    request_timeout: float = 30.0,
    deadline: float = 300.0,
    replica_urls: Sequence[str] = (),
    label: str = "",
    model: str = MODEL,
) -> LiveResult:
    """Send ``config``'s traffic through ``router_url`` and return what came back.

    ``replica_urls`` (each replica's own URL) lets the result carry every replica's counters, read
    from its ``/metrics`` before and after; without them, the router's ``/workers`` list is tried
    (sglang-router and kvlab's router both answer it). The hit rate then comes from the counters,
    else from the responses' ``usage.prompt_tokens_details.cached_tokens``.
    """
    import httpx

    router_url = check_url("router_url", router_url)
    config = check_live_config(config)
    answer_tokens = check_size("answer_tokens", answer_tokens, "tokens", minimum=1)
    concurrency = check_size("concurrency", concurrency, "slots", minimum=1)
    request_timeout = _check_seconds("request_timeout", request_timeout)
    deadline = _check_seconds("deadline", deadline)
    urls = [check_url("replica_urls[]", u) for u in _as_list("replica_urls", replica_urls)]
    if not urls:
        urls = discover_replicas(router_url)
    with httpx.Client(timeout=5.0) as client:
        before = {u: read_counters(client, u) for u in urls}
    traffic = chat_traffic(config.users, config.turns, config.seed, config.system_tokens)
    start = time.perf_counter()
    rows = run_async(
        lambda: _replay(
            router_url, config, traffic, answer_tokens, concurrency, request_timeout, deadline, model
        )
    )  # in a helper thread when a loop already runs here (a Jupyter kernel)
    wall = time.perf_counter() - start
    counters: list[ReplicaCounters] = []
    with httpx.Client(timeout=5.0) as client:
        for u in urls:
            after = read_counters(client, u)
            if before[u] is not None and after is not None:
                counters.append(ReplicaCounters(u, after[0] - before[u][0], after[1] - before[u][1]))
    if len(counters) != len(urls):
        counters = []  # a replica that stopped answering: the responses' counts are all there is
    return LiveResult(config, answer_tokens, concurrency, wall, tuple(rows), tuple(counters), label)


async def _replay(
    router_url: str,
    config: FleetConfig,
    traffic: ChatTraffic,
    answer_tokens: int,
    concurrency: int,
    request_timeout: float,
    deadline: float,
    model: str,
) -> list[LiveRequest]:
    """Dispatch the requests in arrival order, ``concurrency`` at a time; a user's turns in order."""
    import httpx

    chat = _Chat(config, tokens_text(traffic.system), answer_tokens, model)
    slots = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(request_timeout, connect=min(5.0, request_timeout))
    turns: dict[int, int] = {}
    previous: dict[int, asyncio.Task[LiveRequest]] = {}
    tasks: list[asyncio.Task[LiveRequest]] = []

    async with httpx.AsyncClient(base_url=router_url, timeout=timeout, limits=limits) as client:

        async def send(req: UserTurn, turn: int, wait_for: asyncio.Task[LiveRequest] | None) -> LiveRequest:
            try:
                if wait_for is not None:
                    await asyncio.wait([wait_for])  # the previous reply joins the history first
                return await chat.send(client, req, turn)
            finally:
                slots.release()

        async def dispatch() -> None:
            for req in traffic.requests:
                await slots.acquire()
                turn = turns.get(req.user, 0)
                turns[req.user] = turn + 1
                task = asyncio.create_task(send(req, turn, previous.get(req.user)))
                previous[req.user] = task
                tasks.append(task)
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            await asyncio.wait_for(dispatch(), timeout=deadline)
        except asyncio.TimeoutError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    rows: list[LiveRequest] = []
    seen: dict[int, int] = {}
    for i, req in enumerate(traffic.requests):
        turn = seen.get(req.user, 0)
        seen[req.user] = turn + 1
        task = tasks[i] if i < len(tasks) else None
        if task is None or task.cancelled():
            rows.append(LiveRequest(req.clock, req.user, turn, False, error="replay deadline passed"))
        elif task.exception() is not None:
            rows.append(LiveRequest(req.clock, req.user, turn, False, error=repr(task.exception())[:200]))
        else:
            rows.append(task.result())
    return rows


@dataclass
class _Chat:
    """Every user's history so far, and how one turn's request is laid out and read back."""

    config: FleetConfig
    system: str
    answer_tokens: int
    model: str
    histories: dict[int, str] = field(default_factory=dict)

    def prompt(self, req: UserTurn) -> tuple[str, str]:
        """(the prompt text, what joins the history besides the reply), with the timestamp where it goes."""
        header = self.config.header
        stamp = tokens_text(timestamp_tokens(req.clock)) if header != "none" else ""
        message = tokens_text(req.message)
        history = self.histories.get(req.user, "")
        if header == "start":
            return stamp + self.system + history + message, message
        if header == "before-message":
            return self.system + history + stamp + message, stamp + message
        return self.system + history + message, message

    async def send(self, client: object, req: UserTurn, turn: int) -> LiveRequest:
        import httpx

        assert isinstance(client, httpx.AsyncClient)
        prompt, kept = self.prompt(req)
        body: dict[str, object] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.answer_tokens,
            "temperature": 0,
        }
        salt = salt_of(self.config, req.user)
        if salt is not None:
            body["cache_salt"] = salt
        failed = {"clock": req.clock, "user": req.user, "turn": turn, "ok": False}
        t0 = time.perf_counter()
        try:
            resp = await client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            return LiveRequest(**failed, latency_s=time.perf_counter() - t0, error=_error(exc))
        latency = time.perf_counter() - t0
        replica = resp.headers.get("x-kvlab-replica")
        if resp.status_code != 200:
            error = f"HTTP {resp.status_code}: {resp.text[:160]}"
            return LiveRequest(**failed, latency_s=latency, replica=replica, error=error)
        try:
            data = resp.json()
            text = data["choices"][0]["text"]
            usage = data["usage"]
            details = usage.get("prompt_tokens_details") or {}
            if not isinstance(text, str):
                raise TypeError(f"choices[0].text is {type(text).__name__}")
            row = LiveRequest(
                req.clock,
                req.user,
                turn,
                True,
                prompt_tokens=int(usage["prompt_tokens"]),
                cached_tokens=int(details.get("cached_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                latency_s=latency,
                replica=replica,
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            return LiveRequest(
                **failed, latency_s=latency, replica=replica, error=f"malformed response: {exc!r}"
            )
        self.histories[req.user] = self.histories.get(req.user, "") + kept + text
        return row


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


# ---------------------------------------------------------------- metrics and URLs

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_counters(text: str) -> tuple[int, int] | None:
    """(prefix-cache queries, hits) summed over every label set of a Prometheus text page, or None.

    Counters appear as ``vllm:prefix_cache_queries_total`` (prometheus_client adds ``_total``);
    the bare name is read too. None when the page has neither counter.
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a string, got {type(text).__name__}")
    sums = {QUERIES: 0.0, HITS: 0.0}
    found = False
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1).removesuffix("_total")
        if name in sums:
            try:
                value = float(m.group(3))
            except ValueError:
                continue
            if math.isfinite(value):
                sums[name] += value
                found = True
    return (round(sums[QUERIES]), round(sums[HITS])) if found else None


def read_counters(client: object, url: str) -> tuple[int, int] | None:
    """A replica's (queries, hits) from its ``/metrics``; None if it does not answer."""
    import httpx

    assert isinstance(client, httpx.Client)
    try:
        resp = client.get(url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    return parse_counters(resp.text) if resp.status_code == 200 else None


def discover_replicas(router_url: str) -> list[str]:
    """The replicas behind a router, from its ``/workers`` list (sglang-router's and kvlab's); [] if none."""
    import httpx

    try:
        resp = httpx.get(check_url("router_url", router_url).rstrip("/") + "/workers", timeout=5.0)
        workers = resp.json().get("workers", []) if resp.status_code == 200 else []
        urls = [w["url"] for w in workers if isinstance(w, Mapping) and isinstance(w.get("url"), str)]
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    return sorted(urls)


def check_url(name: str, url: object) -> str:
    """An http(s) URL, without a trailing slash."""
    if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+(/\S*)?$", url):
        raise InvalidArgumentError(f"{name} must be an http:// or https:// URL, got {brief(url)}")
    return url.rstrip("/")


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        raise InvalidArgumentError(f"{name} must be a number of seconds in (0, 3600], got {brief(value)}")
    return float(value)


def _as_list(name: str, value: object) -> list[object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{name} must be a list of URLs, got {brief(value)}")
    return list(value)
