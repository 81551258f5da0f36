"""The CUDA caching allocator's setting autopar's runtime runs with: expandable segments.

PyTorch's default caching allocator carves fixed-size segments and keeps freed blocks in pools
by size, so a step whose activations change size from micro-batch to micro-batch (pipelines,
recompute, the loss's logits) can hold gigabytes reserved but unallocated: on one H100 a plan
predicted at 72.2 GiB ran out of memory with 7.75 GiB reserved-unallocated, and ran at 74.8 GiB
with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (issue 31). So autopar's runtime sets
that, unless the user set ``PYTORCH_CUDA_ALLOC_CONF`` themselves (theirs wins, whatever it says).
The cost model prices the allocator autopar runs with (``runtime-profiles/autopar.toml``
``[memory] fragmentation``; ``autopar:default_allocator`` for the caching allocator without it).
"""
from __future__ import annotations

import os

ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def apply_cuda_alloc_defaults(environ=None) -> str | None:
    """Set expandable segments for this process when the user has not configured the allocator;
    returns the setting made, or None (the user's variable stands, or no CUDA). Call before the
    first CUDA allocation; after it, torch applies the setting to the segments it maps later."""
    env = os.environ if environ is None else environ
    if ALLOC_ENV in env:
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    env[ALLOC_ENV] = EXPANDABLE
    if torch.cuda.is_initialized():   # the allocator read the variable already: tell it directly
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if setter is not None:
            setter(EXPANDABLE)
    return EXPANDABLE
