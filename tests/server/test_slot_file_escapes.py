"""Slot files never reach outside their directory, and a hostile file loads nothing (issue 11).

One test per escape: a symlink out of the save directory on read, a planted temporary-name
symlink on write, the names ".", "..", "a/b", absolute paths and NUL, a directory where the file
should be, a FIFO, and a write that fails halfway; then files whose checksum was recomputed over
hostile contents (a negative token id, an infinity in the KV), and size bounds.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import struct

import numpy as np
import pytest

from kvlab.errors import InvalidArgumentError, SlotFileError, raised_limits
from kvlab.server import save_dir, slot_files
from kvlab.server.slot_files import (
    TINY_MODEL,
    SlotData,
    check_filename,
    encode_slot,
    read_slot_file,
    restore_slot,
    save_slot,
    synthetic_kv,
    write_slot_file,
)
from kvlab.server.slots import SlotServer

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")


def _server(tokens=(1, 2, 3, 4)) -> SlotServer:
    s = SlotServer(cache_ram_mib=0)
    s.complete(list(tokens), max_tokens=0)
    return s


def _listing(d):
    return sorted((p.name, p.is_symlink(), p.is_dir()) for p in d.iterdir())


@pytest.fixture
def dirs(tmp_path):
    save = tmp_path / "slots"
    outside = tmp_path / "outside"
    save.mkdir()
    outside.mkdir()
    return save, outside


def test_a_symlink_out_of_the_directory_is_not_followed_on_read(dirs, refuses):
    save, outside = dirs
    save_slot(_server(), 0, "secret.bin", directory=outside)  # a valid slot file, outside
    (save / "p.bin").symlink_to(outside / "secret.bin")
    with pytest.raises(SlotFileError, match="symbolic link"):
        read_slot_file(save, "p.bin", TINY_MODEL)
    target = _server([9, 9])
    refuses(target, lambda s: restore_slot(s, 0, "p.bin", directory=save), SlotFileError, "symbolic link")


def test_a_planted_temporary_symlink_is_not_followed_on_write(dirs):
    save, outside = dirs
    victim = outside / "victim.txt"
    victim.write_bytes(b"precious")
    for planted in ("p.bin.tmp", ".p.bin.tmp", ".kvlab-p.bin.tmp"):
        (save / planted).symlink_to(victim)
    save_slot(_server(), 0, "p.bin", directory=save)
    assert victim.read_bytes() == b"precious"  # the target is untouched
    assert not (save / "p.bin").is_symlink() and (save / "p.bin").is_file()
    assert {p.name for p in save.iterdir()} == {"p.bin", "p.bin.tmp", ".p.bin.tmp", ".kvlab-p.bin.tmp"}


def test_a_symlink_at_the_target_name_is_refused_not_written_through(dirs):
    save, outside = dirs
    victim = outside / "victim.txt"
    victim.write_bytes(b"precious")
    (save / "p.bin").symlink_to(victim)
    with pytest.raises(SlotFileError, match="symbolic link"):
        save_slot(_server(), 0, "p.bin", directory=save)
    assert victim.read_bytes() == b"precious"
    assert _listing(save) == [("p.bin", True, False)]


@pytest.mark.parametrize("name", [".", "..", "a/b", "a\\b", "../p.bin", "/etc/passwd", "a\0b", "\0"])
def test_names_that_leave_the_directory_are_refused(dirs, name, refuses):
    save, _ = dirs
    with pytest.raises(InvalidArgumentError):
        check_filename(name)
    with pytest.raises(InvalidArgumentError):
        save_slot(_server(), 0, name, directory=save)
    refuses(_server([5, 6]), lambda s: restore_slot(s, 0, name, directory=save), InvalidArgumentError)
    assert _listing(save) == []


def test_an_absolute_path_into_another_directory_is_refused(dirs):
    save, outside = dirs
    with pytest.raises(InvalidArgumentError, match="path separator"):
        save_slot(_server(), 0, str(outside / "x.bin"), directory=save)
    assert _listing(save) == [] and _listing(outside) == []


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "empty"),
        (".hidden", "starts with '.'"),
        ("x.tmp", ".tmp"),
        ("CON", "reserved"),
        ("nul.bin", "reserved"),
        ("lpt1.txt", "reserved"),
        ("a:b", "Windows"),
        ("a*b", "Windows"),
        ("x" * 256, "bytes long"),
        ("é" * 128, "bytes long"),  # 256 bytes of UTF-8
        ("a\ud800b", "surrogate"),
        ("a\x1fb", "control"),
        ("a\x7fb", "control"),
        ("a\u2215b", "division slash"),
        ("a\uff0eb", "fullwidth"),
        ("\ufeffa", "byte-order"),
        ("trailing.", "ends with"),
        ("trailing ", "space"),
        (" leading", "space"),
    ],
)
def test_other_refused_names_say_why(name, why):
    with pytest.raises(InvalidArgumentError, match=why):
        check_filename(name)


@pytest.mark.parametrize("name", ["agent-prefix.bin", "p.bin", "a" * 255, "é" * 127, "a.b.c", "CONSOLE.bin"])
def test_plain_names_are_accepted(name):
    assert check_filename(name) == name


@pytest.mark.parametrize(
    "name, why",
    [
        # Windows device names in every form: console devices, superscript ports, port 0, any case or extension
        ("CONIN$", "dollar sign"),
        ("CONOUT$.bin", "dollar sign"),
        ("COM\u00b9", "superscript one"),
        ("LPT\u00b2.bin", "superscript two"),
        ("LPT\u00b3", "superscript three"),
        ("com0.bin", "reserved"),
        ("Aux.tar.gz", "reserved"),
        ("CON .bin", "space"),
        ("CON..bin", "'..'"),
        ("\uff23\uff2f\uff2e.bin", "NFKC"),  # fullwidth CON: NFKC would make it the device name
        ("\ufb01le.bin", "NFKC"),  # LATIN SMALL LIGATURE FI, a letter whose NFKC form is "fi"
        # slash and dot look-alikes
        ("a\uff0fb", "fullwidth solidus"),
        ("a\u2044b", "fraction slash"),
        ("a\u2215b", "division slash"),
        ("a\u29f8b", "big solidus"),
        ("a\u2024b", "one dot leader"),
        # bidi controls and other invisible characters
        ("cod\u202enib.exe", "right-to-left override"),
        ("a\u2066b", "left-to-right isolate"),
        ("a\u2069b", "pop directional isolate"),
        ("a\u200eb", "left-to-right mark"),
        ("a\u200fb", "right-to-left mark"),
        ("a\u200bb", "zero width space"),
        ("a\u00adb", "soft hyphen"),
        ("a\u2028b", "line separator"),
        ("a\u2029b", "paragraph separator"),
        ("a\u3164b", "hangul filler"),
        ("e\u0301.bin", "combining acute"),  # a combining mark: write the composed letter
        ("a\ue000b", "private-use"),
        ("a\U000e0041b", "tag latin capital letter a"),
        ("x.TMP", ".tmp"),
    ],
)
def test_the_allow_list_refuses_every_other_character(name, why):
    with pytest.raises(InvalidArgumentError, match=re.escape(why)) as info:
        check_filename(name)
    assert "letters, digits" in str(info.value)  # every refusal states the one rule


@pytest.mark.parametrize(
    "name",
    ["r\u00e9sum\u00e9.bin", "\u4f1a\u8bdd.bin", "\u0441\u0435\u0441\u0441\u0438\u044f_2.bin", "a-b_c.d"],
)
def test_letters_and_digits_of_any_script_are_accepted(name):
    assert check_filename(name) == name


def test_a_hostile_str_subclass_is_read_as_its_plain_text():
    class Lying(str):
        def __len__(self):
            raise RuntimeError("len refused")

        def __iter__(self):
            raise RuntimeError("iter refused")

        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

        def upper(self):
            return "fine"

    assert type(check_filename(Lying("p.bin"))) is str
    with pytest.raises(InvalidArgumentError, match="reserved"):
        check_filename(Lying("nul.bin"))


def test_a_directory_where_the_file_should_be(dirs, refuses):
    save, _ = dirs
    (save / "p.bin").mkdir()
    with pytest.raises(SlotFileError, match="a directory"):
        save_slot(_server(), 0, "p.bin", directory=save)
    refuses(_server([7]), lambda s: restore_slot(s, 0, "p.bin", directory=save), SlotFileError, "a directory")
    assert _listing(save) == [("p.bin", False, True)]  # no temporary file left behind


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(dirs):
    save, _ = dirs
    os.mkfifo(save / "p.bin")
    with pytest.raises(SlotFileError, match="not a regular file"):
        read_slot_file(save, "p.bin", TINY_MODEL)
    with pytest.raises(SlotFileError, match="not a regular file"):
        save_slot(_server(), 0, "p.bin", directory=save)


def test_a_failing_write_leaves_no_temporary_file(dirs, monkeypatch):
    save, _ = dirs
    save_slot(_server([1, 2]), 0, "p.bin", directory=save)
    before = (save / "p.bin").read_bytes()

    def disk_full(fd, blob):
        os.write(fd, blob[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_dir, "_write_all", disk_full)
    with pytest.raises(SlotFileError, match="No space left") as info:
        save_slot(_server([3, 4, 5]), 0, "p.bin", directory=save)
    assert isinstance(info.value.__cause__, OSError)
    assert _listing(save) == [("p.bin", False, False)]
    assert (save / "p.bin").read_bytes() == before  # the old file is intact


def test_an_interrupt_during_the_write_also_cleans_up(dirs, monkeypatch):
    save, _ = dirs

    def interrupted(fd, blob):
        raise KeyboardInterrupt

    monkeypatch.setattr(save_dir, "_write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_slot(_server(), 0, "p.bin", directory=save)
    assert _listing(save) == []


def test_a_missing_directory_or_a_file_as_directory(dirs):
    save, _ = dirs
    (save / "f").write_bytes(b"")
    for d in (save / "missing", save / "f", "a\0b", 5, None, b"/tmp"):
        with pytest.raises(InvalidArgumentError):
            save_slot(_server(), 0, "p.bin", directory=d)


# ---------------------------------------------------------------- hostile contents


def _with_checksum(blob: bytearray) -> bytes:
    """Recompute the header's SHA-256, as anyone who can write the file can."""
    head = slot_files._HEADER
    fields = list(head.unpack_from(bytes(blob)))
    fields[-1] = hashlib.sha256(bytes(blob[head.size :])).digest()
    return head.pack(*fields) + bytes(blob[head.size :])


