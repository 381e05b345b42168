"""Reading what a user hands the server models: token lists of bounded length, and user callables.

``kvlab.errors.check_tokens`` turns any iterable into a list before it looks at it, so an endless
generator would never return. ``read_tokens`` reads at most one item past the caller's bound (the
slot's context, ``LIMITS.tokens``) and refuses the rest unread. ``call_user`` runs a user's callable
(a ``reply`` function, a layout's ``build``, a history policy, a chat ``clock``) and turns whatever
it raises into kvlab's ``InvalidArgumentError``, chained ``from`` the original, naming what failed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_tokens


def read_tokens(
    name: str,
    value: object,
    *,
    limit: int | None = None,
    allow_empty: bool = False,
    in_range: bool = True,
) -> list[int]:
    """``check_tokens(name, value, in_range=True)`` that reads at most ``limit`` + 1 items.

    ``limit`` defaults to ``LIMITS.tokens``, the most tokens one request may hold. Ids are checked
    against 0..MAX_TOKEN_ID unless ``in_range`` is False (positions, sizes).
    """
    bound = LIMITS.tokens if limit is None else limit
    if isinstance(value, (str, bytes, bytearray)) or not hasattr(value, "__iter__"):
        return check_tokens(name, value, allow_empty=allow_empty, in_range=in_range)  # refuses it
    if type(value) not in (list, tuple):
        try:
            value = list(itertools.islice(iter(value), bound + 1))  # type: ignore[call-overload]
        except Exception as exc:  # a user object whose __iter__ or __next__ raises
            raise InvalidArgumentError(
                f"{name} must be a list of integer token ids; reading it raised {type(exc).__name__}: {brief(exc)}"
            ) from exc
    if len(value) > bound:  # type: ignore[arg-type]
        raise InvalidArgumentError(
            f"{name} has more than {bound:,} items (the most this call accepts); shorten it"
        )
    return check_tokens(name, value, allow_empty=allow_empty, in_range=in_range)


def call_user(what: str, fn: Callable[..., Any], *args: object) -> Any:
    """``fn(*args)``; anything it raises becomes an ``InvalidArgumentError`` that says ``what`` failed."""
    try:
        return fn(*args)
    except Exception as exc:
        raise InvalidArgumentError(f"{what} raised {type(exc).__name__}: {brief(exc, 120)}") from exc
