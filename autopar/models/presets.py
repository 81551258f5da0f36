"""Built-in presets. Each is a ModelConfig of one family; overrides use the family's keys
(``gpt3-175b:seq=4096``). Sources of the shapes are given per preset."""
from __future__ import annotations

from autopar.models.config import ModelConfig

_GPT2 = dict(family="gpt", vocab=50257, seq=1024, dropout=0.1, tied=True)   # Radford et al. 2019
_LLAMA3 = dict(family="llama", kv_heads=8, vocab=128256, seq=8192, rope_theta=500000.0)  # Meta 2024

PRESETS: dict[str, ModelConfig] = {
    "gpt2-small": ModelConfig(layers=12, hidden=768, heads=12, **_GPT2),
    "gpt2-medium": ModelConfig(layers=24, hidden=1024, heads=16, **_GPT2),
    "gpt2-large": ModelConfig(layers=36, hidden=1280, heads=20, **_GPT2),
    "gpt2-xl": ModelConfig(layers=48, hidden=1600, heads=25, **_GPT2),
    # Megatron's GPT-3 175B (Narayanan et al. 2021, Table 1; Korthikanti et al. 2022, Table 3)
    "gpt3-175b": ModelConfig(family="gpt", layers=96, hidden=12288, heads=96, vocab=51200,
                             seq=2048, dropout=0.1, tied=True),
    # "The Llama 3 Herd of Models", Dubey et al. 2024, Table 3
    "llama3-8b": ModelConfig(layers=32, hidden=4096, heads=32, ffn=14336, **_LLAMA3),
    "llama3-70b": ModelConfig(layers=80, hidden=8192, heads=64, ffn=28672, **_LLAMA3),
    "llama3-405b": ModelConfig(layers=126, hidden=16384, heads=128, ffn=53248, **_LLAMA3),
    # Mixtures of Experts (autopar/models/moe.py: GQA attention, no MLA; head dim = hidden/heads).
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, 61 layers, 128 heads,
    # first_k_dense_replace 3, intermediate_size 18432, moe_intermediate_size 2048,
    # n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1, vocab 129280; MLA's
    # low-rank q/kv projections are modelled as full multi-head attention)
    "deepseek-v3-like": ModelConfig(family="moe", layers=61, hidden=7168, heads=128, ffn=18432,
                                    vocab=129280, seq=4096, experts=256, top_k=8, expert_ffn=2048,
                                    shared_experts=1, dense_layers=3, rope_theta=10000.0),
    # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, 48 layers, 32 heads,
    # 4 kv heads, moe_intermediate_size 768, 128 experts, 8 per token, vocab 151936; its
    # head_dim 128 is not hidden/heads = 64 here)
    "qwen3-moe-like": ModelConfig(family="moe", layers=48, hidden=2048, heads=32, kv_heads=4,
                                  ffn=6144, vocab=151936, seq=4096, experts=128, top_k=8,
                                  expert_ffn=768, rope_theta=1000000.0, norm_eps=1e-6),
    # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, 32 layers, 32
    # heads, 8 kv heads, intermediate_size 14336, 8 local experts, 2 per token, vocab 32000)
    "mixtral-like": ModelConfig(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8,
                                ffn=14336, vocab=32000, seq=4096, experts=8, top_k=2,
                                rope_theta=1000000.0),
    # Devlin et al. 2019 (BERT-Large, uncased vocabulary)
    "bert-large": ModelConfig(family="bert", layers=24, hidden=1024, heads=16, vocab=30522,
                              seq=512, dropout=0.1),
    # Dosovitskiy et al. 2021, ViT-Huge/14 at 224x224
    "vit-huge": ModelConfig(family="vit", layers=32, hidden=1280, heads=16, ffn=5120,
                            image=224, patch=14, classes=1000),
}
