"""One exception hierarchy for kvlab.

Every message says what was wrong and what to do about it. A call that raises
leaves the model exactly as it was before the call: models validate first and
mutate second.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


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


# ---------------------------------------------------------------- the shared argument checks
# Every public function checks its arguments with these, so one kind of value is refused the same way
# everywhere. They look at exact types (``type(x) is str``), never at a value's own ``__eq__``, so an
# object that claims to equal everything is refused, and they never call a user object's ``__repr__``
# without a fallback, so a value whose repr raises still gets a clear error.

MAX_TOKEN_ID = 2**31 - 1


@dataclass
class Limits:
    """Upper bounds on everything a user controls that sizes kvlab's memory or time.

    kvlab simulates caches in pure Python, so each bound is set far above what the lessons and a
    realistic deployment need, and far below what would exhaust a laptop: a refused value says the
    limit, and ``with raised_limits(num_blocks=...)`` lifts it for one deliberate, larger run.
    """

    num_blocks: int = 1 << 20  # blocks in one pool: 16M tokens at block size 16, more than any GPU holds
    block_size: int = 1 << 16  # tokens per block (vLLM's largest is 256; llama.cpp's ubatch 512)
    tokens: int = 1 << 22  # tokens in one request, prompt or pool (4,194,304: past any context window)
    total_tokens: int = 1 << 27  # tokens one simulation or scenario may process in all (134M)
    slots: int = 4096  # llama-server slots (-np) or parallel requests
    users: int = 1_000_000  # users in a traffic model
    turns: int = 10_000  # turns per user or conversation
    replicas: int = 4096  # replicas in a fleet
    count: int = 1 << 20  # items a generator draws (request lengths, random ops)
    mib: int = 1 << 20  # MiB of a simulated cache or file (1 TiB: simulated, never allocated)
    memory_mib: int = 4096  # MiB of real arrays kvlab allocates at once (slot-file KV, tensors)
    record_numbers: int = 1 << 26  # numbers in a full replay's records (~400 MB of JSON): past it, --changes
    ops: int = 1_000_000  # operations in one scenario
    scenario_bytes: int = 256 << 20  # bytes of one scenario file
    json_depth: int = 64  # nesting of a scenario's JSON
    int_digits: int = 20  # digits of one integer in a scenario (2**63 has 19)


LIMITS = Limits()


@contextmanager
def raised_limits(**limits: int) -> Iterator[Limits]:
    """Lift some of ``LIMITS`` for the duration of a ``with`` block (a larger run, deliberately)."""
    unknown = set(limits) - set(Limits.__dataclass_fields__)
    if unknown:
        raise InvalidArgumentError(
            f"unknown limit(s) {sorted(unknown)}: use {', '.join(Limits.__dataclass_fields__)}"
        )
    for name, value in limits.items():
        check_int(name, value, minimum=1)
    before = {name: getattr(LIMITS, name) for name in limits}
    for name, value in limits.items():
        setattr(LIMITS, name, value)
    try:
        yield LIMITS
    finally:
        for name, value in before.items():
            setattr(LIMITS, name, value)


def check_size(name: str, value: object, limit: str, *, minimum: int = 0) -> int:
    """``check_int`` with the upper bound ``LIMITS.<limit>``; the refusal says how to go beyond it."""
    bound = getattr(LIMITS, limit)
    value = check_int(name, value, minimum=minimum)
    if value > bound:
        raise InvalidArgumentError(
            f"{name} must be at most {bound:,} (kvlab's limit LIMITS.{limit}), got {brief(value)}; "
            f"for a deliberately larger run use kvlab.errors.raised_limits({limit}=...)"
        )
    return value


"""Token ids are 0 .. 2**31 - 1 in every model: a signed 32-bit id, as vLLM and llama.cpp store them."""


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so an error message stays one readable line.

    Never raises: a repr that fails, or an integer too long to print, is described by its type.
    """
    if type(value) is int and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        text = repr(value)
    except Exception:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object>"
    if not isinstance(text, str):
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: how many blocks of ``b`` hold ``a`` tokens (vLLM's ``cdiv``)."""
    return -(-a // b)


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool; numpy ints are converted) in [minimum, maximum].

    The one rule for floats: every float is refused, an integral one (``4.0``) too, with a message
    that says to pass an int, so a size is never silently truncated (``1.9`` is not 1).
    """
    if type(value) is not int:
        value = _as_int(name, value)
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {brief(value)}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum:,}, got {brief(value)}")
    return value


def _as_int(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__int__(value)  # an int subclass: keep only its plain value, whatever it overrides
    try:
        import numpy as np

        if isinstance(value, np.integer) and not isinstance(value, np.bool_):
            return int(value)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, float) and value.is_integer():
        raise InvalidArgumentError(f"{name} must be an integer: pass an int, not the float {value!r}")
    raise InvalidArgumentError(f"{name} must be an integer, got {brief(value)} ({type(value).__name__})")


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is exactly True or False (not 0/1, not a numpy bool)."""
    if type(value) is not bool:
        raise InvalidArgumentError(f"{name} must be True or False, got {brief(value)}")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...], *, what: str | None = None) -> str:
    """Return ``value`` if it is a ``str`` equal to one of ``choices``; compared by exact type and value."""
    if type(value) is str and value in choices:
        return value
    if isinstance(value, str):  # a str subclass: compare its plain text, never its own __eq__ or __str__
        plain = str.__str__(value)
        if plain in choices:
            return plain
    label = what or name
    raise InvalidArgumentError(f"unknown {label} {brief(value)}: {name} must be one of {', '.join(choices)}")


