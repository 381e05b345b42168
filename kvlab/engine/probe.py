"""A timing side channel through a shared prefix cache, and the per-tenant salt that closes it (lesson 002).

A victim tenant sends a prompt whose start holds a secret (here a patient's
name in a long, otherwise public form). A prober who knows the form sends it
with a candidate name and times the first token: if the victim's blocks are
in a shared cache, the right name reuses them and its prefill shrinks to the
last block; a wrong name misses at the block holding the name and is computed
in full. With a per-tenant salt (vLLM's ``cache_salt``) the prober's hashes
never match the victim's blocks, so every guess is computed in full.

The prober decides from **time alone**, the way a remote prober must:

1. **Calibrate.** It times its own requests: a prompt it sent a moment before
   (a known hit) and a form with a name nobody sent (a known miss), ``calibration``
   times each, interleaved. The threshold is the geometric mean of the two
   medians: halfway between them on a log scale, since load on the machine
   stretches times by a factor rather than by a fixed amount.
   If the two spreads overlap (``Calibration.separated`` is False), timing
   cannot tell them apart on this machine at this moment.
2. **Probe.** Each guess is timed ``repeats`` times, each time between a
   known hit and a known miss timed just before and after it. A repeat's
   threshold is the geometric mean of that hit and that miss, and the verdict
   is "hit" when the guess is below its repeat's threshold in most repeats
   (the median of guess / threshold is below 1): a burst of load that slows
   the guess slows its two neighbours as well, so it moves the threshold
   with it instead of flipping the verdict.

One guess can be tested only once per victim request: the probe itself caches
the guessed prefix, so the same guess sent again would hit the prober's own
blocks. A real prober waits for the victim to send again and flushes the cache
with its own filler traffic in between. The model does the same in one step:
before every timed request it restores the cache to the moment after the
victim's request (``Engine.save_cache_state`` / ``restore_cache_state``; the pool has room for
every request, so no cached block is overwritten) and sends one request.

``cache_n`` (``usage.prompt_tokens_details.cached_tokens`` in an OpenAI-compatible
response) is returned too: a server that reports it hands the prober the
answer exactly, timing or not.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.chat_format import REPLY_WORDS, Message, render
from kvlab.core.timing import MAX_REPEATS, Timing
from kvlab.core.workloads import JavaRandom
from kvlab.engine.engine import CacheState, Engine
from kvlab.errors import InvalidArgumentError, brief, cdiv, check_bool, check_int

DEFAULT_CANDIDATES = ("alice", "bruno", "chen", "dana", "emeka", "farah")
DEFAULT_SECRET = "dana"
KNOWN_HIT = "noone"
"""The name in the prober's own reference prompt: sent once untimed, so timing it again is a known hit."""
KNOWN_MISS = "nobody"
"""A name nobody sends (the cache is restored before each request), so timing it is a known miss."""
DECOYS = (KNOWN_MISS, KNOWN_HIT)
MAX_FORM_TOKENS = 4096


def threshold_ms(hit: Timing, miss: Timing) -> float:
    """The decision threshold: the geometric mean of the hit and miss medians (halfway on a log scale)."""
    for name, value in (("hit", hit), ("miss", miss)):
        if not isinstance(value, Timing):
            raise InvalidArgumentError(f"{name} must be a Timing, got {brief(value)}")
    if hit.median_ms <= 0 or miss.median_ms <= 0:
        raise InvalidArgumentError("hit and miss medians must be positive times")
    return math.sqrt(hit.median_ms * miss.median_ms)


def paired_verdict(guess: Timing, hit: Timing, miss: Timing) -> bool:
    """True when, in most repeats, the guess is below the geometric mean of the hit and miss timed beside it."""
    for name, value in (("guess", guess), ("hit", hit), ("miss", miss)):
        if not isinstance(value, Timing):
            raise InvalidArgumentError(f"{name} must be a Timing, got {brief(value)}")
    if not guess.repeats == hit.repeats == miss.repeats:
        raise InvalidArgumentError("guess, hit and miss need one sample each per repeat")
    ratios = []
    for g, h, m in zip(guess.wall_ms, hit.wall_ms, miss.wall_ms, strict=True):
        if h <= 0 or m <= 0:
            raise InvalidArgumentError("hit and miss times must be positive")
        ratios.append(g / math.sqrt(h * m))
    return statistics.median(ratios) < 1


