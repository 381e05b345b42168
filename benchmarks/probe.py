"""How often the timing side channel's verdicts are right, with a shared cache and with a salt per tenant.

    python benchmarks/probe.py [--probes 200] [--repeats 5] [--form-tokens 256] [--seed 0]

Lesson 002: a shared prefix cache tells a prober, through the time to first
token, whether someone sent a guessed prefix. ``kvlab.engine.probe.Prober``
calibrates known hits and misses, then times each guess ``--repeats`` times,
each between a known hit and a known miss, and calls it a hit when in most
repeats it is below the geometric mean of its two neighbours
(``paired_verdict``). Here it runs ``--probes``
guesses: the victim's secret is drawn anew every 10 guesses, and exactly half
of the guesses are the secret, so always answering "miss" (or a coin) scores
50%. The goal: at least 95% right with a shared cache, and no better than
chance with a per-tenant ``cache_salt``.

Each scenario prints its calibration (median and IQR of hits and misses), the
accuracy, the share of right guesses called hits and of wrong guesses called
misses, and the load average, since the point is that it holds on a busy
machine. The salted run must score near 50%: a binomial 95% band around 50%
for the number of probes is printed next to it.

Each guess costs 15 requests (5 repeats of known hit, guess, known miss), so 200 probes per
scenario take about 2 minutes on an idle core and 4 to 6 with the machine loaded.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvlab.engine.probe import DEFAULT_CANDIDATES, Prober  # noqa: E402

GOAL = 0.95
PER_SECRET = 10


def run(salted: bool, probes: int, repeats: int, form_tokens: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    prober = Prober(salted=salted, form_tokens=form_tokens)
    names = list(DEFAULT_CANDIDATES)
    right = wrong_ok = right_ok = 0
    start = time.perf_counter()
    calibration = None
    for first in range(0, probes, PER_SECRET):
        secret = rng.choice(names)
        prober.plant(secret)
        if calibration is None:
            calibration = prober.calibrate()
        batch = min(PER_SECRET, probes - first)
        others = [n for n in names if n != secret]
        guesses = [secret] * (batch // 2) + [rng.choice(others) for _ in range(batch - batch // 2)]
        rng.shuffle(guesses)
        for name in guesses:
            row = prober.probe(name, repeats=repeats, secret=secret)
            if row.is_secret:
                right += 1
                right_ok += row.classified_hit
            else:
                wrong_ok += not row.classified_hit
    assert calibration is not None
    return {
        "accuracy": (right_ok + wrong_ok) / probes,
        "right_called_hit": right_ok / max(right, 1),
        "wrong_called_miss": wrong_ok / max(probes - right, 1),
        "seconds": time.perf_counter() - start,
        "hit": calibration.hit,
        "miss": calibration.miss,
        "threshold": calibration.threshold_ms,
        "final": prober.calibration(latest=True).threshold_ms,
    }  # type: ignore[dict-item]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="timings per guess (default 5)")
    parser.add_argument("--form-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.probes < 2:
        parser.error("--probes must be at least 2")
    torch.set_num_threads(1)
    print(f"{args.probes} probes, {args.repeats} timings each, {args.form_tokens}-token form; "
          f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    half_band = 1.96 * math.sqrt(0.25 / args.probes)
    ok = True
    for salted in (False, True):
        r = run(salted, args.probes, args.repeats, args.form_tokens, args.seed)
        label = "per-tenant salt" if salted else "shared cache"
        print(f"\n{label}:")
        print(f"  calibration: known hit {r['hit']}")
        print(f"               known miss {r['miss']}")
        print(f"  threshold (geometric mean of the medians) {r['threshold']:.2f} ms at the start, "
              f"{r['final']:.2f} ms over the last known hits and misses")  # fmt: skip
        print(f"  accuracy {100 * r['accuracy']:.1f}%  (right guesses called hits {100 * r['right_called_hit']:.1f}%, "
              f"wrong guesses called misses {100 * r['wrong_called_miss']:.1f}%)  in {r['seconds']:.0f} s; "
              f"load average now {os.getloadavg()[0]:.1f}")  # fmt: skip
        if salted:
            inside = abs(r["accuracy"] - 0.5) <= half_band
            print(f"  chance is 50%; 95% of coin-flip runs of {args.probes} probes land in "
                  f"{100 * (0.5 - half_band):.1f}-{100 * (0.5 + half_band):.1f}%: "
                  f"{'no better than chance' if inside else 'OUTSIDE the band'}")  # fmt: skip
            ok &= inside
        else:
            print(f"  goal: at least {100 * GOAL:.0f}%: {'met' if r['accuracy'] >= GOAL else 'NOT met'}")
            ok &= r["accuracy"] >= GOAL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