def check_id(name: str, value: object) -> str:
    """Return ``value`` if it is a non-empty ``str`` (a request or sequence id); a str subclass becomes its plain text."""
    if isinstance(value, str):
        plain = value if type(value) is str else str.__str__(value)
        if plain:
            return plain
    raise InvalidArgumentError(f"{name} must be a non-empty string, got {brief(value)}")


def check_optional_str(name: str, value: object, *, allow_empty: bool = True) -> str | None:
    """Return ``value`` if it is None or a ``str`` (non-empty unless ``allow_empty``), as plain text."""
    if value is None:
        return None
    if isinstance(value, str):
        plain = value if type(value) is str else str.__str__(value)
        if plain or allow_empty:
            return plain
    what = "a string" if allow_empty else "a non-empty string"
    raise InvalidArgumentError(f"{name} must be {what} or None, got {brief(value)}")


def check_tokens(name: str, tokens: object, *, allow_empty: bool = False, in_range: bool = True) -> list[int]:
    """Return ``tokens`` as a list of plain ints: the one token-id check of kvlab.

    Refuses strings, mappings, sets, floats, bools, ids outside 0..MAX_TOKEN_ID (the one range of
    token ids everywhere; ``in_range=False`` only for callers that pass other integers through this
    check) and more than ``LIMITS.tokens`` items (read lazily, so an endless iterator is refused too).
    """
    from collections.abc import Mapping, Set
    from itertools import islice

    if isinstance(tokens, (str, bytes, bytearray, Mapping, Set)) or not hasattr(tokens, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a list of integer token ids, got {type(tokens).__name__}")
    bound = LIMITS.tokens
    try:
        out = list(islice(tokens, bound + 1))  # type: ignore[call-overload]
    except Exception:  # an object whose iteration raises (a 0-d numpy array, a hostile __iter__)
        raise InvalidArgumentError(
            f"{name} must be a list of integer token ids, got {brief(tokens)} ({type(tokens).__name__})"
        ) from None
    if len(out) > bound:
        raise InvalidArgumentError(
            f"{name} holds more than {bound:,} tokens (kvlab's limit LIMITS.tokens); "
            "for a deliberately larger run use kvlab.errors.raised_limits(tokens=...)"
        )
    for i, t in enumerate(out):
        if type(t) is not int:
            try:
                out[i] = t = _as_int(f"{name}[{i}]", t)
            except InvalidArgumentError:
                raise InvalidArgumentError(
                    f"{name}[{i}] must be an integer token id, got {brief(t)}"
                ) from None
        if in_range and not 0 <= t <= MAX_TOKEN_ID:
            raise InvalidArgumentError(f"{name}[{i}] = {brief(t)} is not a token id: use 0..{MAX_TOKEN_ID}")
    if not out and not allow_empty:
        raise InvalidArgumentError(f"{name} is empty: give at least one token id")
    return out
