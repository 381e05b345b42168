#!/usr/bin/env bash
# GPU checks for kvlab.engine, in under five minutes on one GPU (written for an H200):
#   1. the Triton kernel's tests on CUDA: fp32/fp16/bf16 against float64 attention, block sizes
#      1/16/64, GQA 1/4/8, split-K, a serving shape (32 x ragged up to 4k) against the torch walk;
#   2. the paged-attention and engine tests (CPU tensors; they must still pass on the GPU box; the
#      FlexAttention tests compile C++ on the CPU and stay with the CPU suite);
#   3. the benchmark's GPU section: Triton vs SDPA and % of peak bandwidth at 32 x 4k and others.
# Needs torch with CUDA and triton already installed (the GPU machine has no network).
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
export TRITON_DEFAULT_FP_FUSION=1
python - <<'PY'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
print("torch", torch.__version__, "triton", triton.__version__, "on", torch.cuda.get_device_name())
PY
timeout 120 python -m pytest tests/engine/test_triton_kernel.py -q -rs
timeout 90 python -m pytest tests/engine/test_paged_attention.py tests/engine/test_engine.py -q -x
timeout 90 python benchmarks/paged_attention.py --gpu-only --skip-ttft --skip-prefill --no-flex --reps 5
