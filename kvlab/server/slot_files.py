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
refused -- with a ``SlotFileError`` and nothing loaded -- when it comes from
another model shape or dtype (raw KV values are meaningless to another model, as
the lesson notes), when it is truncated, padded or its checksum does not match,
when it holds more than ``LIMITS.tokens`` tokens or ``LIMITS.mib`` MiB, a token
id outside 0..MAX_TOKEN_ID or a KV value that is not finite (NaN, inf).

**What the checksum protects against.** The SHA-256 catches accidents: a file
cut short by a full disk or a killed process, bits flipped on disk or in
transit, a file copied from another model that happens to have the right size.
It does not protect against tampering: anyone who can write the file can
recompute the checksum, so the value checks above (ids, finite values, sizes,
shape) are made on every load whatever the checksum says, and the file can at
worst restore wrong-but-valid KV. A signature with a server key (an HMAC) would
be needed to trust a file's origin; neither kvlab nor llama-server has one.
llama-server keeps no checksum at all: its restore checks the magic, the version,
that the token count fits the slot, and each layer's type and row size.

**Names and the directory** (``kvlab.server.save_dir``): the file name is one
plain name (``check_filename`` says exactly which names are refused and why), the
file is opened inside the directory without following a symlink, and a save
writes a new temporary file and renames it over the target, removing it on any
failure. llama-server validates the name with ``fs_validate_filename`` and then
opens ``--slot-save-path`` + name directly, following links.

kvlab's slots hold token ids, not tensors, so ``synthetic_kv`` stands in for the
model: a fixed, seeded function of (layer, token id, position) that gives every
saved file real, checkable KV arrays.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    SlotBusyError,
    SlotFileError,
    brief,
    check_choice,
    check_int,
    check_size,
)
from kvlab.server.inputs import read_tokens
from kvlab.server.save_dir import check_filename, read_file, write_file
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
MIB = 1 << 20
# Bounds of a model's cache shape, far above any released model (Llama 3.1 405B: 126 layers, 8 KV
# heads of 128; MHA models reach 128 heads; the widest heads are 576 values): a shape past them is
# a typo or an attack, and it would size synthetic_kv's arrays.
MAX_LAYERS = 1024
MAX_KV_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_KV_BYTES_PER_TOKEN = 16 * MIB  # 128x an 8B Llama at F16
MAX_SEED = 2**64 - 1  # numpy seeds are 64-bit words


