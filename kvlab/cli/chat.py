"""``python -m kvlab chat``: an agent-like chat on the tiny real engine, with the server's counters.

Prints one line per turn (prompt_tokens, cache_n, prompt_n, ttft_ms and the
reply), or with ``--json`` a list of ``{"turn", "prompt_tokens", "cache_n",
"prompt_n", "ttft_ms", "text"}``. Bad options exit with status 2 and one line
saying what to change.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvlab.cli.options import OneLineParser, at_least, whole_number
from kvlab.errors import KvlabError

MAX_SYSTEM_TOKENS = 16000
MAX_BLOCK_SIZE = 4096
MAX_TURNS = 1000
"""Most turns: the history grows ~50 tokens a turn, so 1,000 turns is a 50k-token prompt on a CPU."""
MAX_REPLY_TOKENS = 4096
"""Most tokens sampled per reply (each is one decode step of the tiny model)."""
MAX_THREADS = 1024
"""Most torch CPU threads (more than any machine's cores)."""


_Parser = OneLineParser
_whole_number = whole_number
_positive = at_least(1)


def _at_most(bound: int, why: str):
    def parse(text: str) -> int:
        value = _positive(text)
        if value > bound:
            raise argparse.ArgumentTypeError(f"at most {bound} ({why}), got {value}")
        return value

    return parse


def _block_size(text: str) -> int:
    value = _positive(text)
    if value > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(f"{value} is too large; use at most {MAX_BLOCK_SIZE}")
    return value


def _non_negative(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    if value > MAX_SYSTEM_TOKENS:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_SYSTEM_TOKENS} (the tiny engine runs on a CPU), got {value}"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m kvlab chat",
        description="Run an agent-like chat on the tiny real engine and print llama-server-style cache counters.",
    )
    p.add_argument(
        "--turns",
        type=_at_most(MAX_TURNS, "the tiny engine runs on a CPU"),
        default=4,
        help=f"number of user turns (default 4, at most {MAX_TURNS})",
    )
    p.add_argument(
        "--max-tokens",
        type=_at_most(MAX_REPLY_TOKENS, "the tiny engine runs on a CPU"),
        default=8,
        help=f"tokens sampled per reply (default 8, at most {MAX_REPLY_TOKENS})",
    )
    p.add_argument(
        "--cache",
        choices=("slot", "blocks", "off"),
        default="slot",
        help="slot: llama-server's token-level prefix reuse; blocks: vLLM's block hashes; off: no reuse",
    )
    p.add_argument("--block-size", type=_block_size, default=16, help="tokens per KV block (default 16)")
    p.add_argument(
        "--system-tokens",
        type=_non_negative,
        default=0,
        help="a system prompt of exactly N tokens (0: the lesson's)",
    )
    p.add_argument("--clock", action="store_true", help="put a time stamp at the start of the system prompt")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument(
        "--threads",
        type=_at_most(MAX_THREADS, "more than any machine's cores"),
        default=1,
        help="torch CPU threads (default 1: the tiny model's ops are too small to gain from more)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch

        from kvlab.engine.chat import context_needed, run_chat
        from kvlab.engine.engine import Engine
    except ImportError as exc:
        print(f"kvlab chat: {exc}; install the engine extra: pip install 'kvlab[engine]'", file=sys.stderr)
        return 2
    # this process is ours: threads only wait for each other on ops this small, worse on a busy machine
    torch.set_num_threads(args.threads)
    try:
        engine = Engine(
            cache=args.cache,
            block_size=args.block_size,
            max_model_len=context_needed(args.turns, args.max_tokens, args.system_tokens),
        )
        turns = run_chat(
            engine,
            turns=args.turns,
            max_tokens=args.max_tokens,
            system_tokens=args.system_tokens,
            clock=args.clock,
        )
    except KvlabError as exc:
        print(f"kvlab chat: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([t.as_dict() for t in turns], indent=1))
        return 0
    print(f"cache={args.cache} block_size={args.block_size} max_tokens={args.max_tokens} clock={args.clock}")
    for t in turns:
        print(
            f"turn {t.turn}: prompt_tokens {t.prompt_tokens:5d}  cache_n {t.cache_n:5d}  prompt_n {t.prompt_n:5d}  "
            f"ttft_ms {t.ttft_ms:8.1f}  reply:{t.text}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
