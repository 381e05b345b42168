"""The storage rule for the course notebooks, and the pairing of exercise cells, registry and solutions.

Notebooks are committed without outputs, execution counts or widget state, in exactly the form
tools/strip_notebooks.py writes (run it before committing). Each exercise cell carries
{"kvlab": {"exercise": "NN.k"}} in its metadata, and every registered exercise of the notebook
appears on exactly one cell, with exactly one solution in solutions/NN_slug.py.
"""

from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path

import nbformat
import pytest

from kvlab.exercises import exercises
from kvlab.lessons.course import COURSE

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
SECTIONS = ["What you will learn", "The problem", "The idea", "Exercises", "Check yourself", "Summary"]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _headings(nb: nbformat.NotebookNode) -> list[str]:
    return [
        m.group(2).strip()
        for cell in nb.cells
        if cell.cell_type == "markdown"
        for m in re.finditer(r"^(#{1,3}) (.+)$", cell.source, flags=re.M)
    ]


def _exercise_cells(nb: nbformat.NotebookNode) -> list[tuple[str, nbformat.NotebookNode]]:
    return [
        (c.metadata["kvlab"]["exercise"], c) for c in nb.cells if "exercise" in c.metadata.get("kvlab", {})
    ]


def test_there_are_notebooks():
    assert PATHS, "no notebooks in notebooks/"


def test_names_follow_the_course_map():
    names = {nb.filename for nb in COURSE}
    assert [nb.number for nb in COURSE] == [f"{i:02d}" for i in range(17)]
    for path in PATHS:
        assert path.name in names, (
            f"{path.name}: notebooks are named as in kvlab.lessons.course.COURSE (NN_slug.ipynb)"
        )
    numbers = [p.name[:2] for p in PATHS]
    assert len(numbers) == len(set(numbers)), "two notebooks share a number"


def test_every_registered_notebook_has_its_notebook():
    present = {p.name[:2] for p in PATHS}
    for nb in sorted({e.notebook for e in exercises()}):
        assert nb in present, (
            f"exercises of notebook {nb} are registered, but notebooks/{nb}_*.ipynb is missing"
        )


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
class TestNotebook:
    def test_is_valid_nbformat_with_the_python3_kernel(self, path):
        nb = _read(path)
        nbformat.validate(nb)
        assert nb.nbformat == 4
        assert nb.metadata.kernelspec.name == "python3"

    def test_is_committed_without_outputs(self, path):
        nb = _read(path)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert cell.outputs == [], f"cell {i} has outputs"
                assert cell.execution_count is None, f"cell {i} has an execution count"
        assert "widgets" not in nb.metadata, "widget state is saved in the notebook metadata"
        assert not any(c.cell_type == "raw" for c in nb.cells)

    def test_is_exactly_what_strip_notebooks_writes(self, path):
        text = path.read_text(encoding="utf-8")
        assert text == _tool("strip_notebooks").committed_text(nbformat.reads(text, as_version=4)), (
            f"run: python tools/strip_notebooks.py {path.relative_to(ROOT)}"
        )

    def test_starts_with_its_title(self, path):
        nb = _read(path)
        course = {c.filename: c for c in COURSE}[path.name]
        first = nb.cells[0]
        assert first.cell_type == "markdown" and first.source.startswith(
            f"# {course.number} · {course.title}\n"
        )

    def test_has_the_sections_in_order(self, path):
        if path.name.startswith("00_"):
            pytest.skip("the start page has its own outline")
        headings = _headings(_read(path))
        found = [next((i for i, h in enumerate(headings) if h.startswith(s)), None) for s in SECTIONS]
        missing = [s for s, i in zip(SECTIONS, found, strict=True) if i is None]
        assert not missing, f"missing section headings: {missing}"
        assert found == sorted(found), f"sections out of order; expected {SECTIONS}"

    def test_check_yourself_answers_hide_behind_a_reveal(self, path):
        if path.name.startswith("00_"):
            pytest.skip("the start page has no questions")
        nb = _read(path)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        part = text.split("## Check yourself", 1)[1].split("## Summary", 1)[0]
        assert part.count("<details>") >= 2, "give at least two questions, each answer in <details>"
        assert (
            part.count("<details>")
            == part.count("<summary>Show answer</summary>")
            == part.count("</details>")
        )

    def test_exercise_cells_match_the_registry(self, path):
        nb = _read(path)
        number = path.name[:2]
        marked = [ex_id for ex_id, _ in _exercise_cells(nb)]
        registered = [e.id for e in exercises(number)]
        assert sorted(marked) == sorted(registered), (
            f"exercise cells {marked} must be the registered exercises {registered}, each exactly once"
        )
        assert len(marked) == len(set(marked))
        if number != "00":
            assert 2 <= len(registered) <= 4, "each notebook has two to four exercises"

    def test_exercise_cells_hold_a_placeholder_and_their_check(self, path):
        for ex_id, cell in _exercise_cells(_read(path)):
            assert cell.cell_type == "code"
            assert "..." in cell.source, f"{ex_id}: the shipped cell keeps a ... for the student to replace"
            assert re.search(
                rf"""(check|predict)\(["']{re.escape(ex_id)}["']""", cell.source.splitlines()[-1]
            ), f"{ex_id}: the cell's last line calls check('{ex_id}', ...) (or predict, for a prediction)"

    def test_solutions_pair_with_the_exercise_cells(self, path):
        marked = {ex_id for ex_id, _ in _exercise_cells(_read(path))}
        solutions_file = ROOT / "solutions" / f"{path.stem}.py"
        if not marked:
            assert not solutions_file.exists()
            return
        solutions = runpy.run_path(str(solutions_file))["SOLUTIONS"]
        assert set(solutions) == marked
        for ex_id, source in solutions.items():
            last = source.rstrip().splitlines()[-1]
            assert re.fullmatch(rf"""(check|predict)\(["']{re.escape(ex_id)}["'], .+\)""", last), (
                f"solution {ex_id} must end by calling check('{ex_id}', ...)"
            )


