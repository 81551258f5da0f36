"""The Runner's state in and out: the serial state dict gathered, distributed checkpoints saved
(synchronously or in the background) and loaded under any plan — a mixin of
``autopar.runtime.apply.Runner``, kept here beside the checkpoint code it calls, so the Runner's
file holds building and stepping."""
from __future__ import annotations

import torch

from autopar.runtime.assemble import state_hooks
from autopar.runtime.checkpoints.gather import full_state_dict
from autopar.runtime.faults import dist as adist
from autopar.runtime.faults.failures import peer_failures


class RunnerCheckpoints:
    """Needs the Runner's ``_local``, ``_keys``, ``layout``, ``plan``, ``rank`` and
    ``_state_hooks``."""

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The serial model's state dict (same keys), gathered on the first rank of the plan;
        None on the others. Every rank of the plan must call it."""
        with peer_failures("full_state_dict", self.layout.ranks, self.rank, adist.timeout_s()):
            state = full_state_dict(self._local, self._keys, self.layout, self.plan)
        return None if state is None else state_hooks.apply_hooks(self._state_hooks, state)

    def save(self, path, optimizer=None, extra=None, async_save: bool = False):
        """Write a distributed checkpoint of the model, ``optimizer``'s state, the step, every
        rank's RNG state, the plan, the spec and ``extra`` (``autopar.runtime.checkpoints.dcp``); every rank
        of the plan calls it. A crash mid-save leaves the previous checkpoint whole.
        ``async_save``: return once the state is copied, write in the background; the
        returned ``PendingSave.wait()`` (also run by the next save or load) completes it."""
        from autopar.runtime.checkpoints import dcp
        with peer_failures("runner.save", self.layout.ranks, self.rank, adist.timeout_s()):
            self.wait_for_save()
            out = dcp.save(self, path, optimizer=optimizer, extra=extra, async_save=async_save)
            self._pending_save = out if async_save else None
            return out

    def wait_for_save(self) -> str | None:
        """Finish an ``async_save`` still being written (every rank calls it)."""
        pending, self._pending_save = getattr(self, "_pending_save", None), None
        return pending.wait() if pending is not None else None

    def load(self, path, optimizer=None):
        """Read a checkpoint saved under any plan of this model into this runner (and
        ``optimizer``, built over ``runner.parameters()``); returns the saved ``extra``."""
        from autopar.runtime.checkpoints import dcp
        with peer_failures("runner.load", self.layout.ranks, self.rank, adist.timeout_s()):
            self.wait_for_save()
            return dcp.load(self, path, optimizer=optimizer)
