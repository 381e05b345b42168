"""Render every figure and every animation frame the course notebooks show to PNG, to look at them.

    python tools/render_figures.py                 # every notebook, into renders/figures/
    python tools/render_figures.py 06 08           # notebooks 06 and 08 only
    python tools/render_figures.py --frames ends   # of each animation only the first, middle and last frame
    python tools/render_figures.py --engine kaleido

The figures are the notebooks' own: each notebook's code cells run in order, in this process, with
the working directory notebooks/, and every plotly figure a cell shows (its last expression, or
``fig.show()``) is kept. So a figure is built by the same kvlab.views and kvlab.lessons calls the
notebook makes, and a changed notebook needs no change here. Cells that start a live fleet skip
themselves (KVLAB_SKIP_LIVE=1); a cell that fails is reported and the notebook's later cells still run.

Each figure becomes renders/figures/NN/KK_name.png; an animation becomes one PNG per frame
(KK_name_fFF.png). The default engine, ``browser``, draws in Chromium through Playwright with the
plotly.js that plotly.py ships and steps an animation with ``Plotly.animate``, frame after frame,
the way its slider does, so what plotly.js keeps or drops between frames shows in the PNGs. The
``kaleido`` engine draws each frame as a still figure (the frame's data on the figure's layout).
Both draw at plotly's default 700 px width, the size a notebook shows; ``--width`` changes it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "renders" / "figures"
WIDTH = 700  # plotly's default figure width, what a notebook output shows


@dataclass
class Shown:
    """One figure a notebook shows: where it came from and its plotly JSON."""

    notebook: str
    cell: str
    name: str
    figure: dict[str, Any]

    @property
    def frames(self) -> list[dict[str, Any]]:
        return list(self.figure.get("frames") or [])


@dataclass
class NotebookRun:
    notebook: str
    shown: list[Shown] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def notebook_paths(selectors: list[str]) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if selectors:
        paths = [p for p in paths if any(p.name.startswith(s) or p.stem == s for s in selectors)]
    return paths


def _slug(text: str, limit: int = 40) -> str:
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:limit] or "figure"


def _title(figure: dict[str, Any]) -> str:
    """The head of a figure's title (its bold part, or its first line): what names its PNG."""
    title = figure.get("layout", {}).get("title", {})
    text = str(title.get("text", "") if isinstance(title, dict) else title)
    return text.split("</b>")[0] if "</b>" in text else text.split("<br>")[0]


