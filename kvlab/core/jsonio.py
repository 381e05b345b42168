"""JSON in and out without recursion: a bounded reader for untrusted input and an iterative writer.

``read_json(data)`` is how kvlab reads JSON a user hands it (a scenario file,
standard input, a Playground export). It refuses, with the error class it is
given and a message naming the limit, before anything is built:

* more than ``LIMITS.scenario_bytes`` bytes (256 MiB: a million ops of long
  prompts fit; a file past it is a mistake or an attack, and is not even read
  to the end: ``read_limited``);
* bytes that are not strict UTF-8 (the message names the byte offset), and a
  leading byte-order mark (JSON text has none; the message says to save it without);
* nesting deeper than ``LIMITS.json_depth`` (64: a scenario needs 3 levels;
  ``json`` recurses once per level, so a deep file would otherwise end in a
  ``RecursionError``). An iterative scan that skips string literals counts the
  depth *before* the parser sees the text; a ``RecursionError`` is caught anyway;
* a run of more than ``LIMITS.int_digits`` digits in a number (20: 2**64 has
  20; Python would spend quadratic time converting a million-digit literal, and
  refuses ones past 4,300 digits with a ``ValueError``), found by a scan of the
  bytes outside strings before parsing (a per-literal hook would cost more
  than the parse);
* ``NaN``, ``Infinity`` and ``-Infinity``, and float literals too large to be
  finite (no kvlab field takes them; they are not JSON);
* an object that names one key twice (``{"op": "alloc", "op": "free"}``):
  Python's ``json`` would keep the last silently, another reader the first, so
  the message names the key and the line and column of its object.

``dumps(obj)`` / ``write_json(obj, fp)`` write exactly the bytes
``json.dumps(obj)`` writes with its defaults (``", "`` and ``": "``
separators, ``ensure_ascii``, ``NaN``/``Infinity`` for non-finite floats, keys
in insertion order) for dicts, lists, tuples, strings, ints, floats, bools and
None, but walk the value with an explicit stack, so a tree thousands of levels
deep is written and not a ``RecursionError``. A first iterative pass measures how
deep each container nests; those at most ``_C_DEPTH`` (100) deep are handed to
``json.dumps`` (the C encoder) whole, which keeps the writer fast on the usual
records, and only the deeper ones are opened by the explicit stack.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import IO, Any

from kvlab.errors import LIMITS, InvalidArgumentError, KvlabError, ScenarioError, brief, check_text

__all__ = ["dumps", "iter_json", "read_json", "read_limited", "write_json"]

# a complete JSON string literal (escapes included): what the scans skip. Bytes: in UTF-8 the bytes of
# '"', '\\', brackets and digits never occur inside a multi-byte character.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_KEEP_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\x00\x00")
_DIGITS = bytes.maketrans(b"0123456789", b"dddddddddd")


def read_limited(fh: IO[bytes], what: str = "the scenario", error: type[KvlabError] = ScenarioError) -> bytes:
    """At most ``LIMITS.scenario_bytes`` bytes of ``fh``; refuse (without reading on) when there are more."""
    what, error = _what_and_error(what, error)
    limit = LIMITS.scenario_bytes
    read = getattr(fh, "read", None)
    if not callable(read):
        raise error(f"{what} must be read from a file open for reading, got {brief(fh)}")
    data = read(limit + 1)
    if isinstance(data, str):  # a text stream (a test's StringIO): its characters, as UTF-8
        data = data.encode("utf-8", "surrogateescape")
    if len(data) > limit:
        raise error(_too_big(what, limit))
    if not isinstance(data, (bytes, bytearray)):
        raise error(f"reading {what} gave {type(data).__name__}, not bytes or text")
    return bytes(data)


def _what_and_error(what: object, error: object) -> tuple[str, type[KvlabError]]:
    """What the input is called in messages (plain text) and the kvlab error class to raise."""
    if not (isinstance(error, type) and issubclass(error, KvlabError)):
        raise InvalidArgumentError(
            f"error must be a kvlab error class such as ScenarioError, got {brief(error)}"
        )
    return check_text("what", what, allow_empty=False), error


def _too_big(what: str, limit: int) -> str:
    return (
        f"{what} is larger than {limit:,} bytes (kvlab's limit LIMITS.scenario_bytes); split it, or lift "
        "the limit deliberately with kvlab.errors.raised_limits(scenario_bytes=...)"
    )


def read_json(data: object, what: str = "the scenario", error: type[KvlabError] = ScenarioError) -> Any:
    """Parse untrusted JSON ``data`` (bytes, or text) within ``LIMITS``; refuse anything else with ``error``."""
    what, error = _what_and_error(what, error)
    limit = LIMITS.scenario_bytes
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) > limit:
            raise error(_too_big(what, limit))
        if raw.startswith(b"\xef\xbb\xbf"):
            raise error(
                f"{what} starts with a UTF-8 byte-order mark, which JSON does not allow: save it without one"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(
                f"{what} is not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 4]!r}); "
                "save it as UTF-8 text"
            ) from None
    elif isinstance(data, str):
        text = str.__str__(data)  # a str subclass: its plain text, none of its own methods
        if len(text) > limit:
            raise error(_too_big(what, limit))
        bad = _lone_surrogate(text)
        if bad is not None:
            raise error(
                f"{what} is not valid UTF-8 text (character {bad} is a lone surrogate, "
                f"{text[bad]!r}: bytes that were not UTF-8); save it as UTF-8 text"
            )
        raw = text.encode("utf-8")
    else:
        raise error(f"{what} must be JSON text or bytes, got {type(data).__name__}")
    outside = _outside_strings(raw)
    depth = _depth(outside)
    if depth > LIMITS.json_depth:
        raise error(
            f"{what} nests {depth} levels deep; kvlab reads at most {LIMITS.json_depth} "
            "(LIMITS.json_depth; a scenario needs 3)"
        )
    longest = LIMITS.int_digits
    run = outside.translate(_DIGITS).find(b"d" * (longest + 1))
    if run >= 0:  # checked before parsing: json would convert every digit (quadratic in the length)
        raise error(
            f"{what} has a number of more than {longest} digits ({outside[run : run + 12].decode()}...); "
            f"kvlab reads integers of at most {longest} digits (LIMITS.int_digits; 2**64 has 20)"
        )

    def parse_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise error(f"{what} has the number {literal[:24]}, too large to be a finite float")
        return value

    def parse_constant(name: str) -> Any:
        raise error(f"{what} has {name}, which is not JSON: write a number")

    try:
        return json.loads(
            text, parse_float=parse_float, parse_constant=parse_constant, object_pairs_hook=_unique_keys
        )
    except _DuplicateKey:  # rare: parse again, slowly, to say where
        key, line, column = _first_duplicate(text)
        raise error(
            f"{what} names the key {brief(key)} twice in the object at line {line}, column {column}; "
            "JSON readers disagree on which one counts: keep one"
        ) from None
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except KvlabError:
        raise
    except ValueError:  # Python's own bound on integer literals (4,300 digits), were the scan to miss one
        raise error(f"{what} has an integer too long to read") from None
    except RecursionError:  # the scan above should make this impossible
        raise error(f"{what} nests too deeply to read") from None


class _DuplicateKey(Exception):
    """An object named a key twice (raised inside ``json``, turned into kvlab's error by ``read_json``)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s object hook: the object, unless a key comes twice (a C-speed length check)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise _DuplicateKey
    return obj


def _first_duplicate(text: str) -> tuple[str, int, int]:
    """The duplicated key and the line and column of its object, from the pure-Python parser.

    Only for text ``read_json`` already checked (nesting at most ``LIMITS.json_depth``, so the
    Python parser's recursion is bounded); its ``parse_object`` hook knows where each object starts.
    """

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[dict[str, Any], int]:
        strict, scan_once, _, _, memo = args
        pairs, end = json.decoder.JSONObject(s_and_end, strict, scan_once, None, list, memo)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key, s_and_end[1] - 1)  # stop at the first: nothing after it matters
            seen.add(key)
        return dict(pairs), end

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object  # type: ignore[assignment]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        decoder.decode(text)
    except _DuplicateKey as found:
        key, start = found.args
        line = text.count("\n", 0, start) + 1
        return key, line, start - text.rfind("\n", 0, start)
    except Exception:  # the fast parser found the duplicate, so this one will too; never leak its errors
        pass
    return "?", 1, 1


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (what undecodable bytes become), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _outside_strings(raw: bytes) -> bytes:
    """``raw`` without its string literals, cut at an unterminated one (the parser stops there anyway)."""
    outside = _STRING.sub(b"", raw)
    cut = outside.find(b'"')
    return outside if cut < 0 else outside[:cut]


