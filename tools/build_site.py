"""Execute every course notebook and export the course as a static HTML site that works offline.

    python tools/build_site.py [--out _site] [--jobs 2] [--only 07_lru_eviction]

Each notebook runs top to bottom in a fresh kernel (cwd = notebooks/), then is
exported with nbconvert's lab template. The site holds plotly.js once, as
``plotly.min.js`` beside the pages, and every page loads it from there: no page
inlines it and none needs the network. No widget state is saved: a Stepper or a
Playground shows the still copy its display bundle carries (kvlab.views.live),
so a page is as light as its figures. An index page lists the notebooks in
course order.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")
PLOTLY_FILE = "plotly.min.js"
#: The lab template, with plotly.js from the shared file in place of require.js and MathJax from a CDN (the
#: course has no TeX, and neither loads offline).
SITE_TEMPLATE = f"""{{%- extends 'index.html.j2' -%}}
{{%- block html_head_js_requirejs -%}}
<script>window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script>
<script src="{PLOTLY_FILE}"></script>
{{%- endblock html_head_js_requirejs -%}}
{{%- block html_head_js_mathjax -%}}{{%- endblock html_head_js_mathjax -%}}
"""
#: Mime types a static page never shows: the live widget (no state is saved) and plotly's JSON copy (the page
#: draws the HTML copy of the same figure).
UNSHOWN = ("application/vnd.jupyter.widget-view+json", "application/vnd.plotly.v1+json")
#: plotly's HTML copy of a figure loads MathJax from a CDN; kvlab's figures use no TeX, so the site drops it.
MATHJAX_TAG = re.compile(r'\s*<script src="https://cdnjs\.cloudflare\.com/ajax/libs/mathjax/[^"]*"></script>')


def course_notebooks(only: list[str] | None = None) -> list[Path]:
    paths = sorted(p for p in NOTEBOOKS.glob("*.ipynb") if NAME.match(p.name))
    if only:
        wanted = {o.removesuffix(".ipynb") for o in only}
        paths = [p for p in paths if p.stem in wanted or p.stem[:2] in wanted]
    return paths


def title_of(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "untitled"


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def site_form(nb: Any, plotly_source: str) -> Any:
    """``nb`` as its page shows it: plotly.js and unshown copies taken out of the outputs, links to pages.

    The kernel's ``notebook`` renderer writes plotly.js into the first figure's cell; that output goes,
    since every page loads the shared file instead. Raises ValueError if plotly.js is left in an output
    (a kernel with another plotly would inline a copy this build does not recognise).
    """
    for cell in nb.cells:
        if cell.cell_type == "markdown":  # links between notebooks point at the exported pages
            cell.source = re.sub(r"\((\d\d_[a-z0-9_]+)\.ipynb\)", r"(\1.html)", cell.source)
            continue
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data is None:
                kept.append(output)
                continue
            page_html = data.get("text/html")
            if isinstance(page_html, str) and plotly_source in page_html:
                continue  # the inlined plotly.js
            for mime in UNSHOWN:
                if mime in data and len(data) > 1:
                    del data[mime]
            if isinstance(page_html, str):
                data["text/html"] = MATHJAX_TAG.sub("", page_html)
                if len(page_html) > 1_000_000 and "plotly.js v" in page_html[:2000]:
                    raise ValueError("an output inlines a plotly.js this build does not recognise")
            kept.append(output)
        cell.outputs = kept
    nb.metadata.pop("widgets", None)
    return nb


def site_exporter() -> Any:
    """nbconvert's lab HTML exporter with the site's head (see SITE_TEMPLATE)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(
        template_name="lab",
        extra_loaders=[DictLoader({"kvlab_site.html.j2": SITE_TEMPLATE})],
        template_file="kvlab_site.html.j2",
    )


def build_one(path: Path, out: Path, timeout: int) -> tuple[str, str, float]:
    import nbformat
    from nbclient import NotebookClient

    start = time.perf_counter()
    nb = nbformat.read(path, as_version=4)
    # the mimetype is what JupyterLab draws; 'notebook' adds the HTML copy a page draws (and inlines plotly.js
    # once, which site_form takes out again)
    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype+notebook"
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        store_widget_state=False,
    )
    client.execute()
    site_form(nb, plotly_js())
    body, _ = site_exporter().from_notebook_node(nb)
    (out / f"{path.stem}.html").write_text(body, encoding="utf-8")
    return path.stem, title_of(nb), time.perf_counter() - start


def write_index(out: Path, pages: list[tuple[str, str, float]]) -> None:
    items = "\n".join(
        f'    <li><a href="{stem}.html">{html.escape(stem[:2])} — {html.escape(title)}</a></li>'
        for stem, title, _ in pages
    )
    (out / "index.html").write_text(
        f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvlab — the course</title>
<style>body{{font-family:system-ui,sans-serif;max-width:46rem;margin:3rem auto;line-height:1.6}}</style></head>
<body>
  <h1>kvlab: paged KV cache and prefix caching</h1>
  <p>The executed course, in order. Figures and animations work offline. The live widgets (steppers and
  playgrounds) need a running kernel: here each shows a still copy; open the notebook in JupyterLab or on
  Binder to use them.</p>
  <ol start="0">
{items}
  </ol>
</body></html>
""",
        encoding="utf-8",
    )


def site_size(out: Path) -> int:
    """Bytes of every file under ``out``."""
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "_site"), help="output folder (default: _site)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default: 2)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    parser.add_argument("--only", nargs="*", help="build only these notebooks (NN or NN_slug)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = course_notebooks(args.only)
    if not paths:
        print("build_site: no notebooks matched", file=sys.stderr)
        return 2
    (out / PLOTLY_FILE).write_text(plotly_js(), encoding="utf-8")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        pages = list(pool.map(build_one, paths, [out] * len(paths), [args.timeout] * len(paths)))
    write_index(out, pages)
    for stem, _, seconds in pages:
        size = (out / f"{stem}.html").stat().st_size
        print(f"{stem:<36} {seconds:6.1f} s  {size / 1e6:6.2f} MB")
    print(
        f"wrote {len(pages)} pages, index.html and {PLOTLY_FILE} to {out}: {site_size(out) / 1e6:.1f} MB in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
