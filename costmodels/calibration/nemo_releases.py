"""What a NeMo release ran underneath, where it changes a prediction: the switches of the
``megatron`` runtime (``runtime-profiles/megatron.toml``) that a run's container and GPU imply.

* **Transformer Engine 1.3 (NeMo Framework 24.03)** → ``te_1_3``: that release's attention kernel
  (``kernel_stacks.toml``, ``transformer-engine-1.3`` on H100). NeMo 24.03 shipped TE 1.3 and
  Megatron-core 0.5 on the PyTorch 24.02 base image (docs/validation-cp.md, "Which Transformer
  Engine NeMo 24.03.01 ran"); TE 1.3's ``DotProductAttention`` runs cuDNN's fused attention
  (``F16_arbitrary_seqlen``) on H100 with or without context parallelism. Its rate is not the
  mid-2024 cuDNN figure the ``transformer-engine`` entry reads off FlashAttention-3: the Llama 2
  7B sweep of that container reads, row by row, as attention at 0.66–0.69 of that entry from
  32K to 1M tokens and cp 2 to 32 alike (``benchmarks/bench_costmodels_cp.py``, the attention
  table), i.e. the kernel, not a cp term (the ring's own per-step work in TE 1.3,
  ``AttnFuncWithCP``, is O(tokens) beside the O(tokens²) kernels: docs/validation-cp.md).
* **PyTorch's caching allocator without expandable segments** → ``default_allocator``, for both
  sweeps' releases: neither sets ``PYTORCH_CUDA_ALLOC_CONF``. NeMo 24.03: NeMo v1.23.0 (d2283e3)
  and NeMo-Framework-Launcher 24.03.01 have no ``expandable_segments`` anywhere (``git grep``).
  NeMo 25.04 (NeMo v2.3.0rc2/rc3, April 2025): only the speech (lhotse) data loader sets it; NeMo 2's
  ``PerfEnvPlugin`` began setting it on 2025-05-06 (#13418, 206de59), and from June 2025 its
  performance launchers drop it again on B200 "as it causes an unexpected error" (d671039;
  ``scripts/performance/executors.py`` at 03ee6d5). So both sweeps kept the allocator's reserved but
  unallocated blocks (``allocator.fragmentation``, measured 0.11 of the activations on H100).

Only containers whose release is read here get a switch; every other row keeps the runtime as
``nemo_recipes`` builds it.
"""
from __future__ import annotations

TE_1_3_CONTAINERS = ("NeMo24.03",)          # cp_runs.csv ``container`` of the Llama 2 7B long-sequence sweep
NEMO2_B200_CONTAINERS = ("NeMo25.04",)      # the Llama 3 8B long-sequence sweep on DGX B200
TE13_STACK = "transformer-engine-1.3"        # kernel_stacks.toml entry the te_1_3 option names
# the calibration split of that entry's attention rate (python benchmarks/fit_te13_attention.py):
# the 1M-token, cp 32 run, whose predicted step is 97 % attention, so it measures the kernel and
# little else; every other run of the release (4K-512K, cp 1-16) is a check row
TE13_CALIBRATION = ("nemolong-llama2-7b-1024k-cp32",)


def release_options(container: str, gpu: str) -> list[str]:
    """The ``megatron`` runtime options a run's container and GPU imply (module docstring)."""
    c, g = (container or "").replace(" ", ""), (gpu or "").upper()
    out = []
    if any(c.startswith(x) for x in TE_1_3_CONTAINERS) and "H100" in g:
        out += ["te_1_3", "default_allocator"]
    if any(c.startswith(x) for x in NEMO2_B200_CONTAINERS) and "B200" in g and "GB200" not in g:
        out.append("default_allocator")
    return out


def with_release(runtime: str, container: str, gpu: str) -> str:
    """``runtime`` (a ``megatron`` spec) with ``release_options`` appended; others unchanged."""
    opts = release_options(container, gpu)
    if not opts or not runtime.startswith("megatron"):
        return runtime
    sep = "," if ":" in runtime else ":"
    return runtime + sep + ",".join(opts)
