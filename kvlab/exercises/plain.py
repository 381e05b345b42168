"""Answers as plain data: the one converter every check and the grader trust.

``encode`` turns whatever a student hands in into JSON-able data made of exact
built-in types, and ``decode`` turns that back into Python values. Between the
two no student code runs: ``encode`` reads ints, floats, strings, lists,
tuples, dicts and sets through the built-in types' own slots
(``int.__int__``, ``list.__getitem__``, ``dict.items`` ...), never through a
method the student's class could override, so an ``int`` subclass whose ``==``
always says True arrives as the plain int it holds, and a broken ``__repr__``
is never called. It walks with an explicit stack (no recursion) and stops at
``MAX_DEPTH`` levels, ``MAX_ITEMS`` values and ``MAX_INT_BITS`` bits per
integer, so deep nesting or ``10**5000`` cannot crash it; what it cannot
convert becomes an ``Opaque`` value that equals nothing.

The grader sends answers out of the student's kernel (and out of the process
that re-runs a student's function) as ``encode``'s JSON, so only data crosses
the boundary, never an object.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # deeper than any answer needs; a list nested 100,000 deep is refused, not recursed into
MAX_ITEMS = 2_000_000  # values in one answer (a 13.3 policy returns ~20,000 tokens per turn)
MAX_INT_BITS = 14_000  # about 4,200 digits: below Python's 4,300-digit str() limit, so any kept int prints
MAX_TEXT = 1_000_000  # characters of one string, bytes of one bytes value

_SAFE = 2**53  # ints that JSON readers keep exact
TAG = "§kvlab"  # the key of a tagged value; a student dict with this key is carried as pairs, never confused


@dataclass(frozen=True)
class Opaque:
    """Something that could not be converted: it keeps only why, and equals nothing but itself."""

    reason: str

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<{self.reason}>"


def _type_name(value: Any) -> str:
    """The real name of ``value``'s type, read without running anything the student defined."""
    try:
        name = type.__dict__["__name__"].__get__(type(value))
        return name if type(name) is str else "object"
    except Exception:
        return "object"


def _is(value: Any, cls: type | tuple[type, ...]) -> bool:
    """``isinstance`` by the real type: a ``__class__`` property of the student's cannot answer for it."""
    return issubclass(type(value), cls)


def _tag(kind: str, data: Any = None) -> dict[str, Any]:
    return {TAG: kind, "v": data}


def _numpy_item(value: Any) -> tuple[bool, Any]:
    """(True, plain value) for a numpy scalar or array; numpy is only looked at if already imported."""
    np = sys.modules.get("numpy")
    if np is None:
        return False, None
    try:
        if _is(value, np.ndarray):
            if np.ndarray.__dict__["size"].__get__(value) > MAX_ITEMS:
                return True, Opaque("an array too large to check")
            return True, np.ndarray.tolist(value)
        if _is(value, np.generic):
            return True, np.generic.item(value)
    except Exception:
        return True, Opaque(f"a numpy {_type_name(value)} that could not be read")
    return False, None


def _tensor(value: Any) -> tuple[bool, Any]:
    """(True, tagged tensor) for a torch tensor; torch is only looked at if already imported."""
    torch = sys.modules.get("torch")
    if torch is None or not _is(value, torch.Tensor):
        return False, None
    try:
        t = torch.Tensor.detach(value).cpu()
        if t.numel() > MAX_ITEMS:
            return True, Opaque("a tensor too large to check")
        return True, ("tensor", str(t.dtype).removeprefix("torch."), list(t.shape), t.tolist())
    except Exception:
        return True, Opaque("a tensor that could not be read")


def _scalar(value: Any) -> tuple[bool, Any]:
    """(True, JSON-able form) for a scalar: None, Ellipsis, bool, int, float, str, bytes."""
    if value is None or value is ...:
        return True, _tag("ellipsis") if value is ... else None
    if _is(value, bool):
        return True, value is True  # bool cannot be subclassed; `is True` never calls anything
    if _is(value, int):
        plain = int.__int__(value)  # the stored value, whatever the subclass's __int__ or __eq__ say
        if plain.bit_length() > MAX_INT_BITS:
            return True, _tag(
                "opaque", f"a whole number of about {int(plain.bit_length() * 0.30103):,} digits"
            )
        return True, plain if plain.bit_length() <= 53 else _tag("int", hex(plain))
    if _is(value, float):
        plain = float.__float__(value)
        return True, plain if math.isfinite(plain) else _tag("float", repr(plain))
    if _is(value, str):
        plain = str.__str__(value)
        return True, plain if len(plain) <= MAX_TEXT else _tag("opaque", "a string too long to check")
    if _is(value, (bytes, bytearray)):
        plain = bytes(
            bytes.__getitem__(value, slice(None))
            if _is(value, bytes)
            else bytearray.__getitem__(value, slice(None))
        )
        return True, _tag("bytes", plain.hex()) if len(plain) <= MAX_TEXT else _tag(
            "opaque", "bytes too long"
        )
    return False, None


