"""Execute every course notebook and export the course as a static HTML site.

    python tools/build_site.py [--out _site] [--jobs 2] [--only 07_lru_eviction]

Each notebook runs top to bottom in a fresh kernel (cwd = notebooks/), then is
exported with nbconvert's lab template. plotly.js is embedded in the pages, so
figures and animations work offline; widget state is embedded where the
kernel produced it. An index page lists the notebooks in course order.
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

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


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


def build_one(path: Path, out: Path, timeout: int) -> tuple[str, str, float]:
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    start = time.perf_counter()
    nb = nbformat.read(path, as_version=4)
    # 'notebook' inlines plotly.js once per page; the mimetype keeps JupyterLab's renderer happy too.
    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype+notebook"
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        store_widget_state=True,
    )
    client.execute()
    for cell in nb.cells:  # links between notebooks point at the exported pages
        if cell.cell_type == "markdown":
            cell.source = re.sub(r"\((\d\d_[a-z0-9_]+)\.ipynb\)", r"(\1.html)", cell.source)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
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
  <p>The executed course, in order. Figures and animations work offline.</p>
  <ol start="0">
{items}
  </ol>
</body></html>
""",
        encoding="utf-8",
    )


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
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        pages = list(pool.map(build_one, paths, [out] * len(paths), [args.timeout] * len(paths)))
    write_index(out, pages)
    for stem, _, seconds in pages:
        print(f"{stem:<36} {seconds:6.1f} s")
    print(f"wrote {len(pages)} pages and index.html to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
