"""Real tensors a meta model's forward moves onto ``meta``, kept real in the cut.

A model built for ``autopar.apply`` at any size (``ModelSource.build_meta``: parameters on
``meta``, the buffers its constructor computes real) is cut into rows by tracing its forward on
``meta``. transformers' rotary embedding reads its real ``inv_freq`` buffer as a constant and
moves it to the activations' device — ``self.inv_freq[None, :, None].float().expand(...)
.to(x.device)`` — which, traced on ``meta``, left a ``meta`` constant in the row: materialised
later as uninitialised memory (rotary angles of 1e12, a loss off by 2e-5 and no error). While a
meta model is cut, such a move is recorded as a graph node instead: the real tensor becomes the
row's constant (with its values) and ``.to(device)`` is code the row runs on its rank's device
(``cut.retarget_device`` turns the traced ``meta`` device into the row input's).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx

_META = torch.device("meta")


def _to_meta(args, kwargs) -> bool:
    dev = kwargs.get("device", next((a for a in args if isinstance(a, (torch.device, str))), None))
    return dev is not None and torch.device(dev) == _META


def _device_objects(v):
    return torch.device(v) if isinstance(v, str) and v == "meta" else v


@contextlib.contextmanager
def recorded_moves(tracer):
    """While tracing with ``tracer`` (a ``MetaTracer``): ``real.to(<meta device>)`` outside the
    tracer's own concrete runs becomes a ``to`` node on the real constant."""
    saved = torch.Tensor.to

    def to(self, *args, **kwargs):
        if (tracer._concrete or isinstance(self, fx.Proxy) or self.is_meta
                or type(self) is not torch.Tensor or not _to_meta(args, kwargs)):
            return saved(self, *args, **kwargs)
        args = tuple(_device_objects(a) for a in args)
        kwargs = {k: _device_objects(v) for k, v in kwargs.items()}
        return tracer.create_proxy("call_method", "to", (self, *args), kwargs)

    torch.Tensor.to = to
    try:
        yield
    finally:
        torch.Tensor.to = saved
