"""What every ``python -m kvlab`` command shares on its command line: one-line errors and strict integers.

A bad command line prints one line, ``kvlab COMMAND: what was wrong (see python -m kvlab COMMAND
--help)``, and exits with status 2. Integers are read as kvlab prints them (``kvlab.errors.check_int_text``:
ASCII digits with an optional sign, at most ``LIMITS.int_digits`` of them), so ``1_000`` or another
script's digits are refused rather than read as some other number.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from kvlab.errors import LIMITS, InvalidArgumentError, check_int_text


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error is one clear line and status 2, without the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("python -m ")
        print(f"{command}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def whole_number(text: str) -> int:
    """An argparse type: an integer written in ASCII digits."""
    try:
        return check_int_text("a whole number", text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(
            "expected a whole number: " + str(exc).removeprefix("a whole number ")
        ) from None


def at_least(minimum: int, limit: str | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` and at most ``LIMITS.<limit>``."""

    def parse(text: str) -> int:
        value = whole_number(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if limit is not None and value > getattr(LIMITS, limit):
            raise argparse.ArgumentTypeError(
                f"must be at most {getattr(LIMITS, limit):,} (LIMITS.{limit}), got {value}"
            )
        return value

    return parse
