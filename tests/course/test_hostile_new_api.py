"""A hostile round on the newly added public APIs: compare_table, predict/reveal and the grader's
prediction handling, the slot-file and SWA-decision views, the still copies, and the lesson helpers
(attention_demo, ex01-ex12, fleet, capstone).

``test_finding_NN_*`` tests each pin one problem found in this round: they fail until it is fixed
(the docstring names the finding, its severity and what the call should do). ``test_holds_*`` tests
pin the families that were attacked and held. Every test is short: anything that would hang is run
under an alarm, anything that would read without limit is fed a generator that stops past kvlab's
limit, and no test allocates more than a few hundred MB.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile import AlwaysEqual, BadRepr, LyingDict, LyingInt, LyingList, LyingStr, nested_list

from kvlab.errors import LIMITS, InvalidArgumentError, KvlabError, raised_limits
from kvlab.exercises.guard import TimeUp, deadline

# ---------------------------------------------------------------- helpers


class _ReadTooFar(Exception):
    """A generator was read past kvlab's limit: the caller reads user input without a bound."""


def _escaping(calls: dict[str, Callable[[], Any]]) -> dict[str, str]:
    """The calls that end in a plain Python error (name -> its type), not kvlab's error or a result."""
    escaped = {}
    for name, call in calls.items():
        try:
            call()
        except KvlabError:
            continue
        except Exception as exc:  # noqa: BLE001 - the finding
            escaped[name] = type(exc).__name__
    return escaped


def _refused_quickly(call: Callable[[], Any], seconds: float = 2.0) -> None:
    """``call()`` is refused with kvlab's error (or finishes) within ``seconds``: never a hang."""
    try:
        with deadline(seconds):
            call()
    except KvlabError:
        return
    except TimeUp:
        pytest.fail(f"still running after {seconds} s: a size the user controls is not bounded")


def _endless(item: Callable[[], Any], stop_after: int) -> Iterator[Any]:
    """Yields ``item()`` ``stop_after`` times, then raises _ReadTooFar (a stand-in for an endless generator)."""
    for _ in range(stop_after):
        yield item()
    raise _ReadTooFar


def _kvlab_error(call: Callable[[], Any]) -> None:
    with pytest.raises(KvlabError) as info:
        call()
    assert str(info.value), "a refusal must say what was wrong"


@pytest.fixture(autouse=True)
def _no_exercise_log(monkeypatch):
    monkeypatch.delenv("KVLAB_EXERCISE_LOG", raising=False)


# ---------------------------------------------------------------- shared fixtures (cheap, module-wide)


@pytest.fixture(scope="module")
def restore_history():
    from kvlab.lessons.ex11 import save_restore_history

    return save_restore_history()


@pytest.fixture(scope="module")
def swa_lesson():
    from kvlab.lessons import ex12

    return ex12.example_12()


@pytest.fixture(scope="module")
def agent_runs():
    from kvlab.lessons import ex10

    return ex10.two_agents_on_three_servers()


# ================================================================ findings (each fails until fixed)

# ---------------------------------------------------------------- high


def test_finding_01_refusal_lines_reads_outside_its_directory_and_writes_there(tmp_path):
    """FINDING 01 (high): ``ex11.refusal_lines(directory, filename)`` never checks ``filename``:
    ``"../outside.bin"`` or an absolute path reads a file outside ``directory`` and writes modified
    copies of it (flipped.bin, truncated.bin) into ``directory``; ``"/dev/zero"`` reads without end
    (MemoryError, or the machine's memory); a file under 1,001 bytes ends in IndexError; a non-str
    directory in TypeError. It should check the name with ``save_dir.check_filename`` (as
    ``restore_in_new_process`` does), bound the read, and refuse before writing anything."""
    from kvlab.lessons.ex11 import refusal_lines

    directory = tmp_path / "slots"
    directory.mkdir()
    (tmp_path / "outside.bin").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(KvlabError):
        refusal_lines(str(directory), "../outside.bin")
    assert sorted(p.name for p in directory.iterdir()) == [], "a refused call wrote files"
    (directory / "short.bin").write_bytes(b"x" * 10)
    _kvlab_error(lambda: refusal_lines(str(directory), "short.bin"))
    _kvlab_error(lambda: refusal_lines(None, "short.bin"))  # type: ignore[arg-type]


