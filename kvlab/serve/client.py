"""Client-side measurements a notebook makes against any OpenAI-compatible server (kvlab, vLLM, llama-server).

* ``served_model(url)`` -- the first model ``/v1/models`` lists (vLLM needs it in every request).
* ``first_token_ms(url, prompt)`` -- time to first token as the client sees it: from sending a
  streamed ``/v1/completions`` request to its first token.
* ``run_concurrent(url, prompts, clients=N)`` -- ``clients`` streaming clients working through
  ``prompts``; returns the wall seconds and the output tokens, for requests/s and tokens/s.
* ``measure_first_tokens({name: request})`` -- kvlab's timing recipe (``kvlab.core.timing``)
  for times to first token: interleaved rounds, median and IQR of what each request returned.
* ``concurrency_sweep(url, prompts)`` -- milliseconds per output token at 1, 2, 4, 8 clients,
  timed in interleaved rounds, so a throughput ratio comes with its spread.

Only ``httpx`` is needed (no torch), so the same cells run against a remote server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from kvlab.core.timing import MAX_REPEATS, Timing, measure_side_by_side
from kvlab.errors import InvalidArgumentError, KvlabError, brief, check_int

TIMEOUT_S = 600.0


def _headers(api_key: str | None) -> dict[str, str]:
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}


def served_model(url: str, *, api_key: str | None = None) -> str:
    """The id of the first model the server lists at ``/v1/models``."""
    r = httpx.get(url.rstrip("/") + "/v1/models", headers=_headers(api_key), timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def _body(
    prompt: str | Sequence[int], max_tokens: int, model: str | None, cache_salt: str | None
) -> dict[str, Any]:
    if not isinstance(prompt, str):
        prompt = list(prompt)
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    if model is not None:
        body["model"] = model
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def first_token_ms(
    url: str,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 2,
    model: str | None = None,
    cache_salt: str | None = None,
    api_key: str | None = None,
) -> float:
    """Milliseconds from sending a streamed completion to receiving its first token."""
    max_tokens = check_int("max_tokens", max_tokens, minimum=1)
    body = _body(prompt, max_tokens, model, cache_salt)
    with httpx.Client(timeout=TIMEOUT_S, headers=_headers(api_key)) as client:
        start = time.perf_counter()
        with client.stream("POST", url.rstrip("/") + "/v1/completions", json=body) as r:
            if r.status_code >= 400:
                r.read()
                raise KvlabError(f"/v1/completions answered {r.status_code}: {r.text[:300]}")
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    return (time.perf_counter() - start) * 1e3
    raise KvlabError("the server streamed no token")


@dataclass(frozen=True)
class ConcurrentRun:
    clients: int
    requests: int
    output_tokens: int
    seconds: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def run_concurrent(
    url: str,
    prompts: Sequence[str | Sequence[int]],
    *,
    clients: int,
    max_tokens: int = 16,
    model: str | None = None,
    api_key: str | None = None,
) -> ConcurrentRun:
    """``clients`` streaming clients share ``prompts`` (each takes the next one when done); timed as a whole."""
    clients = check_int("clients", clients, minimum=1, maximum=4096)
    max_tokens = check_int("max_tokens", max_tokens, minimum=1)
    if not prompts:
        raise InvalidArgumentError("prompts is empty: give at least one prompt")
    todo = list(prompts)

    async def one(client: httpx.AsyncClient, prompt: str | Sequence[int]) -> int:
        got = 0
        async with client.stream("POST", "/v1/completions", json=_body(prompt, max_tokens, model, None)) as r:
            if r.status_code >= 400:
                await r.aread()
                raise KvlabError(f"/v1/completions answered {r.status_code}: {r.text[:300]}")
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"text": ""' not in line:
                    got += 1
        return got

    async def worker(client: httpx.AsyncClient) -> int:
        total = 0
        while todo:
            total += await one(client, todo.pop(0))
        return total

    async def main() -> int:
        limits = httpx.Limits(max_connections=clients + 4)
        async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=TIMEOUT_S, limits=limits,
                                     headers=_headers(api_key)) as client:  # fmt: skip
            return sum(await asyncio.gather(*(worker(client) for _ in range(clients))))

    n = len(todo)
    start = time.perf_counter()
    tokens = run_async(main)
    return ConcurrentRun(clients, n, tokens, time.perf_counter() - start)


def run_async(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """``asyncio.run(main())``, in a helper thread when a loop already runs here (a Jupyter kernel)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(main())).result()