def _split_last(source: str) -> tuple[str, str | None]:
    """A cell's code without its last expression, and that expression (what Jupyter would display)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, None
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return source, None
    last = tree.body.pop()
    return ast.unparse(tree), ast.unparse(last)


def run_notebook(path: Path) -> NotebookRun:
    """Run ``path``'s code cells in a fresh namespace and keep every plotly figure they show."""
    import nbformat
    import plotly.basedatatypes as pbt

    run = NotebookRun(path.stem)
    nb = nbformat.read(path, as_version=4)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    cell_id = ""

    def keep(figure: Any) -> None:
        spec = json.loads(figure.to_json())
        name = f"{len(run.shown):02d}_{_slug(_title(spec))}"
        run.shown.append(Shown(path.stem, cell_id, name, spec))

    original_show = pbt.BaseFigure.show
    pbt.BaseFigure.show = lambda self, *a, **k: keep(self)  # type: ignore[method-assign]
    start, cwd = time.perf_counter(), os.getcwd()
    os.chdir(NOTEBOOKS)
    try:
        for cell in nb.cells:
            if cell.cell_type != "code" or cell.source.lstrip().startswith(("%", "!")):
                continue
            cell_id = str(cell.get("id", ""))
            body, last = _split_last(cell.source)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(body, f"{path.stem}:{cell_id}", "exec"), namespace)
                    value = eval(compile(last, f"{path.stem}:{cell_id}", "eval"), namespace) if last else None
            except Exception as exc:  # noqa: BLE001 - report the cell and go on, as a reader would
                run.errors.append(f"cell {cell_id}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            if isinstance(value, pbt.BaseFigure):
                keep(value)
    finally:
        os.chdir(cwd)
        pbt.BaseFigure.show = original_show  # type: ignore[method-assign]
        _close_servers(namespace)
    run.seconds = time.perf_counter() - start
    return run


def _close_servers(namespace: dict[str, Any]) -> None:
    """Stop what a notebook started and did not stop (a run whose last cells failed)."""
    for value in namespace.values():
        stop = getattr(value, "stop", None)
        if callable(stop) and type(value).__name__ in ("StartedServer", "ServerHandle", "RunningServer"):
            with contextlib.suppress(Exception):
                stop()


def pick_frames(count: int, which: str) -> list[int]:
    if which == "all" or count <= 3:
        return list(range(count))
    return sorted({0, count // 2, count - 1})


def frame_figure(figure: dict[str, Any], index: int) -> dict[str, Any]:
    """Frame ``index`` of an animation as a still figure: its data on the layout, the slider at it."""
    frame = figure["frames"][index]
    layout = dict(figure["layout"])
    for key, value in (frame.get("layout") or {}).items():
        layout[key] = dict(layout.get(key) or {}, **value) if isinstance(value, dict) else value
    if layout.get("sliders"):
        layout["sliders"] = [dict(layout["sliders"][0], active=index), *layout["sliders"][1:]]
    return {"data": frame.get("data", figure["data"]), "layout": layout}


def render_kaleido(jobs: list[tuple[Shown, Path, str]], width: int) -> None:
    import plotly.io as pio

    figures, paths = [], []
    for shown, out, which in jobs:
        if not shown.frames:
            figures.append(shown.figure)
            paths.append(out / f"{shown.name}.png")
            continue
        for i in pick_frames(len(shown.frames), which):
            figures.append(frame_figure(shown.figure, i))
            paths.append(out / f"{shown.name}_f{i:02d}.png")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    pio.write_images(figures, paths, width=width, scale=1)


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><script>{plotly}</script>
<style>body{{margin:0;background:white}} #gd{{width:{width}px}}</style></head><body><div id="gd"></div></body></html>"""

_STEP = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}


def render_browser(jobs: list[tuple[Shown, Path, str]], width: int) -> None:
    """Draw in Chromium; an animation is stepped frame by frame with Plotly.animate, as its slider does."""
    from playwright.sync_api import sync_playwright

    plotly_js = (Path(__import__("plotly").__file__).parent / "package_data" / "plotly.min.js").read_text()
    page_file = ROOT / "renders" / "_page.html"
    page_file.parent.mkdir(parents=True, exist_ok=True)
    page_file.write_text(_PAGE.format(plotly=plotly_js, width=width))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 800})
        page.goto(page_file.as_uri())
        for shown, out, which in jobs:
            out.mkdir(parents=True, exist_ok=True)
            spec = shown.figure
            page.evaluate(
                """async ([data, layout, frames]) => {
                     const gd = document.getElementById('gd'); Plotly.purge(gd);
                     await Plotly.newPlot(gd, data, layout, {displayModeBar: false});
                     if (frames.length) await Plotly.addFrames(gd, frames); }""",
                [spec["data"], spec["layout"], shown.frames],
            )
            div = page.locator("#gd")
            if not shown.frames:
                div.screenshot(path=str(out / f"{shown.name}.png"))
                continue
            wanted = set(pick_frames(len(shown.frames), which))
            for i, frame in enumerate(shown.frames):  # every frame in turn, as the slider steps
                page.evaluate(
                    """async ([name, i, args]) => { const gd = document.getElementById('gd');
                         await Plotly.animate(gd, [name], args);
                         if (gd.layout.sliders) await Plotly.relayout(gd, {'sliders[0].active': i}); }""",
                    [frame["name"], i, _STEP],
                )
                if i in wanted:
                    div.screenshot(path=str(out / f"{shown.name}_f{i:02d}.png"))
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="numbers (06) or names of notebooks; default all")
    parser.add_argument("--frames", choices=("all", "ends"), default="all",
                        help="every frame of an animation, or its first, middle and last")  # fmt: skip
    parser.add_argument("--engine", choices=("browser", "kaleido"), default="browser")
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    os.environ.setdefault("KVLAB_SKIP_LIVE", "1")
    os.environ.setdefault("PLOTLY_RENDERER", "json")
    sys.path.insert(0, str(ROOT))
    jobs: list[tuple[Shown, Path, str]] = []
    failed = False
    for path in notebook_paths(args.notebooks):
        run = run_notebook(path)
        frames = sum(len(s.frames) for s in run.shown)
        print(f"{run.notebook}: {len(run.shown)} figures ({frames} animation frames) in {run.seconds:.1f} s")
        for error in run.errors:
            failed = True
            print(f"  {error}")
        out = args.out / path.stem[:2]
        if out.exists():
            shutil.rmtree(out)
        jobs += [(s, out, args.frames) for s in run.shown]
    engine = args.engine
    if engine == "browser" and not (shutil.which("chromium") or shutil.which("chromium-browser")):
        print("Chromium not found: drawing with kaleido instead")
        engine = "kaleido"
    start = time.perf_counter()
    (render_browser if engine == "browser" else render_kaleido)(jobs, args.width)
    pngs = sum(1 for _ in args.out.rglob("*.png"))
    print(f"{pngs} PNG files under {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}"
          f" ({engine}, {time.perf_counter() - start:.1f} s)")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