def test_finding_02_compare_table_walks_shared_nesting_without_a_total_bound():
    """FINDING 02 (high): ``compare_table`` bounds each list (LIMITS.count) and the depth (64), never
    the total: ``a = [0, 0]`` doubled 40 times (``a = [a, a]``, a few hundred bytes of user memory)
    is 2**40 leaves, walked and then printed: a hang. It should count every value it reads (as
    ``kvlab.exercises.plain`` does with MAX_ITEMS) and refuse past a limit."""
    from kvlab.lessons.compare import compare_table

    shared: list = [0, 0]
    for _ in range(40):
        shared = [shared, shared]
    _refused_quickly(lambda: compare_table([("x", shared, 1)]))


def test_finding_03_exact_fit_reads_finished_without_a_bound():
    """FINDING 03 (high): ``ex01.exact_fit(sizes, finished, ...)`` does ``list(finished)``: an endless
    generator (``itertools.count()``) fills memory (MemoryError, or the OOM killer), and a list
    subclass whose ``__iter__`` raises ends in RuntimeError. It should read ``finished`` with
    ``check_items`` (at most LIMITS.count items, a failing iteration refused)."""
    from kvlab.lessons import ex01

    with raised_limits(count=1000):
        _kvlab_error(lambda: ex01.exact_fit([10], _endless(lambda: 0, 5000), 5))
    _kvlab_error(lambda: ex01.exact_fit([10], LyingList([0]), 5))


def test_finding_04_shared_prefix_reads_prompts_without_a_bound():
    """FINDING 04 (high): ``ex05.shared_prefix(prompts)`` enumerates ``prompts`` without a bound
    (``itertools.repeat([1, 2, 3])`` never returns) and a LyingList's ``__iter__`` escapes as
    RuntimeError. It should read the prompts with ``check_items``."""
    from kvlab.lessons import ex05

    with raised_limits(count=1000):
        _kvlab_error(lambda: ex05.shared_prefix(_endless(lambda: [1, 2, 3], 5000)))
    _kvlab_error(lambda: ex05.shared_prefix(LyingList([[1, 2]])))


class _EngineBuilt(Exception):
    pass


def test_finding_05_ttft_by_mode_builds_every_engine_before_checking_their_total_memory(monkeypatch):
    """FINDING 05 (high): ``attention_demo.ttft_by_mode(1_000_000)`` (allowed: system_tokens is bounded
    by LIMITS.tokens only) builds (warmup + repeats) x 3 = 18 engines of max_model_len ~1M up front,
    about 1 GB of KV each, with no check of their total: under a 6 GB address limit it ends after
    ~20 s in torch's ``RuntimeError: DefaultCPUAllocator: can't allocate memory``; without one it
    takes the machine's memory, then hours of prefill (4,000 tokens took 26 s). It should refuse,
    before building any engine, when the engines together pass LIMITS.memory_mib."""
    pytest.importorskip("torch")
    from kvlab.lessons import attention_demo

    def no_engine(*args: Any, **kwargs: Any) -> None:
        raise _EngineBuilt(kwargs.get("max_model_len"))

    monkeypatch.setattr(attention_demo, "Engine", no_engine)
    try:
        attention_demo.ttft_by_mode(1_000_000)
    except KvlabError:
        return
    except _EngineBuilt:
        pytest.fail("an engine was built before the run's total memory was checked")


# ---------------------------------------------------------------- medium: the grader's predictions


def _notebook(tmp_path: Path, name: str, sources: list[str], *, marked: bool = True) -> Path:
    """A notebook whose cell holding ``predict("15.1", ...)`` is marked as exercise 15.1 (unless not ``marked``)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    cells = []
    for src in sources:
        if src.startswith("md:"):
            cells.append(new_markdown_cell(src[3:]))
        elif "predict(" in src and marked:
            cells.append(new_code_cell(src, metadata={"kvlab": {"exercise": "15.1"}}))
        else:
            cells.append(new_code_cell(src))
    path = tmp_path / f"{name}_15_fleet.ipynb"
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


@pytest.fixture
def grade_without_kernel(monkeypatch):
    """``grade_notebook`` with the kernel run replaced: 15.1's cell ran cleanly and answered 42.0."""
    from kvlab.exercises import grading

    def execute(prepared: Any, limits: Any) -> tuple[list[dict[str, Any]], None]:
        entries: list[dict[str, Any]] = [{"kind": "end"}]
        if "15.1" in prepared.cells:
            answer = {"nonce": prepared.nonce, "id": "15.1", "value": 42.0}
            entries = [
                {"kind": "cell", "id": "15.1", "error": None},
                {"kind": "answer", "id": "15.1", "text": json.dumps(answer)},
                *entries,
            ]
        return entries, None

    monkeypatch.setattr(grading, "execute", execute)

    def grade(path: Path) -> Any:
        rows = grading.grade_notebook("student", path)
        (row,) = [r for r in rows if r.exercise == "15.1"]
        return row

    return grade


