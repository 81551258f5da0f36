"""ModelConfig: the handful of numbers that define a preset or family model.

One dataclass serves every built-in family (gpt, llama, bert, vit, mlp); fields a family does
not use keep their defaults. ``autopar.models.spec`` parses strings such as
``gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256`` into one of these.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

FAMILIES = ("gpt", "llama", "bert", "vit", "mlp", "moe")


@dataclass(frozen=True)
class ModelConfig:
    family: str
    layers: int
    hidden: int
    heads: int = 1
    kv_heads: int = 0          # 0 means "same as heads" (no grouped-query attention)
    ffn: int = 0               # 0 means the family default (4·hidden)
    vocab: int = 0
    seq: int = 1
    dropout: float = 0.0
    tied: bool = False         # input embedding shared with the output head
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0   # llama only
    image: int = 224           # vit only
    patch: int = 16            # vit only
    channels: int = 3          # vit only
    classes: int = 1000        # vit, mlp
    in_features: int = 0       # mlp only (0: same as hidden)
    type_vocab: int = 2        # bert only
    # moe only (autopar/models/moe.py): routed experts, experts per token, each expert's inner
    # width, always-on shared experts, leading dense (SwiGLU) blocks, and the capacity factor
    # (0.0: dropless, every routed token is computed)
    experts: int = 8
    top_k: int = 2
    expert_ffn: int = 0        # 0 means ffn (the dense blocks' width)
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float = 0.0
    # moe only: Multi-head Latent Attention (autopar/models/mla.py) when kv_lora_rank is set; its
    # query rank (0: one h → heads·(nope + rope) projection) and head widths
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn_dim(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn_dim(self) -> int:
        return self.expert_ffn or self.ffn_dim

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def tokens_per_sample(self) -> int:
        """Sequence length the model actually runs (ViT: patches + class token)."""
        if self.family == "vit":
            return (self.image // self.patch) ** 2 + 1
        return self.seq


SETTING_TYPES = {f.name: f.type for f in fields(ModelConfig) if f.name != "family"}

# Settings each family accepts (the rest are fixed by the family).
FAMILY_KEYS = {
    "gpt": ("layers", "hidden", "heads", "ffn", "vocab", "seq", "dropout", "tied"),
    "llama": ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "norm_eps",
              "rope_theta", "tied"),
    "bert": ("layers", "hidden", "heads", "ffn", "vocab", "seq", "dropout", "type_vocab"),
    "vit": ("layers", "hidden", "heads", "ffn", "image", "patch", "channels", "classes", "dropout"),
    "mlp": ("layers", "hidden", "ffn", "in_features", "classes", "seq", "dropout"),
    "moe": ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "norm_eps",
            "rope_theta", "tied", "experts", "top_k", "expert_ffn", "shared_experts",
            "dense_layers", "capacity_factor", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim"),
}
REQUIRED_KEYS = {
    "gpt": ("layers", "hidden", "heads", "vocab", "seq"),
    "llama": ("layers", "hidden", "heads", "ffn", "vocab", "seq"),
    "bert": ("layers", "hidden", "heads", "vocab", "seq"),
    "vit": ("layers", "hidden", "heads"),
    "mlp": ("layers", "hidden"),
    "moe": ("layers", "hidden", "heads", "ffn", "vocab", "seq", "experts", "top_k"),
}
