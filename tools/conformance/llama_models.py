"""Tiny random-weight GGUF models for llama-server conformance runs (``llama_harness.py``).

Two models, written with the ``gguf`` package (``pip install gguf``), F32 weights:

* ``tiny-llama.gguf``: architecture ``llama``, 4 layers, n_embd 64, 2 heads and 2 KV
  heads of 32, FFN 128. KV cache (F16 by default): 4 layers x (K 2x32 + V 2x32) x 2 bytes
  = 1,024 bytes per token.
* ``tiny-gemma3.gguf``: architecture ``gemma3``, 6 layers, same widths, sliding window 128
  with llama.cpp's default gemma3 pattern (every 6th layer global: 5 SWA layers, 1 full),
  so ``-c 4096`` gives an SWA cache of pad256(128 + 512) = 768 cells.

Both use a SentencePiece-style vocabulary (``tokenizer.ggml.model = "llama"``): ``<unk>``,
``<s>``, ``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>`` and ``VOCAB_WORDS`` word pieces,
512 tokens in all. Requests send token ids below ``VOCAB_SIZE`` (llama-server refuses
others with "Prompt contains invalid tokens").
"""

from __future__ import annotations

from pathlib import Path

VOCAB_SIZE = 512
N_SPECIAL = 3  # <unk> <s> </s>
N_BYTES = 256
VOCAB_WORDS = VOCAB_SIZE - N_SPECIAL - N_BYTES
N_EMBD = 64
N_HEAD = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 128
N_CTX_TRAIN = 32768
LLAMA_LAYERS = 4
GEMMA3_LAYERS = 6
GEMMA3_SWA = 128
VERSION = 1  # bump when the layout changes, so cached files are rewritten


def _vocab(writer) -> None:  # type: ignore[no-untyped-def]
    import gguf

    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{i:02X}>" for i in range(N_BYTES)]
    types += [gguf.TokenType.BYTE] * N_BYTES
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: list[str] = []
    for a in letters:
        for b in letters:
            if len(words) == VOCAB_WORDS:
                break
            words.append("\u2581" + a + b)
    tokens += words
    types += [gguf.TokenType.NORMAL] * len(words)
    assert len(tokens) == VOCAB_SIZE
    scores = [0.0] * N_SPECIAL + [0.0] * N_BYTES + [-float(i) for i in range(len(words))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def _common(writer, n_layer: int) -> None:  # type: ignore[no-untyped-def]
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(0)  # ALL_F32


def write_model(path: Path, arch: str, seed: int = 0) -> Path:
    """Write one model (``arch`` "llama" or "gemma3") to ``path``."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:  # numpy shape is (rows, cols) = reversed ggml ne
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    n_layer = LLAMA_LAYERS if arch == "llama" else GEMMA3_LAYERS
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(f"kvlab tiny {arch}")
    _common(writer, n_layer)
    if arch == "gemma3":
        writer.add_sliding_window(GEMMA3_SWA)
    _vocab(writer)
    writer.add_tensor("token_embd.weight", w(VOCAB_SIZE, N_EMBD))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    if arch == "llama":
        writer.add_tensor("output.weight", w(VOCAB_SIZE, N_EMBD))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        writer.add_tensor(p + "attn_q.weight", w(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", w(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", w(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", w(N_EMBD, N_HEAD * HEAD_DIM))
        writer.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
        if arch == "gemma3":
            writer.add_tensor(p + "post_attention_norm.weight", ones(N_EMBD))
            writer.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "post_ffw_norm.weight", ones(N_EMBD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def ensure_models(cache: Path) -> dict[str, Path]:
    """The two model files in ``cache/models``, written when missing or out of date."""
    out = {}
    for arch, name in (("llama", "tiny-llama"), ("gemma3", "tiny-gemma3")):
        path = cache / "models" / f"{name}-v{VERSION}.gguf"
        if not path.exists():
            write_model(path, arch)
        out[arch] = path
    return out


if __name__ == "__main__":
    import os
    import sys

    root = Path(os.environ.get("KVLAB_LLAMA_CACHE", Path.home() / ".cache" / "kvlab-llama"))
    for arch, p in ensure_models(root).items():
        print(arch, p, p.stat().st_size, file=sys.stdout)