def measure_first_tokens(
    requests: Mapping[Any, Callable[[], float]], *, warmup: int = 1, repeats: int = 9
) -> dict[Any, Timing]:
    """Times to first token of several kinds of request, ``repeats`` each in interleaved rounds.

    Each function sends one request and returns its time to first token in ms (``first_token_ms``).
    The rounds go A, B, A, B ... in the given order, so a burst of load falls on all kinds alike;
    unlike ``measure_side_by_side``, which shuffles each round, the order is kept, as it can matter
    here (the fleet probe's first request of a round empties the server's cache). A ``Timing``'s
    wall samples are the returned times (the client's own clock, from sending to the first token),
    its CPU samples this process's CPU time over each call.
    """
    if not isinstance(requests, Mapping) or not requests:
        raise InvalidArgumentError(f"requests must map names to functions, got {brief(requests)}")
    for name, fn in requests.items():
        if not callable(fn):
            raise InvalidArgumentError(f"requests[{brief(name)}] must be a function, got {brief(fn)}")
    warmup = check_int("warmup", warmup, minimum=0, maximum=MAX_REPEATS)
    repeats = check_int("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
    for _ in range(warmup):
        for fn in requests.values():
            fn()
    samples: dict[Any, list[tuple[float, float]]] = {name: [] for name in requests}
    for _ in range(repeats):
        for name, fn in requests.items():
            cpu0 = time.process_time()
            ms = fn()
            if isinstance(ms, bool) or not isinstance(ms, (int, float)):
                raise InvalidArgumentError(
                    f"requests[{brief(name)}] must return milliseconds, got {brief(ms)}"
                )
            samples[name].append((float(ms), (time.process_time() - cpu0) * 1e3))
    return {
        name: Timing(tuple(w for w, _ in rows), tuple(c for _, c in rows)) for name, rows in samples.items()
    }


def concurrency_sweep(
    url: str,
    prompts: Sequence[str | Sequence[int]],
    *,
    clients: Sequence[int] = (1, 2, 4, 8),
    requests_per_client: int = 2,
    max_tokens: int = 32,
    repeats: int = 3,
    model: str | None = None,
    api_key: str | None = None,
) -> dict[int, Timing]:
    """Milliseconds per output token at each client count, timed in interleaved rounds.

    With ``c`` clients a run sends the first ``c * requests_per_client`` prompts, so every client
    count keeps each client as busy. One round runs every client count once; ``repeats`` rounds
    give each a median and IQR. Tokens/s is ``1000 / timing.median_ms``; the throughput of ``c``
    clients over one client's is ``sweep[1].ratio_to(sweep[c])``, with ``ratio_spread`` its range.
    """
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence) or not clients:
        raise InvalidArgumentError(f"clients must be a non-empty list of client counts, got {brief(clients)}")
    counts = [check_int("every client count", c, minimum=1, maximum=4096) for c in clients]
    if len(set(counts)) != len(counts):
        raise InvalidArgumentError(f"clients must not repeat a count, got {counts}")
    per_client = check_int("requests_per_client", requests_per_client, minimum=1, maximum=4096)
    if len(prompts) < max(counts) * per_client:
        raise InvalidArgumentError(
            f"{max(counts)} clients x {per_client} requests need {max(counts) * per_client} prompts, "
            f"got {len(prompts)}"
        )
    runs: dict[int, list[ConcurrentRun]] = {c: [] for c in counts}

    def run(c: int) -> None:
        todo = prompts[: c * per_client]
        runs[c].append(
            run_concurrent(url, todo, clients=c, max_tokens=max_tokens, model=model, api_key=api_key)
        )

    timed = measure_side_by_side({c: (lambda c=c: run(c)) for c in counts}, warmup=0, repeats=repeats)
    out: dict[int, Timing] = {}
    for c, timing in timed.items():
        tokens = [r.output_tokens for r in runs[c]]
        if min(tokens) == 0:
            raise KvlabError(f"a run with {c} clients got no output token")
        out[c] = Timing(
            tuple(w / n for w, n in zip(timing.wall_ms, tokens, strict=True)),
            tuple(cpu / n for cpu, n in zip(timing.cpu_ms, tokens, strict=True)),
        )
    return out
