"""An ``hf:`` config held to the same size limits as every other model (``LIMITS`` in
``costmodels.contracts.checks``), read through transformers' own attribute names (its
``attribute_map`` turns GPT-2's ``n_layer`` / ``n_embd`` into ``num_hidden_layers`` /
``hidden_size``), before any module is built: ``n_layer: 100000`` would build for minutes,
``n_embd: 1048576`` would be priced as a 26-trillion-parameter model."""
from __future__ import annotations

import numbers

from costmodels.contracts.checks import LIMITS, quote
from costmodels.contracts.errors import SpecError

# (transformers attribute, LIMITS key) — the first attribute a config has is checked
_SIZES = (("num_hidden_layers", "layers"), ("hidden_size", "hidden"), ("num_attention_heads", "heads"),
          ("num_key_value_heads", "kv_heads"), ("intermediate_size", "ffn"), ("n_inner", "ffn"),
          ("vocab_size", "vocab"), ("image_size", "image"), ("patch_size", "patch"),
          ("num_channels", "channels"), ("num_labels", "classes"), ("type_vocab_size", "type_vocab"))


def check_hf_sizes(config, path: str, seq: int | None = None) -> None:
    """One SpecError line naming the config field above its limit (or not a positive integer)."""
    for attr, key in _SIZES:
        try:
            value = getattr(config, attr, None)
        except Exception:  # noqa: BLE001 — a config property that cannot be computed is not ours
            value = None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            if key in ("vocab", "classes", "type_vocab") and value == 0:
                continue
            raise SpecError(f"hf config '{path}': {attr}={quote(value)} must be a positive integer")
        if value > LIMITS[key]:
            raise SpecError(f"hf config '{path}': {attr}={value:,} is above autopar's limit of "
                            f"{LIMITS[key]:,} (LIMITS['{key}'] in costmodels/contracts/checks.py); "
                            "use a smaller model")
    if seq is not None and seq > LIMITS["seq"]:
        raise SpecError(f"sequence length {seq:,} is above autopar's limit of {LIMITS['seq']:,}")