def _depth(outside: bytes) -> int:
    """How deep ``[``/``{`` nest in JSON text whose strings were taken out; no recursion, C-speed passes."""
    if outside.count(b"[") + outside.count(b"{") <= LIMITS.json_depth:
        return 0  # too few brackets to pass the limit: skip the walk
    steps = outside.translate(_DEPTH_STEP, _KEEP_BRACKETS)
    depth = deepest = 0
    for run in re.finditer(rb"\x01+|\x00+", steps):  # runs of openers deepen: count each run at once
        size = run.end() - run.start()
        if steps[run.start()] == 1:
            depth += size
            deepest = max(deepest, depth)
        else:
            depth -= size
    return deepest


def json_depth(text: str | bytes) -> int:
    """How deep ``[``/``{`` nest in JSON ``text`` (string literals skipped; 0 when under ``LIMITS.json_depth`` brackets)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return _depth(_outside_strings(raw))


# ---------------------------------------------------------------- writing

_encode_str = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
_CONTAINERS = (dict, list, tuple)
_SCALARS = (str, int, float, bool, type(None))


def _key(key: object) -> str:
    if isinstance(key, str):
        return _encode_str(key)
    if isinstance(key, (int, float)) or key is None:  # bool is an int: "true" / "false", as json writes
        return _encode_str(json.dumps(key))
    raise InvalidArgumentError(f"JSON keys must be str, int, float, bool or None, not {type(key).__name__}")


_C_DEPTH = 100  # a container at most this deep goes to the C encoder whole: far below any recursion limit


def _children(value: dict | list | tuple) -> list[Any]:
    """The containers directly inside ``value`` (a C-speed type check first: most hold only scalars)."""
    items = value.values() if isinstance(value, dict) else value
    if not any(issubclass(kind, _CONTAINERS) for kind in set(map(type, items))):
        return []
    return [v for v in items if isinstance(v, _CONTAINERS)]


def _tall(obj: Any) -> set[int]:
    """Ids of the containers in ``obj`` nested more than ``_C_DEPTH`` deep; an explicit stack, no recursion."""
    if not isinstance(obj, _CONTAINERS):
        return set()
    height: dict[int, int] = {}
    open_ids: set[int] = set()
    stack: list[tuple[Any, list[Any] | None]] = [(obj, None)]
    while stack:
        value, kids = stack[-1]
        if kids is None:  # first visit: push the children not measured yet
            kids = _children(value)
            stack[-1] = (value, kids)
            open_ids.add(id(value))
            for kid in kids:
                if id(kid) in open_ids:
                    raise InvalidArgumentError(
                        "Circular reference detected: a value that contains itself cannot be written as JSON"
                    )
                if id(kid) not in height:
                    stack.append((kid, None))
            continue
        stack.pop()
        open_ids.discard(id(value))
        height[id(value)] = 1 + max((height[id(k)] for k in kids), default=0)
    return {ident for ident, h in height.items() if h > _C_DEPTH}


def _c_dumps(value: Any) -> str:
    """``json.dumps`` (the C encoder), with kvlab's errors: NaN and infinities are not JSON."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise InvalidArgumentError(f"{brief(value)} cannot be written as JSON: {exc}") from None
    except TypeError as exc:
        raise InvalidArgumentError(f"{brief(value)} cannot be written as JSON: {exc}") from None


