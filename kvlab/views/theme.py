"""Colours, the plotly template, and renderer setup shared by every view.

The palette is Okabe and Ito's, chosen so that readers with the common forms
of colour blindness can still tell every pair apart; where two meanings could
still be confused (a hit and a new block, say) the views add a second cue: a
line style, a cross, a hatch or a text label.
"""

from __future__ import annotations

import json
import os
import pkgutil
import sys

import plotly.graph_objects as go
import plotly.io as pio

from kvlab.errors import InvalidArgumentError, check_text

# Okabe-Ito, by name.
BLACK = "#000000"
ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
GREY = "#9E9E9E"
LIGHT_GREY = "#E6E6E6"
INK = "#222222"  # text and outlines

OKABE_ITO = (ORANGE, SKY_BLUE, GREEN, YELLOW, BLUE, VERMILLION, PURPLE, BLACK)

#: One colour per block status, in the order of ``BlockState.status`` values a student meets them.
STATUS_COLORS: dict[str, str] = {
    "never used": LIGHT_GREY,
    "in use": BLUE,
    "free, cached": ORANGE,
    "free": SKY_BLUE,
    "null": "#444444",
}
STATUSES: tuple[str, ...] = tuple(STATUS_COLORS)

#: What the status means, for legends and hover text.
STATUS_MEANING: dict[str, str] = {
    "never used": "never handed out",
    "in use": "held by at least one block table",
    "free, cached": "free, still holds a cached prefix (can be hit until handed out again)",
    "free": "free, its old content is not cached",
    "null": "reserved null block, never handed out",
}

#: Marks for what the last operation did (a line style or symbol as well as a colour).
MARK_STYLES: dict[str, dict[str, object]] = {
    "hit": {"color": GREEN, "dash": "solid", "label": "hit (reused by this op)"},
    "new": {"color": PURPLE, "dash": "dot", "label": "newly allocated by this op"},
    "evicted": {"color": VERMILLION, "dash": "solid", "label": "cached content evicted by this op (×)"},
    "copied": {"color": BLACK, "dash": "dash", "label": "copy-on-write target of this op"},
    "freed": {"color": INK, "dash": "dashdot", "label": "joined the queue in this op"},
    "highlight": {"color": BLACK, "dash": "solid", "label": "the chosen token's block"},
}

#: Region parts of the contiguous strip.
REGION_COLORS: dict[str, str] = {
    "stores KV": BLUE,
    "reserved, unused": ORANGE,
    "free gap": LIGHT_GREY,
}

#: Radix-tree node kinds.
NODE_COLORS: dict[str, str] = {
    "root": "#444444",
    "unlocked": SKY_BLUE,
    "locked": BLUE,
    "split by this op": YELLOW,
    "evicted by this op": "#FFFFFF",
}

#: Hash-chain cells.
CHAIN_COLORS: dict[str, str] = {
    "same as the first row": GREEN,
    "changed": VERMILLION,
    "partial block (not hashed)": LIGHT_GREY,
    "new (the first row has no such block)": SKY_BLUE,
}

FONT_FAMILY = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, monospace"

TEMPLATE_NAME = "kvlab"


#: The trace types kvlab's views draw; the kvlab template carries plotly_white's defaults for these only.
TEMPLATE_TRACES = ("bar", "heatmap", "scatter")
#: Parts of plotly_white's layout for subplot kinds kvlab never draws (3-D scenes, maps, polar, ternary).
_UNUSED_LAYOUT = ("geo", "polar", "scene", "ternary")


