import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import InvalidArgumentError, SlotBusyError, SlotFileError
from kvlab.lessons.ex11 import arithmetic_report
from kvlab.server.slot_files import (
    LLAMA_8B,
    TINY_MODEL,
    ModelShape,
    SlotData,
    check_filename,
    decode_slot,
    encode_slot,
    header_bytes,
    offload_estimate,
    read_slot_file,
    restore_slot,
    save_slot,
    slot_file_size,
    synthetic_kv,
    write_slot_file,
)
from kvlab.server.slots import SlotServer

PREFIX = list(range(5000, 5748))  # the lesson's 748-token agent prefix


def test_per_token_layout_of_the_lesson():
    assert TINY_MODEL.kv_bytes_per_token == 1024
    assert TINY_MODEL.file_bytes_per_token == 1040
    assert slot_file_size(TINY_MODEL, 748) - header_bytes(TINY_MODEL) == 777_920
    assert LLAMA_8B.kv_bytes_per_token == 131_072
    assert ModelShape(4, 2, 32, "f32").kv_bytes_per_token == 2048


def test_the_lesson_arithmetic_lines():
    assert arithmetic_report() == [
        "tiny model: 1024 B KV + 4 B token id + 12 B cell metadata = 1040 B per token",
        "predicted 777920 B + header; written 778060 B",
        "8B shape: 93.5 MiB file; read at 3 GB/s: 32.7 ms",
        "recompute on an 8-core CPU at 1.02 TFLOP/s peak: 11.8 s; on an RTX 4090 at 50% of 165.2 TFLOP/s: 145.4 ms",
    ]


def test_offload_estimate_for_the_8b_shape():
    est = offload_estimate(748, 131_072)
    assert est.file_bytes == 748 * 131_072
    assert (
        f"{est.file_mib:.1f} {est.read_ms:.1f} {est.cpu_recompute_s:.1f} {est.gpu_recompute_ms:.1f}"
        == "93.5 32.7 11.8 145.4"
    )
    assert est.recompute_flops == pytest.approx(748 * 2 * 8.03e9)


def test_save_and_restore_in_this_process(tmp_path):
    s = SlotServer(cache_ram_mib=0)
    first = s.complete(PREFIX, max_tokens=0)
    assert (first.tokens_evaluated, first.prompt_n) == (748, 748)
    saved = save_slot(s, 0, "agent-prefix.bin", directory=tmp_path)
    assert saved.to_json() == {
        "id_slot": 0,
        "filename": "agent-prefix.bin",
        "n_saved": 748,
        "n_written": slot_file_size(TINY_MODEL, 748),
    }
    assert (tmp_path / "agent-prefix.bin").stat().st_size == slot_file_size(TINY_MODEL, 748)
    data = read_slot_file(tmp_path, "agent-prefix.bin", TINY_MODEL)
    keys, values = synthetic_kv(TINY_MODEL, PREFIX)
    assert data.tokens == tuple(PREFIX)
    assert np.array_equal(data.keys, keys) and np.array_equal(data.values, values)
    fresh = SlotServer(cache_ram_mib=0)
    assert restore_slot(fresh, 0, "agent-prefix.bin", directory=tmp_path).to_json()["n_restored"] == 748
    rec = fresh.complete(PREFIX + [1, 2, 3, 4, 5], max_tokens=2)
    assert (rec.tokens_evaluated, rec.cache_n, rec.prompt_n) == (753, 748, 5)


