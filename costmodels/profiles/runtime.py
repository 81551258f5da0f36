"""Runtime profiles: what overlaps with what depends on the software that runs the plan.

The same plan runs differently under Megatron-LM, DeepSpeed, PyTorch FSDP or autopar's own
runtime: whether the data-parallel gradient sync hides behind the backward, whether ZeRO-3's
gathers are prefetched, in what dtype gradients are reduced, which kernels are fused, and what the
runtime can run at all (ZeRO stages, schedules, uneven interleaving). A runtime profile is a TOML
file in ``runtime-profiles/`` (package data) or anywhere on disk; ``load_runtime``
takes a name, a name with options (``megatron:overlap_grad_reduce``) or a path.

Format (version 1); every figure is ``{ value = ..., source = "..." }`` as in the hardware
profiles (``costmodels/profiles/hardware.py``), and a figure left out means "as autopar's runtime does it"
(the hardware profile's ``comm_overlap`` / ``fsdp_overlap``, the precision's byte counts)::

    version = 1
    name = "megatron"
    description = "..."
    kernel_stack = "transformer-engine"             # the kernels it runs: per (GPU, stack) constants
                                                    # (costmodels/profiles/kernel_stacks.py); an
                                                    # option may set its own

    [overlap]
    dp_sync = { value = 0.0, source = "..." }       # share of the backward the dp gradient sync
                                                    # hides in (0: it runs after the last backward)
    dp_bucket_bytes = { value = 1.6e8, source = "..." }  # the last gradient bucket, issued
                                                    # after the last backward: never hidden
    param_gather = { value = 0.0, source = "..." }  # share of the weights' all-gather after the
                                                    # optimizer step (ZeRO-1/2) the next forward hides
    param_gather_exposed_buckets = { value = 1, source = "..." }  # of that hidden gather, the
                                                    # buckets the step's first forward waits for
                                                    # (costmodels/model/step_tail.py); default 0
    zero_gathers = { value = 1.0, source = "..." }  # share of compute ZeRO collectives hide in
    zero_edges_exposed = { value = 1, source = "..." }  # 1: a stage's first forward gather and its
                                                    # last backward reduce-scatter are never hidden
                                                    # (nothing runs before / after them to hide them)
    zero_reduce_per_micro_batch = { value = 1, source = "..." }  # 1: ZeRO-2/3 reduce-scatter each
                                                    # row's gradients in every micro-batch's backward
                                                    # (FSDP, DeepSpeed); 0: once per step
    zero2_gather_per_micro_batch = { value = 1, source = "..." }  # 1: ZeRO-2 gathers each row's
                                                    # weights before every micro-batch's forward (FSDP
                                                    # SHARD_GRAD_OP); 0: once after the optimizer step
    pipeline_zero_reduce_per_micro_batch = { value = 1, source = "..." }  # 1: the same reduce-scatter
                                                    # per micro-batch, under pp > 1 only (autopar's stage)
    tp_comm_overlap = { value = 1, source = "..." }  # 1: TP collectives pipelined with the GEMMs
                                                    # in tp chunks (costmodels/model/tp_overlap.py)
    dp_sync_per_chunk = { value = 1, source = "..." }  # 1: under interleaving each model chunk's
                                                    # gradients sync after its own last backward
                                                    # (costmodels/profiles/interleaved_dp_window.py)
    tp_bwd_reduce_scatter_exposed = { value = 1, source = "..." }  # 1: of a block's backward TP
                                                    # collectives only the all-gathers are pipelined
                                                    # (costmodels/model/async_tp_fusion.py)
    pp_p2p_overlap = { value = 1, source = "..." }  # 1: interleaved pipeline sends run beside the
                                                    # chunk compute (costmodels/model/interleaved_p2p_overlap.py)
    compute_slowdown = { value = 0.1, source = "..." }  # compute time lost per second of hidden
                                                    # communication (NCCL kernels share the SMs);
                                                    # only where the hardware profile has no
                                                    # fitted [gpu] collective_slowdown

    [communication]
    grad_reduce_bytes = { value = 4, source = "..." }   # bytes per gradient the dp sync moves
    zero_collectives_per_row = { value = 6, source = "..." }  # ZeRO collectives per block and pass
                                                    # (collectives_at_scale.py); default 1

    [memory]                                         # costmodels/model/allocator.py
    fragmentation = { value = 0.0, source = "..." }  # allocator's unallocated bytes per activation byte
    optimizer_state_bytes = { value = 10, source = "..." }  # per parameter (default: the recipe's)
    torch_pipelining = { value = 1, source = "..." }  # 1: pp stages hold FSDP2's unsharded gradients,
                                                    # outputs, receive buffers (pipeline_fsdp_memory.py)

    [kernels]
    elementwise_bytes_per_saved_byte = { value = 3.0, source = "..." }  # compute.C_FWD
    loss_saved_bytes_per_logit = { value = 4, source = "..." }          # kept for the backward
    loss_grad_bytes_per_logit = { value = 8, source = "..." }   # live at its backward's start (loss_backward_memory)
    loss_parallel_grad_bytes_per_logit = { value = 12, source = "..." }   # the same at tp > 1 (loss parallel)
    gather_copy_passes = { value = 2, source = "..." }  # HBM passes over each ZeRO-gathered weight
    grad_accumulate_bytes_per_param = { value = 18, source = "..." }   # HBM bytes per parameter and
                                           # micro-batch to cast + accumulate gradients (zero_traffic)
    grad_buffer_zero_passes = { value = 1, source = "..." }   # writes of the whole gradient buffer
                                           # (every parameter held) once a step (step_tail); default 0
    reduce_copy_passes = { value = 2, source = "..." }  # ... over each reduced gradient, per micro-
                                                    # batch on a GPU (costmodels.model.zero_traffic); default 0

    [host]
    seconds_per_block_pass = { value = 7.5e-4, source = "..." }  # host time (Python, autograd,
                                                    # hooks) to issue one block's kernels, forward
                                                    # or backward: a pass takes at least this long
                                                    # (compute docstring, "Host"); default 0

    [recompute]                                      # costmodels/model/recompute_early_stop.py
    early_stop = { value = 1, source = "..." }       # 1: a full recompute stops after the last
                                                    # saved tensor (torch's non-reentrant checkpoint,
                                                    # compile's partitioner); default 0: whole forward

    [context_parallel]                               # costmodels.model.context_parallel
    overlap = { value = 1.0, source = "..." }        # share of a ring step's attention the K/V
                                                    # transfer hides in (CPU profiles: 0)
    all_gather_kv = { value = 0, source = "..." }    # 0: ring of p2p sends; 1: one all-gather

    [capabilities]                                   # what the runtime can run (the search's space)
    context_parallel = true                          # runs cp > 1 (default false)
    hsdp_zero = [2, 3]                               # ZeRO stages it runs HSDP with (default none)
    expert_mesh_over_tp = true                       # ep·etp over tp·cp·dp: ep may exceed dp·cp
                                                    # (runtime_rules.expert_mesh_rule; default false)
    fp8_gemm_shapes = "transformer-engine"           # FP8 GEMM shape rule on local shards
                                                    # (costmodels.profiles.fp8_shapes; default none)
    zero = [0, 1]
    pipeline_zero = [0, 1]                           # ZeRO stages it runs with a pipeline
    schedules = ["1f1b", "interleaved-1f1b"]
    uneven_interleaving = true                       # interleave when blocks do not divide pp·vpp
    sequence_parallel = true
    precisions = ["bf16-mixed"]
    source = "..."

    [options.overlap_grad_reduce]                    # enabled by "megatron:overlap_grad_reduce"
    description = "--overlap-grad-reduce"
    overlap = { dp_sync = { value = 1.0, source = "..." } }   # replaces the figures it names

A malformed profile raises ``ProfileError`` naming the file and the field.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES
from costmodels.profiles.interleaved_dp_window import interleaved_window_factor
from costmodels.profiles.runtime_fields import (  # noqa: F401  (ALL_* and FIGURES re-exported)
    ALL_PRECISIONS,
    ALL_SCHEDULES,
    FIGURES,
    _capabilities,
    _figure,
    _figures,
    _stack_name,
)
from costmodels.profiles.shipped import shipped_dir

RUNTIME_VERSION = 1
RUNTIMES_DIR = shipped_dir("runtime-profiles")
DEFAULT_RUNTIME = "autopar"


@dataclass(frozen=True)
class RuntimeProfile:
    """A parsed runtime profile with its options applied (module docstring). ``None`` figures
    mean "as autopar's runtime does it"."""

    name: str                                   # as asked for, options included: "megatron:overlap_grad_reduce"
    base: str                                   # the profile's own name
    description: str = ""
    options: tuple[str, ...] = ()               # the options switched on
    available_options: tuple[tuple[str, str], ...] = ()   # (name, description)
    dp_overlap: float | None = None
    dp_bucket_bytes: float = 0.0
    param_gather_overlap: float | None = None   # None: the gather joins the dp sync's window
    zero_overlap: float | None = None
    zero_edges_exposed: int = 0
    zero_reduce_per_micro_batch: int = 0
    zero2_gather_per_micro_batch: int = 0
    pipeline_zero_reduce_per_micro_batch: int = 0   # 1: as zero_reduce_per_micro_batch, under pp > 1 only
    compute_slowdown: float = 0.0
    grad_reduce_bytes: float | None = None
    elementwise_traffic: float | None = None
    host_block_s: float = 0.0                   # host time per block and pass (compute docstring)
    moe_load_imbalance: float = 1.0             # busiest ep rank's routed tokens / the mean
                                                # (costmodels.model.experts); 1.0: balanced
    moe_dispatch_once_per_node: int = 0         # 1: a token crosses the NICs once per node (DeepEP)
    moe_route_consecutive: int = 0              # 1: a token's k experts are k consecutive ids (experts.py)
    moe_saved_token_copies: int = 1             # token copies kept beyond the experts' input (dispatch_buffers)
    moe_tp_token_gather: int = 0                # 1: tp without sp all-gathers the experts' tokens (expert_token_gather)
    moe_experts_zero_sharded: int = 1           # 0: ZeRO leaves the experts' states whole (experts.expert_zero_group)
    loss_saved_bytes: float | None = None
    loss_grad_bytes: float = 0.0                # the loss backward's transient per logit (loss_backward_memory)
    loss_parallel_grad_bytes: float | None = None   # ... at tp > 1 under loss parallel (None: loss_grad_bytes)
    tp_saves_gathered_inputs: int = 0           # 1: torch TP + SP keeps column-parallel inputs whole (torch_tp_memory)
    gather_copy_passes: float = 0.0             # HBM passes over each gathered weight (zero_traffic)
    reduce_copy_passes: float = 0.0             # ... over each reduced gradient
    grad_accumulate_bytes: float = 0.0          # per parameter and micro-batch, bf16-mixed pricing (zero_traffic)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    schedules: tuple[str, ...] = ALL_SCHEDULES
    uneven_interleaving: bool = True
    sequence_parallel: bool = True
    ddp_beside_model_parallel: bool = True      # ZeRO-0 (DDP) with tp or pp > 1 (runtime_rules.ddp_rule)
    split_backward_dp_after_step: bool = False  # dp grads of ZeRO 0/1 reduced after the step (W bypasses DDP)
    pipeline_zero: tuple[int, ...] = (0, 1, 2, 3)  # ZeRO stages it runs together with pp > 1
    precisions: tuple[str, ...] = ALL_PRECISIONS
    kernel_stack: str = ""                      # costmodels.model.kernel_stack ("": the GPU profile's own)
    tp_comm_overlap: int = 0                    # 1: TP collectives pipelined with the GEMMs (tp_overlap)
    dp_sync_per_chunk: int = 0                  # 1: per-chunk gradient sync under interleaving (interleaved_dp_window)
    tp_bwd_reduce_scatter_exposed: int = 0      # 1: blocks' backward RS not pipelined (async_tp_fusion)
    tp_fwd_reduce_scatter_fp8: float = 0.0      # share of forward RS moving FP8 (fp8_tensor_parallel)
    pp_p2p_overlap: int = 0                     # 1: interleaved sends hidden (interleaved_p2p_overlap)
    zero_collectives_per_row: float = 1.0       # ZeRO collectives per block and pass (collectives_at_scale)
    amax_reductions_per_chunk: int = 0          # FP8 delayed scaling's blocking amax all-reduces (amax_reduction)
    amax_reduce_over_dp: int = 1                # 1: over tp·dp·cp, 0: tp·cp only (tp_only_amax_red)
    fragmentation: float = 0.0                  # allocator's unallocated bytes per activation byte (allocator)
    optimizer_state_bytes: float | None = None  # optimizer bytes per parameter (None: the recipe's)
    torch_pipelining: int = 0                   # 1: FSDP2 stages under torch pipelining (pipeline_fsdp_memory)
    grad_buffer_zero_passes: float = 0.0        # writes of the whole grad buffer a step (step_tail)
    param_gather_exposed_buckets: float = 0.0   # overlapped param all-gather buckets left exposed (step_tail)
    recompute_early_stop: int = 0               # 1: full recompute stops at the last saved tensor
    unfused_norm_fwd_bytes: float = 0.0         # HBM bytes per normalised element beyond a fused norm
    unfused_norm_bwd_bytes: float = 0.0         # ... in its backward (costmodels.model.eager_norm)
    # context parallelism and HSDP (costmodels.model.context_parallel): the K/V exchange
    # (0 a ring of p2p sends, 1 one all-gather), the share of a step's attention it hides in,
    # whether cp runs at all, and the ZeRO stages HSDP (a shard group smaller than dp) runs with
    cp_overlap: float = 1.0
    cp_all_gather: int = 0
    context_parallel: bool = False
    hsdp_zero: tuple[int, ...] = ()
    # the expert mesh (etp, ep, expert-dp) built over the tp·cp·dp ranks, so ep may take ranks
    # from tp when etp < tp (runtime_rules.expert_mesh_rule)
    expert_mesh_over_tp: bool = False
    # the shape rule its FP8 GEMMs enforce on each linear's local shard ("": none;
    # costmodels.profiles.fp8_shapes: "transformer-engine", "torch-scaled-mm")
    fp8_gemm_shapes: str = ""
    path: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_default(self) -> bool:
        """autopar's runtime without options: the cost model exactly as before runtime profiles."""
        return self.name == DEFAULT_RUNTIME

    def dp_window(self, hw_overlap: float) -> float:
        """Share of the backward the dp gradient sync hides in (the hardware's when unset)."""
        return hw_overlap if self.dp_overlap is None else self.dp_overlap

    def dp_window_for(self, plan, hw_overlap: float) -> float:
        """``dp_window`` for ``plan``: 0 where this runtime reduces the data-parallel gradients
        after the step instead of during the backward — the split-backward schedules with ZeRO
        0/1 on a runtime with ``split_backward_dp_after_step`` (autopar's: torch's W pass
        bypasses DDP's hooks, so it all-reduces in buckets after the step)."""
        if (self.split_backward_dp_after_step and plan.schedule in SPLIT_BACKWARD_SCHEDULES
                and plan.zero <= 1 and plan.dp > 1):
            return 0.0
        return self.dp_window(hw_overlap) * interleaved_window_factor(plan, self.dp_sync_per_chunk)

    def zero_window(self, hw_overlap: float) -> float:
        """Share of compute the ZeRO gathers and reduce-scatters hide in."""
        return hw_overlap if self.zero_overlap is None else self.zero_overlap


