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
    # Devlin et al. 2019 (BERT-Large, uncased vocabulary)
    "bert-large": ModelConfig(family="bert", layers=24, hidden=1024, heads=16, vocab=30522,
                              seq=512, dropout=0.1),
    # Dosovitskiy et al. 2021, ViT-Huge/14 at 224x224
    "vit-huge": ModelConfig(family="vit", layers=32, hidden=1280, heads=16, ffn=5120,
                            image=224, patch=14, classes=1000),
}
