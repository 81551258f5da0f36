"""``hf:path/to/config.json``: a transformers model built from its config alone.

No weights and no network: the config file is read locally, the model is built with
``AutoModelForCausalLM.from_config`` (falling back to ``AutoModel``). Inputs are token ids of
``seq`` tokens (default: the config's ``max_position_embeddings``, capped at 2048). Needs the
``hf`` extra (``pip install -e .[hf]``).
"""
from __future__ import annotations

import json
import os

import torch

from autopar.models.source import ModelSource, token_loss
from costmodels.errors import SpecError


def hf_source(spec: str, path: str, seq: int | None) -> ModelSource:
    if not os.path.isfile(path):
        raise SpecError(f"hf config '{path}' does not exist; give 'hf:path/to/config.json'")
    try:
        import transformers
    except ImportError:
        raise SpecError("the 'hf:' model form needs transformers; run: pip install -e '.[hf]'") from None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        config = transformers.AutoConfig.for_model(**raw) if "model_type" in raw else None
    except (json.JSONDecodeError, ValueError, KeyError) as e:
        raise SpecError(f"hf config '{path}' could not be read ({e}); it must be a transformers config.json") from None
    if config is None:
        raise SpecError(f"hf config '{path}' has no 'model_type'; add one (e.g. \"model_type\": \"llama\")")
    config._attn_implementation = "eager"
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 1:
        raise SpecError(f"hf config '{path}' has no vocab_size; autopar feeds token ids to hf models")
    seq_len = seq or min(int(getattr(config, "max_position_embeddings", 2048) or 2048), 2048)

    def build(attention):
        config._attn_implementation = "sdpa" if attention == "flash" else "eager"
        try:
            model = transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:
            model = transformers.AutoModel.from_config(config)
        model.config.use_cache = False
        return HFLogits(model)

    def inputs(batch, g, device):
        if g is None or device == "meta":
            return (torch.randint(0, vocab, (batch, seq_len), device=device),)
        return (torch.randint(0, vocab, (batch, seq_len), generator=g).to(device),)

    def targets(inp, batch, g, device):
        return inputs(batch, g, device)[0]

    return ModelSource(spec=spec, config=None, seq=seq_len, _build=build, _inputs=inputs,
                       _targets=targets, loss_fn=token_loss)


class HFLogits(torch.nn.Module):
    """Wraps a transformers model so that forward(ids) returns a plain tensor (logits or the
    last hidden state) instead of a ModelOutput."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
