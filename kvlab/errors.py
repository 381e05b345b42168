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
        if type(index) is not int:  # a hostile index still gives a readable error, never a second one
            index = (
                int.__int__(index)
                if issubclass(type(index), int) and not issubclass(type(index), bool)
                else None
            )
        self.index = index
        prefix = f"op {index}: " if index is not None else ""
        super().__init__(prefix + _label(message))


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
    drawn_blocks: int = 1 << 14  # blocks a figure or the Playground draws, a cell each: 512 rows of 32 (~3 s)
    frames: int = 1000  # frames one animation draws, a full figure each (~6 ms apiece: 1,000 take ~6 s)
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


def _label(name: object) -> str:
    """An argument's name (or a message) as plain text for an error message; never raises.

    The checks below are public, so even the name they are given may be hostile: anything but a
    plain ``str`` is shown through ``brief``.
    """
    if type(name) is str:
        return name
    if issubclass(type(name), str):
        return str.__str__(name)
    return brief(name)


def _limit(limit: object) -> tuple[str, int]:
    """``(name, LIMITS.<name>)`` for one of ``Limits``' fields, by exact name."""
    if type(limit) is not str:
        limit = str.__str__(limit) if issubclass(type(limit), str) else None
    if limit not in Limits.__dataclass_fields__:
        raise InvalidArgumentError(
            f"unknown limit {brief(limit)}: use one of {', '.join(Limits.__dataclass_fields__)}"
        )
    return limit, getattr(LIMITS, limit)


def check_size(name: str, value: object, limit: str, *, minimum: int = 0) -> int:
    """``check_int`` with the upper bound ``LIMITS.<limit>``; the refusal says how to go beyond it."""
    limit, bound = _limit(limit)
    name = _label(name)
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
    if type(limit) is not int or limit < 8:
        limit = 60
    if type(value) is int and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:  # a str subclass is shown as its plain text, whatever its own __repr__ does
        text = str.__repr__(value) if issubclass(type(value), str) else repr(value)
    except Exception:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object>"
    if type(text) is not str:  # a __repr__ that returns something else, or a str subclass of its own
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: how many blocks of ``b`` hold ``a`` tokens (vLLM's ``cdiv``)."""
    if type(a) is not int or type(b) is not int or a < 0 or b < 1:
        a, b = check_int("a", a, minimum=0), check_int("b", b, minimum=1)
    return -(-a // b)


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool; numpy ints are converted) in [minimum, maximum].

    The one rule for floats: every float is refused, an integral one (``4.0``) too, with a message
    that says to pass an int, so a size is never silently truncated (``1.9`` is not 1).
    """
    if type(name) is not str:
        name = _label(name)
    if type(value) is not int:
        value = _as_int(name, value)
    if minimum is not None and type(minimum) is not int:
        minimum = check_int("minimum", minimum)
    if maximum is not None and type(maximum) is not int:
        maximum = check_int("maximum", maximum)
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {brief(value)}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum:,}, got {brief(value)}")
    return value


def _as_int(name: str, value: object) -> int:
    if issubclass(type(value), int) and not issubclass(type(value), bool):
        return int.__int__(value)  # an int subclass: keep only its plain value, whatever it overrides
    try:
        import numpy as np

        if issubclass(type(value), np.integer) and not issubclass(type(value), np.bool_):
            return int(
                np.generic.item(value)
            )  # its stored value: numpy's own method, not a subclass's __int__
    except ImportError:  # pragma: no cover
        pass
    if issubclass(type(value), float) and float.is_integer(value):
        raise InvalidArgumentError(
            f"{name} must be an integer: pass an int, not the float {float.__repr__(value)}"
        )
    raise InvalidArgumentError(f"{name} must be an integer, got {brief(value)} ({type(value).__name__})")


def check_int_text(name: str, text: object) -> int:
    """The integer a user wrote as text (a command-line option): ASCII digits with an optional sign.

    Python's ``int`` also reads ``"1_000"``, ``" 5\\n"`` and other scripts' digits (``"١٢"`` is 12);
    kvlab reads only what it prints, so a typo is refused rather than read as another number. At
    most ``LIMITS.int_digits`` digits, so a huge literal is refused before it is converted.
    """
    import re

    name, text = _label(name), check_text(name, text)
    match = re.fullmatch(r"[ \t]*([+-]?)([0-9]+)[ \t]*", text, re.ASCII)
    if match is None:
        raise InvalidArgumentError(f"{name} must be an integer written in digits 0-9, got {brief(text, 30)}")
    if len(match.group(2)) > LIMITS.int_digits:
        raise InvalidArgumentError(
            f"{name} must be an integer of at most {LIMITS.int_digits} digits, got {brief(text, 30)}"
        )
    return int(match.group(1) + match.group(2))


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is exactly True or False (not 0/1, not a numpy bool)."""
    if type(value) is not bool:
        name = _label(name)
        raise InvalidArgumentError(f"{name} must be True or False, got {brief(value)}")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...], *, what: str | None = None) -> str:
    """Return ``value`` if it is a ``str`` equal to one of ``choices``; compared by exact type and value."""
    if type(choices) is not tuple or not all(type(c) is str for c in choices):
        choices = _choices(choices)
    if type(value) is str and value in choices:
        return value
    if issubclass(
        type(value), str
    ):  # a str subclass: compare its plain text, never its own __eq__ or __str__
        plain = str.__str__(value)
        if plain in choices:
            return plain
    name = _label(name)
    label = name if what is None else _label(what)
    raise InvalidArgumentError(f"unknown {label} {brief(value)}: {name} must be one of {', '.join(choices)}")


