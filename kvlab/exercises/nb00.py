"""Exercise of notebook 00, the start page: one tiny check to show how checks work."""

from __future__ import annotations

from kvlab.exercises.core import NotYet, exercise
from kvlab.lessons.ex01 import reserve_max


@exercise(
    "00.1",
    title="Try a check",
    assesses="using the exercise cells: replacing ... with an answer and reading the feedback",
    minutes=2,
    answer_type="int",
    points=1,
    difficulty="intro",
    hints=[
        "Each request reserves 2,048 slots, whatever it really needs. How many times does 2,048 go into 8,192?",
        "Divide the pool by one reservation: 8,192 / 2,048 comes out whole. Write that number after answer =.",
    ],
)
def reservations_that_fit(answer: int) -> str:
    placed = len(reserve_max([1] * 10, pool_size=8192, max_len=2048).placed)
    if answer != placed:
        regions = "1 region of 2,048 slots takes" if answer == 1 else f"{answer} regions of 2,048 slots take"
        raise NotYet(f"{regions} {answer * 2048:,} slots, but the pool has 8,192.")
    return f"{placed} regions of 2,048 slots fill the pool; notebook 01 shows what that costs."
