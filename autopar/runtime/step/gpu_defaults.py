"""What the runtime sets on CUDA, as torchtitan does (issue 29): nothing here runs on CPU.

* ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless the user set the variable: the
  caching allocator grows segments instead of fragmenting them across steps of varying
  activation sizes (torchtitan's run_train.sh sets it; torch docs "CUDA memory management").
* TF32 for fp32 matmuls and convolutions (``torch.backends.cuda.matmul.allow_tf32``, cudnn's):
  the fp32 parts of a bf16-autocast step (the loss, norms) run on tensor cores; torchtitan's
  ``training.enable_tf32`` default.
* NCCL timeouts that name the rank: the flight recorder on (``TORCH_NCCL_TRACE_BUFFER_SIZE``) and
  dumped on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) into one file per rank
  (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, torch appends the rank), as torchtitan's
  ``comm.trace_buf_size`` does; the watchdog's own message already starts ``[Rank N]``, and a peer
  that stops answering becomes ``PeerLostError`` naming it (``autopar.runtime.faults``).

Each default yields to a value the user already set.
"""
from __future__ import annotations

import os
import tempfile

import torch

ALLOC_CONF = "expandable_segments:True"


def env_defaults(environ=None) -> dict[str, str]:
    """The variables ``set_env`` would set given ``environ`` (those not already set)."""
    environ = os.environ if environ is None else environ
    want = {"PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF,
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": os.path.join(tempfile.gettempdir(),
                                                            "autopar_nccl_trace_rank_")}
    return {k: v for k, v in want.items() if k not in environ}


def set_env() -> dict[str, str]:
    """Set the defaults in this process's environment (before the NCCL group and the first CUDA
    allocation read them); returns what was set."""
    added = env_defaults()
    os.environ.update(added)
    return added


def apply_on(device: torch.device) -> dict[str, object]:
    """On a CUDA ``device``: TF32 on, and expandable segments in the running allocator when the
    user did not configure it (``set_env`` may have come too late for a process that touched
    CUDA already). Returns what was set; nothing on CPU."""
    if device.type != "cuda":
        return {}
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    done: dict[str, object] = {"tf32": True}
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF) == ALLOC_CONF:
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if setter is not None:
            setter(ALLOC_CONF)
            done["allocator"] = ALLOC_CONF
    return done
