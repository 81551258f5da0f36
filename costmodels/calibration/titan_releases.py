"""What a torchtitan release ran underneath, where it changes a prediction: the switches of the
``fsdp`` runtime (``runtime-profiles/fsdp.toml``) that a run's torchtitan commit implies, as
``nemo_releases`` does for NeMo containers.

* **The loss compiled with the model** → ``compiled_loss``. torchtitan's loss is
  ``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`` in every release read
  here. From Oct 2024 (e10cb94, "Move output .float() to loss fn and compile it if compiling")
  to Apr 2025 it was NOT compiled: e8977b0 (2024-12-18, "turning off compile on loss function",
  #755) commented the ``torch.compile(loss_fn)`` out ("compiling loss function causes CUDA
  errors"), so 9dec370 (2024-12-26, the Dec 2024 benchmark rows) runs it eagerly, and so do runs
  from before bbb1b616e. bbb1b616e (2025-04-02, #1033, "refactor train_spec.loss_fn to
  build_loss_fn & chunked loss": "Enable compiling the loss function ... result in reduction of
  memory") made ``build_cross_entropy_loss`` return ``torch.compile(loss_fn)`` whenever
  ``training.compile`` is on (torchtitan/components/loss.py; 0.2.2 gates it on
  ``compile.components`` containing "loss", its default). Eager, the loss keeps its fp32
  log-softmax (4 bytes per logit) and its backward starts with the fp32 gradients of the
  log-probabilities and of the logits (8 more); compiled, it keeps only the bf16 logits it was
  given and per-token statistics, and its backward writes the bf16 logit gradient in one fused
  kernel (fsdp.toml ``[options.compiled_loss]``, with the inductor partition it was read from).

A run gets a switch only when its torchtitan commit is one read here (``COMPILED_LOSS_COMMITS``:
``git merge-base --is-ancestor bbb1b616e <commit>`` holds for each) and its row says it ran
torch.compile. Rows of other releases keep the plain ``fsdp`` runtime, whose loss is the eager
one: the Dec 2024 benchmark (9dec370) and torchao's float8 README table (torchtitan "0.0.2" with
torchao 890e0ac8 of 2025-02-28, the table committed 2025-03-12 in pytorch/ao 8c81863, both before
bbb1b616e).
"""
from __future__ import annotations

# torchtitan commits of open rows that compile the loss under torch.compile (module docstring)
COMPILED_LOSS_COMMITS = {
    "e7c0cae": "2025-06-11",   # Trainy's H200 runs (benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md)
    "6fc499f": "2025-08-14",   # torchao's MX benchmarks on B200 (torchtitan components/quantization/mxfp8.md)
}


def release_options(framework: str, container: str) -> list[str]:
    """The ``fsdp`` runtime options a torchtitan run's release implies (module docstring)."""
    text = f"{framework or ''} {container or ''}"
    compiled = "torch.compile" in text or "+ compile" in text
    if compiled and any(f"torchtitan {c}" in text for c in COMPILED_LOSS_COMMITS):
        return ["compiled_loss"]
    return []


def with_release(runtime: str, framework: str, container: str) -> str:
    """``runtime`` (an ``fsdp`` spec) with ``release_options`` appended; others unchanged."""
    opts = [o for o in release_options(framework, container) if o not in runtime]
    if not opts or not runtime.startswith("fsdp"):
        return runtime
    sep = "," if ":" in runtime else ":"
    return runtime + sep + ",".join(opts)
