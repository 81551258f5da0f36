"""Expert parallelism: what a plan's ``ep`` (and ``etp``) changes in a row of a Mixture of Experts.

Read by ``coefficients.row_coefficients`` (so ``estimate`` and the search's integer program
price ep identically) and by ``estimate``'s memory. Per MoE row ``i`` and micro-batch of ``b``
sequences (``k = b/b0``), with ``V_i = dispatch_bytes_i·k/tp`` (the tokens of one GPU: Megatron
runs MoE with sequence parallelism over tp, each rank dispatching its slice of the sequence)::

    all-to-all  a2a(V) = α + max(V·(n_in − 1)/ep / β_nvlink,  V·(ep − n_in)/ep / β_nic)
                n_in = ep ranks on one node (the ep group is carved from dp·cp innermost, next
                to tp: a stride of tp·… ranks, ``ep_span``); the NVLink and NIC parts run at once
    forward     + 2·ι·a2a(V)           dispatch and combine, on the critical path (exposed)
    backward    + 2·ι·a2a(V)           their gradients;  full recompute: + 2·ι·a2a(V) again
    experts     + X_i·k/(tp·peak)·(ι/eff(g·ep) − 1/eff(g))   forward; ×2 backward (×1 its W part)
                X_i the routed experts' forward FLOPs, g = X_i·k/(3·E·tp) one expert GEMM at
                ep = 1 (what ``compute.row_times`` charged them at), g·ep the GEMM each of the
                E/ep local experts runs when ep ranks send it their tokens: grouped-GEMM
                efficiency at the tokens per expert, read off the GPU's matmul curve
    ι           the load-imbalance factor: the busiest rank's tokens over the mean, a runtime-
                profile figure (``[moe] load_imbalance``; 1.0 when the router is forced to
                balance), applied to the all-to-alls and to the experts

Parameters on a GPU: ``dense/tp + experts/(ep·etp)``; the dp gradient sync moves them on the dp
line (the experts' group is dp·cp/ep: the same bytes per parameter, ring factors within
(n−1)/n of each other); model states in memory: the dense part ZeRO-sharded over dp (HSDP:
``dp_shard``), the experts over the expert-dp ranks inside that shard group
(``expert_zero_group``: ``dp·cp·(tp/etp)/ep``, or ``max(1, dp_shard·cp·(tp/etp)/ep)`` under
HSDP: with etp < tp the tp ranks holding the same experts are expert-dp ranks too; 1 where the
runtime keeps them whole, ``[moe] experts_zero_sharded = 0``, autopar's own); ZeRO-3 gathers
a row's local part, never the experts of other ep ranks (nor its own where they are whole).
The dispatch buffers (the copies of the
dispatched tokens autograd keeps beyond the experts' input, which the table counts: the
runtime's ``[moe] saved_token_copies``, 0 or 1, ``costmodels.model.dispatch_buffers``) are
``copies·ι·V`` per MoE row and micro-batch in flight, added to the row's saved activations. Under full recompute a
block keeps only its input: its dispatch buffers are freed after its forward and rebuilt when it
is recomputed, so they are held for one block at a time, in the recompute working set (the
largest block's saved bytes plus its buffers: ``work_buffer_bytes``, ``working_set_extra``),
never per micro-batch in flight. (Charging them per row and micro-batch put the NeMo AutoModel
Qwen3-30B-A3B run, whose yaml checkpoints every block, at 131 GiB on an 80 GB H100; it ran.)

The all-to-alls are counted in the breakdown's ``compute`` (they are on the critical path of the
row and no key of ``BREAKDOWN_KEYS`` names them) and listed in the estimate's ``comm`` as kind
``ep``. A dense table (no ``experts`` in any row) is returned unchanged by every function here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodels.model.allocator import optimizer_share
from costmodels.model.compute import RowTimes
from costmodels.model.context_parallel import zero_group
from costmodels.model.dispatch_buffers import dispatch_buffer_bytes
from costmodels.model.expert_precision import fp8_expert_s
from costmodels.model.memory import STATE_BYTES, model_state_bytes, recompute_working_bytes
from costmodels.model.table_arrays import TableArrays
from costmodels.profiles.hardware import HardwareProfile
from costmodels.profiles.runtime import load_runtime
from costmodels.profiles.topology import group_span


@dataclass(frozen=True, eq=False)
class ExpertArrays:
    """The MoE columns of a table, per row."""

    expert_params: np.ndarray
    experts: np.ndarray
    dispatch_bytes: np.ndarray
    expert_fwd_flops: np.ndarray
    routed_tokens: np.ndarray

    @property
    def any(self) -> bool:
        return bool(self.experts.any())


_ARR: dict[int, tuple[TableArrays, ExpertArrays]] = {}


def expert_arrays(arr: TableArrays) -> ExpertArrays:
    """The MoE columns of ``arr``'s table, cached by the arrays' identity."""
    hit = _ARR.get(id(arr))
    if hit is not None and hit[0] is arr:
        return hit[1]
    rows = arr.table.rows
    f = lambda name: np.array([float(getattr(r, name, 0) or 0) for r in rows], dtype=float)  # noqa: E731
    got = ExpertArrays(f("expert_params"), f("experts"), f("dispatch_bytes"), f("expert_fwd_flops"),
                       f("routed_tokens"))
    if len(_ARR) > 64:
        _ARR.clear()
    _ARR[id(arr)] = (arr, got)
    return got


def ep_degrees(plan) -> tuple[int, int]:
    """(ep, etp) of a Plan or a search configuration (1, 1 where it has none)."""
    return int(getattr(plan, "ep", 1) or 1), int(getattr(plan, "etp", 1) or 1)


FOLDING_RUNTIMES = ("megatron", "fsdp")


def _folds_tp(plan) -> bool:
    """Whether the plan's runtime builds a separate expert mesh (etp, then ep, then expert-dp,
    innermost first) that takes the ``tp/etp`` ranks of a tp group an expert is not sharded over
    into its ep group: Megatron-core (``megatron/core/parallel_state.py``, NVIDIA/Megatron-LM
    00caa53: the expert ``RankGenerator(tp=expert_tensor_parallel_size, ep=..., dp=...)`` on
    the same tp-…-pp order, so at etp 1 an ep group is ``ep`` consecutive ranks) and torchtitan
    (the ``fsdp`` profile; its ParallelDims at etp 1: "[partial dp + all tp -> ep]"). autopar's
    own runtime keeps each tp rank's ep group at its tp coordinate, ep ranks ``tp`` apart, where
    ep divides dp·cp, and otherwise takes the tp ranks first as Megatron does (``autopar/runtime/
    step/expert_mesh.py``): any runtime whose ep does not divide dp·cp folds tp (the runtime
    rules refuse it to the others)."""
    name = str(getattr(plan, "runtime", None) or "autopar").split(":")[0]
    ep, _ = ep_degrees(plan)
    return name in FOLDING_RUNTIMES or (plan.dp * int(getattr(plan, "cp", 1) or 1)) % ep != 0


def ep_span(plan, gpus_per_node: int) -> tuple[int, int]:
    """(ep ranks on one NVLink domain, domains the ep group spans): ep is carved from dp·cp
    innermost, so its stride is the product of the dimensions inside cp / dp in ``mesh_order``.
    Callers pass the profile's ``link_domain``, not its host's ``gpus_per_node``: NCCL's
    all-to-all between two GPUs of one NVL72 rack runs over NVLink (the rack is one NVLink
    domain of 72 GPUs; NCCL's P2P transport uses NVLink between GPUs that reach each other over
    it, NVIDIA NCCL docs, "NVLink SHARP and multi-node NVLink"), so an ep group of a GB200 NVL72
    rack crosses the NICs only where it leaves the rack. Pricing its 4-GPU host as the node put
    the ep all-to-alls of every GB200 MoE run on InfiniBand (issue 27: the GB200 rows were
    +16 ... +50 % too slow); on an HGX node both are 8."""
    ep, etp = ep_degrees(plan)
    order = plan.mesh_order() if hasattr(plan, "mesh_order") else ("tp", "cp", "dp", "pp")
    sizes = {"tp": plan.tp, "cp": getattr(plan, "cp", 1), "dp": plan.dp, "pp": plan.pp}
    if etp < plan.tp and _folds_tp(plan):   # the expert mesh: etp innermost, then ep (_folds_tp)
        sizes["tp"] = etp
    inner = []
    for d in order:
        if d in ("cp", "dp"):
            break
        inner.append(d)
    placement = ",".join(inner + ["ep"])
    return group_span(placement, {**sizes, "ep": ep}, "ep", gpus_per_node)


def all_to_all_s(nbytes, plan, profile: HardwareProfile, top_k=None, experts=None):
    """(bytes each GPU sends, seconds) of one all-to-all over the ep group, ``nbytes`` the whole
    buffer of one GPU (module docstring). ``top_k`` (per row) given: the runtime sends a token
    once per destination node over the NICs and fans it out over NVLink there (DeepEP's
    dispatch, the runtime profile's ``[moe] dispatch_once_per_node``): the inter-node bytes are
    those of the expected distinct remote nodes a token's k experts sit on, with the experts
    spread evenly over the N nodes of the ep group, ``(N − 1)·(1 − (1 − 1/N)^k)`` copies
    instead of ``k·(ep − n_in)/ep``. ``experts`` (per row) given as well: the router sends a
    token to ``k`` consecutive expert ids starting at a multiple of ``k`` (NeMo AutoModel's
    ``FakeBalancedGate``: expert ``(t·k + j) mod E`` for token ``t``), which sit on
    ``⌈k / (E/N)⌉`` nodes (one when a node's ``E/N`` experts hold whole runs of ``k``), each
    remote with probability ``(N − 1)/N``: ``⌈k·N/E⌉·(N − 1)/N`` copies."""
    ep, _ = ep_degrees(plan)
    nbytes = np.asarray(nbytes, dtype=float)
    if ep <= 1:
        return nbytes * 0.0, nbytes * 0.0
    n_in, nodes = ep_span(plan, profile.link_domain)   # NVLink domain, not the host (ep_span)
    intra_a, intra_b = profile.tier("intra_node").alpha_beta("all_to_all")
    inter_a, inter_b = profile.tier("inter_node").alpha_beta("all_to_all")
    intra = nbytes * (n_in - 1) / ep
    inter = nbytes * (ep - n_in) / ep
    if top_k is not None and nodes > 1:
        k = np.maximum(np.asarray(top_k, dtype=float), 1.0)
        copies = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
        if experts is not None:   # k consecutive experts: the nodes a run of k spans
            per_node = np.maximum(np.asarray(experts, dtype=float) / nodes, 1.0)
            copies = np.minimum(np.ceil(k / per_node), nodes) * (nodes - 1) / nodes
        inter = np.minimum(inter, nbytes / k * copies)
    alpha = inter_a if ep > n_in else intra_a
    t = alpha + np.maximum(intra / intra_b, inter / inter_b)
    return intra + inter, np.where(nbytes > 0, t, 0.0)


@dataclass(frozen=True, eq=False)
class ExpertTerms:
    """Per-row additions of one configuration (seconds and bytes per micro-batch and GPU)."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    bwd_w_s: np.ndarray
    recompute_s: np.ndarray
    a2a_bytes: np.ndarray      # fwd + bwd (+ recompute) all-to-all bytes each GPU sends
    a2a_s: np.ndarray          # their seconds
    params: np.ndarray         # parameters on one GPU: dense/tp + experts/(ep·etp)
    buffer_bytes: np.ndarray   # dispatch buffers kept for the backward, per micro-batch in flight
    work_buffer_bytes: np.ndarray   # the same buffers while one block runs (full recompute's working set)


def expert_terms(arr: TableArrays, profile: HardwareProfile, plan, recompute: str,
                 imbalance: float, zero_param_s: tuple[float, float] = (0.0, 0.0),
                 dedup: bool = False, runtime_name: str | None = None,
                 consecutive: bool = False, saved_copies: int = 1) -> ExpertTerms | None:
    """The additions of ``plan``'s ep / etp to each row (module docstring); None for a dense
    table. ``zero_param_s``: ZeRO's HBM seconds per parameter on the GPU (forward, backward),
    which ``compute.row_times`` charged on ``params/tp``: the experts' part is moved to their
    ep shard. ``runtime_name``: the FP8 stack (``precision.stack_key``) that runs an FP8 plan's
    experts in FP8 (``costmodels.model.expert_precision``; None: BF16 experts). ``consecutive``:
    the router picks ``k`` consecutive experts (``all_to_all_s``; with ``dedup`` only).
    ``saved_copies``: the runtime's copies of the dispatched tokens kept beyond the experts' input
    (``[moe] saved_token_copies``, costmodels.model.dispatch_buffers)."""
    ea = expert_arrays(arr)
    if not ea.any:
        return None
    ep, etp = ep_degrees(plan)
    tp, b = plan.tp, plan.micro_batch_size
    k = b / arr.table.micro_batch
    moe = ea.experts > 0
    v = ea.dispatch_bytes * k / tp
    top_k = ea.routed_tokens / (arr.table.micro_batch * arr.table.seq) if dedup else None
    one_b, one_s = all_to_all_s(v * imbalance, plan, profile, top_k,
                                ea.experts if (dedup and consecutive) else None)
    passes = 2.0
    rec_pass = 2.0 if recompute == "full" else 0.0
    peak = profile.peak_flops_per_s(arr.table.act_dtype_bytes)
    x = ea.expert_fwd_flops * k / tp
    g = np.where(moe, x / (3.0 * np.maximum(ea.experts, 1.0)), 1.0)
    eff1 = profile.matmul_efficiency(np.maximum(g, 1.0))
    eff_ep = profile.matmul_efficiency(np.maximum(g * ep, 1.0))
    gemm = np.where(moe, x / peak * (imbalance / eff_ep - 1.0 / eff1), 0.0)
    # an FP8 plan's experts in FP8 (expert_precision.py): the local experts' weights and inputs
    e_w = np.where(moe, ea.expert_params / (ep * etp), 0.0)
    h = float(arr.table.hidden or 0)
    fe = np.where(moe, ea.expert_params / np.maximum(3.0 * h * np.maximum(ea.experts, 1.0), 1.0), 0.0)
    e_in = np.where(moe, ea.routed_tokens * k / tp * (h + fe), 0.0)   # fc1 reads h, fc2 f_e per token
    f8_f, f8_b, f8_w = fp8_expert_s(np.where(moe, x, 0.0), g * ep, e_w, e_in, imbalance, profile, plan,
                                    runtime_name)
    gemm = gemm + f8_w
    fwd = gemm + passes * one_s + (f8_f - f8_w)
    bwd = 2.0 * gemm + passes * one_s + (f8_b - 2.0 * f8_w)
    rec = np.where(moe, rec_pass / 2.0 * (gemm + passes * one_s), 0.0) if rec_pass else np.zeros(arr.n)
    params = (arr.params - ea.expert_params) / tp + ea.expert_params / (ep * etp)
    if any(zero_param_s):
        fwd = fwd + zero_param_s[0] * (params - arr.params / tp)
        bwd = bwd + zero_param_s[1] * (params - arr.params / tp)
    held, work = dispatch_buffer_bytes(v, moe, imbalance, saved_copies, recompute)   # dispatch_buffers.py
    return ExpertTerms(fwd_s=fwd, bwd_s=bwd, bwd_w_s=gemm, recompute_s=rec,
                       a2a_bytes=(2 * passes + rec_pass) * one_b,
                       a2a_s=(2 * passes + rec_pass) * one_s, params=params,
                       buffer_bytes=held, work_buffer_bytes=work)


def with_expert_times(rt: RowTimes, moe: ExpertTerms) -> RowTimes:
    """``rt`` with the MoE additions in its compute arrays (module docstring: the all-to-alls are
    on the row's critical path, so they are counted where the row's own time is)."""
    return replace(rt, fwd_s=rt.fwd_s + moe.fwd_s, bwd_s=rt.bwd_s + moe.bwd_s,
                   bwd_w_s=rt.bwd_w_s + moe.bwd_w_s, recompute_s=rt.recompute_s + moe.recompute_s)


def expert_zero_group(plan, runtime=None) -> int:
    """Ranks a routed expert's ZeRO shard group spans: the expert-dp ranks (those holding the
    same experts, ``dp·cp/ep`` of them, ep positions apart) inside the dense part's shard group.

    Without HSDP that is the whole expert-dp group ``dp·cp/ep``. Under HSDP the shard group is
    ``dp_shard·cp`` consecutive ranks (``zero_group``; cp folded in) and the ep group is carved
    innermost, so a shard group holds ``dp_shard·cp/ep`` ranks of each ep position where ep
    divides it (torchtitan's ``dp_shard_mod_ep`` mesh dimension, which it requires), and one
    where ep spans the shard group or more: the experts are then replicated, not sharded. Where
    neither divides the other the positions' counts differ by one: ``max(1, ⌊S/ep⌋)`` is the
    fewest, the most loaded GPU's, which is what a memory estimate must charge.

    With ``etp < tp`` the ``tp/etp`` ranks of a tp group that hold the same expert shard are
    expert-dp ranks too, so the group is ``tp/etp`` times larger: Megatron-core sizes it
    ``world/(etp·ep·pp)`` (``megatron/core/parallel_state.py``, NVIDIA/Megatron-LM 00caa53,
    ``initialize_model_parallel``: ``expert_data_parallel_size = world_size //
    expert_tensor_model_pipeline_parallel_size``), torchtitan's ``dp_shard_mod_ep`` takes the tp
    ranks when etp = 1 (``expert_tensor_parallel_degree``: "[partial dp + all tp -> ep]"), and
    autopar's runtime reduces the experts over the tp ranks as well (``autopar/runtime/step/
    experts.py``). Charging ``dp·cp/ep`` put Grok-1 at tp 4, etp 1, ep 8 on 512 H100 at 85 GiB
    (the expert optimizer shards 4× too large); it ran. A runtime that leaves the experts'
    states whole (``experts_zero_sharded``, autopar's own) has a group of 1."""
    if not experts_zero_sharded(plan, runtime):   # the runtime leaves them whole (below)
        return 1
    ep, etp = ep_degrees(plan)
    fold = max(1, plan.tp // etp)
    return max(1, zero_group(plan) * int(getattr(plan, "cp", 1) or 1) * fold // ep)


def experts_zero_sharded(plan, runtime=None) -> bool:
    """Whether the plan's runtime shards the routed experts' ZeRO states over their expert-dp
    group (``[moe] experts_zero_sharded``; ``runtime`` default: the plan's). 1 by default:
    Megatron-core's distributed optimizer over the expert-dp group and torchtitan's FSDP2 on its
    ``dp_shard_mod_ep`` mesh do. autopar's own runtime says 0 (issue 27): its DDP / ZeRO-1 /
    FSDP2 leave the expert shards out (``autopar/runtime/step/experts.py``: DDP ignores them,
    ZeRO-1 steps them on every rank, FSDP2's ``ignored_params``), all-reduces their gradients
    over the expert-dp group and keeps their weights, fp32 gradients and optimizer state whole
    on every rank of it; ZeRO-3 gathers none of them (``zero_gathered_params``). It does so
    where it treats them as expert shards, ep > 1 or tp > 1 (``autopar/runtime/apply.py``); at
    ep = tp = 1 they are parameters like the others, ZeRO-sharded over dp."""
    rt = runtime if runtime is not None else load_runtime(getattr(plan, "runtime", None))
    if getattr(rt, "moe_experts_zero_sharded", 1):
        return True
    return ep_degrees(plan)[0] == 1 and plan.tp == 1


def zero_gathered_params(arr: TableArrays, plan, runtime=None) -> np.ndarray:
    """Parameters of each row that ZeRO-3 gathers whole on one GPU (its buffer,
    ``RowCoefficients.weight_bytes`` and ``fix_stage_memory``'s ``gathered``): the row's local
    ``dense/tp + experts/(ep·etp)``, less the experts where the runtime leaves them unsharded
    (``experts_zero_sharded``): they are resident whole already, never gathered."""
    if experts_zero_sharded(plan, runtime):
        return local_params(arr, plan)
    return (arr.params - expert_arrays(arr).expert_params) / plan.tp


def local_params(arr: TableArrays, plan) -> np.ndarray:
    """Parameters of each row on one GPU: ``dense/tp + experts/(ep·etp)`` (``ExpertTerms.params``)."""
    ea = expert_arrays(arr)
    ep, etp = ep_degrees(plan)
    return (arr.params - ea.expert_params) / plan.tp + ea.expert_params / (ep * etp)


def expert_state_bytes(arr: TableArrays, plan, precision: str, runtime=None) -> np.ndarray | None:
    """σ_i: weights + grads + optimizer state per row on one GPU, the dense part ZeRO-sharded
    over its shard group (dp, or HSDP's ``dp_shard``: ``zero_group``) and the experts over
    ``expert_zero_group``, the optimizer's bytes the runtime's (``allocator.optimizer_share``,
    as ``estimate``'s ``as_allocated`` charges them; ``runtime`` default: the plan's). None for
    a dense table."""
    ea = expert_arrays(arr)
    if not ea.any:
        return None
    ep, etp = ep_degrees(plan)
    share = optimizer_share(runtime or load_runtime(getattr(plan, "runtime", None)), precision)
    dense = (arr.params - ea.expert_params) / plan.tp
    experts = ea.expert_params / (ep * etp)
    p, g, o = model_state_bytes(1.0, zero_group(plan), plan.zero, precision)
    pe, ge, oe = model_state_bytes(1.0, expert_zero_group(plan, runtime), plan.zero, precision)
    return dense * (p + g + o * share) + experts * (pe + ge + oe * share)


def fix_stage_memory(mem: dict, arr: TableArrays, chunks, plan, precision: str,
                     work_rows: np.ndarray | None = None) -> dict:
    """``memory.stage_memory``'s breakdown with the routed experts' states as ep shards them
    (it charged them as dense parameters, ``experts/tp`` sharded over ``zero_group``) and, under
    ZeRO-3, its gathered weights as a rank gathers them: the two largest rows' local parameters
    ``dense/tp + experts/(ep·etp)`` (it gathers its own ep shard's experts, never the others'),
    the split program's ``weight_bytes`` buffer. Called on the breakdown before
    ``allocator.as_allocated`` (which scales the optimizer bytes to the runtime's).
    ``work_rows`` (``RowCoefficients.act_none_bytes``: a block's saved bytes with its dispatch
    buffers): full recompute's working set is the largest block's of these, where
    ``stage_memory`` charged the largest block's saved bytes alone (``working_set_extra``)."""
    ea = expert_arrays(arr)
    if not ea.any:
        return mem
    if work_rows is not None and plan.recompute == "full":
        extra = working_set_extra(arr, chunks, plan, work_rows)
        mem = {**mem, "activations": mem["activations"] + extra, "total": mem["total"] + extra}
    ep, etp = ep_degrees(plan)
    pe = float(sum(ea.expert_params[s:e].sum() for s, e in chunks))
    if pe == 0.0:
        return mem
    was = model_state_bytes(pe / plan.tp, zero_group(plan), plan.zero, precision)
    now = model_state_bytes(pe / (ep * etp), expert_zero_group(plan), plan.zero, precision)
    out = dict(mem)
    for key, a, b in zip(("params", "grads", "optimizer"), was, now):
        out[key] = max(0.0, mem[key] - a + b)
    if plan.zero >= 3 and mem["gathered"] > 0.0:
        local = np.concatenate([zero_gathered_params(arr, plan)[s:e] for s, e in chunks])
        out["gathered"] = STATE_BYTES[precision][0] * float(np.sort(local)[::-1][:2].sum())
    out["total"] = sum(out[kk] for kk in ("params", "grads", "optimizer", "gathered", "activations", "reserve"))
    return out


def working_set_extra(arr: TableArrays, chunks, plan, work_rows: np.ndarray) -> float:
    """Full recompute's working set with the recomputed block's dispatch buffers
    (``work_rows``, module docstring) less what ``memory.recompute_working_bytes`` charged
    without them: the largest block of ``chunks`` by each."""
    blocks = [work_rows[s:e][arr.is_block[s:e]] for s, e in chunks]
    with_buffers = max((float(b.max()) for b in blocks if b.size), default=0.0)
    without = recompute_working_bytes(arr, plan.tp, plan.sequence_parallel, plan.micro_batch_size,
                                      "full", plan.attention, list(chunks))
    return max(0.0, with_buffers - without)


def ep_comm(table, profile: HardwareProfile, plan, chunks, m: int) -> list[dict]:
    """The estimate's ``comm`` entry of the expert all-to-alls of the slowest rank's ``chunks``
    over a step of ``m`` micro-batches (none without ep or experts)."""
    from costmodels.model.table_arrays import table_arrays
    from costmodels.profiles.runtime import load_runtime
    ep, _ = ep_degrees(plan)
    arr = table_arrays(table)
    if ep <= 1 or not expert_arrays(arr).any:
        return []
    rt = load_runtime(plan.runtime)
    t = expert_terms(arr, profile, plan, plan.recompute, rt.moe_load_imbalance,
                     dedup=bool(rt.moe_dispatch_once_per_node), consecutive=bool(rt.moe_route_consecutive))
    nbytes = m * float(sum(t.a2a_bytes[s:e].sum() for s, e in chunks))
    secs = m * float(sum(t.a2a_s[s:e].sum() for s, e in chunks))
    n_in, nodes = ep_span(plan, profile.link_domain)
    return [{"kind": "ep", "collective": "all_to_all", "group_size": ep,
             "tier": "inter_node" if nodes > 1 else "intra_node", "bytes_per_gpu": nbytes,
             "time_s": secs, "exposed_s": secs}]
