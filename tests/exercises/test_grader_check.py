"""The in-notebook ``check`` and the grader's function runs against hostile and careless answers.

Every exercise is tried with objects that lie about equality (none may pass), and with answers that
used to crash a check (none may raise). Submitted functions are also run the grader's way, in a
``SandboxFunction`` child process, on the notebook's cases plus fresh hidden ones.
"""

from __future__ import annotations

import random
import sys

import pytest
from hostile import all_hostile_values
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvlab.exercises as ex
from kvlab.exercises import core
from kvlab.exercises.plain import MAX_DEPTH, Opaque, decode, encode, plain
from kvlab.exercises.sandbox import SandboxFunction, without_checks


class Liar(int):
    """An int whose == always says yes and whose repr raises."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__

    def __repr__(self):
        raise RuntimeError("no repr")


class LyingList(list):
    def __eq__(self, other):
        return True

    def __iter__(self):
        raise RuntimeError("no iterating")


class LyingDict(dict):
    def __eq__(self, other):
        return True

    def items(self):
        raise RuntimeError("no items")


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")

    @property
    def __class__(self):  # isinstance would ask this; the converter must not
        raise SystemExit


def _deep(levels: int) -> list:
    root: list = []
    cur = root
    for _ in range(levels):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    return root


def _liar_for(kind: str):
    return {
        "int": Liar(0),
        "number": Liar(0),
        "list": LyingList([Liar(0), Liar(1)]),
        "dict": LyingDict({Liar(0): Liar(1)}),
        "str": Liar(0),
        "bool": Liar(1),
        "function": lambda *args: Liar(0),
    }[kind]


def test_lying_objects_pass_no_exercise(capsys):
    graded = [e for e in ex.exercises() if e.kind != "prediction"]
    fooled = [e.id for e in graded if ex.check(e.id, _liar_for(e.answer_type)).right]
    assert fooled == []
    # A prediction takes any guess; a lying int is recorded as the plain int it holds, never as itself.
    for e in ex.exercises():
        if e.kind == "prediction" and ex.check(e.id, _liar_for(e.answer_type)).right:
            assert type(core._predictions[e.id]) in (int, float, str, bool), e.id


def test_a_function_returning_lying_objects_passes_no_function_exercise():
    fooled = []
    for e in ex.exercises():
        if e.answer_type == "function":
            for liar in (lambda *a: Liar(0), lambda *a: LyingList([Liar(0)]), lambda *a: [Liar(0)] * 40):
                if ex.check(e.id, liar).right:
                    fooled.append(e.id)
    assert fooled == []


def _exits(*args):
    sys.exit(3)


CRASHERS = {  # built in the test: pytest itself would ask BadRepr's __class__
    "huge int": lambda: 10**5000,
    "raising repr": BadRepr,
    "100000 deep": lambda: _deep(100_000),
    "in a list": lambda: [BadRepr()],
    "in a dict": lambda: {"k": BadRepr()},
    "sys.exit": lambda: _exits,
    "text": lambda: "4",
    "nan": lambda: float("nan"),
    "bytes": lambda: b"\xff",
}


@pytest.mark.parametrize("kind", list(CRASHERS))
def test_no_answer_crashes_any_check(kind, capsys):
    answer = CRASHERS[kind]()
    for e in ex.exercises():
        if e.id.startswith("14") and kind not in ("huge int", "sys.exit", "raising repr"):
            continue  # notebook 14's checkers run torch; these three cover them
        result = ex.check(e.id, answer)  # must not raise
        assert not result.right and result.status in (ex.NOT_YET, ex.NOT_DONE), (e.id, result)


def test_a_function_that_loops_or_prints_is_stopped(monkeypatch, capsys):
    monkeypatch.setattr(core, "FUNCTION_SECONDS", 1.0)

    def wasted_slots(lengths, pool_size, max_len):
        while True:
            try:  # noqa: SIM105 - a loop that swallows errors cannot swallow the time limit
                pass
            except Exception:
                pass

    result = ex.check("01.3", wasted_slots)
    assert result.status == ex.NOT_YET and "did not return within 1 s" in result.message

    def noisy(lengths, pool_size, max_len):
        print("x" * 5_000_000)
        return 0

    result = ex.check("01.3", noisy)
    assert result.status == ex.NOT_YET and "printed 5,000,001 characters" in result.message
    assert len(capsys.readouterr().out) < 5_000


def test_human_spellings_are_accepted_and_refusals_say_why():
    assert ex.check("00.1", 8192 / 2048).right  # 4.0
    r = ex.check("00.1", 4.5)
    assert r.status == ex.NOT_YET and "not a whole number" in r.message
    r = ex.check("00.1", "4")
    assert "in quotes" in r.message and "without the quotes" in r.message
    assert ex.check("02.4", (" a ", 21)).right  # a tuple for a list, case and spaces in a name
    assert not ex.check("00.1", 4.000001).right


def test_a_type_refusal_does_not_use_up_a_hint():
    hints = ex.get("01.3").hints
    assert ex.check("01.3", 5842).hint == hints[0]  # not a function: refused
    assert ex.check("01.3", "def f(): ...").hint == hints[0]
    assert ex.check("01.3", lambda lengths, pool, max_len: 0).hint == hints[0]  # the first real try
    assert ex.check("01.3", lambda lengths, pool, max_len: 0).hint == hints[1]


def test_the_converter_keeps_values_and_drops_lies():
    value = plain([Liar(3), (1, {2: "x"}), {4, 5}, 2**70, b"ab", ..., None, True, 2.5])
    assert value == [3, (1, {2: "x"}), {4, 5}, 2**70, b"ab", ..., None, True, 2.5]
    assert type(value[0]) is int and type(value[1][1]) is dict
    assert isinstance(plain(10**5000), Opaque) and isinstance(plain(BadRepr()), Opaque)
    deep = plain(_deep(100_000))
    for _ in range(MAX_DEPTH):
        deep = deep[0]
    assert isinstance(deep, Opaque)
    assert decode(encode({"§kvlab": 1})) == {"§kvlab": 1}  # the tag key of a student's own dict is kept
    assert Opaque("x") != Opaque("x")


def test_numpy_values_are_read_as_numbers():
    np = pytest.importorskip("numpy")
    assert plain(np.int64(4)) == 4 and type(plain(np.int64(4))) is int
    assert plain(np.array([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]


# ---------------------------------------------------------------- the grader's way: a child process


def _graded(source: str, name: str, exercise_id: str = "01.3", seconds: float = 4.0) -> ex.Verdict:
    function = SandboxFunction(without_checks(source), name, seconds=seconds, memory_mib=1024)
    try:
        return ex.evaluate(ex.get(exercise_id), function, ex.get(exercise_id).draw_cases(random.Random(5)))
    finally:
        function.close()


RIGHT_01_3 = """
def wasted_slots(lengths, pool_size, max_len):
    placed = lengths[: pool_size // max_len]
    return len(placed) * max_len - sum(placed)


check("01.3", wasted_slots)
"""


def test_a_right_function_is_right_on_hidden_cases():
    verdict = _graded(RIGHT_01_3, "wasted_slots")
    assert verdict.status == ex.RIGHT and "13 pools" in verdict.message


def test_a_function_that_memorised_the_notebooks_cases_fails_the_hidden_ones():
    # Right on every case the notebook shows (so check() in the notebook says right), wrong elsewhere.
    cases = ex.get("01.3").draw_cases(None)
    namespace: dict = {}
    exec(RIGHT_01_3.replace('check("01.3", wasted_slots)', ""), namespace)
    table = {repr(c): namespace["wasted_slots"](*c) for c in cases}
    source = f"TABLE = {table!r}\n\ndef wasted_slots(lengths, pool_size, max_len):\n"
    source += "    return TABLE.get(repr((lengths, pool_size, max_len)), 0)\n"
    memoriser: dict = {}
    exec(source, memoriser)
    assert ex.check("01.3", memoriser["wasted_slots"]).right
    assert _graded(source, "wasted_slots").status == ex.NOT_YET


@pytest.mark.parametrize(
    "body, words",
    [
        ("    return Liar(0)", "returned 0"),
        ("    import sys\n    sys.exit()", "sys.exit()"),
        ("    import os\n    os._exit(0)", "ended the process"),
        ("    while True:\n        pass", "did not finish within 2 s"),
        ("    return [0] * 10**10", "MemoryError"),
        ("    print('x' * 10**7)\n    return 0", "returned 0"),
        ("    import kvlab.models.contiguous as m\n    m.ContiguousPool = None\n    return 0", "returned 0"),
        ("    import os\n    os.write(4, b'{\"value\": 5842}\\n')\n    return 1", "returned"),
    ],
    ids=["liar", "sys.exit", "os._exit", "loop", "memory", "printing", "monkeypatch", "forged channel"],
)
def test_hostile_functions_in_the_child_get_not_yet(body, words):
    source = "class Liar(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n\n\n"
    source += f"def wasted_slots(lengths, pool_size, max_len):\n{body}\n"
    verdict = _graded(source, "wasted_slots", seconds=2.0)
    assert verdict.status == ex.NOT_YET and words in verdict.message, verdict.message


def test_a_cell_that_fails_before_defining_the_function_says_so():
    verdict = _graded("raise ValueError('early')\n", "wasted_slots", seconds=2.0)
    assert verdict.status == ex.NOT_YET and "raised ValueError: early when it was run" in verdict.message
    verdict = _graded("def other():\n    return 1\n", "wasted_slots", seconds=2.0)
    assert "defines no function named wasted_slots" in verdict.message


# ---------------------------------------------------------------- the shared hostile strategies

CHEAP = ["00.1", "01.1", "01.2", "02.1", "02.4", "04.3", "05.2", "09.1"]  # models that answer in milliseconds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=all_hostile_values(), exercise_id=st.sampled_from(CHEAP))
def test_hostile_values_never_raise_and_never_pass(answer, exercise_id):
    # a plain small whole number is an ordinary answer, and may be the right one (00.1's is 4)
    assume(not (type(answer) is int and 0 <= answer < 10**6))
    result = ex.check(exercise_id, answer)
    assert result.status in (ex.NOT_YET, ex.NOT_DONE)
    verdict = ex.evaluate(ex.get(exercise_id), decode(encode(answer)))  # what the grader would check
    assert verdict.status != ex.RIGHT
