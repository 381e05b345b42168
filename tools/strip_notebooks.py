"""Bring course notebooks to their committed form: no outputs, no execution counts, no widget state.

    python tools/strip_notebooks.py            # rewrite notebooks/*.ipynb in place
    python tools/strip_notebooks.py --check    # list notebooks that need stripping; exit 1 if any

Cell metadata is kept (the {"kvlab": {"exercise": ...}} marks live there)
except what Jupyter records about a run ("execution", "ExecuteTime",
"scrolled", "collapsed"). The notebook's metadata becomes the python3
kernelspec and a bare language_info, so a run on another machine changes
nothing. The output is what tests/test_notebook_storage.py expects, byte for byte.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.corpus.words import generate_corpus_id

ROOT = Path(__file__).resolve().parents[1]
RUN_KEYS = ("execution", "ExecuteTime", "scrolled", "collapsed")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def stripped(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` in committed form."""
    nb = nbformat.from_dict(nb)  # deep copy
    keep = {k: v for k, v in nb.metadata.items() if k not in ("widgets", "kernelspec", "language_info")}
    nb.metadata = nbformat.from_dict({"kernelspec": KERNELSPEC, "language_info": {"name": "python"}, **keep})
    for cell in nb.cells:
        for key in RUN_KEYS:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
        if "attachments" in cell and not cell.attachments:
            del cell["attachments"]
        if "id" not in cell:  # nbformat 4.5 wants cell ids; JupyterLab keeps them stable
            cell.id = generate_corpus_id()
    nb.nbformat, nb.nbformat_minor = 4, max(nb.nbformat_minor, 5)
    return nb


def committed_text(nb: nbformat.NotebookNode) -> str:
    """The exact file content of ``nb`` in committed form."""
    return nbformat.writes(stripped(nb)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any needs stripping")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb"))
    dirty = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        want = committed_text(nbformat.reads(text, as_version=4))
        if text != want:
            dirty.append(path)
            if not args.check:
                path.write_text(want, encoding="utf-8")
    verb = "needs stripping" if args.check else "stripped"
    for path in dirty:
        print(f"{verb}: {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
