"""``kvlab serve`` over HTTP: throughput against concurrency, and time to first token against the engine.

Starts ``python -m kvlab serve`` on a free 127.0.0.1 port (one torch thread) and measures, with
``kvlab.core.timing`` (warm-up, repeats, median and interquartile range):

1. **Throughput** at 1, 4, 16 and 64 concurrent streaming clients: each client sends
   ``--per-client`` completions in a row (fresh prompts, so nothing is cached) of
   ``--output`` tokens; requests/s and output tokens/s, and the ratio of 16 clients to 1 --
   the payoff of paging: continuous batching advances every running request in one
   forward pass. The server's mean decode batch (``kvlab:decoded_sequences_total`` /
   ``kvlab:decode_steps_total``) is printed beside it.
2. **Time to first token** of a ``--prompt``-token prompt (2,048 by default), uncached and
   cached (the same prompt again: all but its last partial block hit), measured by the client
   over HTTP (until the first streamed token) and in-process (``Engine.generate``, the same
   model) in interleaved rounds; the HTTP overhead is the difference, printed as a share of
   the in-process TTFT.

    python benchmarks/serve.py [--repeats 5] [--prompt 2048] [--output 32] [--per-client 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time

import httpx
import torch

from kvlab.core.timing import Timing, measure_side_by_side
from kvlab.engine import Engine
from kvlab.serve import start_server
from kvlab.serve.metrics import parse_metrics

CONCURRENCY = (1, 4, 16, 64)
TIMEOUT = 600.0


def fresh_prompts(length: int):
    """Prompts no earlier request shares a block with (their first token differs)."""
    for n in itertools.count():
        yield [1000 + n] + [16 + (n * 31 + i * 7) % 30000 for i in range(length - 1)]


async def stream_one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> int:
    got = 0
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                got += 1
    return got


def throughput(url: str, clients: int, per_client: int, output: int, prompts) -> tuple[Timing, int]:
    """Wall time of ``clients`` concurrent clients each sending ``per_client`` requests in a row."""

    async def client_loop(c: httpx.AsyncClient) -> int:
        return sum([await stream_one(c, next(prompts), output) for _ in range(per_client)])

    async def run() -> int:
        limits = httpx.Limits(max_connections=clients + 4)
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT, limits=limits) as c:
            return sum(await asyncio.gather(*(client_loop(c) for _ in range(clients))))

    tokens: list[int] = []
    timing = measure_side_by_side(
        {"run": lambda: tokens.append(asyncio.run(run()))}, warmup=1, repeats=ARGS.repeats
    )
    assert all(t == clients * per_client * output for t in tokens), tokens
    return timing["run"], clients * per_client


def http_ttft(client: httpx.Client, prompt: list[int]) -> float:
    """Seconds from sending the request to the first streamed token."""
    start = time.perf_counter()
    with client.stream(
        "POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "stream": True}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - start
    raise RuntimeError("no token came back")


def ttft_section(url: str, prompt_len: int) -> None:
    engine = Engine(cache="blocks", max_model_len=max(4096, prompt_len + 8))
    cached_prompt = [999] + [16 + (i * 13) % 30000 for i in range(prompt_len - 1)]
    http_prompts = fresh_prompts(prompt_len)
    local_prompts = fresh_prompts(prompt_len)
    for _ in range(10_000):  # the two sides must never share a prompt: skip the ones the HTTP side used
        next(local_prompts)
    samples: dict[str, list[float]] = {
        k: [] for k in ("http uncached", "engine uncached", "http cached", "engine cached")
    }
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        http_ttft(client, cached_prompt)
        engine.generate(cached_prompt, max_tokens=1)

        def record(name: str, seconds: float) -> None:
            samples[name].append(seconds * 1e3)

        fns = {
            "http uncached": lambda: record("http uncached", http_ttft(client, next(http_prompts))),
            "engine uncached": lambda: record(
                "engine uncached", engine.generate(next(local_prompts), max_tokens=1).ttft_ms / 1e3
            ),
            "http cached": lambda: record("http cached", http_ttft(client, cached_prompt)),
            "engine cached": lambda: record(
                "engine cached", engine.generate(cached_prompt, max_tokens=1).ttft_ms / 1e3
            ),
        }
        measure_side_by_side(fns, warmup=1, repeats=ARGS.repeats)
    timings = {k: Timing(tuple(v[1:]), tuple(v[1:])) for k, v in samples.items()}  # drop the warm-up sample
    print(
        f"\nTime to first token, {prompt_len}-token prompt (median [IQR] ms, {ARGS.repeats} rounds interleaved):"
    )
    for name, t in timings.items():
        print(f"  {name:<16} {t.median_ms:8.2f}  [{t.q1_ms:.2f} .. {t.q3_ms:.2f}]")
    for kind in ("uncached", "cached"):
        h, e = timings[f"http {kind}"], timings[f"engine {kind}"]
        overhead = h.median_ms - e.median_ms
        print(
            f"  HTTP overhead, {kind}: {overhead:+.2f} ms = {100 * overhead / e.median_ms:+.1f}% of the engine's TTFT"
        )
    u, c = timings["engine uncached"], timings["engine cached"]
    print(f"  cached / uncached TTFT (engine): {c.median_ms / u.median_ms:.3f}")


def main() -> int:
    torch.set_num_threads(1)
    server = start_server(use_env=False, cache="blocks", max_num_seqs=64, num_blocks=4096,
                          max_model_len=max(4096, ARGS.prompt + 8))  # fmt: skip
    try:
        print(f"kvlab serve at {server.url} (1 torch thread; this process: {torch.get_num_threads()})")
        print(f"\nThroughput: {ARGS.per_client} requests per client in a row, {ARGS.prompt_short}-token prompts, "
              f"{ARGS.output} output tokens each (median [IQR] of {ARGS.repeats} runs):")  # fmt: skip
        print(f"  {'clients':>7} {'requests/s':>11} {'output tok/s':>13} {'wall s':>16} {'mean batch':>11}")
        prompts = fresh_prompts(ARGS.prompt_short)
        per_second = {}
        for clients in ARGS.concurrency:
            before = parse_metrics(httpx.get(server.url + "/metrics").text)
            timing, n = throughput(server.url, clients, ARGS.per_client, ARGS.output, prompts)
            after = parse_metrics(httpx.get(server.url + "/metrics").text)
            steps = after["kvlab:decode_steps_total"] - before["kvlab:decode_steps_total"]
            seqs = after["kvlab:decoded_sequences_total"] - before["kvlab:decoded_sequences_total"]
            s = timing.median_ms / 1e3
            per_second[clients] = n * ARGS.output / s
            spread = f"{timing.median_ms / 1e3:.2f} [{timing.q1_ms / 1e3:.2f}..{timing.q3_ms / 1e3:.2f}]"
            print(
                f"  {clients:>7} {n / s:>11.2f} {n * ARGS.output / s:>13.1f} {spread:>16} {seqs / max(steps, 1):>11.1f}"
            )
        if 1 in per_second and 16 in per_second:
            print(f"  output tokens/s, 16 clients : 1 client = {per_second[16] / per_second[1]:.2f}x")
        if not ARGS.skip_ttft:
            ttft_section(server.url, ARGS.prompt)
    finally:
        server.stop()
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens for the TTFT section")
    p.add_argument("--prompt-short", type=int, default=64, help="prompt tokens for the throughput section")
    p.add_argument("--output", type=int, default=32, help="output tokens per request (throughput)")
    p.add_argument("--per-client", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="3 repeats, 16 output tokens, 1 request per client")
    p.add_argument("--skip-ttft", action="store_true")
    args = p.parse_args(argv)
    args.concurrency = CONCURRENCY
    if args.quick:
        args.repeats, args.output, args.per_client = 3, 16, 1
    return args


if __name__ == "__main__":
    ARGS = parse_args(sys.argv[1:])
    sys.exit(main())
