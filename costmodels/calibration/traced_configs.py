"""The traced model a Nemotron-4 row is priced with: the transformers config of the same shape
in the ``models/`` folder beside the open CSVs (``nemotron4-15b.json``, ``nemotron4-340b.json``:
``NemotronForCausalLM``, squared-ReLU two-matmul MLP, GQA, partial rotary, untied).

``dgxc_runs`` prices the DGX Cloud Nemotron-4 runs with these configs (``dgxc_nemo_h100.csv``'s
``model_spec`` = ``hf:models/nemotron4-*.json``), so the FP8 harness prices the same runs, and
every other Nemotron-4 row of the same shape, with the same traced model instead of a SwiGLU
llama of ``ffn = 2f/3`` (same weights and FLOPs, but a SwiGLU keeps three ``f``-wide
activations where squared ReLU keeps two, and the llama proxy ties none of Nemotron's partial
rotary / head_dim). A row matches a config only on every shape field the row states (layers,
hidden, heads, kv heads, ffn, vocab, and a seq within the config's positions); a row of another
shape (Nemotron-3 8B / 22B: no traced config here) keeps the llama proxy.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

_FIELDS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
           "kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size"}


@functools.cache
def _configs(models: Path) -> tuple[tuple[Path, dict], ...]:
    if not models.is_dir():
        return ()
    out = []
    for f in sorted(models.glob("nemotron*.json")):
        cfg = json.loads(f.read_text())
        if cfg.get("model_type") == "nemotron":
            out.append((f, cfg))
    return tuple(out)


def traced_nemotron_config(row: dict[str, str], models: Path) -> Path | None:
    """The config file of ``models`` whose shape is the row's Nemotron model, else None."""
    if "nemotron" not in (row.get("model", "") + (row.get("family") or "")).lower():
        return None
    try:
        shape = {k: int(float(row[k])) for k in _FIELDS}
        seq = int(float(row["seq"]))
    except (KeyError, ValueError):
        return None
    for f, cfg in _configs(models):
        if all(cfg.get(v) == shape[k] for k, v in _FIELDS.items()) and seq <= cfg.get("max_position_embeddings", 0):
            return f
    return None