def encode(value: Any) -> Any:
    """JSON-able plain data for ``value``; never raises and never calls the value's own methods."""
    try:
        return _encode(value)
    except (
        Exception,
        SystemExit,
        GeneratorExit,
    ) as exc:  # MemoryError, or what no one foresaw: never a crash
        return _tag("opaque", f"an answer that could not be read ({type(exc).__name__})")


def _encode(value: Any) -> Any:
    root: list[Any] = [None]
    # Each job: (value, depth, container, key) -> put encode(value) into container[key].
    stack: list[tuple[Any, int, Any, Any]] = [(value, 0, root, 0)]
    items = 0
    while stack:
        v, depth, into, key = stack.pop()
        items += 1
        if items > MAX_ITEMS:
            return _tag("opaque", f"an answer with more than {MAX_ITEMS:,} values")
        done, out = _scalar(v)
        if not done:
            out = _container(v, depth, stack, into, key)
        into[key] = out
    return root[0]


def _container(v: Any, depth: int, stack: list[tuple[Any, int, Any, Any]], into: Any, key: Any) -> Any:
    """The JSON-able shell of a container, its children pushed on ``stack``; other values become opaque.

    A numpy value is pushed again as the Python value numpy makes of it (``into[key]`` is then overwritten).
    """
    is_seq = _is(v, (list, tuple))
    if (is_seq or _is(v, (dict, set, frozenset))) and depth >= MAX_DEPTH:
        return _tag("opaque", f"an answer nested more than {MAX_DEPTH} levels deep")
    if _is(v, list):
        children = list.__getitem__(v, slice(None))
        kind = "list"
    elif _is(v, tuple):
        children = list(tuple.__getitem__(v, slice(None)))
        kind = "tuple"
    elif _is(v, (set, frozenset)):
        children = list(set.__iter__(v) if _is(v, set) else frozenset.__iter__(v))
        kind = "set"
    elif _is(v, dict):
        pairs = list(dict.items(v))
        shell: list[Any] = [[None, None] for _ in pairs]
        for i, (k, item) in enumerate(pairs):
            stack.append((k, depth + 1, shell[i], 0))
            stack.append((item, depth + 1, shell[i], 1))
        return _tag("dict", shell)
    else:
        found, out = _numpy_item(v)
        if not found:
            found, out = _tensor(v)
        if found and isinstance(out, Opaque):
            return _tag("opaque", out.reason)
        if found and isinstance(out, tuple):  # a tensor: numbers from torch's own tolist, encoded as usual
            data: list[Any] = [None]
            stack.append((out[3], depth, data, 0))
            return _tag("tensor", {"dtype": out[1], "shape": out[2], "data": data})
        if found:  # numpy's Python value, encoded in its turn; it overwrites into[key]
            stack.append((out, depth, into, key))
            return None
        if callable(v):
            return _tag("opaque", f"a {_type_name(v)} (a function where a value was expected)")
        return _tag("opaque", f"a {_type_name(v)} object")
    shell = [None] * len(children)
    for i, child in enumerate(children):
        t = type(child)  # leaves of exact simple types go straight in: most answers are lists of ints
        simple = (t is int and -_SAFE < child < _SAFE) or t is bool or child is None
        if simple or (t is str and len(child) <= MAX_TEXT):
            shell[i] = child
        else:
            stack.append((child, depth + 1, shell, i))
    return shell if kind == "list" else _tag(kind, shell)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def dumps(value: Any) -> str:
    """``encode(value)`` as a JSON string."""
    return _dumps(encode(value))


def decode(data: Any) -> Any:
    """The Python value of ``encode``'s data: exact built-in types (a torch tensor if one was sent)."""
    try:
        return _decode(data)
    except Exception as exc:  # malformed data from a process that misbehaved
        return Opaque(f"an answer that could not be read back ({type(exc).__name__})")


