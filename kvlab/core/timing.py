"""One way to time things, for the course and the benchmarks: warm-up, repeats, median and spread.

A single timing on a shared 2-core machine says little: another process can
take the core for a few milliseconds at any moment. Every timing kvlab prints
comes from here, so it is always the same recipe:

* ``warmup`` untimed calls first (caches, lazy initialisation, allocator);
* ``repeats`` timed calls, each measured in wall time (``time.perf_counter``)
  and in this process's CPU time (``time.process_time``);
* the median as the value and the interquartile range (IQR) as the spread.

``measure_side_by_side`` times several functions in interleaved rounds (each
once per round, in a seeded shuffled order), so a burst of load on the machine
falls on all of them alike and their ratio stays honest, and no function always
runs in the caches one neighbour left; ``Timing.ratio_by_round`` reads two such
Timings round by round. ``Timing.clearly_faster_than`` is the test
a notebook sentence such as "the cached turn is faster" must pass: the slower
one's first quartile above the faster one's third quartile.

``measure_once`` times a single call that cannot be repeated (a stepper
step's first visit, a whole notebook run) with the same clocks, and ``Timing``
also holds samples measured elsewhere (an engine's time to first token).
``sync`` (for example ``torch.cuda.synchronize``) is called before and after
each timed call, so asynchronous GPU work is inside the measurement.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvlab.errors import InvalidArgumentError, brief, check_choice, check_int

MAX_REPEATS = 100_000
MAX_MS = 1e12  # a sample's bound: about 31 years, past any timing, far below where sums overflow
ORDER_SEED = 0  # measure_side_by_side's shuffles of each round, the same every run


def _quartiles(values: tuple[float, ...]) -> tuple[float, float, float]:
    """The first quartile, median and third quartile, interpolated as ``statistics.quantiles`` does
    (``method="inclusive"``), but as ``low + (high - low) * fraction``: equal neighbours give
    themselves even when they are infinite (a ratio over a zero time) or near the float maximum."""
    data = sorted(values)
    last = len(data) - 1

    def at(fraction: float) -> float:
        position = last * fraction
        i = int(position)
        low = data[i]
        if i == last or position == i:
            return low
        high = data[i + 1]
        return low if high == low else low + (high - low) * (position - i)

    return at(0.25), at(0.5), at(0.75)


def _check_samples(name: str, values: object) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list)):
        raise InvalidArgumentError(f"{name} must be a tuple or list of milliseconds, got {brief(values)}")
    base = tuple if isinstance(values, tuple) else list  # read through the base type: a subclass may lie
    count = base.__len__(values)
    if not 0 < count <= MAX_REPEATS:
        raise InvalidArgumentError(f"{name} must hold 1 to {MAX_REPEATS:,} samples, got {count}")
    out = []
    for v in base.__iter__(values):
        ms = _plain_ms(v)
        if ms is None or not (0 <= ms <= MAX_MS):
            raise InvalidArgumentError(
                f"{name} must hold finite times from 0 to {MAX_MS:.0e} ms, got {brief(v)}"
            )
        out.append(ms)
    return tuple(out)


def _plain_ms(value: object) -> float | None:
    """A sample's own value as a plain float, never calling its class's code (a subclass may lie); None if not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, int):
        number = int.__int__(value)
        return float(number) if abs(number) <= MAX_MS else math.inf
    return None


