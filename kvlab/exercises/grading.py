"""Grade one submitted notebook outside the student's kernel.

``grade_notebook`` does three things, none of which trusts the student's kernel
with a verdict:

1. ``prepare``: the submission's outputs are dropped, and after each value
   exercise's cell a grader cell is added that sends the answer out as
   ``plain`` JSON (``emit``: exact built-in types, no student method called).
2. ``notebook_worker.py``: a separate worker process, with
   an address-space and CPU limit (``resource.setrlimit``, inherited by the
   kernel it starts), executes that notebook in a fresh kernel (nbclient), a
   cell that runs too long is interrupted and the rest still runs, and every
   exercise cell's error and every grader cell's answer is appended to a JSON
   lines file as it happens, so a kernel that dies or a notebook that runs out
   of time still leaves what came before.
3. Back in the grader, each value answer goes to its exercise's checker here,
   with kvlab's own models; each function answer is re-run from its source in a
   ``SandboxFunction`` against the notebook's cases plus fresh hidden ones.
   A redefined ``check``, edited outputs or a monkeypatched kvlab in the kernel
   reach none of this.

Every registered exercise of the notebook gets one ``Row``, with 0 points and
the reason when its cell is missing, raised, or was never reached.

Kept as one module (about 530 lines): preparing a notebook, running it and grading what came
back share the ``Prepared`` record, the worker's record format and the cell-finding rules (which
cell holds an exercise, whether a reveal came before a prediction).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvlab.exercises.core import NOT_DONE, NOT_YET, RIGHT, Exercise, evaluate, exercises, get
from kvlab.exercises.guard import kill_descendants
from kvlab.exercises.notebook_worker import MIME
from kvlab.exercises.plain import Opaque, decode, describe, encode
from kvlab.exercises.sandbox import SandboxFunction, child_env, without_checks

WORKER = Path(__file__).with_name("notebook_worker.py")  # run as a script: it imports no kvlab package
ERROR, MISSING = "error", "missing"  # statuses of an exercise that could not be checked at all
STATUSES = (RIGHT, NOT_YET, NOT_DONE, ERROR, MISSING)
MAX_NOTEBOOK_BYTES = 20 * 2**20
MAX_RECORDS_BYTES = 64 * 2**20  # the worker's records of one notebook: a few KB; the rest is not read
RECORD_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {  # what notebook_worker.py writes, kind by kind
    "cell": {"id": (str,), "error": (str, type(None))},
    "answer": {"id": (str,), "text": (str,)},
    "died": {},
    "failed": {"reason": (str,)},
    "end": {},
}


@dataclass(frozen=True)
class Limits:
    """How long and how much one notebook may take."""

    timeout: float = 300.0  # seconds for the whole notebook
    cell_timeout: float = 60.0  # seconds for one cell before it is interrupted
    function_seconds: float = 30.0  # all calls of one submitted function together, its start included
    memory_mib: int = 2048  # address space of the kernel and of each function's process


@dataclass(frozen=True)
class Row:
    """One exercise of one student's notebook, as grades.csv has it."""

    student: str
    notebook: str
    exercise: str
    points: int
    max_points: int
    status: str
    feedback: str
    title: str = ""
    answer: str = ""  # a short form of a value answer (for the summary's most common wrong answer)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- in the kernel


def emit(nonce: str, exercise_id: str, read: Any) -> None:
    """Send the answer ``read()`` returns out of the kernel as plain JSON; the grader cells call this."""
    try:
        data: dict[str, Any] = {"value": encode(read())}
    except NameError as exc:
        data = {"missing": str(exc)[:200]}
    except BaseException as exc:  # an answer expression that itself fails
        data = {"missing": f"reading the answer raised {type(exc).__name__}"}
    text = json.dumps({"nonce": nonce, "id": exercise_id, **data}, allow_nan=True)
    from IPython.display import publish_display_data

    publish_display_data({MIME: text, "text/plain": f"[kvlab grader: {exercise_id} read]"})


# ---------------------------------------------------------------- preparing


@dataclass
class Prepared:
    """A notebook ready to run, and what the grader needs to read it back."""

    notebook: str  # "02"
    nb: Any  # the nbformat notebook to execute
    cells: dict[str, int]  # exercise id -> index of its cell in ``nb``
    sources: dict[str, str]  # exercise id -> source of its cell
    context: dict[str, str]  # exercise id -> imports and defs of the cells before it
    nonce: str


def identify(nb: Any, path: Path) -> str | None:
    """The course notebook ("02") a submission is: by its exercise cells, else its file name."""
    found = [_cell_exercise(c) for c in nb.cells]
    numbers = {e.split(".")[0] for e in found if e}
    if len(numbers) == 1:
        return numbers.pop()
    ids = {m for c in nb.cells if c.get("cell_type") == "code" for m in _CHECK_ID.findall(_source(c))}
    numbers = {i.split(".")[0] for i in ids if i in _known()}
    if len(numbers) == 1:
        return numbers.pop()
    m = re.search(r"(?:^|[^0-9])(\d\d)_[a-z]", path.name)
    return m.group(1) if m and exercises(m.group(1)) else None


