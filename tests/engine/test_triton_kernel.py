"""The Triton paged-attention kernel: on a GPU for real, on a CPU under Triton's interpreter.

The interpreter must be switched on before the kernel module is imported
(``triton.jit`` decides at decoration time), so this file sets
``TRITON_INTERPRET=1`` first thing when there is no CUDA device.
"""

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from kvlab.engine import paged_attention  # noqa: E402
from kvlab.engine.triton_paged import paged_decode_kernel, triton_paged_attention  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
INTERPRETED = type(paged_decode_kernel).__name__ == "InterpretedFunction"
if not HAS_CUDA and not INTERPRETED:
    pytest.skip(
        "kvlab.engine.triton_paged was imported before TRITON_INTERPRET=1 was set; run this file on its own",
        allow_module_level=True,
    )
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def make_case(lens, block_size, num_kv_heads, group, head_dim=32, dtype=torch.float32, seed=0):
    """Dense per-sequence K/V scattered into shuffled physical blocks (as in test_paged_attention)."""
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(n, num_kv_heads, head_dim, generator=gen) for n in lens]
    values = [torch.randn(n, num_kv_heads, head_dim, generator=gen) for n in lens]
    query = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=gen)
    needed = [-(-n // block_size) for n in lens]
    num_blocks = sum(needed) + 2
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(lens), max(needed) + 1), 10**6, dtype=torch.int32)
    kc = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    vc = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    for s, n in enumerate(lens):
        for b in range(needed[s]):
            block = physical.pop()
            tables[s, b] = block
            rows = slice(b * block_size, min(n, (b + 1) * block_size))
            kc[block, : rows.stop - rows.start] = keys[s][rows]
            vc[block, : rows.stop - rows.start] = values[s][rows]
    # round once, so the float64 oracle sees exactly the values the kernel reads
    keys = [k.to(dtype) for k in keys]
    values = [v.to(dtype) for v in values]
    on = {"device": DEVICE, "dtype": dtype}
    return (
        query.to(**on),
        kc.to(**on),
        vc.to(**on),
        tables.to(DEVICE),
        torch.tensor(lens, dtype=torch.int32, device=DEVICE),
        keys,
        values,
    )


def dense_f64(query, keys, values):
    out = []
    for s, (k, v) in enumerate(zip(keys, values, strict=True)):
        q = query[s].double().cpu()
        group = q.shape[0] // k.shape[1]
        k2 = k.double().repeat_interleave(group, dim=1)
        v2 = v.double().repeat_interleave(group, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q, k2) * q.shape[-1] ** -0.5, dim=-1)
        out.append(torch.einsum("ht,thd->hd", w, v2))
    return torch.stack(out)


LENS = [1, 17, 70]  # tiny: the interpreter runs every program in Python


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_kernel_matches_float64_attention_in_float32(block_size, group):
    q, kc, vc, bt, sl, keys, values = make_case(LENS, block_size, 1, group, seed=block_size * 10 + group)
    out = paged_attention(q, kc, vc, bt, sl, impl="triton")
    torch.testing.assert_close(out.double().cpu(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_kernel_matches_float64_attention_in_float16(block_size):
    q, kc, vc, bt, sl, keys, values = make_case(LENS, block_size, 2, 4, dtype=torch.float16, seed=block_size)
    out = paged_attention(q, kc, vc, bt, sl, impl="triton")
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double().cpu(), dense_f64(q, keys, values), atol=1e-3, rtol=0)


@pytest.mark.parametrize("num_splits", [2, 3])
def test_split_k_merges_to_the_same_result(num_splits):
    """More splits than some sequences have tiles: empty splits must not disturb the merge."""
    q, kc, vc, bt, sl, keys, values = make_case([1, 40, 150], 16, 1, 4, seed=num_splits)
    out = triton_paged_attention(q, kc, vc, bt, sl, scale=32**-0.5, num_splits=num_splits, tile=32)
    torch.testing.assert_close(out.double().cpu(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


def test_head_dim_that_is_not_a_power_of_two_is_padded():
    q, kc, vc, bt, sl, keys, values = make_case([9, 33], 16, 1, 2, head_dim=24)
    out = paged_attention(q, kc, vc, bt, sl, impl="triton")
    torch.testing.assert_close(out.double().cpu(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


@pytest.mark.skipif(
    not HAS_CUDA, reason="the interpreter's bf16 tl.dot is not exact: bf16 is checked on a GPU"
)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_kernel_in_bfloat16_on_a_gpu(block_size):
    q, kc, vc, bt, sl, keys, values = make_case(
        [1, 17, 300, 1000], block_size, 8, 4, head_dim=128, dtype=torch.bfloat16
    )
    out = paged_attention(q, kc, vc, bt, sl)  # auto picks triton on CUDA
    torch.testing.assert_close(out.double().cpu(), dense_f64(q, keys, values), atol=1e-2, rtol=0)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_kernel_on_a_gpu_at_a_serving_shape(dtype):
    """32 sequences of ragged length up to 4k, 32 query / 8 KV heads of 128: triton vs the torch walk."""
    lens = [1 + (97 * i) % 4096 for i in range(32)]
    q, kc, vc, bt, sl, _, _ = make_case(lens, 16, 8, 4, head_dim=128, dtype=dtype)
    out = paged_attention(q, kc, vc, bt, sl, impl="triton")
    ref = paged_attention(q, kc, vc, bt, sl, impl="torch")
    torch.testing.assert_close(out.float(), ref.float(), atol=TOLERANCE[dtype] * 2, rtol=0)


HOPPER_CHECK = """
import sys
from kvlab.engine.triton_paged import compile_ahead
kernel = compile_ahead(90)
ptx = kernel.asm["ptx"]
assert kernel.asm["cubin"], "no cubin"
assert ".target sm_90" in ptx, "not built for sm_90"
assert "mma" in ptx, "the tl.dots did not become tensor-core instructions"
print("ok", len(kernel.asm["cubin"]), "bytes of cubin")
"""


def test_kernel_compiles_for_hopper_without_a_gpu():
    """Build the bf16 kernel for sm_90 (H100/H200) ahead of time: Triton IR -> PTX -> cubin via ptxas.

    In a fresh process: an interpreted process cannot run Triton's real compiler.
    """
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("this triton build has no NVIDIA backend")
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not (os.path.exists(os.path.join(bin_dir, "ptxas")) or shutil.which("ptxas")):
        pytest.skip("no ptxas available to assemble the kernel offline")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", HOPPER_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")
