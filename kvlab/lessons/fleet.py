"""Lesson 002's table: its six scenarios, the numbers it printed, and the runner that replays them.

``lesson_table()`` runs the six rows of ``LESSON_SCENARIOS`` through
``kvlab.fleet.simulate_many`` (one traffic drawn for all six, each chain layout
keyed once). ``LESSON_ROWS`` is what the lesson's program printed for them; the
model reproduces it exactly (tests and notebook 15 compare).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvlab.errors import check_choice
from kvlab.fleet import HASH_SCHEMES, FleetConfig, FleetResult, simulate_many

LESSON_SCENARIOS: tuple[tuple[str, FleetConfig], ...] = (
    ("no cache", FleetConfig(capacity_blocks=0)),
    ("shared system prompt, stable prefix", FleetConfig(capacity_blocks=20_000)),
    ("same, cache 4x smaller", FleetConfig(capacity_blocks=5_000)),
    ("same, cache too small for the sessions", FleetConfig(capacity_blocks=1_000)),
    ("timestamp placed before the system prompt", FleetConfig(capacity_blocks=20_000, header="start")),
    ("per-user salt (no cross-user sharing)", FleetConfig(capacity_blocks=20_000, salt="user")),
)
"""The lesson's six rows, in its order: (scenario name, configuration)."""

LESSON_ROWS: tuple[str, ...] = (
    "0.0 GiB · 0.0% · 2,581,118 of 2.6M",
    "39.1 GiB · 92.8% · 187,102 of 2.6M",
    "9.8 GiB · 67.8% · 831,582 of 2.6M",
    "2.0 GiB · 58.0% · 1,083,470 of 2.6M",
    "39.1 GiB · 0.0% · 2,583,518 of 2.6M",
    "39.1 GiB · 56.5% · 1,123,214 of 2.6M",
)
"""The lesson's printed table, row by row: cache size · hit rate · prompt tokens prefilled of all."""


NAME_WIDTH = 44  # the lesson's scenario column


def _tokens(total: int) -> str:
    if total >= 1_000_000:
        return f"{total / 1e6:.1f}M"
    if total >= 1_000:
        return f"{total / 1e3:.1f}k"
    return str(total)


def format_table(results: Sequence[FleetResult]) -> str:
    """The rows laid out like the lesson's table (cache GiB at 128 KiB of KV per token)."""
    width = max([NAME_WIDTH] + [len(r.scenario) + 2 for r in results])
    lines = [f"{'scenario':<{width}}{'cache':>9}{'hit rate':>10}{'prefill tokens':>16}"]
    for r in results:
        lines.append(
            f"{r.scenario:<{width}}{r.config.cache_gib:>6.1f}GiB{100 * r.hit_rate:>9.1f}%"
            f"{r.prefill_tokens:>10,} of {_tokens(r.total_tokens)}"
        )
    return "\n".join(lines)


def lesson_row(result: FleetResult) -> str:
    """One result as the lesson printed it (the format of ``LESSON_ROWS``)."""
    size, rate = f"{result.config.cache_gib:.1f} GiB", f"{100 * result.hit_rate:.1f}%"
    return f"{size} · {rate} · {result.prefill_tokens:,} of {result.total_tokens / 1e6:.1f}M"


def lesson_table(
    *, hash_scheme: str = "exact", engine: bool = False, concurrent: int = 1, busy_blocks: int = 0
) -> list[FleetResult]:
    """The lesson's six rows (see ``LESSON_SCENARIOS``); the options as in ``FleetConfig`` and ``simulate_many``."""
    check_choice("hash_scheme", hash_scheme, HASH_SCHEMES)
    names = [name for name, _ in LESSON_SCENARIOS]
    configs = [replace(config, hash_scheme=hash_scheme) for _, config in LESSON_SCENARIOS]
    return simulate_many(configs, names=names, engine=engine, concurrent=concurrent, busy_blocks=busy_blocks)
