"""Live widgets for a running kernel: a stepper (a slider over a recorded history) that updates figures in place.

``Stepper`` puts a slider, back / forward / play buttons and a caption above
one or more plotly ``FigureWidget``s. Moving the slider does not rebuild the
figures: the view's spec for the new snapshot is compared with the one on
screen, and only the trace and layout properties that changed are sent, in one
``batch_update`` per figure. The slider takes the arrow keys once it has focus.

Widgets need a kernel. So that a page without one (exported HTML, the static
site, a notebook reopened later) is not an empty box, each widget's display
bundle also carries a still copy as ``text/html``: the stepper's views as plotly
animations (or, for a long history, its last step), the playground's final
state, each under a line saying that the live widget needs a running kernel.
JupyterLab with a kernel prefers the widget; nbconvert falls back to the HTML
whenever no widget state is saved.
"""

from __future__ import annotations

import hashlib
import html
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
from plotly.basedatatypes import Undefined
from plotly.io.json import to_json_plotly

from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_choice, check_int, check_items
from kvlab.views import registry
from kvlab.views._common import Spec, check_ms, steps_of, title_lines
from kvlab.views.animations import animate, step_caption

ViewFn = Callable[[Any, Any], Any]


# ---------------------------------------------------------------------- updating a figure in place


def _as_spec(figure: Any) -> Spec:
    if isinstance(figure, go.Figure):
        return figure.to_plotly_json()
    if isinstance(figure, dict) and "data" in figure:
        return {"data": list(figure["data"]), "layout": dict(figure.get("layout", {}))}
    raise InvalidArgumentError(
        f"a view must return a plotly go.Figure or a {{'data': ..., 'layout': ...}} dict, got {type(figure).__name__}"
    )