IMPORT = "from kvlab.exercises.core import predict, reveal"
PREDICT = 'answer = 42.0\npredict("15.1", answer)'
REVEAL = 'reveal("15.1", 55.0)'


def test_finding_06_a_comment_or_string_naming_reveal_costs_the_prediction_its_points(
    tmp_path, grade_without_kernel
):
    """FINDING 06 (medium): the grader decides "the prediction's cell comes after its reveal" with a
    regex over the code cells above it, so a comment (``# reveal("15.1", x) comes below``) or a
    string naming the reveal gives a prediction made first 0 points. It should look for calls
    (``ast``), not text."""
    for name, above in (
        ("comment", '# reveal("15.1", x) comes below'),
        ("string", "note = \"run reveal('15.1', ...) only after predicting\""),
    ):
        row = grade_without_kernel(_notebook(tmp_path, name, [IMPORT, above, PREDICT, REVEAL]))
        assert row.status == "right", f"{name} above the prediction: {row.status}: {row.feedback}"


def test_finding_07_a_reveal_the_regex_does_not_spell_is_not_seen(tmp_path, grade_without_kernel):
    """FINDING 07 (medium): a reveal above the prediction that the regex ``\\breveal\\(\\s*["']`` does not
    match earns the prediction full points, although in that very run ``predict`` itself says "not
    yet: kvlab's value is already on screen": ``r = reveal; r("15.1", v)``, ``reveal(f"15.1", v)``,
    ``reveal(exercise_id="15.1", value=v)``, ``reveal ("15.1", v)``. The grader should find every
    call that reveals 15.1 (or read the kernel's own record of whether a reveal came first)."""
    variants = {
        "alias": 'r = reveal\nr("15.1", 55.0)',
        "fstring": 'reveal(f"15.1", 55.0)',
        "keyword": 'reveal(exercise_id="15.1", value=55.0)',
        "space": 'reveal ("15.1", 55.0)',
    }
    graded = {
        name: grade_without_kernel(_notebook(tmp_path, name, [IMPORT, cell, PREDICT])).status
        for name, cell in variants.items()
    }
    assert all(status != "right" for status in graded.values()), graded


def test_finding_08_a_prediction_cell_without_its_metadata_is_missing(tmp_path, grade_without_kernel):
    """FINDING 08 (medium): without the cell's ``kvlab.exercise`` metadata (a cell retyped, or copied
    into a fresh notebook), the grader finds exercise cells only by ``check("NN.k"``: a
    ``predict("15.1", answer)`` cell is "missing", and the feedback asks for ``check("15.1", ...)``.
    The grader should find ``predict(`` cells as it finds ``check(`` cells."""
    row = grade_without_kernel(_notebook(tmp_path, "bare", [IMPORT, PREDICT, REVEAL], marked=False))
    assert row.status == "right", f"{row.status}: {row.feedback}"


# ---------------------------------------------------------------- medium: Python's errors where kvlab's belong


HUGE = 10**5000  # past Python's 4,300-digit limit of int -> str


def _huge_int_calls(swa_lesson: Any) -> dict[str, Callable[[], Any]]:
    from kvlab.lessons import capstone, ex08, ex12
    from kvlab.lessons.compare import compare_table
    from kvlab.views.swa import swa_decision_figure

    history = swa_lesson.slots["default"].history
    return {
        "compare_table value": lambda: compare_table([("x", HUGE, 1)]),
        "compare_table dict key": lambda: compare_table([("x", {HUGE: 1}, 1)]),
        "swa_decision_figure request": lambda: swa_decision_figure(history, HUGE),
        "ex12.state_before request": lambda: ex12.state_before(swa_lesson.slots["default"], HUGE),
        "ex12.branch_after_long_prompt shared": lambda: ex12.branch_after_long_prompt(HUGE),
        "capstone.naive_layout turn": lambda: capstone.naive_layout(capstone.agent_session(calls=2), HUGE),
        "ex08.printed_nodes t=": lambda: ex08.printed_nodes("[1] t=" + "9" * 5000),
    }


