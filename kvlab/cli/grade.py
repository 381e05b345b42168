"""``python -m kvlab grade``: grade a class's notebooks in one command (CSV, Markdown, Gradescope).

    python -m kvlab grade submissions.zip --out grades --assignment lab
    python -m kvlab grade alice/ bob/ --out grades --format gradescope
    python -m kvlab grade --instructors-doc docs/instructors.md

SUBMISSIONS are notebooks, folders of notebooks, or zips as learning platforms
download them; the student id comes from the names (docs/instructors.md says
how). Each notebook is graded by ``kvlab.exercises.grading.grade_notebook``,
``--jobs`` at a time, outside the students' kernels. Writes ``grades.csv``,
``feedback/STUDENT.md``, ``summary.md`` and ``summary.csv`` to ``--out``;
with ``--format gradescope`` also ``gradescope/STUDENT/results.json`` and a
ready ``autograder/`` folder. Bad arguments or an unsafe zip exit with status
2 and one line on stderr; a graded run exits 0 whatever the grades.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import shutil
import stat
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvlab.errors import InvalidArgumentError, KvlabError, brief
from kvlab.exercises import exercises
from kvlab.exercises.grading import Limits, Row, grade_notebook, missing_notebook
from kvlab.exercises.instructors import assignment, render
from kvlab.exercises.reports import (
    feedback_markdown,
    gradescope_results,
    write_autograder,
    write_csv,
    write_summary,
)

ZIP_MAX_ENTRIES = 10_000
ZIP_MAX_BYTES = 2**30  # unpacked, all entries together
ZIP_MAX_NOTEBOOK = 20 * 2**20
ZIP_MAX_DEPTH = 32  # folders in one entry's path: a platform's zip has two or three
AUTOGRADER_ROOT_ENV = "KVLAB_AUTOGRADER_ROOT"  # /autograder on Gradescope; a temporary folder in tests
_NOTEBOOK_NAME = re.compile(r"(?:^|[_\-\s.])?(\d\d_[a-z0-9_]+)$")


@dataclass(frozen=True)
class Submission:
    """One notebook of one student."""

    student: str
    path: Path


# ---------------------------------------------------------------- collecting submissions


def student_id(text: str) -> str:
    """A student id safe as a file name: letters, digits, ``.``, ``_``, ``-``; others become ``_``."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text.strip()).strip("._")
    return cleaned or "student"


def _course_slugs() -> list[str]:
    from kvlab.lessons.course import COURSE

    return sorted((nb.slug for nb in COURSE), key=len, reverse=True)


def student_of(path: Path) -> str:
    """The student of a notebook handed in on its own: its name before the notebook's, else its folder."""
    stem = path.stem
    for slug in _course_slugs():
        if stem.lower().endswith(slug):
            stem = stem[: -len(slug)]
            break
    stem = stem.rstrip("_- .")
    return student_id(stem) if stem else student_id(path.parent.name or "student")


def collect(paths: Sequence[str | Path], scratch: Path) -> list[Submission]:
    """Every notebook under ``paths`` with its student; zips are read safely into ``scratch``."""
    found: list[Submission] = []
    for i, raw in enumerate(paths):
        path = Path(raw)
        if path.is_symlink():
            raise InvalidArgumentError(f"{path} is a symbolic link; give the file or folder itself")
        if not path.exists():
            raise InvalidArgumentError(f"{path} does not exist")
        if path.is_file() and path.suffix.lower() == ".zip":
            found += _from_folder(unzip(path, scratch / f"zip{i}"), top=True)
        elif path.is_dir():
            found += _from_folder(path, top=True)
        elif path.suffix.lower() == ".ipynb":
            found.append(Submission(student_of(path.resolve()), path))
        else:
            raise InvalidArgumentError(f"{path} is not a notebook (.ipynb), a folder or a .zip")
    return found


def _from_folder(folder: Path, *, top: bool) -> list[Submission]:
    """Notebooks at the top are one student each (by name); each subfolder is one student (its name)."""
    out: list[Submission] = []
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() or entry.name.startswith((".", "__MACOSX")):
            continue  # never followed: a link could point anywhere
        if entry.is_dir() and top:
            out += [Submission(student_id(entry.name), p) for p in _notebooks_under(entry)]
        elif entry.is_file() and entry.suffix.lower() == ".ipynb":
            out.append(Submission(student_of(entry), entry))
    return out


