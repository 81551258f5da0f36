"""``hf:path/to/config.json``: a transformers model built from its config alone, with the
training head people train it with.

No weights and no network: the config file is read locally. The head: the config's own
``architectures[0]`` when transformers has that class; else ``…ForImageClassification`` for a
vision config (``image_size``), ``…ForMaskedLM`` for an encoder (BERT, RoBERTa: what users
train, not ``BertLMHeadModel``), ``…ForCausalLM`` for a decoder, ``AutoModel`` otherwise.
Inputs: token ids of ``seq`` tokens (default: the config's ``max_position_embeddings``, capped
at 2048), or pixels ``(B, channels, image, image)`` with class labels for an image model, whose
``seq`` is its token count (patches, plus one class token). Needs the ``hf`` extra
(``pip install -e .[hf]``).
"""
from __future__ import annotations

import json
import os

import torch

from autopar.models.source import ModelSource, token_loss
from costmodels.contracts.errors import SpecError


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
        config = _quiet_config(transformers, raw) if "model_type" in raw else None
    except (json.JSONDecodeError, ValueError, KeyError) as e:
        raise SpecError(f"hf config '{path}' could not be read ({e}); it must be a transformers config.json") from None
    if config is None:
        raise SpecError(f"hf config '{path}' has no 'model_type'; add one (e.g. \"model_type\": \"llama\")")
    from autopar.models.hf_limits import check_hf_sizes
    check_hf_sizes(config, path, seq)   # before any module is built
    config._attn_implementation = "eager"
    head = training_head(transformers, config)
    image = int(getattr(config, "image_size", 0) or 0) if head.__name__.endswith("ImageClassification") else 0
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if not image and vocab < 1:
        raise SpecError(f"hf config '{path}' has no vocab_size (nor image_size); autopar feeds token ids "
                        "(or pixels) to hf models")
    if image:
        patch = int(getattr(config, "patch_size", 16) or 16)
        seq_len = (image // patch) ** 2 + 1
        channels, classes = int(getattr(config, "num_channels", 3)), int(getattr(config, "num_labels", 2))
    else:
        seq_len = seq or min(int(getattr(config, "max_position_embeddings", 2048) or 2048), 2048)

    fused = supports_sdpa(transformers, head, config)

    def build(attention):
        # a model without SDPA attention in transformers runs its eager attention under any plan
        config._attn_implementation = "sdpa" if attention == "flash" and fused else "eager"
        model = head(config)
        model.config.use_cache = False
        return HFLogits(model)

    def draw(high, shape, g, device):
        if g is None or device == "meta":
            return torch.randint(0, high, shape, device=device)
        return torch.randint(0, high, shape, generator=g).to(device)

    def inputs(batch, g, device):
        if image:
            shape = (batch, channels, image, image)
            if g is None or device == "meta":
                return (torch.randn(shape, device=device),)
            return (torch.randn(shape, generator=g).to(device),)
        return (draw(vocab, (batch, seq_len), g, device),)

    def targets(inp, batch, g, device):
        return draw(classes, (batch,), g, device) if image else draw(vocab, (batch, seq_len), g, device)

    return ModelSource(spec=spec, config=None, seq=seq_len, _build=build, _inputs=inputs,
                       _targets=targets, loss_fn=token_loss, fused_attention=fused)


def supports_sdpa(transformers, head, config) -> bool:
    """Whether transformers has SDPA attention for the class ``head`` builds (``_supports_sdpa``):
    Gemma-2, BLOOM and DeBERTa-v2 do not, and asking for it raises a ValueError at build."""
    cls = head
    if isinstance(head, _AutoHead):
        cls = head.auto._model_mapping.get(type(config), None) if hasattr(head.auto, "_model_mapping") else None
    return bool(getattr(cls, "_supports_sdpa", True)) if cls is not None else True


def _quiet_config(transformers, raw: dict):
    """The config, without transformers' warnings on stderr (a command's output is its own lines:
    a config's oddity that matters is refused by autopar in one line)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return transformers.AutoConfig.for_model(**raw)
    finally:
        transformers.logging.set_verbosity(verbosity)


def training_head(transformers, config):
    """The model class users train for ``config`` (see the module docstring)."""
    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    auto = transformers.models.auto.modeling_auto
    kind = config.model_type
    if getattr(config, "image_size", None) and kind in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return _AutoHead(transformers.AutoModelForImageClassification, "ImageClassification")
    if kind in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False) \
            and kind not in _DECODERS:
        return _AutoHead(transformers.AutoModelForMaskedLM, "MaskedLM")
    if kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return _AutoHead(transformers.AutoModelForCausalLM, "CausalLM")
    return _AutoHead(transformers.AutoModel, "Model")


# decoders that transformers also maps to a masked-LM head (for infilling); users train them causal
_DECODERS = {"mistral", "llama", "qwen2", "gpt2", "mixtral"}


class _AutoHead:
    """``AutoModelFor….from_config`` as a class-like callable with the head in its name."""

    def __init__(self, auto, head: str):
        self.auto, self.__name__ = auto, f"AutoModelFor{head}"

    def __call__(self, config):
        return self.auto.from_config(config)


class HFLogits(torch.nn.Module):
    """Wraps a transformers model so that forward(ids) returns a plain tensor (logits or the
    last hidden state) instead of a ModelOutput; an encoder-decoder's decoder is fed the ids
    shifted right."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs):
        key = "pixel_values" if inputs.is_floating_point() else "input_ids"
        extra = {}
        if getattr(self.model.config, "is_encoder_decoder", False) and key == "input_ids":
            # an encoder-decoder (T5) trained as it is with labels = the inputs: the decoder reads
            # them shifted right by one, its start token first (transformers' _shift_right, in ops
            # a trace can follow: no item assignment)
            start = int(getattr(self.model.config, "decoder_start_token_id", 0) or 0)
            extra["decoder_input_ids"] = torch.cat([torch.full_like(inputs[:, :1], start), inputs[:, :-1]], dim=1)
        out = self.model(**{key: inputs}, **extra)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