def _decode(data: Any) -> Any:
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(data, root, 0, 0)]
    post: list[tuple[Any, Any, str, list[Any]]] = []  # containers to freeze once their children are in
    while stack:
        d, into, key, depth = stack.pop()
        if depth > MAX_DEPTH + 2:
            into[key] = Opaque("an answer nested too deep")
            continue
        if d is None or type(d) in (bool, int, float, str):
            into[key] = d
        elif type(d) is list:
            out: list[Any] = list(d)
            into[key] = out
            for i, c in enumerate(d):
                if type(c) in (list, dict):  # scalars are already in place
                    stack.append((c, out, i, depth + 1))
        elif type(d) is dict and d.get(TAG) is not None:
            _decode_tagged(d, into, key, depth, stack, post)
        else:
            into[key] = Opaque("malformed answer data")
    for into, key, kind, parts in reversed(post):  # children before parents
        into[key] = _freeze(kind, parts)
    return root[0]


def _decode_tagged(d: dict, into: Any, key: Any, depth: int, stack: list, post: list) -> None:
    kind, v = d[TAG], d.get("v")
    if kind == "ellipsis":
        into[key] = ...
    elif kind == "int":
        into[key] = int(v, 16)
    elif kind == "float":
        into[key] = float(v)
    elif kind == "bytes":
        into[key] = bytes.fromhex(v)
    elif kind == "opaque":
        into[key] = Opaque(str(v))
    elif kind == "tensor":
        into[key] = _make_tensor(v)
    elif kind in ("tuple", "set", "dict"):
        parts: list[Any] = [None] * len(v)
        post.append((into, key, kind, parts))
        if kind == "dict":
            for i, pair in enumerate(v):
                parts[i] = [None, None]
                stack.append((pair[0], parts[i], 0, depth + 1))
                stack.append((pair[1], parts[i], 1, depth + 1))
        else:
            stack.extend((c, parts, i, depth + 1) for i, c in enumerate(v))
    else:
        into[key] = Opaque("malformed answer data")


def _freeze(kind: str, parts: list[Any]) -> Any:
    try:
        if kind == "tuple":
            return tuple(parts)
        if kind == "set":
            return set(parts)
        return {k: v for k, v in parts}
    except TypeError:  # an unhashable key or member (a list in a set): not an answer any check takes
        return Opaque(f"a {kind} whose members cannot be compared")


def _make_tensor(v: dict[str, Any]) -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - only 14.3 sends tensors, and it needs torch
        return Opaque("a tensor (torch is not installed here)")
    dtype = getattr(torch, str(v["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        return Opaque("a tensor of an unknown dtype")
    data = decode(v["data"][0])
    if isinstance(data, Opaque):
        return data
    return torch.tensor(data, dtype=dtype).reshape(v["shape"])


def plain(value: Any) -> Any:
    """``decode(encode(value))``: a copy of ``value`` made only of exact built-in types."""
    return decode(encode(value))


def describe(value: Any, limit: int = 60) -> str:
    """A short readable form of a plain value (``plain``'s result), safe for huge or deep values."""
    from kvlab.errors import brief

    return brief(value, limit)


def tidy(value: Any, depth: int = 0) -> Any:
    """Surrounding whitespace off every string of a plain answer, nan and inf made opaque.

    A nan compares False with everything, so ``abs(answer - expected) >= tolerance`` would let it
    through; as an ``Opaque`` it equals nothing and takes part in no arithmetic. (Bounded: plain
    data is at most 64 deep.)
    """
    if type(value) is str:
        return value.strip()
    if type(value) is float and not math.isfinite(value):
        return Opaque(f"{value!r}, which is not a number any answer can be")
    if depth > 80:
        return value
    if type(value) in (list, tuple):
        return type(value)(tidy(v, depth + 1) for v in value)
    if type(value) is dict:
        out = {}
        for k, v in value.items():
            out[tidy(k, depth + 1)] = tidy(v, depth + 1)
        return out
    return value


def name_in(answer: Any, names: Any) -> Any:
    """``answer`` spelled as one of ``names`` when it matches ignoring case, else ``answer`` unchanged.

    Names are what a student types by hand ("History", "history "): a checker maps them onto its own
    spelling with this before comparing.
    """
    if type(answer) is not str:
        return answer
    for name in names:
        if type(name) is str and name.casefold() == answer.strip().casefold():
            return name
    return answer
