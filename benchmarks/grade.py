"""Notebooks graded per minute by ``python -m kvlab grade``, against only running them.

    python benchmarks/grade.py [--students 4] [--jobs 2] [--repeats 3] [--notebook 02]

Builds a class of ``--students`` copies of one notebook (half solved, half as shipped), then times,
side by side and ``--repeats`` times each: the grader on the whole class (a worker process and a
fresh kernel per notebook, a child process per function answer, every check outside the kernel)
and the baseline, the same notebooks executed by tools/run_notebooks.py with no grading. It prints
the median and quartiles of both, notebooks per minute, and the grader's cost as a ratio to the
baseline. Run it on an idle machine: other processes on the two cores stretch every number.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import run_notebooks  # noqa: E402

from kvlab.cli.grade import collect, grade_all  # noqa: E402
from kvlab.core.timing import measure_side_by_side  # noqa: E402
from kvlab.exercises.grading import Limits  # noqa: E402


def build_class(folder: Path, notebook: str, students: int) -> list[Path]:
    """``students`` submissions of ``notebook``: even ones solved, odd ones as shipped."""
    path = run_notebooks.notebook_paths([notebook])[0]
    solutions = run_notebooks.load_solutions(path)
    out = []
    for i in range(students):
        nb = nbformat.read(path, as_version=4)
        if i % 2 == 0:
            run_notebooks.fill_solutions(nb, solutions)
        target = folder / f"student{i:02d}_{path.name}"
        nbformat.write(nb, target)
        out.append(target)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=4, help="submissions in the class (default 4)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks at once, for both (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (default 3)")
    parser.add_argument("--notebook", default="02", help="which notebook the class hands in (default 02)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="kvlab-bench-grade-") as tmp:
        paths = build_class(Path(tmp), args.notebook, args.students)
        submissions = collect([tmp], Path(tmp) / "scratch")
        limits = Limits(timeout=300, cell_timeout=120, function_seconds=30)
        points: list[int] = []
        lost: list[str] = []  # a solved notebook's exercise that did not get its points, and why

        def grade() -> None:
            rows = grade_all(submissions, limits, args.jobs, random.randrange(2**32), None)
            points.append(sum(r.points for r in rows))
            solved = {
                s.student for i, s in enumerate(sorted(submissions, key=lambda s: s.student)) if i % 2 == 0
            }
            lost.extend(
                f"{r.student} {r.exercise}: {r.feedback}"
                for r in rows
                if r.student in solved and not r.points
            )

        def run_only() -> None:
            for f in run_notebooks.run_many([(p, False) for p in paths], args.jobs):
                f.result()

        timings = measure_side_by_side({"grade": grade, "run only": run_only}, warmup=0, repeats=args.repeats)
    g, base = timings["grade"], timings["run only"]
    print(
        f"{args.students} notebooks {args.notebook} (half solved), {args.jobs} at a time, {args.repeats} runs each"
    )
    for name, t in timings.items():
        per_minute = 60_000 * args.students / t.median_ms
        print(f"  {name:<9} median {t.median_ms / 1e3:6.1f} s  (q1 {t.q1_ms / 1e3:.1f}, q3 {t.q3_ms / 1e3:.1f})"
              f"  {per_minute:5.1f} notebooks/min")  # fmt: skip
    low, high = g.ratio_spread(base)
    print(f"  grading costs {g.ratio_to(base):.2f}x running alone (spread {low:.2f}-{high:.2f})")
    print(
        f"  points given per run: {points} (each run draws new hidden cases; a solved notebook keeps its points)"
    )
    for line in lost:
        print(f"  lost by a solved notebook: {line}")
    return 0 if not lost else 1


if __name__ == "__main__":
    sys.exit(main())
