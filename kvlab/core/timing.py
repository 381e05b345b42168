"""One way to time things, for the course and the benchmarks: warm-up, repeats, median and spread.

A single timing on a shared 2-core machine says little: another process can
take the core for a few milliseconds at any moment. Every timing kvlab prints
comes from here, so it is always the same recipe:

* ``warmup`` untimed calls first (caches, lazy initialisation, allocator);
* ``repeats`` timed calls, each measured in wall time (``time.perf_counter``)
  and in this process's CPU time (``time.process_time``);
* the median as the value and the interquartile range (IQR) as the spread.

``measure_side_by_side`` times several functions in interleaved rounds (A, B,
C, A, B, C, ...), so a burst of load on the machine falls on all of them
alike and their ratio stays honest. ``Timing.clearly_faster_than`` is the test
a notebook sentence such as "the cached turn is faster" must pass: the slower
one's first quartile above the faster one's third quartile.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvlab.errors import InvalidArgumentError, brief, check_int

MAX_REPEATS = 100_000


def _quartiles(values: tuple[float, ...]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclass(frozen=True)
class Timing:
    """Repeated measurements of one thing: wall and CPU milliseconds, one entry per timed call."""

    wall_ms: tuple[float, ...]
    cpu_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.wall_ms or len(self.wall_ms) != len(self.cpu_ms):
            raise InvalidArgumentError("a Timing needs at least one sample, as many CPU as wall samples")

    @property
    def repeats(self) -> int:
        return len(self.wall_ms)

    @property
    def median_ms(self) -> float:
        return _quartiles(self.wall_ms)[1]

    @property
    def q1_ms(self) -> float:
        return _quartiles(self.wall_ms)[0]

    @property
    def q3_ms(self) -> float:
        return _quartiles(self.wall_ms)[2]

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
        """This median over ``other``'s median (above 1: this one is slower)."""
        if not isinstance(other, Timing):
            raise InvalidArgumentError(f"ratio_to needs a Timing, got {brief(other)}")
        return self.median_ms / other.median_ms if other.median_ms > 0 else float("inf")

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


def _one_call(fn: Callable[[], object]) -> tuple[float, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - wall0) * 1e3, (time.process_time() - cpu0) * 1e3


def measure(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 11) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return every sample."""
    return measure_side_by_side({"fn": fn}, warmup=warmup, repeats=repeats)["fn"]


def measure_side_by_side(
    fns: Mapping[str, Callable[[], object]], *, warmup: int = 1, repeats: int = 11
) -> dict[str, Timing]:
    """Time several functions in interleaved rounds, so load on the machine falls on all alike."""
    if not isinstance(fns, Mapping) or not fns:
        raise InvalidArgumentError(f"fns must be a non-empty mapping of name to function, got {brief(fns)}")
    checked = {str(name): _check_callable(f"fns[{name!r}]", fn) for name, fn in fns.items()}
    warmup = check_int("warmup", warmup, minimum=0, maximum=MAX_REPEATS)
    repeats = check_int("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
    for _ in range(warmup):
        for fn in checked.values():
            fn()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in checked}
    for _ in range(repeats):
        for name, fn in checked.items():
            samples[name].append(_one_call(fn))
    return {
        name: Timing(tuple(w for w, _ in rows), tuple(c for _, c in rows)) for name, rows in samples.items()
    }
