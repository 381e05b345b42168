"""Files inside one directory, and never outside it: llama-server's ``--slot-save-path`` (example 11).

A client names a slot file; the server reads or writes ``DIR/name``. Whoever sends the name is
untrusted, and so is whatever else lives in the directory, so three things are checked:

* **The name** (``check_filename``) is one plain file name, by one allow-list rule: it is made
  only of letters and digits (Unicode categories L and Nd), ``-``, ``_`` and ``.``, and is in NFKC
  form (its compatibility normal form is itself). Everything else is refused: ``/``, ``\\``, NUL,
  spaces, ``: * ? " < > | $``, control and format characters (bidi overrides such as U+202E, U+2066
  to U+2069, U+200E/U+200F, zero-width characters), line and paragraph separators, look-alikes of a
  slash or a dot (U+FF0F, U+2044, U+2215, U+29F8, U+FF0E: none is a letter or digit, and the
  fullwidth forms are not NFKC), superscript digits (``COM¹``), the blank Hangul filler letters, and
  lone surrogates. On top of it: not empty, no ``..`` anywhere, no ``.`` at either end (hidden files,
  the prefix of kvlab's temporary files, and Windows strips a trailing dot), not ending in ``.tmp``
  (kvlab's temporary files), at most 255 bytes of UTF-8 (NAME_MAX of ext4, XFS, APFS and NTFS), and
  not one of Windows' device names ``CON PRN AUX NUL COM0-9 LPT0-9`` with any extension, in any
  case (``nul.bin`` is the null device there). Since NFKC is checked first, no compatibility form
  can spell a refused name. Stricter than llama-server on purpose: a name is sent by an untrusted
  client, and a rule that lists what is allowed cannot miss a dangerous character the way a list of
  refused ones can.
* **Reading** opens the name relative to the directory (``dir_fd``) with ``O_NOFOLLOW`` and
  ``O_NONBLOCK``: a symlink planted in the directory is refused, not followed, and a FIFO does not
  block. The opened file must be a regular file (``fstat``), and at most ``max_bytes`` are read.
* **Writing** never opens an existing name: the bytes go to a new temporary file created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` inside the directory (a random ``.kvlab-*.tmp`` name), are
  ``fsync``-ed, and ``os.replace`` moves it over the target, which never follows a link. Whatever
  fails on the way, the temporary file is removed. A target that exists and is not a regular
  file (a directory, a symlink, a FIFO) is refused.

llama-server itself validates the name with ``fs_validate_filename`` (common/common.cpp at
0c1e57098): at most 255 bytes of valid UTF-8, no C0/C1 control character or DEL, none of
``/ \\ : * ? " < > |``, no U+FF0E, U+2215, U+2216, U+FFFD or U+FEFF, no ``..`` anywhere, not ``.``,
no leading or trailing space and no trailing dot. It lets through the rest of Unicode (bidi
overrides, zero-width characters, other slash look-alikes), inner spaces and Windows device names.
It then opens ``--slot-save-path`` + name with ``fopen`` -- which follows a symlink, on save and on
restore, and writes in place, so an interrupted save leaves a truncated file.

On systems without ``dir_fd`` or ``O_NOFOLLOW`` (Windows) the same checks are made with ``lstat``
just before opening; the window between the two is then the only gap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import unicodedata
from pathlib import Path

from kvlab.errors import InvalidArgumentError, SlotFileError, brief, check_text

NAME_MAX_BYTES = 255
TEMP_PREFIX = ".kvlab-"
TEMP_SUFFIX = ".tmp"
RESERVED_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))]
)  # Windows' device names (CONIN$, CONOUT$, COM¹ ... are refused by the allow-list: '$', '¹')
ALLOWED_PUNCTUATION = frozenset("-_.")
ALLOWED_RULE = "letters, digits, '-', '_' and '.'"
# Letters that are Default_Ignorable_Code_Point in Unicode: they render as nothing
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
_FAST = hasattr(os, "O_NOFOLLOW") and os.open in os.supports_dir_fd and os.replace in os.supports_dir_fd


def check_filename(filename: object) -> str:
    """Return ``filename`` as plain text if it names one plain file inside a directory; refuse anything else.

    The rule is an allow-list (see the module docstring): NFKC-stable letters and digits, ``-``,
    ``_`` and ``.``; no ``.`` at either end, no ``..``, no ``.tmp`` suffix, no Windows device name,
    at most 255 bytes.
    """
    if not isinstance(filename, str):
        raise InvalidArgumentError(
            f"filename must be a string such as 'agent-prefix.bin', got {type(filename).__name__}"
        )
    name = check_text("filename", filename)  # a str subclass keeps no behaviour of its own
    shown = brief(name)

    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"filename {shown} {why}: a slot file name is made of {ALLOWED_RULE} only, "
            "such as 'agent-prefix.bin'"
        )

    if not name:
        raise InvalidArgumentError("filename is empty: give a bare file name such as 'agent-prefix.bin'")
    if name in (".", ".."):
        raise bad("names a directory")
    for ch in name:
        if not _allowed(ch):
            raise bad(f"contains {_describe(ch)}")
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        raise bad(
            f"is not in Unicode NFKC form, which is {brief(normal)} (a compatibility form stands for it)"
        )
    size = len(name.encode("utf-8"))
    if size > NAME_MAX_BYTES:
        raise bad(f"is {size} bytes long in UTF-8; file systems allow {NAME_MAX_BYTES}")
    if ".." in name:
        raise bad("contains '..'")
    if name.startswith("."):
        raise bad("starts with '.' (hidden files and kvlab's temporary files do)")
    if name.endswith("."):
        raise bad("ends with '.', which Windows strips (two names would mean one file)")
    if name.lower().endswith(TEMP_SUFFIX):
        raise bad(f"ends with {TEMP_SUFFIX!r}, the suffix of kvlab's temporary files")
    if name.split(".")[0].upper() in RESERVED_NAMES:
        raise bad("is a reserved device name on Windows, whatever its extension")
    return name


def _allowed(ch: str) -> bool:
    if ch.isascii():
        return ch.isalnum() or ch in ALLOWED_PUNCTUATION
    category = unicodedata.category(ch)
    return (category[0] == "L" or category == "Nd") and ch not in _BLANK_LETTERS


_KINDS = {
    "Cc": "a control character",
    "Cf": "an invisible format character",
    "Zs": "a space",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Cs": "a lone surrogate, which has no UTF-8 form",
}
_NOTES = {
    "/": "a path separator",
    "\\": "a path separator",
    "\ufeff": "a byte-order mark",
    **{ch: "not allowed in Windows file names" for ch in ':*?"<>|'},
}


def _describe(ch: str) -> str:
    """One character as a message shows it: its code point, Unicode name and kind, never the raw character."""
    parts = [unicodedata.name(ch, "").lower(), _KINDS.get(unicodedata.category(ch), ""), _NOTES.get(ch, "")]
    return f"U+{ord(ch):04X} ({', '.join(p for p in parts if p) or 'a character outside the rule'})"


def check_directory(directory: object) -> Path:
    """The save directory as a ``Path``; it must exist and be a directory."""
    if isinstance(directory, bytes) or not isinstance(directory, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"directory must be a path (the server's --slot-save-path), got {type(directory).__name__}"
        )
    try:
        raw = os.fspath(directory)  # a PathLike's own path: it must be text too
        if not isinstance(raw, str):
            raise TypeError(f"its path is {type(raw).__name__}, not str")
        d = Path(check_text("directory", raw))  # plain text: a str subclass keeps no behaviour
        ok = d.is_dir()
    except Exception as exc:  # a NUL in the path, a PathLike that lies or raises
        raise InvalidArgumentError(f"directory {brief(directory)} is not a usable path: {exc}") from None
    if not ok:
        raise InvalidArgumentError(f"the slot save directory {brief(str(d))} does not exist; create it first")
    return d


def _open_dir(d: Path) -> int:
    try:
        return os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise SlotFileError(f"cannot open the slot save directory {brief(str(d))}: {exc.strerror}") from None


def _refuse_kind(mode: int, name: str, d: Path) -> None:
    if stat.S_ISREG(mode):
        return
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a symbolic link"
        if stat.S_ISLNK(mode)
        else "not a regular file"
    )
    raise SlotFileError(
        f"{brief(name)} in {brief(str(d))} is {kind}; a slot file must be a regular file in the save directory "
        "(kvlab does not follow links)"
    )


def read_file(directory: object, filename: object, max_bytes: int) -> bytes:
    """The bytes of ``directory/filename``, a regular file of at most ``max_bytes``; never follows a link."""
    name = check_filename(filename)
    d = check_directory(directory)
    try:
        return _read(d, name, max_bytes)
    except FileNotFoundError:
        raise SlotFileError(f"no slot file {brief(name)} in {brief(str(d))}") from None
    except OSError as exc:
        raise SlotFileError(f"cannot read {brief(name)} in {brief(str(d))}: {exc.strerror or exc}") from None


def _read(d: Path, name: str, max_bytes: int) -> bytes:
    if _FAST:
        dfd = _open_dir(d)
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):  # Linux, FreeBSD: the name is a symlink
                    _refuse_kind(stat.S_IFLNK, name, d)
                raise
        finally:
            os.close(dfd)
    else:  # pragma: no cover - Windows
        path = d / name
        _refuse_kind(os.lstat(path).st_mode, name, d)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        _refuse_kind(st.st_mode, name, d)
        if st.st_size > max_bytes:
            raise SlotFileError(
                f"{brief(name)} is {st.st_size:,} bytes, more than the {max_bytes:,} a slot file can have here"
            )
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 24, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise SlotFileError(f"{brief(name)} grew past {max_bytes:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def write_file(directory: object, filename: object, blob: bytes) -> int:
    """Write ``blob`` to ``directory/filename`` atomically (temporary file, fsync, replace); return its size."""
    name = check_filename(filename)
    d = check_directory(directory)
    if not isinstance(blob, (bytes, bytearray)):
        raise InvalidArgumentError(f"blob must be the file's bytes (bytes or bytearray), got {brief(blob)}")
    if not _FAST:  # pragma: no cover - Windows
        return _write_portable(d, name, blob)
    dfd = _open_dir(d)
    tmp = None
    try:
        with contextlib.suppress(FileNotFoundError):
            _refuse_kind(os.lstat(name, dir_fd=dfd).st_mode, name, d)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        for _ in range(100):
            candidate = f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
            try:
                fd = os.open(candidate, flags, 0o666, dir_fd=dfd)
            except FileExistsError:
                continue
            tmp = candidate
            break
        else:
            raise SlotFileError(f"could not create a temporary file in {brief(str(d))}")
        try:
            _write_all(fd, blob)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        tmp = None
        with contextlib.suppress(OSError):
            os.fsync(dfd)  # the rename itself reaches the disk
        return len(blob)
    except OSError as exc:
        raise SlotFileError(
            f"could not write {brief(name)} in {brief(str(d))}: {exc.strerror or exc}; nothing was saved"
        ) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
        os.close(dfd)


def _write_portable(d: Path, name: str, blob: bytes) -> int:  # pragma: no cover - Windows
    import tempfile

    target = d / name
    with contextlib.suppress(FileNotFoundError):
        _refuse_kind(os.lstat(target).st_mode, name, d)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX)
    try:
        try:
            _write_all(fd, blob)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        tmp = None
        return len(blob)
    except OSError as exc:
        raise SlotFileError(
            f"could not write {brief(name)}: {exc.strerror or exc}; nothing was saved"
        ) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
