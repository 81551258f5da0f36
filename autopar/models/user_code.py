"""A user's own model: ``path/to/file.py:fn`` or ``package.module:fn``.

Contract (also in the README):

    def fn(batch_size: int = 1):
        model = MyModel(...)                 # an nn.Module; build it with plain constructors
        inputs = (torch.randint(0, V, (batch_size, S)),)   # a tensor or tuple of tensors, batch first
        targets = torch.randint(0, V, (batch_size, S))     # optional third item
        return model, inputs                 # or (model, inputs, targets)

autopar calls ``fn`` under ``torch.device("meta")`` to trace (no weight memory) and on a real
device, after ``torch.manual_seed``, to run. Loss: cross-entropy for integer targets, MSE for
float targets, mean square of the output when no targets are returned. ``fn`` may take no
argument; then its inputs' batch size is used as is.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys

import torch
import torch.nn as nn

from autopar.models.source import ModelSource, token_loss
from costmodels.errors import SpecError


def user_source(spec: str, where: str, fn_name: str, seq: int | None) -> ModelSource:
    fn = _load_function(where, fn_name)
    takes_batch = bool(inspect.signature(fn).parameters)

    def call(batch: int):
        out = fn(batch) if takes_batch else fn()
        if not (isinstance(out, tuple) and len(out) in (2, 3) and isinstance(out[0], nn.Module)):
            raise SpecError(f"{spec}: {fn_name}() must return (model, inputs) or (model, inputs, "
                            "targets) with model an nn.Module; see the README's user-code contract")
        inputs = out[1] if isinstance(out[1], tuple) else (out[1],)
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            raise SpecError(f"{spec}: {fn_name}() inputs must be a tensor or a tuple of tensors")
        return out[0], inputs, (out[2] if len(out) == 3 else None)

    probe_device = torch.device("meta")
    with probe_device:
        _, probe_inputs, _ = call(1)
    seq_len = seq or (probe_inputs[0].shape[1] if probe_inputs[0].dim() > 1 else 1)

    def inputs(batch, g, device):
        if g is not None:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        with torch.device(device):
            return call(batch)[1]

    def targets(inp, batch, g, device):
        if g is not None:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        with torch.device(device):
            return call(batch)[2]

    return ModelSource(spec=spec, config=None, seq=int(seq_len),
                       _build=lambda attention: call(1)[0], _inputs=inputs, _targets=targets,
                       loss_fn=token_loss)


def _load_function(where: str, fn_name: str):
    if where.endswith(".py") or os.sep in where:
        if not os.path.exists(where):
            raise SpecError(f"model file '{where}' does not exist; give 'path/to/file.py:fn'")
        name = "autopar_user_" + os.path.splitext(os.path.basename(where))[0]
        spec = importlib.util.spec_from_file_location(name, where)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's file failed to import: say where
            raise SpecError(f"importing '{where}' failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise SpecError(f"cannot import module '{where}' ({e}); check the name and PYTHONPATH") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise SpecError(f"'{where}' has no function '{fn_name}'; callables there: {', '.join(found[:8]) or 'none'}")
    return fn
