"""autopar's pipeline stage: torch's ``PipelineStage`` with ZeRO-2/3 gradients sharded per
micro-batch (issue 31).

torch.distributed.pipelining drives an FSDP2 stage by hand: its
``_PipelineStageBase.backward_maybe_with_nosync`` calls ``set_requires_gradient_sync(False)``
and ``set_reshard_after_backward(False)`` before every micro-batch's backward and reduces only in
``perform_reduce_grad`` after the last one. A stage then holds every parameter gathered with a
whole fp32 gradient for its whole backward phase (measured before this class:
``python benchmarks/measure_autopar_pp_zero_memory.py``), so ZeRO-2/3 under a pipeline saved no
memory at all. ``ShardedGradStage`` keeps torch's schedule and changes only what the stage tells
FSDP2 around each backward:

* **every backward that computes weight gradients reduce-scatters them** into the sharded (1/dp)
  fp32 gradients, which FSDP2 accumulates across reduce-scatters: ``requires_gradient_sync``
  is on, so FSDP2's own post-backward hooks reduce block by block, overlapped with the rest of
  the backward as at pp = 1; a split-backward schedule's weight pass (``"weight"``: plain
  ``torch.autograd.grad``, which fires no FSDP2 hook) is followed by the ``post_backward`` of
  every param group, as torch's ``perform_reduce_grad`` does after the last one;
* **ZeRO-3 reshards after each backward** (``reshard_after_backward`` on); **ZeRO-2 keeps its
  weights gathered from the step's first forward to the end of its last backward** (off), what
  ZeRO-2 means elsewhere in autopar (``schedules.run_local(keep_unsharded=True)``: one
  all-gather per step). torch's ``perform_reduce_grad`` then reshards both at the step's end;
* a split-backward schedule's input pass (``"input"``) is left as torch runs it (no reduce, no
  reshard): its weight pass still needs what the input pass gathered and the gradients it has
  not yet computed. ZeRO-3 never runs under those schedules (``costmodels.contracts.runnable``).

``is_last_backward`` stays off until ``perform_reduce_grad`` (torch's setting): FSDP2 then waits
for the step's outstanding reduce-scatters once, at the end, not after every micro-batch.
HSDP (``dp_shard``): the all-reduce of the shards over the replicas runs once a step, in the
stage's last backward (torch's ``last_backward``): before it FSDP2 accumulates each micro-batch's
reduce-scattered shard (``set_requires_all_reduce(False)``: its ``partial_reduce_output``), and
the last backward's reduce adds it and all-reduces the sum. ``perform_reduce_grad`` refuses to
end a step with a shard left un-all-reduced (it would be a wrong gradient, silently).

Every other stage type (DDP, plain) goes to torch's method unchanged."""
from __future__ import annotations

from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._backward import stage_backward, stage_backward_weight


class ShardedGradStage(PipelineStage):
    """torch's ``PipelineStage`` whose FSDP2 stage reduce-scatters every micro-batch's weight
    gradients and (``reshard_after_backward``: ZeRO-3) reshards after each backward (module
    docstring)."""

    def __init__(self, *args, reshard_after_backward: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.reshard_each_backward = reshard_after_backward

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        fsdp = self.submod
        if not isinstance(fsdp, FSDPModule) or backward_type == "input":
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        fsdp.set_is_last_backward(False)
        fsdp.set_requires_gradient_sync(True)
        fsdp.set_reshard_after_backward(self.reshard_each_backward)
        fsdp.set_requires_all_reduce(last_backward)   # HSDP's replicas: once a step (docstring)
        if backward_type == "full":   # FSDP2's hooks reduce each block as its backward ends
            grads = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                   bwd_kwargs["input_values"])
            return grads, None
        if backward_type != "weight":
            raise RuntimeError(f"Unknown backward type: {backward_type}")
        grads = stage_backward_weight(self.submod.parameters(), bwd_kwargs["param_groups"])
        reduce_now(fsdp)   # autograd.grad fired no FSDP2 hook: reduce as perform_reduce_grad does
        return grads, None

    def perform_reduce_grad(self, grad_scale_factor: int):
        super().perform_reduce_grad(grad_scale_factor)
        if isinstance(self.submod, FSDPModule) and any(
                g._partial_reduce_output is not None
                for st in fully_shard.state(self.submod)._state_ctx.all_states for g in st._fsdp_param_groups):
            raise RuntimeError(f"stage {self.stage_index}: HSDP gradients were reduce-scattered but never "
                               "all-reduced over the replicas (no last backward reached FSDP2)")


def reduce_now(fsdp: FSDPModule) -> None:
    """Reduce-scatter the weight gradients every FSDP2 param group of ``fsdp``'s stage holds
    (``post_backward`` is a no-op on a group with none) and end the backward as FSDP2's root
    callback does, without its last-backward wait."""
    state = fully_shard.state(fsdp)
    for st in state._state_ctx.all_states:
        for group in reversed(st._fsdp_param_groups):
            group.post_backward()
    state._root_post_backward_final_callback()