def _changed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``new`` whose values differ from ``old``, and keys ``old`` had that ``new`` lacks (as None)."""
    out = {k: v for k, v in new.items() if old.get(k, _MISSING) != v}
    out.update({k: None for k in old if k not in new})
    return out


_MISSING = object()


def _fast_array(value: Any) -> Any:
    """A 2-D list (a heatmap's z, text or hover text) as a numpy array.

    plotly validates and serialises nested Python lists element by element;
    a numpy array goes through in one piece, which is most of a step's cost
    on a large pool. Gaps (None) become NaN in numbers and "" in text.
    """
    if not (isinstance(value, list) and value):
        return value
    if not isinstance(value[0], list):  # a long 1-D list of numbers with None gaps (outlines, crosses)
        if len(value) > 16 and all(v is None or isinstance(v, (int, float)) for v in value):
            return np.array([np.nan if v is None else v for v in value], dtype=float)
        return value
    flat = [v for row in value for v in row if v is not None]
    if flat and all(isinstance(v, (int, float)) for v in flat):
        return np.array(value, dtype=float)
    if all(isinstance(v, str) for v in flat):
        return np.array([[v if v is not None else "" for v in row] for row in value], dtype=object)
    return value


class LiveFigure:
    """A ``FigureWidget`` plus the spec it shows, updated in place with only what changed.

    ``show`` sends one ``plotly_update`` message holding just the trace
    properties and layout keys that differ from what is on screen. The values
    come from a spec the view builder made the same way as the figure's first
    one, so they skip plotly's per-property validation, which would otherwise
    cost more than drawing the step.
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.widget = go.FigureWidget(spec)
        self.updates = 0  # properties sent by the last show(), for tests and the benchmark

    def show(self, spec: Spec) -> None:
        old = self.spec
        fw = self.widget
        same_shape = len(old["data"]) == len(spec["data"]) and all(
            a.get("type") == b.get("type") for a, b in zip(old["data"], spec["data"], strict=True)
        )
        if not same_shape:  # a different set of traces: start over
            with fw.batch_update():
                fw.data = []
                fw.add_traces(spec["data"])
                fw.layout = spec["layout"]
            self.spec = spec
            self.updates = len(spec["data"]) + len(spec["layout"])
            return
        per_trace = [_changed(before, after) for before, after in zip(old["data"], spec["data"], strict=True)]
        indexes = [i for i, diff in enumerate(per_trace) if diff]
        restyle: dict[str, list[Any]] = {}
        for position, i in enumerate(indexes):
            for key, value in per_trace[i].items():
                column = restyle.setdefault(key, [Undefined] * len(indexes))
                column[position] = _fast_array(value)
        relayout: dict[str, Any] = {}
        for key, value in _changed(old["layout"], spec["layout"]).items():
            before = old["layout"].get(key)
            if isinstance(value, dict) and isinstance(before, dict) and not set(before) - set(value):
                for sub, sub_value in _changed(before, value).items():
                    relayout[f"{key}.{sub}"] = sub_value
            else:
                relayout[key] = value
        if restyle or relayout:
            fw.plotly_update(restyle_data=restyle or None, relayout_data=relayout or None,
                             trace_indexes=indexes or None)  # fmt: skip
        self.spec = spec
        self.updates = sum(len(d) for d in per_trace) + len(relayout)


# ---------------------------------------------------------------------- the still copy for pages without a kernel

#: The still copy of one widget stays under this many bytes of figure JSON; a longer history shows its last step.
STILL_BYTES = 400_000
MAX_STILL_BYTES = 64 << 20  # the largest budget a caller may give one still copy (64 MiB of JSON in a page)
KERNEL_NOTE = (
    "A still copy of an interactive widget: its controls need a running kernel. "
    "Open the notebook in JupyterLab (or on Binder) and run the cell to use it."
)
_still_ids = itertools.count()


def still_html(figures: Sequence[Spec | go.Figure], note: str, extra: str = "") -> str:
    """An HTML block that draws ``figures`` with the page's plotly.js, under ``note``; ``extra`` is trusted HTML.

    The figures are drawn once the page has loaded when plotly.js comes later in the page (nbconvert
    writes it into the first figure's output); a page with no plotly.js at all still shows the note.
    """
    parts = [f'<div class="kvlab-still">\n<p class="kvlab-kernel-note" style="margin:0.3em 0;color:#555;'
             f'font-style:italic">{html.escape(note)}</p>']  # fmt: skip
    for figure in figures:
        # through go.Figure, which writes the template out: plotly.js knows no template by name
        spec = (figure if isinstance(figure, go.Figure) else go.Figure(figure)).to_plotly_json()
        text = to_json_plotly(spec).replace("</", "<\\/")  # no "</script>" inside the script
        div_id = f"kvlab-still-{next(_still_ids)}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
        height = int(spec.get("layout", {}).get("height") or 450)
        parts.append(
            f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}px;width:100%"></div>\n'
            f'<script type="text/javascript">(function () {{\n  var id = "{div_id}", fig = {text};\n'
            "  function draw() { if (!window.Plotly) return false;\n"
            "    Plotly.newPlot(id, fig.data, fig.layout, {responsive: true}).then(function () {\n"
            "      if (fig.frames) return Plotly.addFrames(id, fig.frames); });\n    return true; }\n"
            "  if (!draw()) window.addEventListener('load', function () { if (!draw())\n"
            "    document.getElementById(id).textContent = '(this page has no plotly.js, so the figure is not drawn)'; });\n"
            "})();</script>"
        )  # fmt: skip
    if extra:
        parts.append(extra)
    parts.append("</div>")
    return "\n".join(parts)


class StillCopy:
    """Mixin for a widget: its display bundle adds ``still_html()`` as ``text/html`` beside the live view."""

    def still_html(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]
        if isinstance(bundle, tuple):  # (data, metadata)
            bundle = bundle[0]
        return {**bundle, "text/html": self.still_html()}


# ---------------------------------------------------------------------- stepper