_CHECK_ID = re.compile(r"""(?:check|predict)\(\s*["'](\d\d\.\d+)["']""")
"""An exercise cell without its metadata, found by its ``check("NN.k", ...)`` or ``predict("NN.k", ...)``."""


def _known() -> set[str]:
    return {e.id for e in exercises()}


def _source(cell: Any) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _cell_exercise(cell: Any) -> str | None:
    meta = cell.get("metadata", {})
    ex = meta.get("kvlab", {}).get("exercise") if isinstance(meta.get("kvlab"), dict) else None
    return ex if isinstance(ex, str) and ex in _known() else None


def prepare(nb: Any, notebook: str, nonce: str) -> Prepared:
    """Outputs dropped, one grader cell after each value exercise's cell (the nonce marks its answers)."""
    import nbformat

    code = [i for i, c in enumerate(nb.cells) if c.get("cell_type") == "code"]
    for i in code:
        nb.cells[i].outputs, nb.cells[i].execution_count = [], None
    wanted = {e.id: e for e in exercises(notebook)}
    located: dict[str, int] = {}
    for i in code:  # the cell marked in its metadata; else the last cell that checks the exercise
        ex = _cell_exercise(nb.cells[i])
        if ex in wanted:
            located[ex] = i
    marked = set(located)
    for i in code:
        for ex in _CHECK_ID.findall(_source(nb.cells[i])):
            if ex in wanted and _cell_exercise(nb.cells[i]) is None and ex not in marked:
                located[ex] = i  # no marked cell: the last cell that checks it
    sources = {ex: _source(nb.cells[i]) for ex, i in located.items()}
    context = {ex: _context(nb, code, i) for ex, i in located.items()}
    cells: list[Any] = []
    index: dict[str, int] = {}
    by_cell = {i: ex for ex, i in located.items()}
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        ex = by_cell.get(i)
        if ex is None:
            continue
        index[ex] = len(cells) - 1
        if wanted[ex].answer_type != "function":
            expr = _answer_expression(sources[ex], ex)
            read = f"__import__('kvlab.exercises.grading', fromlist=['emit']).emit({nonce!r}, {ex!r}, lambda: ({expr}))"
            grader = nbformat.v4.new_code_cell(read, metadata={"kvlab": {"grader": ex}})
            grader.id = f"kvlab-grader-{ex.replace('.', '-')}"
            cells.append(grader)
    nb.cells = cells
    return Prepared(notebook, nb, index, sources, context, nonce)