def list_runtimes() -> list[str]:
    """Names of the shipped runtime profiles, sorted."""
    return sorted(p.stem for p in RUNTIMES_DIR.glob("*.toml")) if RUNTIMES_DIR.is_dir() else []


_CACHE: dict[tuple, RuntimeProfile] = {}
_REGISTERED: dict[str, RuntimeProfile] = {}
# shipped profiles by the text asked for ("fsdp:bf16_reduce"): the search asks once per configuration,
# hundreds of thousands of times, and resolving and stat-ing the file each time dominated it
_SHIPPED: dict[str, RuntimeProfile] = {}


def register_runtime(profile: RuntimeProfile) -> RuntimeProfile:
    """Make ``profile`` loadable by its name (a variant built in Python, e.g. by a calibration
    that varies one figure); a shipped name cannot be replaced."""
    if profile.name in list_runtimes():
        raise ProfileError(f"runtime '{profile.name}' is shipped; register a variant under another name")
    _REGISTERED[profile.name] = profile
    return profile


def load_runtime(spec: str | os.PathLike | RuntimeProfile | None = None) -> RuntimeProfile:
    """A runtime by shipped name, ``name:option,option`` or path to a TOML file (options after
    a ``:`` too); None is autopar's runtime."""
    if isinstance(spec, RuntimeProfile):
        return spec
    text = DEFAULT_RUNTIME if spec is None else str(spec).strip()
    if text in _REGISTERED:
        return _REGISTERED[text]
    shipped = _SHIPPED.get(text)
    if shipped is not None:
        return shipped
    if ".toml" in text:      # a path, maybe with options after it: "my.toml:opt"
        cut = text.rindex(".toml") + len(".toml")
        base, opts = text[:cut], text[cut:].lstrip(":")
    else:
        base, _, opts = text.partition(":")
    options = tuple(o.strip() for o in opts.split(",") if o.strip())
    path = Path(base)
    if not (base.endswith(".toml") or os.sep in base):
        path = RUNTIMES_DIR / f"{base}.toml"
        if not path.is_file():
            close = difflib.get_close_matches(base, list_runtimes(), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ProfileError(f"unknown runtime '{base}'; {hint}shipped runtimes: "
                               f"{', '.join(list_runtimes()) or '(none)'}, or pass a path to a .toml file")
    if not path.is_file():
        raise ProfileError(f"runtime profile file '{base}' does not exist; pass a shipped name "
                           f"({', '.join(list_runtimes())}) or a path to a .toml file")
    key = (str(path.resolve()), path.stat().st_mtime, options)
    if key not in _CACHE:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"runtime profile '{path}' is not valid TOML ({e}); fix the file") from None
        except UnicodeDecodeError:   # tomllib decodes the bytes itself
            raise ProfileError(f"runtime profile '{path}' is not UTF-8 text, so not a TOML profile; "
                               "pass a .toml runtime profile (runtime-profiles/ has the shipped ones)") from None
        _CACHE[key] = parse_runtime(data, str(path), options)
    prof = _CACHE[key]
    name = prof.base + (":" + ",".join(options) if options else "")
    prof = prof if prof.name == name else _replace(prof, name=name)
    if path.parent == RUNTIMES_DIR:   # a shipped profile: read once per process, by its text
        _SHIPPED[text] = prof
    return prof


