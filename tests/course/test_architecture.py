"""The layout's rules, read from the source: which rooms may import which, and how big a module may grow.

Data flows one way (scenario -> model -> snapshots/events -> views). The lower rooms hold state and
rules and never reach up; exercises read lessons and models, never the reverse.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kvlab"
LOWER = ("core", "models", "server", "fleet")
UPPER = ("views", "lessons", "exercises", "cli")
MAX_LINES = 500  # past this a module's docstring must say why one concept needs the room
# The "lesson" hash scheme is a model of its own (the lesson's byte layout, beside vLLM's), not a lesson run.
SCHEME_CONSTANTS = {"LESSON_NONE_HASH"}


def _modules(room: str) -> list[Path]:
    return sorted((PACKAGE / room).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every kvlab module a file imports, at any depth (inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("kvlab.")}


def _room(module: str) -> str:
    return module.split(".")[1]


@pytest.mark.parametrize("room", LOWER)
def test_lower_rooms_never_import_upper_ones(room):
    wrong = {
        str(path.relative_to(PACKAGE)): sorted(m for m in _imports(path) if _room(m) in UPPER)
        for path in _modules(room)
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_lessons_never_import_exercises_or_the_cli():
    wrong = {
        str(path.relative_to(PACKAGE)): sorted(m for m in _imports(path) if _room(m) in ("exercises", "cli"))
        for path in _modules("lessons")
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_models_carry_no_lesson_runners():
    """``example_N`` runners and ``EXAMPLE_``/``LESSON_`` constants live in kvlab.lessons, not in the models."""
    found = []
    for room in LOWER:
        for path in _modules(room):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
                if isinstance(node, ast.Assign):
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                for name in names:
                    if name in SCHEME_CONSTANTS:
                        continue
                    if name.startswith(("example_", "Example", "EXAMPLE_", "LESSON_")):
                        found.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert not found


def test_long_modules_say_why():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if lines > MAX_LINES and "kept as one module" not in doc.lower():
            long.append(f"{path.relative_to(PACKAGE)} ({lines} lines)")
    assert not long, "split these, or say in the docstring why they stay one module"