def _answer_expression(source: str, exercise_id: str) -> str:
    """What the cell hands to ``check(exercise_id, ...)`` or ``predict(...)``: usually the name ``answer``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "answer"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("check", "predict")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == exercise_id
        ):
            text = ast.get_source_segment(source, node.args[1])
            if text and "\n" not in text:
                return text
    return "answer"


def _function_name(source: str, exercise_id: str) -> str | None:
    tree = ast.parse(source)
    expr = _answer_expression(source, exercise_id)
    if expr.isidentifier() and expr != "answer":
        return expr
    defs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return defs[-1] if defs else None


def _context(nb: Any, code: list[int], upto: int) -> str:
    """Imports, defs and classes of the code cells before ``upto``: what a function may rely on."""
    kept: list[str] = []
    for i in code:
        if i >= upto:
            break
        try:
            tree = ast.parse(_source(nb.cells[i]))
        except SyntaxError:  # a cell with IPython magics, or broken: nothing from it
            continue
        keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        kept += [ast.unparse(n) for n in tree.body if isinstance(n, keep)]
    return "\n".join(kept)


# ---------------------------------------------------------------- running


def execute(prepared: Prepared, limits: Limits) -> tuple[list[dict[str, Any]], str | None]:
    """Run the prepared notebook in a worker process; its records, and why it stopped early (or None)."""
    import nbformat

    with tempfile.TemporaryDirectory(prefix="kvlab-grade-") as tmp:
        path, records = Path(tmp, "notebook.ipynb"), Path(tmp, "records.jsonl")
        for ex, i in prepared.cells.items():
            prepared.nb.cells[i].metadata.setdefault("kvlab", {})["exercise_index"] = ex
        nbformat.write(prepared.nb, str(path))
        cmd = [sys.executable, str(WORKER), str(path), str(records),
               str(limits.cell_timeout), str(limits.memory_mib), str(int(limits.timeout) + 5)]  # fmt: skip
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env(),
            cwd=tmp,
            start_new_session=True,
        )
        stopped = None
        try:
            _, err = proc.communicate(timeout=limits.timeout + 30)  # the kernel's start is not the student's
        except subprocess.TimeoutExpired:
            _kill(proc)
            err = b""
            stopped = f"the notebook ran past its time limit of {limits.timeout:g} s"
        entries = read_records(records)
    if stopped is None and not any(e["kind"] == "end" for e in entries):
        stopped = "the notebook's run was stopped (it ran out of memory or CPU time)"
        if err:
            stopped += f": {err.decode(errors='replace').strip().splitlines()[-1][:200]}"
    for e in entries:
        if e["kind"] == "died":
            stopped = "the notebook's kernel stopped (os._exit, a crash, or its memory limit)"
        elif e["kind"] == "failed":
            stopped = f"the notebook could not be run ({e['reason']})"
    return entries, stopped


def read_records(path: Path) -> list[dict[str, Any]]:
    """The worker's records, read at most ``MAX_RECORDS_BYTES`` far; lines that are not records are skipped.

    The kernel runs as the same user as the worker, so a student's cell can find this file and write
    to it: anything but the worker's own well-formed records is dropped here, never trusted or raised.
    """
    if not path.exists():
        return []
    with open(path, "rb") as fh:
        data = fh.read(MAX_RECORDS_BYTES)
    entries = []
    for raw in data.splitlines():
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            continue
        if _is_record(entry):
            entries.append(entry)
    return entries


def _is_record(entry: Any) -> bool:
    if type(entry) is not dict or entry.get("kind") not in RECORD_FIELDS:
        return False
    return all(type(entry.get(name)) in kinds for name, kinds in RECORD_FIELDS[entry["kind"]].items())


def _kill(proc: subprocess.Popen[bytes]) -> None:
    kill_descendants(proc.pid)  # the worker adopted what the notebook started (become_subreaper)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and the kernel it started
    proc.wait()


# ---------------------------------------------------------------- grading


def grade_notebook(
    student: str,
    path: Path,
    *,
    limits: Limits = Limits(),  # noqa: B008 - frozen
    rng: random.Random | None = None,
    notebook: str | None = None,
) -> list[Row]:
    """One row per exercise of the notebook ``path`` is (or ``notebook``), graded outside its kernel."""
    import nbformat

    rng = rng or random.Random()
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"it is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:
        number = notebook or identify_by_name(path)
        reason = f"{path.name} is not a readable notebook ({type(exc).__name__}: {str(exc)[:120]})"
        return _all(student, number, ERROR, reason) if number else [_unknown(student, path, reason)]
    number = notebook or identify(nb, path)
    if number is None:
        return [_unknown(student, path, f"{path.name} is none of the course's notebooks with exercises")]
    prepared = prepare(nb, number, uuid.uuid4().hex)
    needs_kernel = any(get(ex).answer_type != "function" for ex in prepared.cells)
    entries, stopped = execute(prepared, limits) if needs_kernel else ([], None)
    cell_errors = {e["id"]: e["error"] for e in entries if e["kind"] == "cell"}
    answers: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e["kind"] == "answer" and e["id"] not in answers:  # the grader cell's own answer comes first
            try:
                data = json.loads(e["text"])
            except (ValueError, RecursionError):
                continue
            if type(data) is dict and data.get("nonce") == prepared.nonce and data.get("id") == e["id"]:
                answers[e["id"]] = data
    return [
        _grade_one(student, ex, prepared, cell_errors, answers, stopped, limits, rng)
        for ex in exercises(number)
    ]


def identify_by_name(path: Path) -> str | None:
    m = re.search(r"(?:^|[^0-9])(\d\d)_[a-z]", path.name)
    return m.group(1) if m and exercises(m.group(1)) else None


def _unknown(student: str, path: Path, reason: str) -> Row:
    return Row(student, "", "", 0, 0, ERROR, reason, title=path.name)


def _all(student: str, notebook: str, status: str, reason: str) -> list[Row]:
    return [_row(student, ex, status, reason) for ex in exercises(notebook)]


def missing_notebook(student: str, notebook: str) -> list[Row]:
    """The rows of a notebook a student did not hand in."""
    return _all(student, notebook, MISSING, f"no notebook {notebook} was handed in")


def _row(student: str, ex: Exercise, status: str, feedback: str, answer: str = "") -> Row:
    points = ex.points if status == RIGHT else 0
    return Row(student, ex.notebook, ex.id, points, ex.points, status, feedback, ex.title, answer)


def _parsed(source: str) -> ast.Module | None:
    """A code cell's syntax tree; IPython's ``%magic`` and ``!shell`` lines are read as blank lines."""
    for text in (source, re.sub(r"(?m)^[ \t]*[%!].*$", "", source)):
        try:
            return ast.parse(text)
        except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
            continue
    return None


def _id_argument(call: ast.Call) -> str | None:
    """The exercise id a call names: its first argument or ``exercise_id=``, a constant string or an
    f-string without fields (``f"15.1"``); None when it is computed."""
    node = (
        call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "exercise_id"), None)
    )
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _reveal_names(tree: ast.Module, names: set[str]) -> None:
    """Add to ``names`` every name the cell binds to ``reveal``: ``r = reveal``, ``import ... reveal as r``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names if a.name == "reveal"}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}