def _choices(choices: object) -> tuple[str, ...]:
    """A caller's choices as a tuple of plain strings (compared by value, never by their own ``__eq__``)."""
    items = check_items("choices", choices, what="a tuple of strings")
    if not all(issubclass(type(c), str) for c in items):
        raise InvalidArgumentError(f"choices must be strings, got {brief(items)}")
    return tuple(str.__str__(c) for c in items)


def check_text(name: str, value: object, *, allow_empty: bool = True) -> str:
    """Return ``value`` as plain ``str`` text: the one check of kvlab for a name, label or title.

    A ``str`` subclass becomes a copy of its plain text (``str.__str__``), so none of its own methods
    (a ``__len__``, ``__iter__``, ``__getitem__``, ``__hash__``, ``__eq__`` or ``__format__`` that
    raises or lies) runs afterwards. Anything else, ``bytes`` and numpy strings included, is refused.
    """
    if type(name) is not str:
        name = _label(name)
    allow_empty = check_bool("allow_empty", allow_empty)
    if type(value) is not str:
        if not issubclass(type(value), str):
            what = "a string" if allow_empty else "a non-empty string"
            raise InvalidArgumentError(f"{name} must be {what}, got {brief(value)} ({type(value).__name__})")
        value = str.__str__(value)  # an exact str copy of a subclass's text
    if not value and not allow_empty:
        raise InvalidArgumentError(f"{name} must be a non-empty string, got ''")
    return value


def check_id(name: str, value: object) -> str:
    """Return ``value`` if it is a non-empty ``str`` (a request or sequence id), as plain text (``check_text``)."""
    name = _label(name)
    if issubclass(type(value), str):
        plain = check_text(name, value)
        if plain:
            return plain
    raise InvalidArgumentError(f"{name} must be a non-empty string, got {brief(value)}")


def check_optional_str(name: str, value: object, *, allow_empty: bool = True) -> str | None:
    """Return ``value`` if it is None or a ``str`` (non-empty unless ``allow_empty``), as plain text."""
    name, allow_empty = _label(name), check_bool("allow_empty", allow_empty)
    if value is None:
        return None
    if issubclass(type(value), str):
        plain = check_text(name, value)
        if plain or allow_empty:
            return plain
    what = "a string" if allow_empty else "a non-empty string"
    raise InvalidArgumentError(f"{name} must be {what} or None, got {brief(value)}")


def check_items(name: str, value: object, limit: str = "count", *, what: str = "a list") -> list[object]:
    """Return the items of a list, tuple or other iterable as a plain list, at most ``LIMITS.<limit>`` of them.

    Strings, bytes, mappings and sets are refused (they iterate, but are not sequences of items); an
    iterable whose iteration raises (a 0-d numpy array, a hostile ``__iter__``) or never ends is refused
    with kvlab's error. Only ``iter`` and ``next`` are called: never a ``__len__`` or ``__getitem__``.
    """
    from collections.abc import Mapping, Set
    from itertools import islice

    name, what = _label(name), _label(what)
    limit, bound = _limit(limit)
    if isinstance(value, (str, bytes, bytearray, Mapping, Set)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"{name} must be {what}, got {brief(value)} ({type(value).__name__})")
    try:
        items = list(islice(value, bound + 1))  # type: ignore[call-overload]
    except Exception:
        raise InvalidArgumentError(
            f"{name} must be {what}, got {brief(value)} ({type(value).__name__}), whose iteration failed"
        ) from None
    if len(items) > bound:
        raise InvalidArgumentError(
            f"{name} holds more than {bound:,} items (kvlab's limit LIMITS.{limit}); "
            f"for a deliberately larger run use kvlab.errors.raised_limits({limit}=...)"
        )
    return items


def check_tokens(name: str, tokens: object, *, allow_empty: bool = False, in_range: bool = True) -> list[int]:
    """Return ``tokens`` as a list of plain ints: the one token-id check of kvlab.

    Refuses strings, mappings, sets, floats, bools, ids outside 0..MAX_TOKEN_ID (the one range of
    token ids everywhere; ``in_range=False`` only for callers that pass other integers through this
    check) and more than ``LIMITS.tokens`` items (read lazily, so an endless iterator is refused too).
    """
    from collections.abc import Mapping, Set
    from itertools import islice

    if type(name) is not str:
        name = _label(name)
    if type(allow_empty) is not bool or type(in_range) is not bool:
        allow_empty, in_range = check_bool("allow_empty", allow_empty), check_bool("in_range", in_range)
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
