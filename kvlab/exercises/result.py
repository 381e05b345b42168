"""What one ``check`` shows: a ``Result`` with its verdict, message and hint, as text or in a notebook.

Kept apart from the registry (``core``) so that display is one small thing: ``check`` builds a
``Result`` and calls ``show``; the grader never shows anything.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

RIGHT = "right"
NOT_YET = "not yet"
NOT_DONE = "not done yet"


class ShownOnce:
    """Shows itself once: rich output in a notebook, plain text elsewhere (needs ``text``, ``_repr_html_``
    and a ``_shown`` field). ``check`` and ``reveal`` show what they return already; a cell ending in
    either call must not show it twice."""

    _shown: bool

    def show(self) -> None:
        self._shown = True
        if _ipython_shell() is None:
            print(self.text())  # type: ignore[attr-defined]
        else:
            from IPython.display import publish_display_data

            publish_display_data({"text/plain": self.text(), "text/html": self._repr_html_()})  # type: ignore[attr-defined]

    def _ipython_display_(self) -> None:
        if not self._shown:
            self.show()


@dataclass
class Result(ShownOnce):
    """What one ``check`` found. ``status`` is "right", "not yet" or "not done yet"."""

    exercise_id: str
    title: str
    status: str
    message: str
    hint: str | None = None
    _shown: bool = field(default=False, repr=False, compare=False)

    @property
    def right(self) -> bool:
        return self.status == RIGHT

    def __bool__(self) -> bool:
        return self.right

    def text(self) -> str:
        mark = {RIGHT: "✓", NOT_YET: "✗", NOT_DONE: "…"}[self.status]
        lines = [f"{mark} {self.exercise_id} {self.title}: {self.status}. {self.message}".rstrip()]
        if self.hint:
            lines.append(f"  Hint: {self.hint}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        color = {RIGHT: "#1a7f37", NOT_YET: "#bc4c00", NOT_DONE: "#57606a"}[self.status]
        mark = {RIGHT: "✓ Right", NOT_YET: "✗ Not yet", NOT_DONE: "… Not done yet"}[self.status]
        hint = f"<div style='margin-top:4px'><b>Hint:</b> {html.escape(self.hint)}</div>" if self.hint else ""
        return (
            f"<div style='border-left:4px solid {color};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{color}'>{mark}</b> &middot; {html.escape(self.exercise_id)} "
            f"{html.escape(self.title)}<div>{html.escape(self.message)}</div>{hint}</div>"
        )


def _ipython_shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return None
    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None
