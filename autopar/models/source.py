"""ModelSource: everything autopar needs to know about a model, whatever the MODEL form.

It can build the module (on ``meta`` for tracing — no weight memory — or for real, seeded, for
the runtime), make example inputs for a micro-batch, make a random training batch, and compute
the loss. The runtime relies on ``build(device, seed)`` giving the same weights on every rank.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.models.config import ModelConfig


@dataclass
class ModelSource:
    spec: str
    config: ModelConfig | None
    seq: int
    _build: Callable[[str], nn.Module] = field(repr=False)
    _inputs: Callable[[int, torch.Generator | None, str], tuple] = field(repr=False)
    _targets: Callable[[Any, int, torch.Generator | None, str], torch.Tensor | None] = field(repr=False)
    loss_fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] = field(repr=False, default=None)
    # False: the model has no fused attention; it is built with materialised attention whatever
    # ``attention`` asks (``autopar.models.hf``), and its layer table says so to the estimate
    fused_attention: bool = True

    def build(self, device: str | torch.device = "cpu", seed: int | None = 0,
              attention: str = "math", dtype: torch.dtype | None = None) -> nn.Module:
        """Build the module. On ``meta`` no memory is allocated; otherwise weights depend only
        on ``seed``. ``attention`` selects materialised ("math") or fused ("flash") attention."""
        if seed is not None:
            torch.manual_seed(seed)
        skip = _skip_init() if torch.device(device).type == "meta" else contextlib.nullcontext()
        with torch.device(device), skip:
            model = self._build(attention)
        if dtype is not None:
            model = model.to(dtype)
        return model

    def build_meta(self, attention: str = "math") -> nn.Module:
        """The module for ``autopar.apply`` / ``autopar.init_serial`` at any size: parameters on
        ``meta`` (no memory), computed buffers (causal masks, RoPE tables) real; built-in
        models carry their initialiser as ``autopar_init_fn`` for the row-by-row init."""
        with meta_parameters():
            model = self._build(attention)
        if self.config is not None:
            model.autopar_init_fn = builtin_init
        return model

    def example_inputs(self, batch: int = 1, device: str | torch.device = "meta") -> tuple:
        """Inputs for one micro-batch of ``batch`` samples (random values on real devices)."""
        return self._inputs(batch, None, str(device))

    def make_batch(self, batch: int, seed: int = 0, device="cpu") -> tuple[tuple, torch.Tensor | None]:
        """A random (inputs, targets) training batch, identical for a given seed."""
        g = torch.Generator().manual_seed(seed)
        inputs = self._inputs(batch, g, str(device))
        return inputs, self._targets(inputs, batch, g, str(device))

    def loss(self, output: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        return self.loss_fn(output, targets)


_INIT_FUNCS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
               "xavier_uniform_", "xavier_normal_", "orthogonal_", "constant_", "zeros_", "ones_")


@contextlib.contextmanager
def _skip_init():
    """On ``meta`` there are no values to initialise: make torch.nn.init's functions no-ops.
    (Running them on meta tensors costs ~1 ms each and imports torch._dynamo.)"""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCS if hasattr(nn.init, name)}
    for name in saved:
        setattr(nn.init, name, lambda tensor, *a, **k: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


@contextlib.contextmanager
def meta_parameters():
    """Build modules with their parameters on ``meta`` and their buffers real (what
    ``ModelSource.build_meta`` uses; accelerate's ``init_empty_weights(include_buffers=False)``):
    a buffer computed in a constructor (a causal mask, a RoPE table) keeps its values, which a
    model built wholly under ``torch.device("meta")`` loses."""
    register = nn.Module.register_parameter

    def on_meta(self, name, param):
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    nn.Module.register_parameter = on_meta
    try:
        with _skip_init():
            yield
    finally:
        nn.Module.register_parameter = register


def builtin_init(row: nn.Module) -> None:
    """The built-in models' initialiser for one row: norms to ones / zeros, then GPT-2 style
    normal(0, 0.02) linears and embeddings (``layers.init_weights``)."""
    from autopar.models.layers import init_weights
    for m in row.modules():
        own = dict(m.named_parameters(recurse=False))
        if not own or isinstance(m, (nn.Linear, nn.Embedding)):
            continue
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()
        else:   # a norm of this package (RMSNorm): weight ones, bias zeros
            for name, p in own.items():
                nn.init.ones_(p) if name == "weight" else nn.init.zeros_(p)
    init_weights(row)


def token_loss(output: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy for integer targets, MSE for float targets, mean square otherwise."""
    if targets is None:
        return output.float().pow(2).mean()
    if targets.is_floating_point():
        return F.mse_loss(output.float(), targets.float())
    return F.cross_entropy(output.float().reshape(-1, output.size(-1)), targets.reshape(-1))


def builtin_source(spec: str, cfg: ModelConfig) -> ModelSource:
    from autopar.models.encoders import MLP, Bert, ViT
    from autopar.models.gpt import GPT
    from autopar.models.llama import Llama
    from autopar.models.moe import MoE
    cls = {"gpt": GPT, "llama": Llama, "bert": Bert, "vit": ViT, "mlp": MLP, "moe": MoE}[cfg.family]

    def inputs(batch, g, device):
        if cfg.family == "vit":
            shape = (batch, cfg.channels, cfg.image, cfg.image)
            return (_rand(shape, g, device),)
        if cfg.family == "mlp":
            return (_rand((batch, cfg.seq, cfg.in_features or cfg.hidden), g, device),)
        return (_randint(cfg.vocab, (batch, cfg.seq), g, device),)

    def targets(inp, batch, g, device):
        if cfg.family == "vit":
            return _randint(cfg.classes, (batch,), g, device)
        if cfg.family == "mlp":
            return _randint(cfg.classes, (batch, cfg.seq), g, device)
        return _randint(cfg.vocab, (batch, cfg.seq), g, device)

    return ModelSource(spec=spec, config=cfg, seq=cfg.tokens_per_sample,
                       _build=lambda attention: cls(cfg, attention=attention),
                       _inputs=inputs, _targets=targets, loss_fn=token_loss)


def _rand(shape, g, device):
    if device == "meta" or g is None:
        return torch.randn(shape, device=device)
    return torch.randn(shape, generator=g).to(device)


def _randint(high, shape, g, device):
    if device == "meta" or g is None:
        return torch.randint(0, high, shape, device=device)
    return torch.randint(0, high, shape, generator=g).to(device)
