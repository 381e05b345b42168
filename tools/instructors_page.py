"""Regenerate docs/instructors.md (a shortcut for ``python -m kvlab grade --instructors-doc docs/instructors.md``).

    python tools/instructors_page.py           # rewrite docs/instructors.md
    python tools/instructors_page.py --check   # exit 1 if it is out of date

The page is rendered by ``kvlab.exercises.instructors.render`` from the exercise registry and the
course map; tests/exercises/test_grader_docs.py fails when the page differs from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "instructors.md"


def main(argv: list[str] | None = None) -> int:
    from kvlab.exercises.instructors import render

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the page is out of date"
    )
    args = parser.parse_args(argv)
    text = render()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if args.check:
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python tools/instructors_page.py")
            return 1
        return 0
    if current != text:
        PAGE.write_text(text, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