def _blob(tokens=(1, 2, 3)) -> bytearray:
    keys, values = synthetic_kv(TINY_MODEL, tokens)
    return bytearray(encode_slot(SlotData(TINY_MODEL, tuple(tokens), keys, values)))


def test_a_negative_token_id_with_a_recomputed_checksum_is_refused(dirs, refuses):
    save, _ = dirs
    blob = _blob()
    struct.pack_into("<i", blob, slot_files._HEADER.size, -5)
    (save / "p.bin").write_bytes(_with_checksum(blob))
    refuses(_server([8]), lambda s: restore_slot(s, 0, "p.bin", directory=save), SlotFileError, "-5")


def test_an_infinite_kv_value_with_a_recomputed_checksum_is_refused(dirs, refuses):
    save, _ = dirs
    blob = _blob()
    np.frombuffer(blob, dtype="<f2")[-1:] = np.inf  # the last value of the last layer's V
    (save / "p.bin").write_bytes(_with_checksum(blob))
    refuses(_server([8]), lambda s: restore_slot(s, 0, "p.bin", directory=save), SlotFileError, "infinity")


def test_a_nan_or_a_second_sequence_is_refused(dirs):
    save, _ = dirs
    blob = _blob()
    np.frombuffer(blob, dtype="<f2")[-2:-1] = np.nan
    (save / "nan.bin").write_bytes(_with_checksum(blob))
    with pytest.raises(SlotFileError, match="NaN"):
        read_slot_file(save, "nan.bin", TINY_MODEL)
    blob = _blob()
    cells = slot_files._HEADER.size + 4 * 3
    struct.pack_into("<i", blob, cells + 8, 1)  # seq_id of the first cell
    (save / "seq.bin").write_bytes(_with_checksum(blob))
    with pytest.raises(SlotFileError, match="cell metadata"):
        read_slot_file(save, "seq.bin", TINY_MODEL)


def test_sizes_are_bounded_before_reading(dirs):
    save, _ = dirs
    save_slot(_server(range(40)), 0, "p.bin", directory=save)
    with raised_limits(tokens=10), pytest.raises(SlotFileError, match="more than"):
        read_slot_file(save, "p.bin", TINY_MODEL)
    with raised_limits(tokens=10), pytest.raises(SlotFileError, match="LIMITS.tokens"):
        slot_files.decode_slot((save / "p.bin").read_bytes(), TINY_MODEL)
    with raised_limits(mib=1):
        assert read_slot_file(save, "p.bin", TINY_MODEL).n_tokens == 40  # 41 KiB: within 1 MiB


def test_non_finite_kv_is_never_written(dirs):
    save, _ = dirs
    keys, values = synthetic_kv(TINY_MODEL, [1, 2])
    keys = keys.copy()
    keys[0, 0, 0, 0] = np.inf
    with pytest.raises(InvalidArgumentError, match="infinity"):
        write_slot_file(save, "p.bin", SlotData(TINY_MODEL, (1, 2), keys, values))
    with pytest.raises(InvalidArgumentError):
        SlotData(TINY_MODEL, (1, -2), values, values)
    assert _listing(save) == []
