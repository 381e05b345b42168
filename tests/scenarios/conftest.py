"""Fixtures the scenario tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def example_8_scenario() -> dict:
    """Lesson example 8 as a radix scenario: three prompts, a lookup that ends mid-run, lock, evict one token.

    Written out literally (not built from ``kvlab.lessons.ex08``), so the tests pin the lesson's numbers.
    """
    return {
        "config": {"page_size": 1},
        "ops": [
            {"op": "insert", "tokens": [1, 2, 3, 4, 5, 6, 10, 11]},
            {"op": "insert", "tokens": [1, 2, 3, 4, 5, 6, 20, 21, 22]},
            {"op": "insert", "tokens": [1, 2, 3, 4, 5, 6, 10, 11, 30, 31]},
            {"op": "match", "tokens": [1, 2, 3, 4, 5, 6, 20, 21, 22, 40], "as": "req"},
            {"op": "lock", "node": "req"},
            {"op": "evict", "num_tokens": 1},
        ],
    }
