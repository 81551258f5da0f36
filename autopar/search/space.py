"""The discrete search space: which degrees and switches a plan may take, and ``--fix`` parsing.

A *configuration* is a plan without its split points: ``(dp, tp, pp, vpp, micro_batch_size,
zero, recompute, sequence_parallel, schedule, attention, placement)``. ``configurations`` lists
every configuration that can exist for a model, a cluster and a global batch:

* ``dp · tp · pp = gpus`` (for the GPU-count objectives: ``≤ gpus``, see ``gpu_counts``);
* ``tp`` divides ``heads`` and ``kv_heads`` (each rank owns whole heads) and stays inside a node
  (``tp ≤ gpus_per_node`` and divides it) unless ``allow_cross_node_tp``;
* ``dp · micro_batch_size`` divides the global batch (whole micro-batches on every replica);
* ``pp · vpp ≤ rows`` (every virtual stage runs at least one layer-table row); several stages
  per rank (``vpp > 1``) need ``pp ≥ 2`` and a multi-stage schedule: the looped ones,
  ``interleaved-1f1b`` (also ``num_micro_batches % pp == 0``: Megatron's groups of ``pp``) and
  ``interleaved-zb`` (torch's ``ScheduleInterleavedZeroBubble``: rounds of ``m // pp`` dividing
  ``m``), both over the same vpps, or the V ones, ``zb-v`` and ``dualpipe-v`` (exactly vpp = 2,
  rank r holding stages r and 2·pp − 1 − r; DualPipeV also ``m ≥ 2·pp``); the split points
  may give the chunks uneven block counts wherever the runtime cuts uneven virtual stages
  (``uneven_interleaving``; else ``layers % (pp·vpp) == 0``, Megatron's old rule). A pipeline
  depth whose blocks divide some ``pp·vpp`` is searched with those even vpp only (uneven ones add
  CP-SAT work for near-ties there); the uneven ones are searched where ``pp`` has no even vpp
  (llama3-405b's 126 blocks on 16 stages), the smallest vpp for each largest chunk size
  ``⌈layers/(pp·vpp)⌉``, or any when ``vpp`` is pinned;
* the runtime (``fix["runtime"]``, default ``autopar``; ``costmodels.profiles.runtime_rules``) can run it:
  its ZeRO stages (with a pipeline: those it combines with one), schedules, sequence parallel;
* the runtime's own rules, ``costmodels.contracts.runnable.check_runnable`` (1F1B needs ``m ≥ pp``,
  interleaving ``m`` a multiple of ``pp``; tp vs heads, kv heads, SP's sequence; ``pp·vpp`` vs rows);
* canonical forms, so that the top-k plans are distinct in what they do: ``dp = 1`` → ZeRO 0
  (there is nothing to shard across); ``pp = 1`` → schedule ``1f1b``, ``vpp = 1``; ``tp = 1`` →
  no sequence parallel. A field the user pins with ``--fix`` is exempt from canonicalisation.

``attention`` is ``flash`` and ``placement`` ``tp,dp,pp`` unless pinned (flash attention never
costs more time or memory in the cost model, and tp-innermost is the placement every other
placement is checked against). ``stages`` (the split points) are not part of a configuration:
the solver places them.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from autopar.search.fix import (  # noqa: F401  (re-exported: the --fix API lived here)
    ALIASES,
    FIX_FIELDS,
    SCHEDULE_ALIASES,
    check_fix_against,
    parse_fix,
    schedule_name,
)
from costmodels.contracts.plan import (
    MULTI_STAGE_SCHEDULES,
    RECOMPUTE,
    SCHEDULES,
    SPLIT_BACKWARD_SCHEDULES,
    V_SCHEDULES,
    Plan,
)
from costmodels.contracts.runnable import ModelDims, is_runnable
from costmodels.profiles.fp8_shapes import Fp8Shapes, fp8_shape_rule
from costmodels.profiles.runtime import DEFAULT_RUNTIME, RuntimeProfile, load_runtime
from costmodels.profiles.runtime_rules import (
    context_parallel_rule,
    ddp_rule,
    expert_mesh_rule,
    hsdp_rule,
    interleaving_rule,
    schedule_rule,
    sequence_parallel_rule,
    zero_rule,
)


@dataclass(frozen=True)
class Config:
    """A plan without split points (see the module docstring)."""
    dp: int
    tp: int
    pp: int
    vpp: int
    micro_batch_size: int
    zero: int
    recompute: str
    sequence_parallel: bool
    schedule: str
    attention: str = "flash"
    placement: str = "tp,dp,pp"
    runtime: str = DEFAULT_RUNTIME
    precision: str = "bf16"    # the matmuls' format (autopar.search.precision_space lists them)
    cp: int = 1                      # context parallel degree (autopar.search.context_space)
    dp_shard: int | None = None      # HSDP's shard group (None: ZeRO over the whole dp)
    ep: int = 1                    # expert parallel, from dp (costmodels.model.experts)
    etp: int = 1
    # no split yet: so that the runtime's rules (``is_runnable``) read a configuration as they read
    # a plan. Enumeration asks them of every configuration, and building a ``Plan`` for each (its
    # field validation, which enumerated values pass by construction) was half the time of
    # listing them (gpt3-175b, every count to 128 GPUs: 168k ``Plan``s, 9 of 19 s). Not a field.
    stages = None

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def plan(self, stages=None) -> Plan:
        return Plan(dp=self.dp, tp=self.tp, pp=self.pp, vpp=self.vpp,
                    micro_batch_size=self.micro_batch_size, zero=self.zero,
                    recompute=self.recompute, sequence_parallel=self.sequence_parallel,
                    schedule=self.schedule, attention=self.attention, placement=self.placement,
                    runtime=self.runtime, precision=self.precision, cp=self.cp, dp_shard=self.dp_shard,
                    ep=self.ep, etp=self.etp,
                    stages=tuple(tuple(s) for s in stages) if stages is not None else None)

    @classmethod
    def of(cls, plan: Plan) -> Config:
        return cls(**{f.name: getattr(plan, f.name) for f in fields(cls)})


# --------------------------------------------------------------------------------------------
# candidate degrees
# --------------------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


@dataclass(frozen=True)
class Shape:
    """What the space needs to know about the model (from the layer table)."""
    rows: int
    layers: int
    heads: int | None
    kv_heads: int | None
    seq: int | None = None
    experts: int = 0               # routed experts per MoE layer (0: dense)
    fp8: Fp8Shapes | None = None   # block linears' shapes (costmodels.profiles.fp8_shapes; None: unchecked)

    @classmethod
    def of(cls, table) -> Shape:
        return cls(rows=len(table.rows), layers=table.layers, heads=table.heads,
                   kv_heads=table.kv_heads, seq=table.seq,
                   experts=max((getattr(r, "experts", 0) for r in table.rows), default=0),
                   fp8=Fp8Shapes.of_table(table))


def tp_candidates(shape: Shape, gpus_per_node: int, allow_cross_node_tp: bool, limit: int) -> list[int]:
    out = []
    for tp in divisors(limit):
        if not is_runnable(Plan(tp=tp), ModelDims(heads=shape.heads, kv_heads=shape.kv_heads)):
            continue   # the runtime's rule: tp divides heads and kv heads
        if not shape.heads and tp > 1:
            continue  # no tensor-parallel pairs to split
        if not allow_cross_node_tp and (tp > gpus_per_node or gpus_per_node % tp):
            continue
        out.append(tp)
    return out


def gpu_counts(max_gpus: int, gpus_per_node: int) -> list[int]:
    """GPU counts the GPU-count objectives try: powers of two below a node, whole nodes above."""
    counts = {g for g in (1 << i for i in range(32)) if g <= min(max_gpus, gpus_per_node)}
    counts |= {n * gpus_per_node for n in range(1, max_gpus // gpus_per_node + 1)}
    if max_gpus < gpus_per_node:
        counts.add(max_gpus)
    return sorted(c for c in counts if c <= max_gpus)


def configurations(shape: Shape, gpus: int, global_batch: int, gpus_per_node: int,
                   fix: dict[str, Any] | None = None, allow_cross_node_tp: bool = False,
                   max_micro_batch: int | None = None, zero_bubble: bool = False,
                   precisions: tuple[str, ...] = ("bf16",)) -> Iterator[Config]:
    """Every configuration for exactly ``gpus`` GPUs (module docstring), honouring ``fix``; the
    zero-bubble schedules only with ``zero_bubble`` or when ``fix`` pins one (``_schedules``).
    Context parallelism and HSDP (``autopar.search.context_space``): each cp degree the rule
    there admits, the configurations of ``gpus / cp`` GPUs with that cp, and their HSDP splits."""
    from functools import partial

    from autopar.search.context_space import with_context_parallel
    inner = partial(_configurations, precisions=precisions)
    rt = load_runtime((fix or {}).get("runtime"))
    for c in with_context_parallel(inner, shape, gpus, global_batch, gpus_per_node, fix,
                                   allow_cross_node_tp, max_micro_batch, zero_bubble):
        if c.precision == "bf16" or not fp8_shape_rule(rt, c, shape.fp8):   # FP8 GEMM shapes (fp8_shapes)
            yield c


def _configurations(shape: Shape, gpus: int, global_batch: int, gpus_per_node: int,
                    fix: dict[str, Any] | None = None, allow_cross_node_tp: bool = False,
                    max_micro_batch: int | None = None, zero_bubble: bool = False,
                    precisions: tuple[str, ...] = ("bf16",)) -> Iterator[Config]:
    """``configurations`` without cp (cp = 1) and without HSDP."""
    fix = dict(fix or {})
    fix.pop("stages", None)
    dims = ModelDims(rows=shape.rows, heads=shape.heads, kv_heads=shape.kv_heads, seq=shape.seq,
                     experts=shape.experts)
    rt = load_runtime(fix.get("runtime"))
    rules_ok: dict = {}
    def allowed(name, values):
        return [fix[name]] if name in fix else values
    for tp in allowed("tp", tp_candidates(shape, gpus_per_node, allow_cross_node_tp, gpus)):
        if gpus % tp:
            continue
        for pp in allowed("pp", divisors(gpus // tp)):
            if pp > shape.rows or (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            if "dp" in fix and fix["dp"] != dp:
                continue
            if global_batch % dp:
                continue
            per_replica = global_batch // dp
            degrees = expert_degrees(shape, dp, tp, fix, rt)   # srch7: per (dp, tp), not per configuration
            mbs_all = [b for b in divisors(per_replica) if max_micro_batch is None or b <= max_micro_batch]
            for mbs in allowed("micro_batch_size", mbs_all):
                if per_replica % mbs:
                    continue
                m = per_replica // mbs
                for schedule, vpp in _schedules(shape, pp, m, fix, rt, zero_bubble):
                    for zero in allowed("zero", [0, 1, 2, 3] if dp > 1 else [0]):
                        for recompute in allowed("recompute", _recomputes(fix)):
                            for sp in allowed("sequence_parallel", [False, True] if tp > 1 else [False]):
                                if sp and tp < 2:
                                    continue
                                for ep, etp in degrees:
                                    kw = dict(dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mbs,
                                              zero=zero, recompute=recompute, sequence_parallel=sp,
                                              schedule=schedule, attention=fix.get("attention", "flash"),
                                              placement=fix.get("placement", "tp,dp,pp"), runtime=rt.name,
                                              ep=ep, etp=etp)
                                    c = Config(**kw)
                                    # the rules read neither recompute nor the micro-batch size
                                    # (only m): asked once per the fields they read
                                    rk = (tp, pp, dp, vpp, schedule, zero, sp, ep, etp, m)
                                    ok = rules_ok.get(rk)
                                    if ok is None:   # srch7: the runtime's rules read no m: once per rk[:-1]
                                        rt_ok = rules_ok.get(rk[:-1])
                                        if rt_ok is None:
                                            rt_ok = rules_ok[rk[:-1]] = runnable(rt, c)
                                        ok = rules_ok[rk] = rt_ok and is_runnable(c, dims, m)
                                    if ok:
                                        for prec in allowed("precision", list(precisions)):
                                            # (a constructor, not dataclasses.replace: 2× cheaper,
                                            # and H100 spaces hold one per configuration)
                                            yield c if prec == "bf16" else Config(**kw, precision=prec)


def expert_degrees(shape: Shape, dp: int, tp: int, fix: dict[str, Any],
                   rt: RuntimeProfile | None = None) -> list[tuple[int, int]]:
    """(ep, etp) pairs of a configuration: ep over the divisors of dp that divide the routed
    experts (1 alone for a dense model); etp 1 unless pinned (the cost model prices etp's
    smaller expert shards but not its collectives yet, so the search does not choose it).
    A runtime whose expert mesh spans tp (``expert_mesh_over_tp``) also gets the ep that take
    the ``tp/etp`` ranks an expert is not sharded over (``autopar.search.expert_tp_space``)."""
    if "ep" in fix:
        eps = [fix["ep"]]
    elif shape.experts:
        eps = [e for e in divisors(dp) if shape.experts % e == 0]
    else:
        eps = [1]
    etps = [fix["etp"]] if "etp" in fix else [1]
    if rt is not None and rt.expert_mesh_over_tp and "ep" not in fix and shape.experts:
        from autopar.search.expert_tp_space import eps_over_tp
        return [(ep, etp) for etp in etps for ep in eps_over_tp(eps, shape.experts, dp, tp, etp)]
    return [(ep, etp) for ep in eps for etp in etps]


def runnable(rt: RuntimeProfile, c: Config) -> bool:
    """The runtime's rules (``costmodels.profiles.runtime_rules``) that a configuration can break."""
    return not (zero_rule(rt, c) or ddp_rule(rt, c) or schedule_rule(rt, c) or sequence_parallel_rule(rt, c)
                or context_parallel_rule(rt, c) or hsdp_rule(rt, c) or expert_mesh_rule(rt, c))