def _notebooks_under(folder: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__MACOSX")))
        for name in sorted(files):
            p = Path(root, name)
            if name.lower().endswith(".ipynb") and not p.is_symlink() and not name.startswith("."):
                found.append(p)
    return found


def unzip(path: Path, into: Path) -> Path:
    """Unpack only the notebooks of ``path`` into ``into``; refuse the whole zip if any entry is unsafe."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InvalidArgumentError(f"{path} is not a readable zip ({exc})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > ZIP_MAX_ENTRIES:
            raise InvalidArgumentError(
                f"{path} has {len(infos):,} entries; at most {ZIP_MAX_ENTRIES:,} are read"
            )
        total = 0
        for info in infos:
            name = info.filename
            parts = Path(name.replace("\\", "/")).parts
            if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
                raise InvalidArgumentError(f"{path}: entry {name!r} points outside the zip; refusing it all")
            if len(parts) > ZIP_MAX_DEPTH or any(len(p.encode()) > 255 for p in parts):
                raise InvalidArgumentError(
                    f"{path}: entry {brief(name, 80)} is nested more than {ZIP_MAX_DEPTH} folders deep or has "
                    "a name over 255 bytes; refusing it all"
                )
            if stat.S_ISLNK(info.external_attr >> 16):
                raise InvalidArgumentError(f"{path}: entry {name!r} is a symbolic link; refusing it all")
            total += info.file_size
            if total > ZIP_MAX_BYTES:
                raise InvalidArgumentError(
                    f"{path} unpacks to more than {ZIP_MAX_BYTES // 2**30} GiB; refusing it"
                )
        into.mkdir(parents=True)
        for info in infos:
            parts = Path(info.filename.replace("\\", "/")).parts
            if info.is_dir() or not parts or not parts[-1].lower().endswith(".ipynb"):
                continue
            if info.file_size > ZIP_MAX_NOTEBOOK or any(p.startswith((".", "__MACOSX")) for p in parts):
                continue
            target = into.joinpath(*parts)
            if into.resolve() not in target.resolve().parents:  # belt and braces after the checks above
                raise InvalidArgumentError(f"{path}: entry {info.filename!r} points outside the zip")
            try:  # a damaged, encrypted or oddly compressed entry, or a file where a folder should be
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (
                zipfile.BadZipFile,
                NotImplementedError,
                RuntimeError,
                EOFError,
                OSError,
                zlib.error,
            ) as exc:
                raise InvalidArgumentError(
                    f"{path}: entry {brief(info.filename, 80)} cannot be unpacked ({brief(str(exc), 120)}); "
                    "refusing it all"
                ) from None
    # a zip holding one folder (as some platforms make it) is that folder
    entries = [e for e in into.iterdir() if not e.name.startswith(".")]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and _has_subfolders(entries[0]) else into


def _has_subfolders(folder: Path) -> bool:
    return any(e.is_dir() for e in folder.iterdir())


# ---------------------------------------------------------------- grading


def notebooks_of(spec: str | None, submitted: list[str]) -> list[str]:
    """The notebooks every student is graded on: an assignment set, a list like "01,02", or what was handed in."""
    if spec is None:
        return sorted(set(submitted))
    chosen = assignment(spec)
    if chosen is not None:
        return [n for n in chosen.notebooks if exercises(n)]
    numbers = [s.strip().zfill(2) for s in spec.split(",") if s.strip()]
    bad = [n for n in numbers if not exercises(n)]
    if not numbers or bad:
        raise InvalidArgumentError(
            f"--assignment takes lab, module, course or notebook numbers like 01,02; no exercises in {bad or spec!r}"
        )
    return sorted(set(numbers))


def grade_all(
    submissions: list[Submission], limits: Limits, jobs: int, rng_seed: int, wanted: list[str] | None
) -> list[Row]:
    """Rows for every submission, ``jobs`` notebooks at a time, plus rows for notebooks not handed in."""

    def one(sub: Submission) -> list[Row]:
        return grade_notebook(sub.student, sub.path, limits=limits, rng=random.Random(rng_seed))

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="grade") as pool:
        results = list(pool.map(one, submissions))
    best: dict[tuple[str, str], list[Row]] = {}
    keep: list[Row] = []
    for sub, group in zip(submissions, results, strict=True):
        number = next((r.notebook for r in group if r.notebook), "")
        if not number:  # a file that is none of the notebooks: its one row says so
            keep += group
            continue
        key = (sub.student, number)  # the same notebook handed in twice: the better one counts
        if key not in best or sum(r.points for r in group) > sum(r.points for r in best[key]):
            best[key] = group
    numbers = wanted if wanted is not None else sorted({n for _, n in best})
    keep += [r for (_, n), group in best.items() if n in numbers for r in group]
    for student in sorted({s.student for s in submissions}):
        keep += [r for n in numbers if (student, n) not in best for r in missing_notebook(student, n)]
    order = {e.id: i for i, e in enumerate(exercises())}
    return sorted(keep, key=lambda r: (r.student, order.get(r.exercise, -1), r.title))


# ---------------------------------------------------------------- the command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab grade", description=__doc__.split("\n\n")[0])
    p.add_argument("submissions", nargs="*", help="notebooks, folders of notebooks, or zips")
    p.add_argument("--out", type=Path, help="folder for grades.csv, feedback/, summary.md (created)")
    p.add_argument(
        "--assignment",
        help="lab, module, course, or notebook numbers like 01,02 (default: what was handed in)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook (default 300)")
    p.add_argument(
        "--cell-timeout",
        type=float,
        default=60.0,
        help="seconds per cell before it is interrupted (default 60)",
    )
    p.add_argument(
        "--function-timeout",
        type=float,
        default=20.0,
        help="seconds for all calls of one submitted function (default 20)",
    )
    p.add_argument(
        "--memory",
        type=int,
        default=2048,
        help="MiB of address space per notebook and per function (default 2048)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="notebooks at once (default: the number of cores)",
    )
    p.add_argument(
        "--format",
        choices=("csv", "gradescope"),
        default="csv",
        help="gradescope: also results.json and autograder/",
    )
    p.add_argument("--seed", type=int, help="seed of the hidden cases (default: fresh for this run)")
    p.add_argument(
        "--results-json",
        type=Path,
        help="grade all SUBMISSIONS as one student's and write its results.json here (run_autograder)",
    )
    p.add_argument("--instructors-doc", nargs="?", const="-", metavar="PATH",
                   help="write docs/instructors.md to PATH (or print it) and exit")  # fmt: skip
    return p  # fmt: skip


def _check_args(args: argparse.Namespace) -> Limits:
    for name, low, high in (
        ("timeout", 1, 86_400),
        ("cell_timeout", 1, 86_400),
        ("function_timeout", 1, 3_600),
    ):
        value = getattr(args, name)
        if not low <= value <= high:
            raise InvalidArgumentError(
                f"--{name.replace('_', '-')} must be from {low} to {high} seconds, got {value:g}"
            )
    if not 256 <= args.memory <= 1_048_576:
        raise InvalidArgumentError(f"--memory must be from 256 to 1048576 MiB, got {args.memory}")
    if not 1 <= args.jobs <= 256:
        raise InvalidArgumentError(f"--jobs must be from 1 to 256, got {args.jobs}")
    if args.out is None:
        raise InvalidArgumentError("--out DIR is required: the folder for grades.csv and the feedback")
    if args.out.exists() and not args.out.is_dir():
        raise InvalidArgumentError(f"--out {args.out} is a file; give a folder (it is created if missing)")
    if not args.submissions and args.format != "gradescope":
        raise InvalidArgumentError(
            "give SUBMISSIONS: notebooks, folders or zips (or --format gradescope to make the autograder only)"
        )
    return Limits(args.timeout, args.cell_timeout, args.function_timeout, args.memory)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.instructors_doc is not None:
            text = render()
            if args.instructors_doc == "-":
                sys.stdout.write(text)
            else:
                Path(args.instructors_doc).write_text(text, encoding="utf-8")
            return 0
        limits = _check_args(args)
        return _grade(args, limits)
    except KvlabError as exc:
        print(f"kvlab grade: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder that cannot be made, a file where a folder should be, a full disk
        where = f" {exc.filename}" if exc.filename else ""
        print(f"kvlab grade: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _grade(args: argparse.Namespace, limits: Limits) -> int:
    start = time.perf_counter()
    seed = args.seed if args.seed is not None else secrets.randbits(48)
    out: Path = args.out
    with tempfile.TemporaryDirectory(prefix="kvlab-submissions-") as scratch:
        submissions = collect(args.submissions, Path(scratch))
        if args.submissions and not submissions:
            raise InvalidArgumentError(f"no notebooks (.ipynb) found in {', '.join(args.submissions)}")
        if args.results_json is not None:  # Gradescope: everything uploaded is one student's
            submissions = [Submission("submission", s.path) for s in submissions]
        wanted = notebooks_of(args.assignment, []) if args.assignment else None
        out.mkdir(parents=True, exist_ok=True)
        rows = grade_all(submissions, limits, args.jobs, seed, wanted) if submissions else []
    seconds = time.perf_counter() - start
    write_csv(rows, out / "grades.csv")
    (out / "feedback").mkdir(exist_ok=True)
    students = sorted({r.student for r in rows})
    for student in students:
        mine = [r for r in rows if r.student == student]
        (out / "feedback" / f"{student}.md").write_text(feedback_markdown(student, mine), encoding="utf-8")
    write_summary(rows, out, seed)
    if args.format == "gradescope":
        for student in students:
            folder = out / "gradescope" / student
            folder.mkdir(parents=True, exist_ok=True)
            result = gradescope_results([r for r in rows if r.student == student], seconds)
            (folder / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
        if args.results_json is not None:
            mine = gradescope_results(rows, seconds)
            args.results_json.parent.mkdir(parents=True, exist_ok=True)
            args.results_json.write_text(json.dumps(mine, indent=1), encoding="utf-8")
        options = [f"--timeout {args.timeout:g}", f"--cell-timeout {args.cell_timeout:g}",
                   f"--function-timeout {args.function_timeout:g}", f"--memory {args.memory}", "--jobs 1"]  # fmt: skip
        numbers = wanted or sorted({r.notebook for r in rows if r.notebook})
        if numbers:
            options.append(f"--assignment {','.join(numbers)}")
        if args.results_json is None:  # inside Gradescope there is no autograder to make
            write_autograder(out / "autograder", options, numbers)
    total = sum(r.points for r in rows)
    print(f"graded {len(submissions)} notebooks of {len(students)} students in {seconds:.1f} s "
          f"({total} points given); wrote {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