def test_finding_09_a_huge_integer_reaches_an_f_string(swa_lesson, capsys):
    """FINDING 09 (medium): a 5,000-digit integer passes the checks (no maximum) and then reaches an
    f-string or ``int()``, which raise Python's ValueError ("Exceeds the limit (4300 digits) for
    integer string conversion") instead of kvlab's error. Messages should show such values with
    ``brief`` (which describes them), and text read as a number should go through ``check_int_text``."""
    escaped = _escaping(_huge_int_calls(swa_lesson))
    capsys.readouterr()
    assert not escaped, escaped


def test_finding_10_printed_nodes_reads_any_script_s_digits():
    """FINDING 10 (medium): ``ex08.printed_nodes`` tests ``time.isdigit()`` and converts with ``int()``:
    ``"[1] t=²"`` (a superscript two: isdigit, but no int) ends in ValueError, and ``"[1] t=١٢"``
    (Arabic-Indic digits) is read as 12. kvlab reads numbers only as it prints them (``check_int_text``)."""
    from kvlab.lessons import ex08

    _kvlab_error(lambda: ex08.printed_nodes("[1] t=²"))
    _kvlab_error(lambda: ex08.printed_nodes("[1] t=١٢"))


def test_finding_11_compare_table_prints_half_a_table_then_fails_on_a_lone_surrogate(capsys):
    """FINDING 11 (medium): ``check_text`` lets a lone surrogate (``"\\ud800"``) through, so
    ``compare_table`` prints the title and the head, then ``print`` raises UnicodeEncodeError on
    the row: a refusal that printed half a table, and Python's error. Text that cannot be encoded
    should be refused before anything is printed."""
    from kvlab.lessons.compare import compare_table

    with pytest.raises(KvlabError):
        compare_table([("x\ud800", 1, 1)], "a title")
    assert "a title" not in capsys.readouterr().out, "a refused table printed its title"


def test_finding_12_slot_file_animation_draws_any_number_of_frames(restore_history):
    """FINDING 12 (medium): ``slot_file_animation`` (like every animation over a history) accepts up to
    LIMITS.count (1,048,576) steps and builds a frame for each: ``[state] * 20_000`` took 120 s, a
    million steps would take hours and gigabytes. The number of frames should be bounded (and the
    refusal say to pass fewer steps, or raise the limit)."""
    from kvlab.views.slot_files import slot_file_animation

    state = restore_history.steps[-1].state
    _refused_quickly(lambda: slot_file_animation([state] * 200_000))


def test_finding_13_reveal_of_a_huge_integer_escapes_as_overflow():
    """FINDING 13 (medium): ``reveal("15.1", 10**400)`` raises OverflowError (``_as_number``'s
    ``float(a)`` is not caught), where a value of the wrong kind is refused with InvalidArgumentError;
    and ``predict("15.1", 10**4000)`` answers "could not be checked (OverflowError: ...)" rather
    than saying the number is out of range. A refused reveal must also leave 15.1 unrevealed."""
    from kvlab.exercises import core, reveal

    core._revealed.discard("15.1")
    with pytest.raises(InvalidArgumentError):
        reveal("15.1", 10**400)
    assert "15.1" not in core._revealed


