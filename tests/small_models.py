"""The small models of the training tests, as `tenplex model gpt` arguments (Megatron-LM's
names): one list each, shared by gpt_train_test, python_reference_test and recompute_test
so that the same model is described once."""

from __future__ import annotations

# GPT-2 style: learned positions, LayerNorm, GeLU, tied embeddings; 4 layers of 64.
SMALL_GPT: list[str] = [
    "--num-layers",
    "4",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--vocab-size",
    "250",
    "--max-position-embeddings",
    "64",
]

# Llama style: RoPE, GQA (8 heads, 2 groups), SwiGLU, RMSNorm, no biases, untied output.
SMALL_LLAMA: list[str] = [
    "--num-layers",
    "4",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "8",
    "--num-query-groups",
    "2",
    "--ffn-hidden-size",
    "96",
    "--vocab-size",
    "250",
    "--make-vocab-size-divisible-by",
    "64",
    "--position-embedding-type",
    "rope",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--normalization",
    "RMSNorm",
    "--disable-bias-linear",
]
