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
import traceback

import torch
import torch.nn as nn

from autopar.models.source import ModelSource, token_loss
from costmodels.contracts.checks import nearest, quote, shorten
from costmodels.contracts.errors import AutoparError, SpecError


def user_source(spec: str, where: str, fn_name: str, seq: int | None) -> ModelSource:
    fn = _load_function(where, fn_name)
    try:
        takes_batch = bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        raise SpecError(f"{quote(spec)}: cannot read the signature of {fn_name}(); make it a plain "
                        "Python function 'def fn(batch_size=1)'") from None

    def call(batch: int):
        try:
            out = fn(batch) if takes_batch else fn()
        except AutoparError:
            raise
        except Exception as e:  # the user's own code failed: say where, in one line
            raise SpecError(f"{quote(spec)}: {fn_name}() raised {_where_raised(e, fn)}; fix the model "
                            "code there") from None
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
        if not os.path.isfile(where):
            what = "is a directory" if os.path.isdir(where) else "does not exist"
            raise SpecError(f"model file {quote(where)} {what}; give 'path/to/file.py:fn'")
        name = "autopar_user_" + os.path.splitext(os.path.basename(where))[0]
        spec = importlib.util.spec_from_file_location(name, where)
        if spec is None or spec.loader is None:
            raise SpecError(f"model file {quote(where)} is not a Python file (.py); give 'path/to/file.py:fn'")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's file failed to import: say where
            raise SpecError(f"importing {quote(where)} failed: {_where_raised(e, None, where)}") from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise SpecError(f"cannot import module {quote(where)} ({shorten(str(e), 200)}); check the "
                            "name and PYTHONPATH") from None
        except Exception as e:  # the module itself failed while importing
            raise SpecError(f"importing module {quote(where)} failed: {_where_raised(e, None)}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise SpecError(f"{quote(where)} has no function {quote(fn_name)}; {nearest(fn_name, found)}"
                        f"callables there: {', '.join(found[:8]) or 'none'}")
    return fn


def _where_raised(e: BaseException, fn, path: str | None = None) -> str:
    """``ValueError: bad width at model.py:12 (in build)``: the exception and the deepest line
    of the user's own file it passed through (else the deepest line of all), so the one-line
    error points at their code, not at torch's."""
    files = {os.path.abspath(path)} if path else set()
    code = getattr(fn, "__code__", None)
    if code is not None:
        files.add(os.path.abspath(code.co_filename))
    if isinstance(e, SyntaxError) and e.filename:
        place = f" at {e.filename}:{e.lineno}"
    else:
        frames = traceback.extract_tb(e.__traceback__)
        own = [f for f in frames if os.path.abspath(f.filename) in files] or frames[-1:]
        place = f" at {own[-1].filename}:{own[-1].lineno} (in {own[-1].name})" if own else ""
    text = shorten(str(e), 300)
    return f"{type(e).__name__}{': ' + text if text else ''}{place}"
