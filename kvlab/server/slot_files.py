"""Saving a slot's KV cache to a file and restoring it, in this process or a new one (example 11).

llama-server's ``--slot-save-path DIR`` with ``POST /slots/N?action=save`` writes
a slot's token ids and KV values to ``DIR/filename``; ``action=restore`` reads
them back into a slot, even in a freshly started server, and the next request
that starts with the saved tokens gets them all as ``cache_n``.

The file format here is kvlab's own, with the per-token layout the lesson
measured on llama-server: the KV bytes, a 4-byte token id and 12 bytes of cell
metadata (position, number of sequences, sequence id) per token. So the lesson's
tiny model (4 layers, 2 KV heads of 32 values, F16) takes 1,024 + 16 = 1,040
bytes per token. Layout, all little-endian::

    header      magic "KVLABSLT", format version, n_layers, n_kv_heads, head_dim,
                dtype code, n_tokens (u32 each), SHA-256 of everything after the header
    token ids   n_tokens x int32
    cells       n_tokens x (pos int32, n_seq u32, seq_id int32)
    per layer   K: (layer, bytes per token) u32 x 2, then n_tokens x n_kv_heads x head_dim values
                V: the same

Arrays are written and read as raw bytes with numpy (never pickle). A file is
refused -- with a ``SlotFileError`` and nothing loaded -- when its name could
leave the directory, when it comes from another model shape or dtype (raw KV
values are meaningless to another model, as the lesson notes), or when it is
truncated or its checksum does not match.

kvlab's slots hold token ids, not tensors, so ``synthetic_kv`` stands in for the
model: a fixed, seeded function of (layer, token id, position) that gives every
saved file real, checkable KV arrays.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvlab.errors import (
    InvalidArgumentError,
    SlotBusyError,
    SlotFileError,
    brief,
    check_choice,
    check_int,
    check_tokens,
)
from kvlab.server.slots import SlotServer

MAGIC = b"KVLABSLT"
FORMAT_VERSION = 1
TOKEN_ID_BYTES = 4
CELL_META_BYTES = 12
_HEADER = struct.Struct("<8sIIIIII32s")
_LAYER = struct.Struct("<II")
_CELL = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq_id", "<i4")])
DTYPES: dict[str, tuple[int, np.dtype]] = {"f16": (1, np.dtype("<f2")), "f32": (2, np.dtype("<f4"))}
_DTYPE_BY_CODE = {code: name for name, (code, _) in DTYPES.items()}


@dataclass(frozen=True)
class ModelShape:
    """What a KV cache's bytes depend on: layers, KV heads, head size and the cache's dtype."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "f16"

    def __post_init__(self) -> None:
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_kv_heads", self.n_kv_heads, minimum=1)
        check_int("head_dim", self.head_dim, minimum=1)
        check_choice("dtype", self.dtype, tuple(DTYPES))

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1].itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.itemsize

    @property
    def file_bytes_per_token(self) -> int:
        """KV bytes plus the token id and the cell metadata."""
        return self.kv_bytes_per_token + TOKEN_ID_BYTES + CELL_META_BYTES

    def describe(self) -> str:
        return f"{self.n_layers} layers, {self.n_kv_heads} KV heads x {self.head_dim}, {self.dtype.upper()}"


TINY_MODEL = ModelShape(4, 2, 32, "f16")  # the lesson's tiny model
LLAMA_8B = ModelShape(32, 8, 128, "f16")  # an 8B Llama-3 shape: 131,072 B per token


def header_bytes(shape: ModelShape) -> int:
    """Bytes that do not scale with tokens: the header and the per-layer fields."""
    _check_shape(shape)
    return _HEADER.size + 2 * _LAYER.size * shape.n_layers


def slot_file_size(shape: ModelShape, n_tokens: int) -> int:
    """Exact size of a slot file holding ``n_tokens`` tokens."""
    check_int("n_tokens", n_tokens, minimum=0)
    return header_bytes(shape) + n_tokens * shape.file_bytes_per_token


