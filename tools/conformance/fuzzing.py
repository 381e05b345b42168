"""The fuzz driver both fuzzers share: run seeds, shrink the first differing scenario, report it.

A fuzzer supplies ``generate(seed, num_ops) -> scenario`` and
``first_difference(scenario) -> (op index, kvlab record, engine record) | None``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab.errors import ScenarioError

Scenario = dict[str, Any]
FirstDifference = Callable[[Scenario], "tuple[int, dict, dict] | None"]


def _still_differs(scenario: Scenario, first_difference: FirstDifference) -> bool:
    try:
        return first_difference(scenario) is not None
    except (ScenarioError, KeyError):  # a cut left an op naming a request or handle that no longer exists
        return False


def shrink(scenario: Scenario, first_difference: FirstDifference) -> Scenario:
    """Drop ops (in halves, then one by one, until nothing more goes) while the scenario still differs."""
    found = first_difference(scenario)
    assert found is not None
    ops = scenario["ops"][: found[0] + 1]
    config = scenario["config"]
    while True:
        before = len(ops)
        chunk = max(1, len(ops) // 2)
        while chunk >= 1:
            i = 0
            while i < len(ops):
                trial = ops[:i] + ops[i + chunk :]
                if trial and _still_differs({"config": config, "ops": trial}, first_difference):
                    ops = trial
                else:
                    i += chunk
            chunk //= 2
        if len(ops) == before:
            return {"config": config, "ops": ops}


def fuzz(
    seeds: range,
    num_ops: int,
    *,
    generate: Callable[[int, int], Scenario],
    first_difference: FirstDifference,
    engine: str,
    out: Path | None = None,
    verbose: bool = False,
) -> int:
    """Fuzz ``seeds``; return the number of ops compared. Raises AssertionError on the first difference."""
    total = 0
    start = time.time()
    for seed in seeds:
        scenario = generate(seed, num_ops)
        if first_difference(scenario) is not None:
            small = shrink(scenario, first_difference)
            i, ours, theirs = first_difference(small)
            if out is not None:
                out.write_text(json.dumps(small) + "\n")
            raise AssertionError(
                f"seed {seed}: kvlab differs from {engine} at op {i} of the shrunk "
                f"scenario{f' (written to {out})' if out else ''}:\n"
                f"scenario: {json.dumps(small)}\nkvlab: {json.dumps(ours)}\n{engine}: {json.dumps(theirs)}"
            )
        total += len(scenario["ops"])
        if verbose and (seed - seeds.start + 1) % 20 == 0:
            print(
                f"  seeds {seeds.start}..{seed}: {total} ops agree ({time.time() - start:.0f} s)", flush=True
            )
    return total


def seed_range(text: str) -> range:
    """'A:B' -> range(A, B); 'A' -> range(A, A + 1)."""
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi)) if hi else range(int(lo), int(lo) + 1)