def _calls_to(tree: ast.Module, names: set[str], attribute: str) -> list[tuple[ast.Call, str | None]]:
    """Each call of one of ``names`` (or of an attribute ``attribute``, ``core.reveal(...)``), with the id it
    names, in source order: calls, never a word in a comment or a string."""
    found = [
        (node, _id_argument(node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in names)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == attribute)
        )
    ]
    return sorted(found, key=lambda pair: (pair[0].lineno, pair[0].col_offset))


def _revealed_before(prepared: Prepared, exercise_id: str) -> bool:
    """Whether a code cell above the prediction's own cell, or its own cell before its ``predict`` call,
    calls ``reveal`` for it (a guess made after seeing the answer).

    The calls are found in each cell's syntax tree: ``reveal``, any name bound to it above, or an
    attribute ``.reveal``, with the id as a constant or an f-string without fields, by position or
    as ``exercise_id=``. A comment or a string that names a reveal is not one.
    """
    mine = prepared.cells[exercise_id]
    names = {"reveal"}
    for index, cell in enumerate(prepared.nb.cells[: mine + 1]):
        if cell.get("cell_type") != "code" or (tree := _parsed(_source(cell))) is None:
            continue
        _reveal_names(tree, names)
        reveals = [c for c, ex in _calls_to(tree, names, "reveal") if ex == exercise_id]
        if index < mine and reveals:
            return True
        if index == mine and reveals:
            predicts = [c for c, ex in _calls_to(tree, {"predict"}, "predict") if ex == exercise_id]
            first = (predicts[0].lineno, predicts[0].col_offset) if predicts else None
            return first is None or (reveals[0].lineno, reveals[0].col_offset) < first
    return False


def _grade_one(
    student: str,
    ex: Exercise,
    prepared: Prepared,
    cell_errors: dict[str, str | None],
    answers: dict[str, dict[str, Any]],
    stopped: str | None,
    limits: Limits,
    rng: random.Random,
) -> Row:
    if ex.id not in prepared.cells:
        call = "predict" if ex.kind == "prediction" else "check"
        return _row(
            student, ex, MISSING, f'no exercise cell for {ex.id} (the cell with {call}("{ex.id}", ...))'
        )
    if ex.answer_type == "function":
        return _grade_function(student, ex, prepared, limits, rng)
    if ex.kind == "prediction" and _revealed_before(prepared, ex.id):
        return _row(
            student,
            ex,
            NOT_YET,
            f"the prediction's cell comes after its reveal: move it above reveal({ex.id!r}, ...)",
        )
    if ex.id not in cell_errors:
        return _row(
            student, ex, ERROR, f"{stopped or 'the notebook stopped'} before this exercise's cell ran"
        )
    if cell_errors[ex.id]:
        error = cell_errors[ex.id]
        if error.startswith("KeyboardInterrupt"):
            error = f"the time limit of {limits.cell_timeout:g} s per cell (it was interrupted)"
        return _row(student, ex, ERROR, f"the exercise cell stopped with {error}")
    data = answers.get(ex.id)
    if data is None or "value" not in data:
        why = data.get("missing") if data else "the answer could not be read after the cell ran"
        return _row(student, ex, MISSING, f"no answer to read: {why}")
    value = decode(data["value"])
    verdict = evaluate(ex, value)
    shown = repr(value)[1:-1] if isinstance(value, Opaque) else describe(value, 80)
    return _row(student, ex, verdict.status, verdict.message, shown if verdict.status == NOT_YET else "")


def _grade_function(
    student: str, ex: Exercise, prepared: Prepared, limits: Limits, rng: random.Random
) -> Row:
    source = prepared.sources[ex.id]
    try:
        body = without_checks(source)
        name = _function_name(source, ex.id)
    except SyntaxError as exc:
        return _row(
            student, ex, ERROR, f"the exercise cell stopped with SyntaxError: {exc.msg} (line {exc.lineno})"
        )
    if name is None:
        return _row(student, ex, MISSING, "the exercise cell defines no function")
    function = SandboxFunction(
        prepared.context[ex.id] + "\n" + body,
        name,
        seconds=limits.function_seconds,
        memory_mib=limits.memory_mib,
    )
    try:
        verdict = evaluate(ex, function, ex.draw_cases(rng))
    finally:
        function.close()
    return _row(student, ex, verdict.status, verdict.message)