def _unvalidated_calls(agent_runs: Any) -> dict[str, Callable[[], Any]]:
    from kvlab.lessons import capstone, ex09, ex10, ex12, fleet
    from kvlab.server.slots import SlotServer

    a = agent_runs["-np 1"]
    server = SlotServer(1, cache_ram_mib=0)
    ex10.take_turns(server)
    session = capstone.agent_session(calls=2)
    calls: dict[str, Callable[[], Any]] = {
        "ex09.turn_table(None)": lambda: ex09.turn_table(None),
        "fleet.format_table(None)": lambda: fleet.format_table(None),
        "fleet.lesson_row(None)": lambda: fleet.lesson_row(None),
        "fleet.engine_probe_lines({'a': 1})": lambda: fleet.engine_probe_lines({"a": 1}),
        "fleet.turn_lines(LyingList)": lambda: fleet.turn_lines(LyingList([1])),
        "fleet.rate_lines({BadRepr(): 1})": lambda: fleet.rate_lines({BadRepr(): 1}),
        "ex10.agent_lines([1])": lambda: ex10.agent_lines([1]),
        "ex10.same_counters_from(iter, iter)": lambda: ex10.same_counters_from(iter(a), iter(a)),
        "ex10.compare_runs([1], [2])": lambda: ex10.compare_runs([1], [2], "a", "b"),
        "ex10.where_matches_stop(server, None)": lambda: ex10.where_matches_stop(server, None),
        "ex10.arithmetic_report(LyingList)": lambda: ex10.arithmetic_report(LyingList([1])),
        "capstone.naive_layout(None, 1)": lambda: capstone.naive_layout(None, 1),
        "capstone.append_only_layout(s, 'a')": lambda: capstone.append_only_layout(session, "a"),
        "capstone.information_kept(None, layout)": lambda: capstone.information_kept(
            None, capstone.append_only_layout
        ),
        "ex12.show_chat((1, 2, slot))": lambda: ex12.show_chat((1, 2, ex12.branch_after_long_prompt(300))),
    }
    if "torch" in sys.modules or _has_torch():
        from kvlab.lessons import attention_demo as ad

        calls |= {
            "attention_demo.ttft_lines(None)": lambda: ad.ttft_lines(None),
            "attention_demo.cold_turns_line(None)": lambda: ad.cold_turns_line(None),
            "attention_demo.least_speedup(None)": lambda: ad.least_speedup(None),
            "attention_demo.goal_line(None, None, 'x')": lambda: ad.goal_line(None, None, "x"),
            "attention_demo.dense_attention(None, None, None)": lambda: ad.dense_attention(None, None, None),
            "attention_demo.error_table(generator, ...)": lambda: ad.error_table(iter([4]), ["torch"]),
            "attention_demo.paged_batch(dtype='float32')": lambda: ad.paged_batch([4], 4, dtype="float32"),
        }
    return calls


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_finding_14_new_lesson_helpers_do_not_check_their_arguments(agent_runs, capsys):
    """FINDING 14 (medium): printing and row helpers added with the notebooks read their arguments'
    attributes and items unchecked, so a wrong argument ends in AttributeError, TypeError,
    KeyError, IndexError or the argument's own RuntimeError (each listed call below). Each should
    check its argument's type (as ``fleet._check_result`` and ``ex12._check_example`` do) and read
    containers with ``check_items`` / ``read_pairs``."""
    escaped = _escaping(_unvalidated_calls(agent_runs))
    capsys.readouterr()
    assert not escaped, escaped


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str refused")


class _HashRaisingStr(str):
    def __hash__(self) -> int:
        raise RuntimeError("hash refused")


def test_finding_15_an_id_or_an_error_whose_repr_raises_escapes(capsys):
    """FINDING 15 (medium): error messages built from a user's object with ``{x!r}`` or ``{exc}``
    raise that object's error instead: ``predict(BadRepr(), 1)`` and ``check(BadRepr(), 1)``
    (``core.get`` formats the id with !r), ``predict(<str subclass whose __hash__ raises>, 1)``
    (the registry lookup hashes the subclass), ``capstone.route_fleet`` with a router that raises
    an exception whose ``__str__`` raises. Use ``brief`` and look ids up by their plain text."""
    from kvlab.exercises import check, predict
    from kvlab.lessons import capstone

    def bad_router(request: Any, replicas: Any) -> int:
        raise _StrRaises

    calls = {
        "predict(BadRepr())": lambda: predict(BadRepr(), 1),
        "check(BadRepr())": lambda: check(BadRepr(), 1),
        "predict(hash-raising str)": lambda: predict(_HashRaisingStr("15.1"), 1),
        "predict(LyingStr)": lambda: predict(LyingStr("15.1"), 1),
        "route_fleet(router raising)": lambda: capstone.route_fleet(bad_router, users=2, turns=1),
    }
    escaped = _escaping(calls)
    capsys.readouterr()
    assert not escaped, escaped


# ---------------------------------------------------------------- low


