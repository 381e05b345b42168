"""Files inside one directory, and never outside it: llama-server's ``--slot-save-path`` (example 11).

A client names a slot file; the server reads or writes ``DIR/name``. Whoever sends the name is
untrusted, and so is whatever else lives in the directory, so three things are checked:

* **The name** (``check_filename``) is one plain file name: not empty, not ``.`` or ``..``, no
  ``..`` anywhere, no ``/`` or ``\\`` or NUL, no control character, none of ``: * ? " < > |``
  (illegal on Windows, and ``:`` opens an NTFS alternate stream), no Unicode look-alike of a dot
  or a slash (U+FF0E, U+2215, U+2216), no byte-order mark or replacement character, no lone
  surrogate (it has no UTF-8 form), at most 255 bytes of UTF-8 (NAME_MAX of ext4, XFS, APFS and
  NTFS), no whitespace at either end and no trailing dot (Windows strips them, so two names would
  mean one file). kvlab also refuses names that start with ``.`` (hidden files, and the prefix of
  its own temporary files) or end with ``.tmp`` (the suffix of its temporary files), and Windows'
  reserved device names ``CON PRN AUX NUL COM1-9 LPT1-9`` with any extension, which name a device
  rather than a file there (``NUL.bin`` is the null device).
* **Reading** opens the name relative to the directory (``dir_fd``) with ``O_NOFOLLOW`` and
  ``O_NONBLOCK``: a symlink planted in the directory is refused, not followed, and a FIFO does not
  block. The opened file must be a regular file (``fstat``), and at most ``max_bytes`` are read.
* **Writing** never opens an existing name: the bytes go to a new temporary file created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` inside the directory (a random ``.kvlab-*.tmp`` name), are
  ``fsync``-ed, and ``os.replace`` moves it over the target, which never follows a link. Whatever
  fails on the way, the temporary file is removed. A target that exists and is not a regular
  file (a directory, a symlink, a FIFO) is refused.

llama-server itself validates the name with ``fs_validate_filename`` (common/common.cpp: the checks
above from "not empty" to "no trailing dot", without kvlab's extra four) and then opens
``--slot-save-path`` + name with ``fopen`` -- which follows a symlink, on save and on restore, and
writes in place, so an interrupted save leaves a truncated file.

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

from kvlab.errors import InvalidArgumentError, SlotFileError, brief

NAME_MAX_BYTES = 255
TEMP_PREFIX = ".kvlab-"
TEMP_SUFFIX = ".tmp"
RESERVED_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))]
)
_ILLEGAL = set(':*?"<>|')
_LOOKALIKES = {"\uff0e": "a fullwidth full stop", "\u2215": "a division slash", "\u2216": "a set minus"}
_INVISIBLE = {"\ufeff": "a byte-order mark", "\ufffd": "a replacement character"}
_FAST = hasattr(os, "O_NOFOLLOW") and os.open in os.supports_dir_fd and os.replace in os.supports_dir_fd


def check_filename(filename: object) -> str:
    """Return ``filename`` as a plain ``str`` if it names one plain file inside a directory; refuse anything else."""
    if not isinstance(filename, str):
        raise InvalidArgumentError(
            f"filename must be a string such as 'agent-prefix.bin', got {type(filename).__name__}"
        )
    name = str.__str__(filename)  # a str subclass keeps no behaviour of its own
    shown = brief(name)

    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"filename {shown} {why}: give a bare file name such as 'agent-prefix.bin'"
        )

    if not name:
        raise InvalidArgumentError("filename is empty: give a bare file name such as 'agent-prefix.bin'")
    if name in (".", ".."):
        raise bad("names a directory")
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if any(sep in name for sep in seps):
        raise bad("contains a path separator")
    if ".." in name:
        raise bad("contains '..'")
    if "\0" in name:
        raise bad("contains a NUL character")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise bad("contains a lone surrogate, which has no UTF-8 form") from None
    if size > NAME_MAX_BYTES:
        raise bad(f"is {size} bytes long in UTF-8; file systems allow {NAME_MAX_BYTES}")
    for ch in name:
        if unicodedata.category(ch) == "Cc":
            raise bad(f"contains the control character U+{ord(ch):04X}")
        if ch in _ILLEGAL:
            raise bad(f"contains {ch!r}, which Windows does not allow in a file name")
        if ch in _LOOKALIKES or ch in _INVISIBLE:
            raise bad(f"contains {(_LOOKALIKES | _INVISIBLE)[ch]} (U+{ord(ch):04X})")
    if name.strip() != name or name.endswith("."):
        raise bad("starts or ends with whitespace or ends with '.'")
    if name.startswith("."):
        raise bad("starts with '.' (hidden files and kvlab's temporary files do)")
    if name.endswith(TEMP_SUFFIX):
        raise bad(f"ends with {TEMP_SUFFIX!r}, the suffix of kvlab's temporary files")
    if name.split(".")[0].upper() in RESERVED_NAMES:
        raise bad("is a reserved device name on Windows")
    return name


def check_directory(directory: object) -> Path:
    """The save directory as a ``Path``; it must exist and be a directory."""
    if isinstance(directory, bytes) or not isinstance(directory, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"directory must be a path (the server's --slot-save-path), got {type(directory).__name__}"
        )
    try:
        d = Path(directory)
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
