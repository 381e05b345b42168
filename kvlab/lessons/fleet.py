"""Lesson 002's table: its six scenarios, the numbers it printed, and the runner that replays them.

``lesson_table()`` runs the six rows of ``LESSON_SCENARIOS`` through
``kvlab.fleet.simulate_many`` (one traffic drawn for all six, each chain layout
keyed once). ``LESSON_ROWS`` is what the lesson's program printed for them; the
model reproduces it exactly (tests and notebook 15 compare). The functions after
``lesson_table`` print what notebook 15's prose says (hit rates turn by turn, the
working set, a sweep, salts, routing), so every number it states comes from a run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvlab.errors import InvalidArgumentError, brief, check_choice, check_int, check_items, check_text
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
    results = _check_results("results", results)
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
    result = _check_result("result", result)
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


# ---------------------------------------------------------------- notebook 15's printouts
# Every number notebook 15's prose states is printed by one of these, from the simulator's results.


def _check_result(name: str, result: object) -> FleetResult:
    if not isinstance(result, FleetResult):
        raise InvalidArgumentError(
            f"{name} must be a FleetResult (from kvlab.fleet.simulate), got {brief(result)}"
        )
    return result


def _check_results(name: str, results: object) -> list[FleetResult]:
    what = "a non-empty list of FleetResult (from kvlab.fleet.simulate)"
    items = check_items(name, results, what=what)
    if not items:
        raise InvalidArgumentError(f"{name} must be {what}, got an empty one")
    return [_check_result(f"{name}[{i}]", r) for i, r in enumerate(items)]


def _named(name: str, mapping: object, what: str) -> list[tuple[str, Any]]:
    """A dict's (name, value) pairs, read through dict's own methods; every name plain text."""
    if not isinstance(mapping, dict):
        raise InvalidArgumentError(f"{name} must be {what}, got {brief(mapping)} ({type(mapping).__name__})")
    pairs = check_items(name, list(dict.items(mapping)), what=what)
    if not pairs:
        raise InvalidArgumentError(f"{name} must be {what}, got an empty dict")
    return [(check_text(f"a name in {name}", k), v) for k, v in pairs]  # type: ignore[misc]


def prefill_by_turn(result: FleetResult) -> list[int]:
    """Prompt tokens prefilled on each turn, summed over the users (the table's last column, split by turn)."""
    result = _check_result("result", result)
    t = result.trace
    out = [0] * result.config.turns
    for turn, prompt, cached in zip(t.turn, t.prompt_tokens, t.cached_tokens, strict=True):
        out[turn] += prompt - cached
    return out


def turn_lines(results: Sequence[FleetResult], *, early: int = 300) -> list[str]:
    """Hit rate turn by turn, after ``early`` requests and after all; then turn 1's prefill of each."""
    results = _check_results("results", results)
    early = check_int("early", early, minimum=1, maximum=min(len(r.trace) for r in results))
    turns = results[0].config.turns
    lines = [
        f"{'hit rate':<40}{'turn 1 ... turn ' + str(turns):^42}  after {early:,} requests  after all {len(results[0].trace):,}"
    ]
    for r in results:
        by_turn = " ".join(f"{100 * h:5.1f}%" for h in r.trace.hit_rate_by_turn())
        running = r.trace.cumulative_hit_rate()
        lines.append(
            f"{r.scenario:<40}{by_turn}  {100 * running[early - 1]:18.1f}%  {100 * running[-1]:14.1f}%"
        )
    first = [prefill_by_turn(r)[0] for r in results]
    lowest = min(first)
    lines.append("")
    lines.append("prefilled on turn 1: " + "; ".join(
        f"{r.scenario} {n:,} ({n / lowest:.1f}x the least)" for r, n in zip(results, first, strict=True)))  # fmt: skip
    return lines


def working_set_lines(unlimited: FleetResult, large: FleetResult) -> list[str]:
    """What an unlimited cache ends up holding, against the lesson's large cache (``large``)."""
    unlimited, large = _check_result("unlimited", unlimited), _check_result("large", large)
    everything = max(unlimited.trace.cached_blocks, default=0)
    if not everything:
        raise InvalidArgumentError(
            "unlimited cached nothing: pass a run with a cache (capacity_blocks > 0), such as an unlimited one"
        )
    gib = replace(unlimited.config, capacity_blocks=everything).cache_gib
    return [
        f"unlimited cache: ends up holding {everything:,} blocks ({gib:.1f} GiB), hit rate {100 * unlimited.hit_rate:.1f}%",
        f"{large.capacity_blocks:,} blocks:   evicted {sum(large.trace.evicted_blocks):,} blocks on the way, "
        f"hit rate {100 * large.hit_rate:.1f}%",
        f"the {large.capacity_blocks:,}-block cache holds {large.capacity_blocks / everything:.0%} of what the fleet "
        f"ever caches and loses {100 * (unlimited.hit_rate - large.hit_rate):.2f} points to an unlimited one "
        f"({100 * unlimited.hit_rate:.2f}% - {100 * large.hit_rate:.2f}%, before rounding)",
    ]


def sweep_lines(results: Sequence[FleetResult], *, system_tokens: int | None = None) -> list[str]:
    """One line per cache size of a sweep: blocks, hit rate; and how many blocks the system prompt takes."""
    results = _check_results("results", results)
    config = results[0].config
    system = (
        config.system_tokens
        if system_tokens is None
        else check_int("system_tokens", system_tokens, minimum=0)
    )
    lines = [
        f"the {system:,}-token system prompt takes {system // config.block_size} blocks of {config.block_size}"
    ]
    lines += [f"{r.capacity_blocks:>8,} blocks: hit rate {100 * r.hit_rate:5.1f}%" for r in results]
    return lines


def salt_lines(none: FleetResult, salted: FleetResult) -> list[str]:
    """A salted run against the unsalted one: hit rates, prefill, and the system prompt's copies."""
    none, salted = _check_result("none", none), _check_result("salted", salted)
    config = salted.config
    copies = (
        config.users if config.salt == "user" else (config.tenants or 1) if config.salt == "tenant" else 1
    )
    per_copy = config.system_tokens // config.block_size
    return [
        f"no salt: {100 * none.hit_rate:.1f}%, {none.prefill_tokens:,} tokens prefilled",
        f"{salted.scenario or config.salt}: {100 * salted.hit_rate:.1f}%, {salted.prefill_tokens:,} tokens prefilled, "
        f"{salted.prefill_tokens - none.prefill_tokens:,} more",
        f"{copies:,} copies of the {config.system_tokens:,}-token system prompt, {per_copy} blocks each: "
        f"{copies * per_copy:,} blocks of the {config.capacity_blocks:,}",
    ]


def users_per_replica(result: FleetResult) -> list[int]:
    """How many distinct users each replica served."""
    result = _check_result("result", result)
    users_of: list[set[int]] = [set() for _ in range(result.config.replicas)]
    for user, replica in zip(result.trace.user, result.trace.replica, strict=True):
        users_of[replica].add(user)
    return [len(u) for u in users_of]


def home_share(result: FleetResult) -> float:
    """Of the requests after a user's first, the share the simulation sent to the replica of its previous one."""
    result = _check_result("result", result)
    last: dict[int, int] = {}
    home = later = 0
    for user, replica in zip(result.trace.user, result.trace.replica, strict=True):
        if user in last:
            later += 1
            home += last[user] == replica
        last[user] = replica
    return home / later if later else 0.0


def routing_lines(results: Sequence[FleetResult]) -> list[str]:
    """Per routed run: hit rate, users per replica, and the share of later turns sent where the last one went."""
    results = _check_results("results", results)
    return [
        f"{r.scenario:<34} {100 * r.hit_rate:5.1f}%   users per replica: {users_per_replica(r)}   "
        f"later turns on their previous turn's replica: {home_share(r):.1%}"
        for r in results
    ]


def rate_lines(results: dict[str, FleetResult]) -> list[str]:
    """``name: hit rate`` for each named run, in order."""
    pairs = [
        (k, _check_result(f"results[{brief(k)}]", r))
        for k, r in _named("results", results, "a non-empty dict of name -> FleetResult")
    ]
    width = max(len(k) for k, _ in pairs) + 2
    return [f"{k + ':':<{width}}{100 * r.hit_rate:5.1f}%" for k, r in pairs]


# ---------------------------------------------------------------- the timing probe, on the engine and over HTTP


def _check_probe_runs(runs: object) -> list[tuple[str, Any]]:
    """``runs`` as (setting, ProbeRun) pairs, each run with its guesses and exactly one secret among them.

    A ProbeRun exists only once ``kvlab.engine.probe`` (and torch) is loaded, so the type is looked up
    there rather than imported: refusing a wrong argument never needs torch.
    """
    what = "the dict tenant_probe_demo() returns (setting -> ProbeRun)"
    pairs = _named("runs", runs, what)
    probe = sys.modules.get("kvlab.engine.probe")
    probe_run, probe_row = getattr(probe, "ProbeRun", None), getattr(probe, "ProbeRow", None)
    for setting, run in pairs:
        if probe_run is None or not isinstance(run, probe_run):
            raise InvalidArgumentError(
                f"runs[{brief(setting)}] must be a ProbeRun (from kvlab.engine.tenant_probe_demo), got {brief(run)}"
            )
        guesses = run.guesses
        if type(guesses) is not tuple or not all(isinstance(r, probe_row) for r in guesses):  # type: ignore[arg-type]
            raise InvalidArgumentError(f"runs[{brief(setting)}].guesses must be a tuple of ProbeRow")
        if sum(r.is_secret is True for r in guesses) != 1:
            raise InvalidArgumentError(
                f"runs[{brief(setting)}] must have exactly one guess that is the secret: pass tenant_probe_demo()'s runs"
            )
    return pairs


def engine_probe_lines(runs: dict[str, Any]) -> list[str]:
    """What ``kvlab.engine.tenant_probe_demo`` found, per setting: calibration, every guess, the score."""
    lines = []
    for setting, run in _check_probe_runs(runs):
        cal = run.calibration
        lines.append(f"{setting}: the victim's record names {brief(run.secret, 80)}")
        lines.append(
            f"  calibration: known hit {cal.hit.median_ms:.1f} ms (IQR {cal.hit.q1_ms:.1f}-{cal.hit.q3_ms:.1f}), "
            f"known miss {cal.miss.median_ms:.1f} ms (IQR {cal.miss.q1_ms:.1f}-{cal.miss.q3_ms:.1f}); "
            f"spreads apart: {cal.separated}"
        )
        for r in run.guesses:
            lines.append(
                f"  guess {r.name:<6} cached {r.cache_n:3} of {r.prompt_tokens} tokens   first token after "
                f"{r.ttft_ms:6.1f} ms (IQR {r.ttft.q1_ms:.1f}-{r.ttft.q3_ms:.1f}, threshold {r.threshold_ms:5.1f})"
                f"   verdict: {'hit' if r.classified_hit else 'miss'}"
            )
        secret_row = next(r for r in run.guesses if r.is_secret)  # _check_probe_runs: there is one
        right = sum(r.classified_hit == r.is_secret for r in run.guesses)
        counts = {r.cache_n for r in run.guesses}
        if len(counts) == 1:
            lines.append(
                f"  every guess cached {counts.pop()} tokens: the server did the same work for each, so the "
                "differences between their times are the machine's noise, not the cache"
            )
        lines.append(
            f"  the prober concludes {list(run.found) or 'nothing'}; the right name took "
            f"{secret_row.ttft.ratio_to(cal.miss):.2f}x a known miss's median time; verdicts right for "
            f"{right} of {len(run.guesses)} names (calling every name a miss scores {len(run.guesses) - 1})"
        )
        lines.append("")
    return lines[:-1]  # a blank line between the settings, none after the last


def http_probe_lines(*, form_tokens: int = 256, rounds: int = 7) -> list[str]:
    """The timing probe over HTTP: a shared cache, then a salt per tenant (vLLM's ``cache_salt``).

    Against ``kvlab serve`` started here on a free loopback port (stopped before this returns), or
    the server in ``KVLAB_SERVER_URL``. Each of ``rounds`` rounds empties the cache
    (``POST /reset_prefix_cache``), lets the victim send its record and the prober its reference
    prompt, then times a known hit, every guess once and a known miss; each guess's verdict is
    ``paired_verdict`` against the known hit and miss of the same rounds.
    """
    from kvlab.engine.probe import (
        DEFAULT_CANDIDATES,
        DEFAULT_SECRET,
        KNOWN_HIT,
        KNOWN_MISS,
        form_text,
        paired_verdict,
    )
    from kvlab.serve import start_server
    from kvlab.serve.client import first_token_ms, measure_first_tokens, served_model

    form_tokens = check_int("form_tokens", form_tokens, minimum=1, maximum=400)
    rounds = check_int("rounds", rounds, minimum=1, maximum=50)
    server = start_server(cache="blocks", max_model_len=512)
    try:
        model = served_model(server.url, api_key=server.api_key)
        where = "the server at " if server.external else "kvlab serve, started here, at "
        lines = [f"{where}{server.url}: model {model}"]

        def record(name: str) -> str:
            return form_text(name, form_tokens) + " Summarize the record."

        def send(name: str, salt: str | None) -> None:  # one untimed request: the victim's, or the reference
            body = {"model": model, "prompt": record(name), "max_tokens": 1, "temperature": 0}
            server.post("/v1/completions", body | ({"cache_salt": salt} if salt else {}))

        def timed(name: str, salt: str | None) -> Any:
            return lambda: first_token_ms(
                server.url, record(name), max_tokens=1, model=model, cache_salt=salt, api_key=server.api_key
            )

        for setting, (victim_salt, prober_salt) in {
            "shared cache": (None, None),
            "per-tenant salt": ("victim", "prober"),
        }.items():

            def plant_then_hit(
                victim_salt: str | None = victim_salt, prober_salt: str | None = prober_salt
            ) -> float:
                server.post("/reset_prefix_cache")  # the cache emptied; the victim sends again
                send(DEFAULT_SECRET, victim_salt)
                send(KNOWN_HIT, prober_salt)
                return timed(KNOWN_HIT, prober_salt)()

            # one round: plant, known hit, every guess once, known miss
            requests = {"hit": plant_then_hit} | {n: timed(n, prober_salt) for n in DEFAULT_CANDIDATES}
            t = measure_first_tokens(
                requests | {"miss": timed(KNOWN_MISS, prober_salt)}, warmup=0, repeats=rounds
            )
            lines.append(
                f"{setting}: the victim's record names {DEFAULT_SECRET!r}; known hit {t['hit'].median_ms:.1f} ms, "
                f"known miss {t['miss'].median_ms:.1f} ms (medians of {rounds})"
            )
            verdicts = {n: paired_verdict(t[n], t["hit"], t["miss"]) for n in DEFAULT_CANDIDATES}
            for n, is_hit in verdicts.items():
                lines.append(
                    f"  guess {n:<6} first token after {t[n].median_ms:5.1f} ms "
                    f"(IQR {t[n].q1_ms:.1f}-{t[n].q3_ms:.1f})   verdict: {'hit' if is_hit else 'miss'}"
                )
            right = sum(is_hit == (n == DEFAULT_SECRET) for n, is_hit in verdicts.items())
            lines.append(
                f"  the prober concludes {[n for n, h in verdicts.items() if h] or 'nothing'}; verdicts right for "
                f"{right} of {len(verdicts)} names (calling every name a miss scores {len(verdicts) - 1})"
            )
    finally:
        server.stop()
    return lines