def _recomputes(fix: dict[str, Any]) -> list[str]:
    # with flash attention nothing is stored that selective recompute could drop: the cost model
    # gives "selective" exactly the time and memory of "none", so only one of them is listed
    if fix.get("attention", "flash") == "flash":
        return ["none", "full"]
    return list(RECOMPUTE)


def _schedules(shape: Shape, pp: int, m: int, fix: dict[str, Any], rt: RuntimeProfile,
               zero_bubble: bool = False) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs for a pipeline depth (module docstring). The micro-batch rules of
    each schedule are ``costmodels.contracts.runnable``'s (``configurations`` asks ``is_runnable``);
    interleaved 1F1B's multiple of pp is checked here too, before listing its vpps.

    The zero-bubble schedules (``SPLIT_BACKWARD_SCHEDULES``) are listed only with
    ``zero_bubble`` (``autopar search --zero-bubble``) or when ``--fix`` pins one: their split
    program (the simulator's op graph, ``autopar.search.split_schedules``) is exact but costs
    CP-SAT seconds per configuration at pp ≥ 8, and their split-independent bounds cannot see
    the bubble they leave, so adding them to every search multiplies its time (gpt3-175b on 1024
    GPUs: 7.5 s → 200 s, README)."""
    out = []
    if pp == 1:
        out = [(s, 1) for s in (SCHEDULES if "schedule" in fix else ("1f1b",)) if s not in MULTI_STAGE_SCHEDULES]
    else:
        out = [("gpipe", 1), ("1f1b", 1)]
        looped = [s for s in LOOPED_SCHEDULES if not (s == "interleaved-1f1b" and m % pp)]
        for vpp in (_looped_vpps(shape, pp, fix) if looped else ()):
            probe = Config(1, 1, pp, vpp, 1, 0, "none", False, "interleaved-1f1b")
            if not interleaving_rule(rt, probe, shape.layers):
                out.extend((s, vpp) for s in looped)
        if 2 * pp <= shape.rows:   # V schedules: exactly two stages per rank (costmodels.contracts.plan)
            probe = Config(1, 1, pp, 2, 1, 0, "none", False, "zb-v")
            if not interleaving_rule(rt, probe, shape.layers):
                out.extend((s, 2) for s in V_SCHEDULES)
    if not (zero_bubble or fix.get("schedule") in SPLIT_BACKWARD_SCHEDULES):
        out = [o for o in out if o[0] not in SPLIT_BACKWARD_SCHEDULES]
    if "schedule" in fix:
        out = [o for o in out if o[0] == fix["schedule"]]
    if "vpp" in fix:
        out = [o for o in out if o[1] == fix["vpp"]]
    return out


# the looped multi-stage schedules (virtual stage v on rank v mod pp), any vpp ≥ 2
LOOPED_SCHEDULES = tuple(s for s in MULTI_STAGE_SCHEDULES if s not in V_SCHEDULES)


def _looped_vpps(shape: Shape, pp: int, fix: dict[str, Any]) -> list[int]:
    """The vpps a looped schedule is searched with (module docstring): even ones where this pp
    has any, else the smallest uneven vpp per largest chunk ⌈layers / (pp·vpp)⌉ (more chunks of
    the same largest size add sends, not speed; they only hold fewer activations); any when
    vpp is pinned."""
    vpps = list(range(2, shape.rows // pp + 1))
    if "vpp" in fix:
        return vpps
    even = [v for v in vpps if shape.layers % (pp * v) == 0]
    if even:
        return even
    seen: set[int] = set()
    out = []
    for v in vpps:
        largest = -(-shape.layers // (pp * v))
        if largest not in seen:
            seen.add(largest)
            out.append(v)
    return out