@dataclass(frozen=True)
class Timing:
    """Repeated measurements of one thing: wall and CPU milliseconds, one entry per timed call."""

    wall_ms: tuple[float, ...]
    cpu_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        wall = _check_samples("wall_ms", self.wall_ms)
        cpu = _check_samples("cpu_ms", self.cpu_ms)
        if len(wall) != len(cpu):
            raise InvalidArgumentError(
                f"a Timing needs as many CPU as wall samples, got {len(cpu)} and {len(wall)}"
            )
        object.__setattr__(self, "wall_ms", wall)
        object.__setattr__(self, "cpu_ms", cpu)

    @cached_property
    def _wall_quartiles(self) -> tuple[float, float, float]:
        return _quartiles(self.wall_ms)

    @property
    def repeats(self) -> int:
        return len(self.wall_ms)

    @property
    def median_ms(self) -> float:
        return self._wall_quartiles[1]

    @property
    def q1_ms(self) -> float:
        return self._wall_quartiles[0]

    @property
    def q3_ms(self) -> float:
        return self._wall_quartiles[2]

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    @property
    def min_ms(self) -> float:
        return min(self.wall_ms)

    @property
    def cpu_median_ms(self) -> float:
        return _quartiles(self.cpu_ms)[1]

    def ratio_to(self, other: Timing) -> float:
        """This median over ``other``'s median (above 1: this one is slower); 1 when both are 0."""
        if not isinstance(other, Timing):
            raise InvalidArgumentError(f"ratio_to needs a Timing, got {brief(other)}")
        if other.median_ms > 0:
            return self.median_ms / other.median_ms
        return 1.0 if self.median_ms == 0 else math.inf

    def ratio_spread(self, other: Timing) -> tuple[float, float]:
        """The ratio's range when the spreads are at their least and most favourable: (q1 / q3', q3 / q1').

        A claim "A is N times slower than B" holds across both spreads when N is at most the first value.
        """
        if not isinstance(other, Timing):
            raise InvalidArgumentError(f"ratio_spread needs a Timing, got {brief(other)}")
        low = self.q1_ms / other.q3_ms if other.q3_ms > 0 else math.inf
        high = self.q3_ms / other.q1_ms if other.q1_ms > 0 else math.inf
        return low, high

    def ratio_by_round(self, other: Timing, clock: str = "wall") -> tuple[float, float, float]:
        """The first quartile, median and third quartile of this sample over ``other``'s, round by round.

        For two Timings from one ``measure_side_by_side``: sample i of each ran in the same
        round, back to back, so a burst of load on the machine that slows one slows the
        other and cancels in their ratio, where ``ratio_spread`` (each spread at its worst)
        counts it twice. A claim "A is at most N times B in most rounds" holds when N is at
        least the third value. ``clock`` is "wall" (wall_ms) or "cpu" (cpu_ms, this process's CPU
        time, which another process holding the core does not inflate).
        """
        if not isinstance(other, Timing):
            raise InvalidArgumentError(f"ratio_by_round needs a Timing, got {brief(other)}")
        field = check_choice("clock", clock, ("wall", "cpu")) + "_ms"
        # the samples read again, not trusted: a subclass may skip the checks or change them after
        mine = _check_samples(f"this Timing's {field}", object.__getattribute__(self, field))
        theirs = _check_samples(f"the other Timing's {field}", object.__getattribute__(other, field))
        if len(theirs) != len(mine):
            raise InvalidArgumentError(
                f"ratio_by_round pairs sample i of one with sample i of the other, so both need as many; "
                f"got {len(mine)} and {len(theirs)} (time them in one measure_side_by_side)"
            )
        ratios = tuple(
            a / b if b > 0 else (1.0 if a == 0 else math.inf) for a, b in zip(mine, theirs, strict=True)
        )
        return _quartiles(ratios)

    def clearly_faster_than(self, other: Timing) -> bool:
        """True when the spreads do not overlap: this one's third quartile below ``other``'s first."""
        if not isinstance(other, Timing):
            raise InvalidArgumentError(f"clearly_faster_than needs a Timing, got {brief(other)}")
        return self.q3_ms < other.q1_ms

    def as_dict(self) -> dict[str, float]:
        return {
            "median_ms": self.median_ms,
            "q1_ms": self.q1_ms,
            "q3_ms": self.q3_ms,
            "iqr_ms": self.iqr_ms,
            "cpu_median_ms": self.cpu_median_ms,
            "repeats": self.repeats,
        }

    def __str__(self) -> str:
        return (
            f"{self.median_ms:.2f} ms (IQR {self.q1_ms:.2f}-{self.q3_ms:.2f}, "
            f"CPU {self.cpu_median_ms:.2f} ms, n={self.repeats})"
        )


def _check_callable(name: str, fn: object) -> Callable[[], object]:
    if not callable(fn):
        raise InvalidArgumentError(f"{name} must be a function taking no arguments, got {brief(fn)}")
    return fn  # type: ignore[return-value]


def _check_sync(sync: object) -> Callable[[], object] | None:
    return None if sync is None else _check_callable("sync", sync)


def _one_call(fn: Callable[[], object], sync: Callable[[], object] | None) -> tuple[object, float, float]:
    if sync is not None:
        sync()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    value = fn()
    if sync is not None:
        sync()
    return value, (time.perf_counter() - wall0) * 1e3, (time.process_time() - cpu0) * 1e3


def measure_once(
    fn: Callable[[], object], *, sync: Callable[[], object] | None = None
) -> tuple[object, Timing]:
    """Call ``fn`` once, timed; return its value and a one-sample ``Timing`` (no spread: say so when printing)."""
    fn = _check_callable("fn", fn)
    value, wall, cpu = _one_call(fn, _check_sync(sync))
    return value, Timing((wall,), (cpu,))


def measure(
    fn: Callable[[], object],
    *,
    warmup: int = 1,
    repeats: int = 11,
    sync: Callable[[], object] | None = None,
) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return every sample."""
    return measure_side_by_side({"fn": fn}, warmup=warmup, repeats=repeats, sync=sync)["fn"]


def measure_side_by_side(
    fns: Mapping[Any, Callable[[], object]],
    *,
    warmup: int = 1,
    repeats: int = 11,
    sync: Callable[[], object] | None = None,
) -> dict[Any, Timing]:
    """Time several functions in interleaved rounds, so load on the machine falls on all alike.

    After the warm-up (in the given order), each round runs the functions in a shuffled
    order, the same shuffles every run (seeded): a call runs in the caches its predecessor
    left, warm when both read the same tensors and cold after one that swept others
    through, so in a fixed order a function would always inherit its neighbour's. ``fns``
    maps any key (a name, a block size) to a function; the result has the same keys.
    """
    if not isinstance(fns, Mapping) or not fns:
        raise InvalidArgumentError(f"fns must be a non-empty mapping of name to function, got {brief(fns)}")
    if len(fns) > MAX_REPEATS:
        raise InvalidArgumentError(f"at most {MAX_REPEATS:,} functions side by side, got {len(fns)}")
    checked = {name: _check_callable(f"fns[{brief(name)}]", fn) for name, fn in fns.items()}
    warmup = check_int("warmup", warmup, minimum=0, maximum=MAX_REPEATS)
    repeats = check_int("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
    sync = _check_sync(sync)
    for _ in range(warmup):
        for fn in checked.values():
            fn()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in checked}
    names, shuffler = list(checked), random.Random(ORDER_SEED)
    for _ in range(repeats):
        shuffler.shuffle(names)
        for name in names:
            _, wall, cpu = _one_call(checked[name], sync)
            samples[name].append((wall, cpu))
    return {
        name: Timing(tuple(w for w, _ in rows), tuple(c for _, c in rows)) for name, rows in samples.items()
    }