@dataclass(frozen=True)
class ModelShape:
    """What a KV cache's bytes depend on: layers, KV heads, head size and the cache's dtype."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "f16"

    def __post_init__(self) -> None:
        """Bounds: ``MAX_LAYERS``, ``MAX_KV_HEADS``, ``MAX_HEAD_DIM`` and ``MAX_KV_BYTES_PER_TOKEN`` (see there)."""
        for name, bound in (
            ("n_layers", MAX_LAYERS),
            ("n_kv_heads", MAX_KV_HEADS),
            ("head_dim", MAX_HEAD_DIM),
        ):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1, maximum=bound))
        object.__setattr__(self, "dtype", check_choice("dtype", self.dtype, tuple(DTYPES)))
        if self.kv_bytes_per_token > MAX_KV_BYTES_PER_TOKEN:
            raise InvalidArgumentError(
                f"this shape needs {self.kv_bytes_per_token:,} bytes of KV per token, more than kvlab's "
                f"{MAX_KV_BYTES_PER_TOKEN:,} (128 times an 8B Llama): check the numbers"
            )

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
    """Exact size of a slot file holding ``n_tokens`` tokens (at most ``LIMITS.tokens``)."""
    n_tokens = check_size("n_tokens", n_tokens, "tokens")
    return header_bytes(shape) + n_tokens * shape.file_bytes_per_token


@dataclass(frozen=True, eq=False)
class SlotData:
    """A slot's cache: its token ids and K/V arrays of shape (n_layers, n_tokens, n_kv_heads, head_dim)."""

    shape: ModelShape
    tokens: tuple[int, ...]
    keys: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        """Token ids in 0..MAX_TOKEN_ID, at most ``LIMITS.tokens``; K and V finite, of the shape's dtype."""
        _check_shape(self.shape)
        object.__setattr__(self, "tokens", tuple(read_tokens("tokens", self.tokens, allow_empty=True)))
        want = (self.shape.n_layers, len(self.tokens), self.shape.n_kv_heads, self.shape.head_dim)
        dtype = DTYPES[self.shape.dtype][1]
        for name, arr in (("keys", self.keys), ("values", self.values)):
            if not isinstance(arr, np.ndarray) or arr.shape != want or arr.dtype != dtype:
                raise InvalidArgumentError(f"{name} must be a {dtype} array of shape {want}")
            if not np.isfinite(arr).all():
                raise InvalidArgumentError(f"{name} holds a NaN or an infinity; KV values must be finite")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def synthetic_kv(shape: ModelShape, tokens: Sequence[int], *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stand-in K and V for ``tokens``: same inputs, same bits, in any process."""
    _check_shape(shape)
    toks = np.asarray(read_tokens("tokens", tokens, allow_empty=True), dtype=np.int64)
    seed = check_int("seed", seed, minimum=0, maximum=MAX_SEED)
    rows = len(toks) * shape.kv_bytes_per_token // shape.itemsize * 8  # float64 rows before the cast
    table = 2 * shape.n_layers * 257 * shape.n_kv_heads * shape.head_dim * 8  # the random table
    work = 2 * rows + table  # the rows and their cosine-scaled copy, plus the table
    if work > LIMITS.memory_mib * MIB:
        raise InvalidArgumentError(
            f"{len(toks):,} tokens of this shape need {work // MIB:,} MiB of working memory, more than "
            f"LIMITS.memory_mib ({LIMITS.memory_mib:,}); use fewer tokens or a smaller shape, or "
            f"kvlab.errors.raised_limits(memory_mib=...)"
        )
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
            f"the file is truncated: {len(blob):,} bytes, shorter than the {_HEADER.size}-byte header"
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
    dtype_name = _DTYPE_BY_CODE[code]
    if (n_layers, n_heads, head_dim, dtype_name) != (
        shape.n_layers,
        shape.n_kv_heads,
        shape.head_dim,
        shape.dtype,
    ):
        saved = f"{n_layers} layers, {n_heads} KV heads x {head_dim}, {dtype_name.upper()}"
        raise SlotFileError(
            f"the file was saved by a model with {saved}, but this model has {shape.describe()}: "
            "KV values only mean something to the model and cache type that wrote them"
        )
    if n > LIMITS.tokens:
        raise SlotFileError(
            f"the file claims {n:,} tokens, more than LIMITS.tokens ({LIMITS.tokens:,}); it is corrupted "
            "or from a larger run (kvlab.errors.raised_limits(tokens=...))"
        )
    want = slot_file_size(shape, n)
    if len(blob) < want:
        raise SlotFileError(f"the file is truncated: {len(blob):,} bytes, {want:,} expected for {n:,} tokens")
    if len(blob) > want:
        raise SlotFileError(
            f"the file has {len(blob) - want:,} bytes more than {n:,} tokens need; it is corrupted"
        )
    payload = blob[_HEADER.size :]
    if hashlib.sha256(payload).digest() != digest:
        raise SlotFileError("the file's checksum does not match its contents; it is corrupted")
    off = 0
    tokens = np.frombuffer(payload, dtype="<i4", count=n, offset=off)
    off += 4 * n
    if n and int(tokens.min()) < 0:  # int32: never above MAX_TOKEN_ID
        i = int(np.argmin(tokens))
        raise SlotFileError(f"token {i} of the file is {int(tokens[i])}, not a token id (0..2**31-1)")
    cells = np.frombuffer(payload, dtype=_CELL, count=n, offset=off)
    off += _CELL.itemsize * n
    if not (
        np.array_equal(cells["pos"], np.arange(n))
        and np.all(cells["n_seq"] == 1)
        and np.all(cells["seq_id"] == 0)
    ):
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
            if not np.isfinite(arr).all():
                raise SlotFileError(
                    f"layer {layer}'s {'KV'[kind]} holds a NaN or an infinity; KV values are finite, so the file is "
                    "corrupted (a recomputed checksum does not make it valid)"
                )
            arrays[kind].append(arr.reshape(n, n_heads, head_dim))
            off += n * row
    keys = np.stack(arrays[0])
    values = np.stack(arrays[1])
    return SlotData(shape, tuple(int(t) for t in tokens), keys.copy(), values.copy())


def max_file_bytes(shape: ModelShape) -> int:
    """The largest slot file kvlab reads for ``shape``: ``LIMITS.tokens`` tokens, and at most ``LIMITS.mib`` MiB."""
    return min(slot_file_size(shape, LIMITS.tokens), LIMITS.mib * MIB)


def write_slot_file(directory: str | os.PathLike[str], filename: str, data: SlotData) -> int:
    """Write ``data`` to ``directory/filename`` atomically (``kvlab.server.save_dir.write_file``); return the bytes written."""
    check_filename(filename)
    blob = encode_slot(data)
    if len(blob) > LIMITS.mib * MIB:
        raise InvalidArgumentError(
            f"the slot file would be {len(blob):,} bytes, more than LIMITS.mib ({LIMITS.mib:,} MiB)"
        )
    return write_file(directory, filename, blob)


def read_slot_file(directory: str | os.PathLike[str], filename: str, shape: ModelShape) -> SlotData:
    """Read and check ``directory/filename`` for a model of ``shape`` (never following a symlink)."""
    check_filename(filename)
    _check_shape(shape)
    return decode_slot(read_file(directory, filename, max_file_bytes(shape)), shape)


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
    slot_id = check_int("slot_id", slot_id)
    if server.state().slots[slot_id].request_id is not None:
        raise SlotBusyError(f"slot {slot_id} is busy; save it when idle")
    filename = check_filename(filename)
    _check_shape(shape)
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
    slot_id = check_int("slot_id", slot_id)
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
    n_tokens = check_size("n_tokens", n_tokens, "tokens")
    bytes_per_token = check_int("bytes_per_token", bytes_per_token, minimum=1, maximum=MAX_KV_BYTES_PER_TOKEN)
    for name, v in (
        ("n_params", n_params),
        ("read_bytes_per_s", read_bytes_per_s),
        ("cpu_flops", cpu_flops),
        ("gpu_flops", gpu_flops),
        ("gpu_efficiency", gpu_efficiency),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _positive_finite(v):
            raise InvalidArgumentError(f"{name} must be a positive, finite number, got {brief(v)}")
    if float(gpu_efficiency) > 1:
        raise InvalidArgumentError(
            f"gpu_efficiency is a fraction of peak (0 to 1], got {brief(gpu_efficiency)}"
        )
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


def _positive_finite(v: float) -> bool:
    try:
        f = float(v)
    except (OverflowError, ValueError):  # an int too large for a float
        return False
    return math.isfinite(f) and f > 0
