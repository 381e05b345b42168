"""What a grading run writes: grades.csv, feedback, the summary, Gradescope's results.json, the autograder.

``python -m kvlab grade`` (kvlab/cli/grade.py) collects and grades; these functions only turn its
``Row``s into files. Gradescope's autograder contract: ``setup.sh`` runs once when the image is
built, ``/autograder/run_autograder`` for each submission, which is in ``/autograder/submission``;
the grade goes to ``/autograder/results/results.json`` (``score``, ``tests`` with ``name``,
``score``, ``max_score``, ``output``).
"""

from __future__ import annotations

import csv
import shutil
from collections import Counter
from pathlib import Path

from kvlab.exercises.core import NOT_DONE, NOT_YET, RIGHT, exercises, get
from kvlab.exercises.grading import ERROR, MISSING, Row

FIELDS = ("student", "notebook", "exercise", "points", "max_points", "status", "feedback")


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow(r.as_dict())


def feedback_markdown(student: str, rows: list[Row]) -> str:
    """One student's feedback: score, then each exercise with its verdict and, when not right, the hint."""
    got, out_of = sum(r.points for r in rows), sum(r.max_points for r in rows)
    lines = [f"# Feedback for {student}", "", f"**{got} of {out_of} points.**", ""]
    mark = {RIGHT: "✓", NOT_YET: "✗", NOT_DONE: "…", ERROR: "!", MISSING: "-"}
    for r in rows:
        if not r.exercise:
            lines += [f"- ! {r.title}: {r.feedback}", ""]
            continue
        lines.append(
            f"## {mark.get(r.status, '?')} {r.exercise} {r.title}: {r.status} ({r.points}/{r.max_points})"
        )
        lines += ["", r.feedback, ""]
        if r.status != RIGHT:
            lines += [f"Hint: {get(r.exercise).hints[0]}", ""]
    return "\n".join(lines)


def summary_rows(rows: list[Row]) -> list[dict[str, object]]:
    """Per exercise: how many were graded, got it, and the most common wrong answer."""
    out = []
    for ex in exercises():
        mine = [r for r in rows if r.exercise == ex.id]
        if not mine:
            continue
        wrong = Counter(r.answer or r.feedback.split(";")[0][:80] for r in mine if r.status == NOT_YET)
        common, times = wrong.most_common(1)[0] if wrong else ("", 0)
        out.append({
            "exercise": ex.id, "title": ex.title, "max_points": ex.points, "students": len(mine),
            "right": sum(r.status == RIGHT for r in mine), "not_yet": sum(r.status == NOT_YET for r in mine),
            "not_done": sum(r.status == NOT_DONE for r in mine),
            "error_or_missing": sum(r.status in (ERROR, MISSING) for r in mine),
            "most_common_wrong": f"{common} ({times}×)" if times else "",
        })  # fmt: skip
    return out


def write_summary(rows: list[Row], out: Path, seed: int) -> None:
    table = summary_rows(rows)
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["exercise"])
        writer.writeheader()
        writer.writerows(table)
    students = sorted({r.student for r in rows})
    lines = [
        "# Grading summary",
        "",
        f"{len(students)} students; hidden cases drawn with seed {seed} (`--seed {seed}` draws them again).",
        "",
        "| Exercise | Title | Right | Not yet | Not done | Error or missing | Most common wrong answer |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for t in table:
        wrong = str(t["most_common_wrong"]).replace("|", "\\|")
        lines.append(f"| {t['exercise']} | {t['title']} | {t['right']}/{t['students']} | {t['not_yet']} | "
                     f"{t['not_done']} | {t['error_or_missing']} | {wrong} |")  # fmt: skip
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def gradescope_results(rows: list[Row], seconds: float) -> dict[str, object]:
    """Gradescope's results.json for one submission: score, execution_time, output, tests."""
    tests = [
        {
            "name": f"{r.exercise} {r.title}" if r.exercise else r.title,
            "number": r.exercise or None,
            "score": r.points,
            "max_score": r.max_points,
            "status": "passed" if r.status == RIGHT else "failed",
            "output": f"{r.status}: {r.feedback}",
            "visibility": "visible",
        }
        for r in rows
    ]
    got, out_of = sum(r.points for r in rows), sum(r.max_points for r in rows)
    return {
        "score": got,
        "execution_time": round(seconds, 1),
        "output": f"{got} of {out_of} points, graded by kvlab outside your notebook's kernel.",
        "visibility": "visible",
        "tests": tests,
    }


RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for each submission: /autograder/submission holds what the student uploaded,
# /autograder/results/results.json is what Gradescope reads. $KVLAB_AUTOGRADER_ROOT replaces
# /autograder (for a trial run on your own machine), $KVLAB_PYTHON the interpreter.
set -u
ROOT="${{KVLAB_AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{KVLAB_PYTHON:-python3}}"
mkdir -p "$ROOT/results"
"$PYTHON" -m kvlab grade "$ROOT/submission" --out "$ROOT/results/kvlab" --format gradescope \\
    --results-json "$ROOT/results/results.json" {options}
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
    printf '{{"score": 0, "output": "kvlab could not grade this submission (exit %s)", "tests": []}}\\n' \\
        "$status" > "$ROOT/results/results.json"
fi
exit 0
"""

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image (Ubuntu, as root).
set -euo pipefail
cd "$(dirname "$0")"
apt-get update -q && apt-get install -y -q python3 python3-pip python3-venv
python3 -m pip install --break-system-packages --no-cache-dir \\
    nbclient nbformat ipykernel "jsonschema<4.25" || \\
python3 -m pip install --no-cache-dir nbclient nbformat ipykernel "jsonschema<4.25"
{torch}python3 -m pip install --break-system-packages --no-cache-dir ./kvlab_src || \\
python3 -m pip install --no-cache-dir ./kvlab_src
python3 -m ipykernel install --name python3
"""


def write_autograder(folder: Path, options: list[str], notebooks: list[str]) -> None:
    """setup.sh, run_autograder and a copy of this kvlab: the folder whose contents Gradescope takes as a zip."""
    import kvlab

    if folder.exists():
        shutil.rmtree(folder)
    src = folder / "kvlab_src"
    shutil.copytree(
        Path(kvlab.__file__).parent, src / "kvlab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    root = Path(kvlab.__file__).resolve().parents[1]
    if (root / "pyproject.toml").exists():
        shutil.copy(root / "pyproject.toml", src / "pyproject.toml")
        if (root / "README.md").exists():
            shutil.copy(root / "README.md", src / "README.md")
    torch = ""
    if "14" in notebooks:  # only the paged-attention notebook needs torch; the CPU build is enough
        torch = ("python3 -m pip install --break-system-packages --no-cache-dir torch "
                 "--index-url https://download.pytorch.org/whl/cpu || true\n")  # fmt: skip
    for name, text in (("setup.sh", SETUP_SH.format(torch=torch)),
                       ("run_autograder", RUN_AUTOGRADER.format(options=" ".join(options)))):  # fmt: skip
        (folder / name).write_text(text, encoding="utf-8")
        (folder / name).chmod(0o755)
