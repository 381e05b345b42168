"""One exception hierarchy for kvlab.

Every message says what was wrong and what to do about it. A call that raises
leaves the model exactly as it was before the call: models validate first and
mutate second.
"""

from __future__ import annotations


class KvlabError(Exception):
    """Base class of every error kvlab raises on purpose."""


class InvalidArgumentError(KvlabError, ValueError):
    """An argument has the wrong type, range or shape."""


class UnknownRequestError(KvlabError, KeyError):
    """A request (sequence) id that the model does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateRequestError(KvlabError, ValueError):
    """A request id that the model already holds."""


class OutOfBlocksError(KvlabError):
    """The pool cannot satisfy an allocation; nothing was changed."""


class SlotBusyError(KvlabError):
    """A llama-server slot (or every slot) is processing a request; llama-server would defer the task."""


class SlotFileError(KvlabError, ValueError):
    """A saved slot file is missing, truncated, corrupted or from another model; nothing was loaded."""


class ScenarioError(KvlabError):
    """A scenario (a list of ops) is malformed; ``index`` is the op's position, or None."""

    def __init__(self, message: str, index: int | None = None) -> None:
        self.index = index
        prefix = f"op {index}: " if index is not None else ""
        super().__init__(prefix + message)


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) >= ``minimum``; raise a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_tokens(name: str, tokens: object, *, allow_empty: bool = False) -> list[int]:
    """Return ``tokens`` as a list of ints; reject strings, floats, bools and (unless allowed) empty lists."""
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a list of integer token ids, got {type(tokens).__name__}")
    out = list(tokens)  # type: ignore[call-overload]
    for i, t in enumerate(out):
        if isinstance(t, bool) or not isinstance(t, int):
            # numpy integers are fine; convert them
            try:
                import numpy as np

                if isinstance(t, np.integer):
                    out[i] = int(t)
                    continue
            except ImportError:  # pragma: no cover
                pass
            raise InvalidArgumentError(f"{name}[{i}] must be an integer token id, got {t!r}")
    if not out and not allow_empty:
        raise InvalidArgumentError(f"{name} is empty: give at least one token id")
    return out