def test_finding_16_unknown_exercise_error_is_not_an_invalid_argument_error():
    """FINDING 16 (low): the bar is "kvlab.errors.InvalidArgumentError or a subclass"; ``predict``,
    ``reveal``, ``check`` and ``get`` refuse an unknown or non-str id with ``UnknownExerciseError``,
    a KvlabError and LookupError but not an InvalidArgumentError."""
    from kvlab.exercises import UnknownExerciseError

    assert issubclass(UnknownExerciseError, InvalidArgumentError)


def test_finding_17_a_hand_built_save_restore_state_crashes_the_view(restore_history):
    """FINDING 17 (low): ``SaveRestoreState`` is a public dataclass, checked by ``isinstance`` only, so
    a hand-built one with wrong fields ends in TypeError (``prefix_tokens="x"``, ``file_tokens=5``),
    OverflowError (``prefix_tokens=10**400``) or AttributeError (``first=object()``) inside
    ``slot_file_spec``/``slot_file_animation``. (The older views share the pattern: a
    ``BlockPoolState`` with ``blocks=3`` ends in TypeError in ``block_pool_spec``.) The view should
    check the fields it draws."""
    from kvlab.views.slot_files import slot_file_spec

    state = restore_history.steps[-1].state
    for fields in (
        {"prefix_tokens": "x"},
        {"prefix_tokens": 10**400},
        {"file_tokens": 5},
        {"first": object()},
    ):
        _kvlab_error(lambda f=fields: slot_file_spec(dataclasses.replace(state, **f)))


def test_finding_18_swa_decision_figure_trusts_a_forged_reuse_event(swa_lesson):
    """FINDING 18 (low): ``swa_decision_figure`` reads ``event["common_prefix"]`` and the other fields
    of a ``swa.reuse`` event unchecked: a History built with ``History.add`` and an event without
    them ends in KeyError, one with a string ``common_prefix`` in TypeError (and a reuse event at
    step 0 silently reads ``steps[-1]`` as the state before it)."""
    from kvlab.core.snapshots import Event, History
    from kvlab.views.swa import swa_decision_figure

    state = swa_lesson.slots["default"].history.steps[0].state
    empty = History()
    empty.add("start", state)
    empty.add(Event.of("swa.reuse"), state)
    _kvlab_error(lambda: swa_decision_figure(empty, 1))
    wrong = History()
    wrong.add("start", state)
    wrong.add(Event.of("swa.reuse", common_prefix="a", threshold=None, forced_full=False, cache_n=1), state)
    _kvlab_error(lambda: swa_decision_figure(wrong, 1))


def test_finding_19_compare_table_messages_and_the_kvlab_column():
    """FINDING 19 (low): two refusals say their shape twice ("a row must be rows must be a non-empty
    list ...", "not_reproduced must be not_reproduced must be ..."), and ``against="kvlab"`` is
    accepted (a table with two "kvlab" columns) where ``sources=("kvlab",)`` is refused."""
    from kvlab.lessons.compare import compare_table

    with pytest.raises(InvalidArgumentError) as row:
        compare_table([LyingList(["x", 1, 1])])
    assert "must be rows must be" not in str(row.value)
    with pytest.raises(InvalidArgumentError) as pairs:
        compare_table([("x", 1, 1)], not_reproduced="ab")
    assert "must be not_reproduced must be" not in str(pairs.value)
    with pytest.raises(InvalidArgumentError):
        compare_table([("x", 1, 1)], against="kvlab")


def test_finding_20_a_prediction_within_a_huge_integer_breaks_its_reveal(capsys):
    """FINDING 20 (low): ``_check_prediction`` accepts ``within=10**400`` (``0 <= 10**400 < inf``), and
    the reveal then formats it with ``:g``: OverflowError. (``Prediction`` itself checks nothing:
    ``Prediction(reread=None, within="x")`` is built; only ``exercise()`` looks.) ``within`` should
    be a finite float-convertible number."""
    from kvlab.exercises.core import _REGISTRY, Prediction, exercise

    try:
        with pytest.raises(InvalidArgumentError):
            exercise(
                "99.1", title="t", assesses="a", minutes=1, answer_type="number", hints=["h"], points=1,
                difficulty="core", predicts=Prediction(reread="r", within=10**400),
            )(lambda answer: None)  # fmt: skip
    finally:
        _REGISTRY.pop("99.1", None)


