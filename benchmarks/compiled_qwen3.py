"""The Qwen3 that the compiled-training scripts (bench_compiled.py,
diff_compiled.py) build in each side's process: `tiny`, tests/test_compile.py's
model in float32 with a batch of 2 x 32; `bench`, the 0.6B's widths with 4 layers in
bf16 with a batch of 4 x 512."""

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SIZES = {
    "tiny": (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=512, initializer_range=0.2), torch.float32, (2, 32)),
    "bench": (dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                   head_dim=128, intermediate_size=3072, vocab_size=151936), torch.bfloat16, (4, 512)),
}


def build(size, device):
    """The model on `device` (seeded), its vocabulary size and its batch shape."""
    sizes, dtype, batch_shape = SIZES[size]
    torch.manual_seed(0)
    config = Qwen3Config(**sizes, tie_word_embeddings=True, attn_implementation="sdpa")
    return Qwen3ForCausalLM(config).to(dtype).to(device), sizes["vocab_size"], batch_shape