@dataclass(frozen=True, eq=False)
class SlotData:
    """A slot's cache: its token ids and K/V arrays of shape (n_layers, n_tokens, n_kv_heads, head_dim)."""

    shape: ModelShape
    tokens: tuple[int, ...]
    keys: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        _check_shape(self.shape)
        want = (self.shape.n_layers, len(self.tokens), self.shape.n_kv_heads, self.shape.head_dim)
        dtype = DTYPES[self.shape.dtype][1]
        for name, arr in (("keys", self.keys), ("values", self.values)):
            if not isinstance(arr, np.ndarray) or arr.shape != want or arr.dtype != dtype:
                raise InvalidArgumentError(f"{name} must be a {dtype} array of shape {want}")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def synthetic_kv(shape: ModelShape, tokens: Sequence[int], *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stand-in K and V for ``tokens``: same inputs, same bits, in any process."""
    _check_shape(shape)
    toks = np.asarray(check_tokens("tokens", tokens, allow_empty=True), dtype=np.int64)
    check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((2, shape.n_layers, 257, shape.n_kv_heads, shape.head_dim))
    angle = np.arange(len(toks))[:, None, None] * (1.0 / (1 + np.arange(shape.head_dim)))[None, None, :]
    rows = table[:, :, toks % 257]  # (2, layers, tokens, heads, dim)
    kv = (rows * np.cos(angle)).astype(DTYPES[shape.dtype][1])
    return kv[0], kv[1]


def encode_slot(data: SlotData) -> bytes:
    """The bytes of a slot file holding ``data``."""
    if not isinstance(data, SlotData):
        raise InvalidArgumentError(f"data must be SlotData, got {type(data).__name__}")
    shape, n = data.shape, data.n_tokens
    cells = np.zeros(n, dtype=_CELL)
    cells["pos"] = np.arange(n)
    cells["n_seq"] = 1
    parts = [np.asarray(data.tokens, dtype="<i4").tobytes(), cells.tobytes()]
    row = shape.n_kv_heads * shape.head_dim * shape.itemsize
    for layer in range(shape.n_layers):
        for arr in (data.keys, data.values):
            parts.append(_LAYER.pack(layer, row))
            parts.append(np.ascontiguousarray(arr[layer]).tobytes())
    payload = b"".join(parts)
    head = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        shape.n_layers,
        shape.n_kv_heads,
        shape.head_dim,
        DTYPES[shape.dtype][0],
        n,
        hashlib.sha256(payload).digest(),
    )
    return head + payload


def decode_slot(blob: bytes, shape: ModelShape) -> SlotData:
    """Parse a slot file's bytes for a model of ``shape``; refuse anything that does not fit it."""
    _check_shape(shape)
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"blob must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _HEADER.size:
        raise SlotFileError(
            f"the file is truncated: {len(blob)} bytes, shorter than the {_HEADER.size}-byte header"
        )
    magic, version, n_layers, n_heads, head_dim, code, n, digest = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise SlotFileError("this is not a kvlab slot file (wrong magic bytes)")
    if version != FORMAT_VERSION:
        raise SlotFileError(
            f"slot file format version {version} is not supported (this kvlab reads {FORMAT_VERSION})"
        )
    if code not in _DTYPE_BY_CODE:
        raise SlotFileError(f"the file names an unknown dtype code {code}; it is corrupted")
    saved = ModelShape(n_layers, n_heads, head_dim, _DTYPE_BY_CODE[code])
    if saved != shape:
        raise SlotFileError(
            f"the file was saved by a model with {saved.describe()}, but this model has {shape.describe()}: "
            "KV values only mean something to the model and cache type that wrote them"
        )
    want = slot_file_size(shape, n)
    if len(blob) < want:
        raise SlotFileError(f"the file is truncated: {len(blob)} bytes, {want} expected for {n} tokens")
    if len(blob) > want:
        raise SlotFileError(
            f"the file has {len(blob) - want} bytes more than {n} tokens need; it is corrupted"
        )
    payload = blob[_HEADER.size :]
    if hashlib.sha256(payload).digest() != digest:
        raise SlotFileError("the file's checksum does not match its contents; it is corrupted")
    off = 0
    tokens = np.frombuffer(payload, dtype="<i4", count=n, offset=off)
    off += 4 * n
    cells = np.frombuffer(payload, dtype=_CELL, count=n, offset=off)
    off += _CELL.itemsize * n
    if not (np.array_equal(cells["pos"], np.arange(n)) and np.all(cells["n_seq"] == 1)):
        raise SlotFileError(
            "the file's cell metadata is not one sequence at positions 0..n-1; it is corrupted"
        )
    row = n_heads * head_dim * shape.itemsize
    dtype = DTYPES[shape.dtype][1]
    arrays: list[list[np.ndarray]] = [[], []]
    for layer in range(n_layers):
        for kind in (0, 1):
            got_layer, got_row = _LAYER.unpack_from(payload, off)
            off += _LAYER.size
            if (got_layer, got_row) != (layer, row):
                raise SlotFileError(f"layer {layer} has the wrong section header; the file is corrupted")
            arr = np.frombuffer(payload, dtype=dtype, count=n * n_heads * head_dim, offset=off)
            arrays[kind].append(arr.reshape(n, n_heads, head_dim))
            off += n * row
    keys = np.stack(arrays[0])
    values = np.stack(arrays[1])
    return SlotData(shape, tuple(int(t) for t in tokens), keys.copy(), values.copy())


def check_filename(filename: object) -> str:
    """Return ``filename`` if it names a plain file inside the save directory; refuse anything else."""
    if not isinstance(filename, str) or not filename:
        raise InvalidArgumentError("filename must be a non-empty string such as 'agent-prefix.bin'")
    if "/" in filename or "\\" in filename or os.sep in filename or (os.altsep and os.altsep in filename):
        raise InvalidArgumentError(f"filename {filename!r} contains a path separator: give a bare file name")
    if ".." in filename:
        raise InvalidArgumentError(f"filename {filename!r} contains '..': give a bare file name")
    if "\0" in filename or filename.strip() != filename or len(filename.encode("utf-8")) > 255:
        raise InvalidArgumentError(f"filename {filename!r} is not a valid file name")
    return filename


def _path(directory: str | os.PathLike[str], filename: str) -> Path:
    check_filename(filename)
    if not isinstance(directory, (str, os.PathLike)):
        raise InvalidArgumentError("directory must be a path (the server's --slot-save-path)")
    d = Path(directory)
    if not d.is_dir():
        raise InvalidArgumentError(f"the slot save directory {str(d)!r} does not exist; create it first")
    return d / filename


def write_slot_file(directory: str | os.PathLike[str], filename: str, data: SlotData) -> int:
    """Write ``data`` to ``directory/filename`` (atomically); return the bytes written."""
    path = _path(directory, filename)
    blob = encode_slot(data)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    return len(blob)


def read_slot_file(directory: str | os.PathLike[str], filename: str, shape: ModelShape) -> SlotData:
    """Read and check ``directory/filename`` for a model of ``shape``."""
    path = _path(directory, filename)
    if not path.is_file():
        raise SlotFileError(f"no slot file {filename!r} in {str(path.parent)!r}")
    return decode_slot(path.read_bytes(), shape)


@dataclass(frozen=True)
class SlotActionResult:
    """The server's reply to a save or restore."""

    id_slot: int
    filename: str
    n_tokens: int
    n_bytes: int
    is_save: bool

    def to_json(self) -> dict[str, object]:
        if self.is_save:
            return {
                "id_slot": self.id_slot,
                "filename": self.filename,
                "n_saved": self.n_tokens,
                "n_written": self.n_bytes,
            }
        return {
            "id_slot": self.id_slot,
            "filename": self.filename,
            "n_restored": self.n_tokens,
            "n_read": self.n_bytes,
        }


def save_slot(
    server: object,
    slot_id: int,
    filename: str,
    *,
    directory: str | os.PathLike[str],
    shape: ModelShape = TINY_MODEL,
    seed: int = 0,
) -> SlotActionResult:
    """``POST /slots/{slot_id}?action=save``: write the slot's tokens and (stand-in) KV to a file."""
    if not isinstance(server, SlotServer):
        raise InvalidArgumentError("server must be a kvlab.server.slots.SlotServer")
    tokens = server.slot_tokens(slot_id)
    if server.state().slots[slot_id].request_id is not None:
        raise SlotBusyError(f"slot {slot_id} is busy; save it when idle")
    keys, values = synthetic_kv(shape, tokens, seed=seed)
    n = write_slot_file(directory, filename, SlotData(shape, tokens, keys, values))
    return SlotActionResult(slot_id, filename, len(tokens), n, True)


def restore_slot(
    server: object,
    slot_id: int,
    filename: str,
    *,
    directory: str | os.PathLike[str],
    shape: ModelShape = TINY_MODEL,
) -> SlotActionResult:
    """``POST /slots/{slot_id}?action=restore``: load a file into an idle slot; nothing changes on error."""
    if not isinstance(server, SlotServer):
        raise InvalidArgumentError("server must be a kvlab.server.slots.SlotServer")
    server.slot_tokens(slot_id)  # validates the slot id
    if server.state().slots[slot_id].request_id is not None:
        raise SlotBusyError(f"slot {slot_id} is busy; restore it when idle")
    data = read_slot_file(directory, filename, shape)
    if data.n_tokens > server.n_ctx:
        raise SlotFileError(f"the file holds {data.n_tokens} tokens but a slot holds {server.n_ctx}")
    server.load_tokens(slot_id, data.tokens)
    return SlotActionResult(slot_id, filename, data.n_tokens, slot_file_size(shape, data.n_tokens), False)


# ---------------------------------------------------------------------- memory arithmetic


@dataclass(frozen=True)
class OffloadEstimate:
    """What a saved prefix costs to read back, against recomputing it."""

    n_tokens: int
    bytes_per_token: int
    read_bytes_per_s: float
    recompute_flops: float
    cpu_flops: float
    gpu_flops: float
    gpu_efficiency: float

    @property
    def file_bytes(self) -> int:
        return self.n_tokens * self.bytes_per_token

    @property
    def file_mib(self) -> float:
        return self.file_bytes / (1 << 20)

    @property
    def read_ms(self) -> float:
        return self.file_bytes / self.read_bytes_per_s * 1000

    @property
    def cpu_recompute_s(self) -> float:
        return self.recompute_flops / self.cpu_flops

    @property
    def gpu_recompute_ms(self) -> float:
        return self.recompute_flops / (self.gpu_flops * self.gpu_efficiency) * 1000


def offload_estimate(
    n_tokens: int,
    bytes_per_token: int,
    *,
    n_params: float = 8.03e9,
    read_bytes_per_s: float = 3e9,
    cpu_flops: float = 1.02e12,
    gpu_flops: float = 165.2e12,
    gpu_efficiency: float = 0.5,
) -> OffloadEstimate:
    """Read time of the file against prefill at 2 FLOPs per parameter per token (defaults: the lesson's)."""
    check_int("n_tokens", n_tokens, minimum=0)
    check_int("bytes_per_token", bytes_per_token, minimum=1)
    for name, v in (
        ("n_params", n_params),
        ("read_bytes_per_s", read_bytes_per_s),
        ("cpu_flops", cpu_flops),
        ("gpu_flops", gpu_flops),
        ("gpu_efficiency", gpu_efficiency),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise InvalidArgumentError(f"{name} must be a positive number, got {brief(v)}")
    if gpu_efficiency > 1:
        raise InvalidArgumentError(f"gpu_efficiency is a fraction of peak (0 to 1], got {gpu_efficiency}")
    return OffloadEstimate(
        n_tokens,
        bytes_per_token,
        float(read_bytes_per_s),
        n_tokens * 2 * float(n_params),
        float(cpu_flops),
        float(gpu_flops),
        float(gpu_efficiency),
    )


def _check_shape(shape: object) -> None:
    if not isinstance(shape, ModelShape):
        raise InvalidArgumentError(f"shape must be a ModelShape, got {type(shape).__name__}")