def iter_json(obj: Any) -> Iterator[str]:
    """The pieces of ``json.dumps(obj)``, in order, produced with an explicit stack (no recursion).

    A value that cannot be written (a dict subclass whose ``items`` raises, a float subclass whose
    ``__repr__`` lies, a cycle) is refused with ``InvalidArgumentError``, never Python's own error.
    """
    try:
        yield from _iter_json(obj)
    except KvlabError:
        raise
    except Exception as exc:  # a hostile container or scalar inside obj (a RecursionError too)
        raise InvalidArgumentError(f"the value cannot be written as JSON: {brief(exc)}") from None


def _iter_json(obj: Any) -> Iterator[str]:
    """``iter_json`` without the guard.

    Containers at most ``_C_DEPTH`` deep are written by ``json.dumps`` whole (the C
    encoder, its recursion bounded by that depth); only the deeper ones are opened here.
    """
    if isinstance(obj, _CONTAINERS) and not any(map(_children, _children(obj))):
        yield _c_dumps(obj)  # the usual record: two levels at most, no measuring pass needed
        return
    tall = _tall(obj)
    stack: list[tuple[Iterator[Any], bool, str]] = []  # (items, is a dict, closing bracket)
    first = False
    value = obj
    while True:
        if isinstance(value, _CONTAINERS) and id(value) in tall:
            is_dict = isinstance(value, dict)
            yield "{" if is_dict else "["
            items = iter(value.items()) if is_dict else iter(value)
            stack.append((items, is_dict, "}" if is_dict else "]"))
            first = True
        elif type(value) is str:
            yield _encode_str(value)
        elif type(value) is int:
            yield int.__repr__(value)
        elif isinstance(value, (_CONTAINERS, _SCALARS)):
            yield _c_dumps(value)
        else:
            raise InvalidArgumentError(f"an object of type {type(value).__name__} cannot be written as JSON")
        while stack:  # close what is finished, then step to the next item
            items, is_dict, closing = stack[-1]
            item = next(items, _DONE)
            if item is _DONE:
                stack.pop()
                first = False
                yield closing
                continue
            prefix = "" if first else ", "
            first = False
            if is_dict:
                key, value = item
                yield prefix + _key(key) + ": "
            else:
                value = item
                if prefix:
                    yield prefix
            break
        else:
            return


_DONE: Any = object()


def dumps(obj: Any) -> str:
    """``json.dumps(obj)``, byte for byte, for JSON-ready values of any depth."""
    return "".join(iter_json(obj))


def write_json(obj: Any, fp: IO[str]) -> None:
    """``json.dump(obj, fp)``, byte for byte, for JSON-ready values of any depth, written in pieces."""
    write = getattr(fp, "write", None)
    if not callable(write):
        raise InvalidArgumentError(f"fp must be a text file open for writing, got {brief(fp)}")
    pending: list[str] = []
    size = 0
    for piece in iter_json(obj):
        pending.append(piece)
        size += len(piece)
        if size > 1 << 16:
            write("".join(pending))
            pending, size = [], 0
    write("".join(pending))