def test_finding_21_the_still_copys_budget_reads_only_the_last_step():
    """FINDING 21 (low): ``Stepper.still_figures`` estimates the animation's size as
    ``steps x len(last step's JSON)``: a history whose earlier steps are larger than its last (a
    view that draws less at the end) gets a still copy far past STILL_BYTES (200 steps: 21.8 MB
    against 400 KB). The budget should be measured on the frames it keeps."""
    from kvlab.core.snapshots import History
    from kvlab.views.live import STILL_BYTES, Stepper

    history: History = History()
    for i in range(30):
        history.add(f"step {i}", i)

    def shrinking(state: int, previous: Any) -> dict:
        n = 20_000 if state < 29 else 1
        return {"data": [{"type": "scatter", "x": list(range(n))}], "layout": {}}

    page = Stepper(history, [shrinking]).still_html()
    assert len(page) < 2 * STILL_BYTES, f"{len(page):,} bytes"


# ================================================================ families that held


def test_holds_compare_table_refuses_hostile_figures_with_kvlab_errors(capsys):
    """Deep nesting, sets, bytes, numpy text/object/complex, None, a list whose iteration raises,
    wrong sources: refused with kvlab's error; a lying str subclass compares by its plain text, a
    lying dict subclass is read through dict's own methods, rows may be a generator."""
    import numpy as np

    from kvlab.lessons.compare import compare_table

    for value in (
        nested_list(100_000), {1}, b"a", np.array(["a"]), np.array([object()]), np.complex128(1), None,
        LyingList([1]), AlwaysEqual(),
    ):  # fmt: skip
        _kvlab_error(lambda v=value: compare_table([("x", v, 1)]))
    _kvlab_error(lambda: compare_table([("x", 1, 1)], sources="lesson"))
    _kvlab_error(lambda: compare_table([("x", 1, 1)], sources=("a",), against="b"))
    _kvlab_error(lambda: compare_table(None))  # type: ignore[arg-type]
    capsys.readouterr()

    class Liar(str):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    compare_table([("liar", Liar("a"), "b")])
    assert "✗" in capsys.readouterr().out
    compare_table(row for row in [("lying dict", LyingDict({"a": 1}), {"a": 1})])
    assert "✓" in capsys.readouterr().out


def test_holds_still_copies_never_break_out_of_their_script():
    """A title, a trace name and a caption holding ``</script>`` and ``<!--<script>`` stay inside the
    still copy's one script: plotly's JSON escapes ``<``, ``>`` and ``/``, the note is escaped."""
    import plotly.graph_objects as go

    from kvlab.core.snapshots import History
    from kvlab.views.live import Stepper

    evil = "</script><script>alert(1)</script><!--<script>"
    history: History = History()
    for i in range(3):
        history.add(evil + str(i), i)

    def view(state: int, previous: Any) -> go.Figure:
        return go.Figure(layout={"title": {"text": evil}}, data=[{"type": "bar", "x": [state], "name": evil}])

    page = Stepper(history, [view])._repr_mimebundle_()["text/html"]
    assert page.count("<script") == page.count("</script>") == 1
    assert "<script>alert" not in page and evil not in page


def test_holds_predict_never_raises_for_an_answer_and_a_refused_reveal_reveals_nothing(capsys):
    """nan, inf, 10**5000, a lying int, an object whose repr raises, an endless generator, deep
    nesting, a lying str: ``predict`` returns a result (never raises), "right" only for a plain
    number in range; a ``reveal`` that is refused leaves the exercise unrevealed."""
    import itertools

    from kvlab.exercises import core, predict, reveal

    core._revealed.discard("15.1")
    answers = (float("nan"), float("inf"), 10**5000, BadRepr(), itertools.count(), nested_list(100_000),
               LyingStr("50"), "50", True, 150)  # fmt: skip
    for answer in answers:
        assert predict("15.1", answer).status != "right"
    assert predict("15.1", LyingInt(50)).status == "right"
    for value in ("x", float("nan"), BadRepr(), 10**5000):
        with pytest.raises(InvalidArgumentError):
            reveal("15.1", value)
        assert "15.1" not in core._revealed
    core._predictions.pop("15.1", None)
    capsys.readouterr()