def _replace(prof: RuntimeProfile, **kw) -> RuntimeProfile:
    from dataclasses import replace
    return replace(prof, **kw)


def parse_runtime(data: dict[str, Any], where: str = "<runtime>",
                  options: tuple[str, ...] = ()) -> RuntimeProfile:
    """Validate a parsed TOML document and build the profile with ``options`` switched on
    (ProfileError names the field)."""
    def err(name: str, problem: str) -> ProfileError:
        return ProfileError(f"runtime profile '{where}': field '{name}' {problem}; see the format "
                            "in the costmodels/profiles/runtime.py docstring")

    if not isinstance(data, dict):
        raise err("(top level)", "must be a table")
    version = data.get("version", RUNTIME_VERSION)
    if version != RUNTIME_VERSION:
        raise err("version", f"is {version!r}; this autopar reads version {RUNTIME_VERSION}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise err("name", "is missing, not a string, or holds a ':'")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise err("description", "must be a string")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if "kernel_stack" in data:   # the kernels the runtime runs (costmodels.model.kernel_stack)
        values["kernel_stack"] = _stack_name(data["kernel_stack"], "kernel_stack", err)
    _figures(data, "", values, sources, err)
    values.update(_capabilities(data.get("capabilities"), err, sources))
    opts = data.get("options", {})
    if not isinstance(opts, dict):
        raise err("options", "must be a table of [options.<name>] tables")
    available = []
    for oname, o in opts.items():
        if not isinstance(o, dict):
            raise err(f"options.{oname}", "must be a table")
        if not isinstance(o.get("description"), str) or not o["description"].strip():
            raise err(f"options.{oname}.description", "is missing or empty")
        available.append((oname, o["description"]))
        unknown = [k for k in o if k not in ("description", "kernel_stack") and k not in FIGURES]
        if unknown:
            raise err(f"options.{oname}.{unknown[0]}", f"is not one of {', '.join(FIGURES)}")
        if oname in options:
            _figures(o, f"options.{oname}.", values, sources, err)
            if "kernel_stack" in o:
                values["kernel_stack"] = _stack_name(o["kernel_stack"], f"options.{oname}.kernel_stack", err)
    missing = [o for o in options if o not in dict(available)]
    if missing:
        names = ", ".join(n for n, _ in available) or "(none)"
        raise ProfileError(f"runtime '{name}' has no option '{missing[0]}'; its options: {names}")
    return RuntimeProfile(name=name + (":" + ",".join(options) if options else ""), base=name,
                          description=desc, options=tuple(options), available_options=tuple(available),
                          path=where, sources=sources, **values)