class Stepper(StillCopy, widgets.VBox):
    """Step through a recorded history: slider, back / forward / play, caption, linked figures.

    ``views`` is one view name or a list of them (``contiguous``,
    ``block_pool``, ``free_queue``, ``radix``), or callables
    ``view(state, previous) -> go.Figure``; by default the views that suit the
    history's snapshots. ``highlight=(request_id, position)`` is passed to the
    block-pool view. Without a kernel the stepper shows ``still_html()``: each
    view as a plotly animation over the same steps.
    """

    def __init__(
        self,
        history: object,
        views: str | Sequence[str | ViewFn] | None = None,
        *,
        highlight: tuple[str, int] | None = None,
        interval_ms: int = 900,
    ) -> None:
        steps = steps_of(history)
        kinds = {type(s) for _, s in steps}
        if len(kinds) != 1:
            raise InvalidArgumentError(
                f"a history must hold one kind of snapshot, found {', '.join(sorted(k.__name__ for k in kinds))}"
            )
        state_type = kinds.pop()
        interval_ms = check_ms("interval_ms", interval_ms)
        self.steps = steps
        self.states = [s for _, s in steps]
        self.captions = [c for c, _ in steps]
        self._views = self._resolve_views(views, state_type, highlight)
        self._cache: dict[tuple[int, int], Spec] = {}
        self.figures = [LiveFigure(self.spec(v, 0)) for v in range(len(self._views))]
        n = len(steps)
        self.slider = widgets.IntSlider(
            value=0, min=0, max=n - 1, step=1, description="step", continuous_update=True,
            readout=True, layout=widgets.Layout(width="420px"),
        )  # fmt: skip
        self.play = widgets.Play(value=0, min=0, max=n - 1, step=1, interval=interval_ms, description="play",
                                 show_repeat=False, layout=widgets.Layout(width="120px"))  # fmt: skip
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.back = widgets.Button(
            description="◀ back", tooltip="previous step", layout=widgets.Layout(width="90px")
        )
        self.forward = widgets.Button(description="forward ▶", tooltip="next step",
                                      layout=widgets.Layout(width="100px"))  # fmt: skip
        self.caption = widgets.HTML()
        self.back.on_click(lambda _: self.step(-1))
        self.forward.on_click(lambda _: self.step(+1))
        self.slider.observe(self._on_slider, names="value")
        # the row wraps (slider under the buttons) in a narrow notebook instead of running off the edge
        controls = widgets.HBox(
            [self.back, self.play, self.forward, self.slider], layout=widgets.Layout(flex_flow="row wrap")
        )
        super().__init__([controls, self.caption, *(f.widget for f in self.figures)])
        self._show(0)

    # -- views

    def _resolve_views(
        self, views: object, state_type: type, highlight: object
    ) -> list[tuple[str, ViewFn, dict]]:
        if views is None:
            views = registry.defaults(state_type)
            if not views:
                raise InvalidArgumentError(
                    f"no default view for {state_type.__name__}; pass views= as callables (state, previous) -> figure"
                )
        if isinstance(views, str) or callable(views):
            views = [views]
        if not isinstance(views, Sequence):
            raise InvalidArgumentError("views must be a view name, a callable, or a non-empty list of them")
        views = check_items("views", views, what="a view name, a callable, or a non-empty list of them")
        if not views:
            raise InvalidArgumentError("views must be a view name, a callable, or a non-empty list of them")
        out: list[tuple[str, ViewFn, dict]] = []
        for v in views:
            if callable(v):
                out.append((getattr(v, "__name__", "view"), v, {}))
                continue
            view = registry.get(v, extra=", or a callable")
            if not issubclass(state_type, view.state_type):
                raise InvalidArgumentError(
                    f"view {brief(v)} draws {view.state_type.__name__} snapshots, but this history holds {state_type.__name__}"
                )
            out.append((v, view.spec, self._hints(view, highlight)))
        return out

    def _hints(self, view: registry.View, highlight: object) -> dict[str, Any]:
        """The view's hints for this history, with room for the longest caption and the subtitle."""
        hints = view.hints(self.states)
        count = len(self.states)
        hints["head_lines"] = max(title_lines(step_caption(i, count, c)) for i, c in enumerate(self.captions))
        hints["sub_lines"] = 2
        if view.highlight:
            hints.update(highlight=highlight, strict=False)
            if highlight is not None:
                hints["sub_lines"] = 3  # the token's translation takes a line of its own
        return hints

    def spec(self, view: int, index: int) -> Spec:
        """The spec view number ``view`` shows at step ``index`` (what the figure holds after a step)."""
        view = check_int("view", view, minimum=0, maximum=len(self._views) - 1)
        index = check_int("index", index, minimum=-len(self.states), maximum=len(self.states) - 1) % len(
            self.states
        )
        key = (view, index)
        if key not in self._cache:
            name, fn, hints = self._views[view]
            state = self.states[index]
            previous = self.states[index - 1] if index > 0 else None
            if name in registry.VIEWS:
                caption = step_caption(index, len(self.states), self.captions[index])
                self._cache[key] = fn(state, previous, caption=caption, **hints)
            else:
                self._cache[key] = _as_spec(fn(state, previous))
        return self._cache[key]

    # -- without a kernel

    def still_figures(self, budget: int = STILL_BYTES) -> tuple[list[go.Figure], str]:
        """What a page without a kernel shows: one plotly animation per view over every step, or, when
        that would pass ``budget`` bytes of JSON, each view at the last step; and a line saying which."""
        budget = check_int("budget", budget, minimum=1, maximum=MAX_STILL_BYTES)
        count = len(self.states)
        last = [self.spec(v, count - 1) for v in range(len(self._views))]
        if count == 1:
            return [go.Figure(spec) for spec in last], "The history has a single step."
        if not self._frames_fit(count, budget):
            return [go.Figure(spec) for spec in last], (
                f"This copy shows the last of its {count} steps; run the notebook to step through all of them."
            )
        animations = [
            animate([self.spec(v, i) for i in range(count)], self.captions) for v in range(len(last))
        ]
        return animations, "Here each figure steps on its own: press play or drag its slider."

    def _frames_fit(self, count: int, budget: int) -> bool:
        """Whether every view's frames over all ``count`` steps stay within ``budget`` bytes of JSON.

        Each frame is measured (a view may draw more at some steps than at the last), and the count
        stops as soon as it passes ``budget``: at most ``budget`` bytes and one frame are ever built.
        """
        if count > LIMITS.frames:
            return False
        used = 0
        for i in range(count):
            for v in range(len(self._views)):
                used += len(to_json_plotly(self.spec(v, i)))
                if used > budget:
                    return False
        return True

    def still_html(self) -> str:
        """The stepper as a page without a kernel shows it (the ``text/html`` of its display bundle)."""
        figures, which = self.still_figures()
        return still_html(figures, f"{KERNEL_NOTE} {which}")

    # -- stepping

    @property
    def index(self) -> int:
        return int(self.slider.value)

    def go_to(self, index: int) -> None:
        """Show step ``index`` (negative counts from the end)."""
        index = check_int("index", index)
        n = len(self.states)
        if not -n <= index < n:
            raise InvalidArgumentError(f"step {index} does not exist: the history has steps 0..{n - 1}")
        self.slider.value = index % n

    def step(self, delta: int) -> None:
        """Move ``delta`` steps, stopping at either end."""
        delta = check_int("delta", delta)
        self.slider.value = min(max(self.index + delta, 0), len(self.states) - 1)

    def _on_slider(self, change: dict[str, Any]) -> None:
        self._show(int(change["new"]))

    def _show(self, index: int) -> None:
        for v, fig in enumerate(self.figures):
            fig.show(self.spec(v, index))
        self.caption.value = (f"<b>{html.escape(step_caption(index, len(self.states), ''))}</b>"
                              f"{html.escape(self.captions[index])}")  # fmt: skip
        self.back.disabled = index == 0
        self.forward.disabled = index == len(self.states) - 1


def stepper(history: object, kind: str | None = None, **options: Any) -> Stepper:
    """A ``Stepper`` with the views for ``kind`` (``contiguous``, ``block_pool``, ``free_queue``,
    ``prefix_cache``, ``radix``); without ``kind``, the views that suit the snapshots."""
    if kind is None:
        return Stepper(history, **options)
    kinds = registry.kinds()
    kind = check_choice("kind", kind, tuple(kinds))
    return Stepper(history, kinds[kind], **options)