def test_restore_in_a_new_process(tmp_path):
    s = SlotServer(cache_ram_mib=0)
    s.complete(PREFIX, max_tokens=0)
    save_slot(s, 0, "agent-prefix.bin", directory=tmp_path)
    code = textwrap.dedent(
        f"""
        from kvlab.server.slots import SlotServer
        from kvlab.server.slot_files import restore_slot
        server = SlotServer(cache_ram_mib=0)
        res = restore_slot(server, 0, "agent-prefix.bin", directory={str(tmp_path)!r})
        rec = server.complete(list(range(5000, 5748)) + [1, 2, 3, 4, 5], max_tokens=2)
        print(res.n_tokens, rec.tokens_evaluated, rec.cache_n, rec.prompt_n)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["748", "753", "748", "5"]


@pytest.mark.parametrize(
    "name", ["../x.bin", "a/b.bin", "a\\b.bin", "..", "x..bin", "", " x", "a\0b", None, 5]
)
def test_file_names_that_could_leave_the_directory_are_refused(tmp_path, name):
    s = SlotServer(cache_ram_mib=0)
    s.complete([1, 2, 3])
    with pytest.raises(InvalidArgumentError):
        check_filename(name)
    with pytest.raises(InvalidArgumentError):
        save_slot(s, 0, name, directory=tmp_path)
    with pytest.raises(InvalidArgumentError):
        restore_slot(s, 0, name, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def saved(tmp_path):
    s = SlotServer(cache_ram_mib=0)
    s.complete(list(range(40)), max_tokens=0)
    save_slot(s, 0, "p.bin", directory=tmp_path)
    target = SlotServer(cache_ram_mib=0)
    target.complete([7, 7, 7], max_tokens=1)
    return tmp_path, target


def _refused(target, directory, **kw):
    before = target.state()
    with pytest.raises(SlotFileError) as exc:
        restore_slot(target, 0, "p.bin", directory=directory, **kw)
    assert target.state() == before  # nothing loaded
    return str(exc.value)


@pytest.mark.parametrize(
    "shape, words",
    [
        (ModelShape(4, 2, 32, "f32"), "F32"),
        (ModelShape(5, 2, 32), "5 layers"),
        (ModelShape(4, 4, 32), "4 KV heads"),
        (ModelShape(4, 2, 64), "x 64"),
    ],
)
def test_a_file_from_another_model_is_refused(saved, shape, words):
    directory, target = saved
    msg = _refused(target, directory, shape=shape)
    assert "saved by a model with 4 layers, 2 KV heads x 32, F16" in msg and words in msg


def test_truncated_corrupted_and_padded_files_are_refused(saved):
    directory, target = saved
    path = directory / "p.bin"
    blob = path.read_bytes()
    path.write_bytes(blob[:-100])
    assert "truncated" in _refused(target, directory)
    path.write_bytes(blob[:20])
    assert "truncated" in _refused(target, directory)
    flipped = bytearray(blob)
    flipped[-5] ^= 0xFF
    path.write_bytes(bytes(flipped))
    assert "checksum" in _refused(target, directory)
    path.write_bytes(blob + b"\0")
    assert "more than" in _refused(target, directory)
    path.write_bytes(b"NOTASLOT" + blob[8:])
    assert "not a kvlab slot file" in _refused(target, directory)
    path.unlink()
    assert "no slot file" in _refused(target, directory)


def test_too_many_tokens_for_the_slot_is_refused(saved):
    directory, _ = saved
    small = SlotServer(n_ctx=10, cache_ram_mib=0)
    with pytest.raises(SlotFileError, match="holds 40 tokens"):
        restore_slot(small, 0, "p.bin", directory=directory)
    assert small.slot_tokens(0) == ()


def test_busy_slots_and_bad_arguments(tmp_path):
    s = SlotServer(cache_ram_mib=0)
    s.start([1, 2, 3])
    with pytest.raises(SlotBusyError):
        save_slot(s, 0, "x.bin", directory=tmp_path)
    with pytest.raises(SlotBusyError):
        restore_slot(s, 0, "x.bin", directory=tmp_path)
    with pytest.raises(InvalidArgumentError):
        save_slot("server", 0, "x.bin", directory=tmp_path)
    with pytest.raises(InvalidArgumentError):
        save_slot(SlotServer(), 3, "x.bin", directory=tmp_path)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        save_slot(SlotServer(), 0, "x.bin", directory=tmp_path / "missing")
    with pytest.raises(InvalidArgumentError):
        ModelShape(0, 2, 32)
    with pytest.raises(InvalidArgumentError):
        ModelShape(4, 2, 32, "q8_0")
    with pytest.raises(InvalidArgumentError):
        SlotData(TINY_MODEL, (1, 2), np.zeros((4, 3, 2, 32), np.float16), np.zeros((4, 2, 2, 32), np.float16))
    with pytest.raises(InvalidArgumentError):
        encode_slot("not data")
    with pytest.raises(InvalidArgumentError):
        decode_slot("text", TINY_MODEL)
    with pytest.raises(InvalidArgumentError):
        offload_estimate(748, 131072, gpu_efficiency=1.5)
    with pytest.raises(InvalidArgumentError):
        offload_estimate(-1, 131072)
    with pytest.raises(InvalidArgumentError):
        synthetic_kv(TINY_MODEL, [1], seed=-1)
    assert list(tmp_path.iterdir()) == []


shapes = st.builds(
    ModelShape, st.integers(1, 3), st.integers(1, 3), st.integers(1, 8), st.sampled_from(["f16", "f32"])
)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, tokens=st.lists(st.integers(0, 2**31 - 1), max_size=20), seed=st.integers(0, 5))
def test_encode_decode_round_trip(tmp_path_factory, shape, tokens, seed):
    keys, values = synthetic_kv(shape, tokens, seed=seed)
    data = SlotData(shape, tuple(tokens), keys, values)
    blob = encode_slot(data)
    assert len(blob) == slot_file_size(shape, len(tokens))
    back = decode_slot(blob, shape)
    assert back.tokens == data.tokens
    assert np.array_equal(back.keys, keys) and np.array_equal(back.values, values)
    d = tmp_path_factory.mktemp("slots")
    assert write_slot_file(d, "f.bin", data) == len(blob)
    assert read_slot_file(d, "f.bin", shape).tokens == data.tokens