def _make_template() -> go.layout.Template:
    """plotly_white, cut to the 2-D traces and axes kvlab draws, with kvlab's fonts, colours and margins.

    Every figure copies and validates its template, so a small one keeps both
    ``import kvlab.views`` and each figure fast: the full plotly_white carries
    defaults for 24 trace types and 3-D, map, polar and ternary subplots,
    which cost about a second to import and validate and 100 ms per figure.
    For the traces and axes kvlab draws the result is identical; ``setup()``
    still makes ``plotly_white+kvlab`` the default, so other figures get the
    whole of plotly_white.
    """
    white = json.loads(pkgutil.get_data("plotly", "package_data/templates/plotly_white.json") or b"{}")
    layout = {k: v for k, v in white.get("layout", {}).items() if k not in _UNUSED_LAYOUT}
    data = {k: v for k, v in white.get("data", {}).items() if k in TEMPLATE_TRACES}
    template = go.layout.Template({"data": data, "layout": layout})
    template.layout.update(
        font={"family": FONT_FAMILY, "size": 13, "color": INK},
        colorway=list(OKABE_ITO),
        paper_bgcolor="white",
        plot_bgcolor="white",
        hoverlabel={"font": {"family": MONO_FAMILY, "size": 12}, "align": "left"},
        legend={"bgcolor": "rgba(255,255,255,0.85)", "bordercolor": LIGHT_GREY, "borderwidth": 1},
        title={
            "x": 0.01,
            "xanchor": "left",
            "font": {"size": 16},
            "yref": "container",
            "y": 1,
            "yanchor": "top",
            "pad": {"t": 12},
        },
        margin={"l": 70, "r": 30, "t": 70, "b": 60},
    )
    return template


pio.templates[TEMPLATE_NAME] = _make_template()

#: Renderers that show a figure in JupyterLab and VS Code, offline (the plotly mimetype), and in exported
#: HTML (``notebook_connected``: the page loads plotly.js by reference instead of carrying its 4.8 MB in
#: every saved notebook; tools/build_site.py serves one shared copy, so the course's site stays offline).
DEFAULT_RENDERER = "plotly_mimetype+notebook_connected"


def setup(renderer: str | None = None) -> str:
    """Make figures show in JupyterLab and VS Code (offline) and in exported HTML; return the renderer used.

    ``renderer`` overrides the choice (any name ``plotly.io.renderers`` knows,
    or several joined with ``+``). Without it the ``PLOTLY_RENDERER``
    environment variable wins when set, and ``plotly_mimetype+notebook_connected``
    otherwise: the mimetype draws the figure in JupyterLab and VS Code, and the
    HTML copy (plotly.js by reference, so a saved notebook stays small) is what
    nbconvert, nbviewer and the course's static site show.
    """
    if renderer is None:
        renderer = os.environ.get("PLOTLY_RENDERER") or DEFAULT_RENDERER
    renderer = check_text("renderer", renderer, allow_empty=False)
    known = set(pio.renderers)
    unknown = [name for name in renderer.split("+") if name not in known]
    if unknown:
        raise InvalidArgumentError(
            f"unknown plotly renderer(s) {unknown}: use one of {', '.join(sorted(known))}, joined with '+'"
        )
    pio.renderers.default = renderer
    _set_default_template(f"plotly_white+{TEMPLATE_NAME}")
    return renderer


def _set_default_template(name: str) -> None:
    """Make ``name`` plotly's default template without building it now.

    plotly's ``templates.default`` setter merges and validates the whole of
    plotly_white at once (most of a second in a fresh kernel), although only
    figures without a template of their own use it, and kvlab's figures name
    theirs. plotly reads the default from ``_default`` and merges it when such
    a figure is built, so the name is stored there, after checking that its
    parts are registered; if this plotly stores it elsewhere, the setter is used.
    """
    missing = [part for part in name.split("+") if part not in pio.templates]
    if missing:  # pragma: no cover - both parts are registered above
        raise InvalidArgumentError(f"unknown plotly template(s) {missing}")
    templates = pio.templates
    if hasattr(templates, "_default"):
        templates._default = name
        if templates.default == name:
            return
    templates.default = name  # pragma: no cover - another plotly layout: validate now


def in_notebook_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, VS Code, nbclient), where ``setup`` should run.

    A kernel has imported IPython before any user code runs, so when IPython
    is not loaded there is no kernel, and importing it (a second) is skipped.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