def verdict(guess: Timing, threshold: float) -> bool:
    """True ("the guess was cached") when the guess's median time is below ``threshold`` ms."""
    if not isinstance(guess, Timing):
        raise InvalidArgumentError(f"guess must be a Timing, got {brief(guess)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0:
        raise InvalidArgumentError(f"threshold must be a positive number of ms, got {brief(threshold)}")
    if not math.isfinite(threshold):
        raise InvalidArgumentError(f"threshold must be finite, got {threshold!r}")
    return guess.median_ms < threshold


@dataclass(frozen=True)
class Calibration:
    """The prober's own known hits and misses, timed before the guesses (and topped up after each)."""

    hit: Timing
    miss: Timing

    @property
    def threshold_ms(self) -> float:
        return threshold_ms(self.hit, self.miss)

    @property
    def separated(self) -> bool:
        """True when the two spreads do not overlap (hit's third quartile below miss's first)."""
        return self.hit.clearly_faster_than(self.miss)


@dataclass(frozen=True)
class ProbeRow:
    """One guess: its ``repeats`` timings, the median of its repeats' thresholds and the verdict from time alone."""

    name: str
    is_secret: bool
    prompt_tokens: int
    cache_n: int
    ttft: Timing
    threshold_ms: float
    classified_hit: bool

    @property
    def prompt_n(self) -> int:
        return self.prompt_tokens - self.cache_n

    @property
    def ttft_ms(self) -> float:
        """The median time to first token over the guess's repeats."""
        return self.ttft.median_ms

    @property
    def cache_hit(self) -> bool:
        """What the server's counter says: the guess reused cached blocks (a known miss reuses none)."""
        return self.cache_n > 0


@dataclass(frozen=True)
class ProbeRun:
    """One scenario: the calibration (all samples taken) and every guess; ``salted``: per-tenant salts."""

    salted: bool
    secret: str
    victim_cache_n: int
    calibration: Calibration
    guesses: tuple[ProbeRow, ...]

    @property
    def found(self) -> tuple[str, ...]:
        """Names the prober's timing classified as cached (the right one alone when the channel is open)."""
        return tuple(r.name for r in self.guesses if r.classified_hit)

    @property
    def leaked(self) -> bool:
        return self.found == (self.secret,)

    @property
    def accuracy(self) -> float:
        """Share of guesses whose verdict says truly whether the guess was the victim's prompt (NaN: none)."""
        if not self.guesses:
            return math.nan
        return sum(r.classified_hit == r.is_secret for r in self.guesses) / len(self.guesses)

    def ttft_ratio(self) -> float:
        """Median over wrong guesses' median times, divided by the right guess's (about 1: no signal)."""
        wrong = Timing(*_pooled(r.ttft for r in self.guesses if not r.is_secret))
        right = Timing(*_pooled(r.ttft for r in self.guesses if r.is_secret))
        return wrong.median_ms / right.median_ms

    def as_rows(self) -> list[dict[str, object]]:
        """Plain dicts, one per guess, for a table or a plot."""
        return [
            {
                "salted": self.salted,
                "name": r.name,
                "is_secret": r.is_secret,
                "prompt_tokens": r.prompt_tokens,
                "cache_n": r.cache_n,
                "ttft_ms": r.ttft_ms,
                "q1_ms": r.ttft.q1_ms,
                "q3_ms": r.ttft.q3_ms,
                "threshold_ms": r.threshold_ms,
                "classified_hit": r.classified_hit,
            }
            for r in self.guesses
        ]


def _pooled(timings) -> tuple[tuple[float, ...], tuple[float, ...]]:
    wall: list[float] = []
    cpu: list[float] = []
    for t in timings:
        wall += t.wall_ms
        cpu += t.cpu_ms
    return tuple(wall), tuple(cpu)


def form_text(name: str, form_tokens: int) -> str:
    """The victim's system prompt: the name near the start, then ``form_tokens`` public tokens."""
    rnd = JavaRandom(form_tokens)
    body = "".join(" " + REPLY_WORDS[rnd.next_int(len(REPLY_WORDS))] for _ in range(form_tokens))
    return f"Patient record. Name: {name}. Intake form follows:{body}"


class Prober:
    """The prober's side of the attack on one ``"blocks"`` engine, with the victim's request planted.

    ``plant(secret)`` plays the victim's request (and the prober's own
    reference prompt) and remembers the cache state after it; every timed
    request starts from that state. ``calibrate`` and ``probe`` time requests;
    ``hit_samples`` and ``miss_samples`` keep every known hit and miss timed so far.
    """

    def __init__(
        self, *, salted: bool, form_tokens: int = 256, block_size: int = 16, calibration: int = 15
    ) -> None:
        check_bool("salted", salted)
        self.form_tokens = check_int("form_tokens", form_tokens, minimum=1, maximum=MAX_FORM_TOKENS)
        block_size = check_int("block_size", block_size, minimum=1, maximum=256)
        self.window = check_int("calibration", calibration, minimum=1, maximum=MAX_REPEATS)
        self.salted = salted
        self.victim_salt, self.prober_salt = ("victim", "prober") if salted else (None, None)
        max_len = form_tokens + 64
        # the victim's, the reference's and one request's blocks, with room to spare: nothing is evicted
        num_blocks = 4 * cdiv(max_len, block_size)
        self.engine = Engine(
            cache="blocks", block_size=block_size, max_model_len=max_len, num_blocks=num_blocks
        )
        self._planted: CacheState | None = None
        self.victim_cache_n = 0
        self.hit_samples: list[tuple[float, float]] = []
        self.miss_samples: list[tuple[float, float]] = []

    def prompt(self, name: str) -> list[int]:
        msgs = [
            Message("system", form_text(name, self.form_tokens)),
            Message("user", "Summarize the record."),
        ]
        return list(render(msgs, self.engine.tokenizer).tokens)

    def plant(self, secret: str) -> None:
        """The victim sends its record; the prober sends its reference prompt once; remember that state."""
        _check_name("secret", secret)
        engine = self.engine
        engine.prefix_cache = type(engine.prefix_cache)(engine.pool.num_blocks, engine.block_size)
        self.victim_cache_n = engine.generate(
            self.prompt(secret), max_tokens=1, cache_salt=self.victim_salt
        ).cache_n
        engine.generate(self.prompt(KNOWN_HIT), max_tokens=1, cache_salt=self.prober_salt)
        self._planted = engine.save_cache_state()

    def restore(self) -> None:
        """Put the cache back as it was right after the victim's request (and the prober's reference)."""
        if self._planted is None:
            raise InvalidArgumentError("plant(secret) first: there is no victim request to probe")
        self.engine.restore_cache_state(self._planted)

    def request(self, name: str) -> tuple[float, float, int, int]:
        """One timed request from the planted state: (wall ms, CPU ms, prompt tokens, cache_n)."""
        self.restore()
        prompt = self.prompt(name)
        cpu0 = time.process_time()
        res = self.engine.generate(prompt, max_tokens=1, cache_salt=self.prober_salt)
        return res.ttft_ms, (time.process_time() - cpu0) * 1e3, res.prompt_tokens, res.cache_n

    def _calibration_step(self) -> None:
        self.hit_samples.append(self.request(KNOWN_HIT)[:2])
        self.miss_samples.append(self.request(KNOWN_MISS)[:2])

    def calibrate(self) -> Calibration:
        """Time ``calibration`` known hits and known misses, interleaved; return them."""
        for _ in range(self.window):
            self._calibration_step()
        return self.calibration()

    def calibration(self, *, latest: bool = False) -> Calibration:
        """Every calibration sample so far, or with ``latest`` the last ``calibration`` of each."""
        if not self.hit_samples:
            raise InvalidArgumentError("calibrate() first: no known hits and misses were timed yet")
        hit = self.hit_samples[-self.window :] if latest else self.hit_samples
        miss = self.miss_samples[-self.window :] if latest else self.miss_samples
        return Calibration(_timing(hit), _timing(miss))

    def probe(self, name: str, *, repeats: int = 5, secret: str | None = None) -> ProbeRow:
        """Time ``name`` ``repeats`` times, each between a known hit and a known miss; decide by ``paired_verdict``.

        The known hits and misses join the calibration samples.
        """
        _check_name("name", name)
        repeats = check_int("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
        hits, guesses, misses = [], [], []
        for _ in range(repeats):
            hits.append(self.request(KNOWN_HIT))
            guesses.append(self.request(name))
            misses.append(self.request(KNOWN_MISS))
        self.hit_samples += [h[:2] for h in hits]
        self.miss_samples += [m[:2] for m in misses]
        hit, ttft, miss = (_timing([r[:2] for r in rows]) for rows in (hits, guesses, misses))
        threshold = statistics.median(math.sqrt(h[0] * m[0]) for h, m in zip(hits, misses, strict=True))
        _, _, prompt_tokens, cache_n = guesses[0]
        return ProbeRow(
            name, name == secret, prompt_tokens, cache_n, ttft, threshold, paired_verdict(ttft, hit, miss)
        )


def _timing(samples: Sequence[tuple[float, float]]) -> Timing:
    return Timing(tuple(w for w, _ in samples), tuple(c for _, c in samples))


def tenant_probe(
    *,
    salted: bool,
    secret: str = DEFAULT_SECRET,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    form_tokens: int = 256,
    block_size: int = 16,
    repeats: int = 5,
    calibration: int = 15,
) -> ProbeRun:
    """Plant the victim's request, calibrate, then time every candidate ``repeats`` times.

    ``salted`` gives each tenant its own ``cache_salt`` ("victim" / "prober").
    """
    check_bool("salted", salted)
    names = _check_names(secret, candidates)
    repeats = check_int("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
    prober = Prober(salted=salted, form_tokens=form_tokens, block_size=block_size, calibration=calibration)
    prober.plant(secret)
    prober.calibrate()
    guesses = tuple(prober.probe(n, repeats=repeats, secret=secret) for n in names)
    return ProbeRun(salted, secret, prober.victim_cache_n, prober.calibration(), guesses)


def tenant_probe_demo(**kwargs: object) -> dict[str, ProbeRun]:
    """Both scenarios side by side: ``{"shared cache": ..., "per-tenant salt": ...}``."""
    return {
        "shared cache": tenant_probe(salted=False, **kwargs),  # type: ignore[arg-type]
        "per-tenant salt": tenant_probe(salted=True, **kwargs),  # type: ignore[arg-type]
    }


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name.isalpha() or not name.isascii() or len(name) > 64:
        raise InvalidArgumentError(f"{what} must be one word of at most 64 ASCII letters, got {brief(name)}")
    return name


def _check_names(secret: object, candidates: object) -> list[str]:
    _check_name("secret", secret)
    if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
        raise InvalidArgumentError("candidates must be a non-empty list of names")
    if len(candidates) > 64:
        raise InvalidArgumentError(f"at most 64 candidates, got {len(candidates)}")
    names = [_check_name("every candidate", n) for n in candidates]
    if len(set(names)) != len(names):
        raise InvalidArgumentError("candidates must not repeat a name")
    if set(DECOYS) & {secret, *names}:
        raise InvalidArgumentError(
            f"{' and '.join(DECOYS)} are the prober's known-miss and known-hit names; pick others"
        )
    return names