def test_start_page_links_every_notebook():
    start = NOTEBOOKS / "00_start_here.ipynb"
    text = "\n".join(c.source for c in _read(start).cells if c.cell_type == "markdown")
    for nb in COURSE[1:]:
        assert f"]({nb.filename})" in text, f"the course map lacks a link to {nb.filename}"
        assert f"{nb.minutes} min" in text


# ---------------------------------------------------------------------- executed notebooks stay light

EXECUTED_LIMIT = 2_000_000  # bytes an executed notebook may take (issue 16)


@pytest.fixture(scope="module")
def executed_07(tmp_path_factory):
    """Notebook 07 (a Stepper and a Playground) run by tools/run_notebooks.py and saved: (record, notebook)."""
    folder = tmp_path_factory.mktemp("executed")
    record = _tool("run_notebooks").run_notebook(NOTEBOOKS / "07_lru_eviction.ipynb", save_to=folder)
    assert record["error"] is None, record["error"]
    return record, _read(folder / "07_lru_eviction.ipynb")


def test_an_executed_notebook_with_widgets_stays_under_two_megabytes(executed_07):
    record, nb = executed_07
    assert "widgets" not in nb.metadata, "widget state is megabytes per plotly widget; it is never saved"
    heaviest = max(
        ((len(str(v)), i, mime) for i, c in enumerate(nb.cells) if c.cell_type == "code"
         for o in c.outputs for mime, v in o.get("data", {}).items()),
        default=(0, None, None),
    )  # fmt: skip
    assert record["bytes"] <= EXECUTED_LIMIT, (
        f"07 executed is {record['bytes'] / 1e6:.1f} MB; its heaviest output is cell {heaviest[1]}'s "
        f"{heaviest[2]}, {heaviest[0] / 1e6:.1f} MB (plotly's 'notebook' renderer inlines plotly.js, 4.8 MB)"
    )


def test_its_exported_html_shows_each_widget_as_a_still_copy(executed_07):
    from nbconvert import HTMLExporter

    from kvlab.views.live import KERNEL_NOTE

    _, nb = executed_07
    widgets = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]  # fmt: skip
    assert len(widgets) == 2, "07 shows a Stepper and a Playground"
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    assert body.count(KERNEL_NOTE) == 2
    assert 'type="application/vnd.jupyter.widget-view+json"' not in body  # no empty widget box