def test_holds_the_grader_orders_a_prediction_and_its_reveal(tmp_path, grade_without_kernel):
    """A prediction above its reveal earns its points; one below a plain reveal gets "not yet"; a
    reveal written in a markdown cell above is not a reveal."""
    assert grade_without_kernel(_notebook(tmp_path, "ordered", [IMPORT, PREDICT, REVEAL])).status == "right"
    assert grade_without_kernel(_notebook(tmp_path, "after", [IMPORT, REVEAL, PREDICT])).status == "not yet"
    markdown = _notebook(tmp_path, "markdown", [IMPORT, "md:" + REVEAL, PREDICT, REVEAL])
    assert grade_without_kernel(markdown).status == "right"


def test_holds_slot_file_and_swa_views_refuse_wrong_arguments(restore_history, swa_lesson):
    from kvlab.views.slot_files import slot_file_animation, slot_file_spec, slot_file_stepper
    from kvlab.views.swa import swa_decision_figure

    state = restore_history.steps[-1].state
    _kvlab_error(lambda: slot_file_animation(restore_history, frame_ms=10**400))
    _kvlab_error(lambda: slot_file_animation(restore_history, title=BadRepr()))
    _kvlab_error(lambda: slot_file_animation([]))
    _kvlab_error(lambda: slot_file_animation(iter([state])))
    _kvlab_error(lambda: slot_file_stepper(restore_history, interval_ms=float("nan")))
    _kvlab_error(lambda: slot_file_spec(state, previous=3))
    history = swa_lesson.slots["default"].history
    for request in (0, 1, 10**400, "2", 2.0):
        _kvlab_error(lambda r=request: swa_decision_figure(history, r))
    _kvlab_error(lambda: swa_decision_figure(list(history.steps), 2))
    assert swa_decision_figure(history, LyingInt(2)) is not None


def test_holds_restore_in_new_process_refuses_a_path_before_starting_a_process(tmp_path):
    from kvlab.lessons.ex11 import restore_in_new_process

    _kvlab_error(lambda: restore_in_new_process(str(tmp_path), [1, 2, 3], "../outside.bin"))
    _kvlab_error(lambda: restore_in_new_process(str(tmp_path), "abc", "slot.bin"))


def test_holds_build_site_escapes_outputs_and_stays_in_notebooks():
    """A text/plain output holding ``</script><script>`` is escaped on the page; ``--only`` names
    outside notebooks/ select nothing."""
    pytest.importorskip("nbconvert")
    tools = Path(__file__).resolve().parents[2] / "tools"
    sys.path.insert(0, str(tools))
    try:
        import build_site
    finally:
        sys.path.remove(str(tools))
    import nbformat  # noqa: F401
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    output = new_output("execute_result", data={"text/plain": "</script><script>alert(1)</script>"},
                        execution_count=1)  # fmt: skip
    nb = new_notebook(cells=[new_code_cell("x", outputs=[output])])
    body, _ = build_site.site_exporter().from_notebook_node(build_site.site_form(nb, "PLOTLY-JS"))
    assert "<script>alert(1)" not in body
    assert build_site.course_notebooks(["../tools/build_site", "/etc/passwd", "../../x"]) == []


def test_holds_lesson_row_builders_check_their_inputs(capsys):
    """ex01-ex05's row builders and sweeps refuse what is not their lesson object or a size in range."""
    from kvlab.lessons import capstone, ex01, ex02, ex03, ex04, ex05

    for call in (
        lambda: ex01.part_one_rows(None),
        lambda: ex01.part_two_rows(object()),
        lambda: ex02.block_table_rows(1),
        lambda: ex03.block_size_table([0]),
        lambda: ex03.block_size_table(LyingList([4])),
        lambda: ex03.block_size_table([10**400]),
        lambda: ex04.child_requests(prompt_len=LIMITS.tokens, n=LIMITS.slots),
        lambda: ex04.child_request_rows("x"),
        lambda: ex05.prefix_cache_rows([1, 2]),
        lambda: ex05.example_5_rows(None),
        lambda: capstone.first_differences(["abc", "abd"]),
        lambda: capstone.first_differences([[AlwaysEqual()], [1]]),
        lambda: capstone.first_differences(LyingList([[1]])),
    ):
        _kvlab_error(call)
    assert capstone.first_differences([[LyingInt(1), 2], [LyingInt(5), 3]]) == [0]
    capsys.readouterr()
