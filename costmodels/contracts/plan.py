"""The Plan: one frozen, versioned, JSON-serialisable contract between search and apply.

The search writes plans, ``autopar estimate`` scores them, the rewrite/runtime executes them,
``autopar report`` draws them. A plan names *how* to parallelise; it does not name the model or
the cluster (those travel beside it in a plans file, see ``PlansFile``).

Defaults (a field left out of the JSON takes these):
    dp=1, tp=1, pp=1, vpp=1, micro_batch_size=1, zero=0, recompute="none",
    sequence_parallel=False, schedule="1f1b", attention="flash", stages=None (balanced),
    placement="tp,dp,pp" (innermost first: tp inside a node, then dp, then pp),
    runtime="autopar" (the software the plan was scored for: a runtime profile of
    ``runtime-profiles/``, options after a colon, e.g. ``megatron:overlap_grad_reduce``;
    see ``costmodels.profiles.runtime``),
    cp=1, ep=1, etp=1, precision="bf16", dp_shard=None (the axes below).

The axes of long sequences, Mixtures of Experts, FP8 and HSDP (one definition the cost model,
search, runtime and exporters all read):

* ``cp`` — context parallel degree: each sequence is cut into ``2·cp`` chunks, rank ``i`` of the
  cp group holding chunks ``i`` and ``2·cp − 1 − i`` (causal load balance, as Megatron-core and
  torch's ``context_parallel`` do). The world is ``dp·cp·tp·pp`` GPUs; a sample is split over cp,
  so the global batch is still divided over ``dp`` only. The cp group sits just outside tp in
  every placement (``mesh_order``), as in Megatron (tp-cp-dp-pp) and torchtitan.
* ``ep`` — expert parallel degree, ``etp`` — tensor parallel degree of each expert (dividing
  ``tp``): each MoE layer's experts are sharded over ``ep`` ranks and each expert over ``etp``;
  dense parts are unaffected. The expert mesh is built over the ``tp·cp·dp`` ranks of a pipeline
  stage (Megatron-core's rule: its expert ``RankGenerator(tp=etp, ep=ep, dp=world/(etp·ep·pp))``
  on the same ranks, world = pp·etp·ep·edp; ``megatron/core/parallel_state.py``
  ``initialize_model_parallel``, NVIDIA/Megatron-LM 00caa53), so the contract's rule is
  ``ep·etp`` divides ``dp·cp·tp``. At ``etp = tp`` that is ``ep`` divides ``dp·cp`` (the ep
  ranks taken from the data-parallel and context-parallel groups); with ``etp < tp`` the
  ``tp/etp`` ranks of a tp group an expert is not sharded over join the expert groups, so ``ep``
  may exceed ``dp·cp`` (DeepSeek-V3 at tp 2, etp 1, ep 64 on dp 32). The expert-dp group
  (ranks holding the same expert shard) is ``dp·cp·(tp/etp)/ep``; the cost model places the ep
  group innermost over the freed tp ranks for the runtimes whose expert mesh does so
  (``costmodels.model.experts.ep_span``), and a runtime whose ep group stays inside ``dp·cp``
  refuses ``ep`` not dividing ``dp·cp`` (``costmodels.profiles.runtime_rules.expert_mesh_rule``;
  autopar's own runtime: ``costmodels.contracts.runnable.check_experts``).
* ``precision`` — the matmuls' number format: ``bf16`` (today's behaviour), ``fp8``
  (per-tensor scaling, delayed or current as the runtime profile says), ``fp8-rowwise``,
  ``mxfp8`` (block scaling, Blackwell). Independent of ``estimate``'s memory recipe
  (``bf16-mixed``, ``amp``, ``fp32``), which says what the master weights and states are.
* ``dp_shard`` — HSDP: the ZeRO shard group spans ``dp_shard`` of the ``dp`` ranks (inner), the
  ``dp / dp_shard`` groups replicating each other (outer; FSDP2's 2-D mesh, torchtitan's
  ``data_parallel_replicate_degree`` × ``data_parallel_shard_degree``). ``None``: the whole dp
  (plain ZeRO); needs ``zero >= 1``; a value equal to dp is stored as ``None``.

Each of these is left out of ``to_dict`` at its default, so a plan without them serialises
exactly as before they existed.

``stages`` lists, for each of the ``pp * vpp`` virtual stages in pipeline order, the half-open
range ``[start, end)`` of layer-table rows it runs (embedding = row 0, head = last row). Virtual
stage ``v`` runs on pipeline rank ``v % pp`` (Megatron's interleaving), except under the V
schedules (``zb-v``, ``dualpipe-v``), where rank ``r`` runs stages ``r`` and ``2·pp − 1 − r``:
``stages_of_rank`` / ``rank_of_stage`` are the one rule both the cost model and the runtime read.

Lives in ``costmodels`` (torch-free) so the cost model can score a plan without torch;
``autopar.Plan`` is this same class.
"""
from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from costmodels.contracts.checks import LIMITS, is_int, nearest, quote
from costmodels.contracts.errors import PlanError

PLAN_VERSION = 1
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe-v")
# Schedules that run several virtual stages per pipeline rank (vpp > 1 needs one of them).
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe-v")
# V-shaped schedules: exactly two stages per rank, rank r holding stages r and 2·pp − 1 − r
# (torch's ScheduleZBVZeroBubble / ScheduleDualPipeV, ``generate_stage_to_rank_mapping(style="v")``).
V_SCHEDULES = ("zb-v", "dualpipe-v")
# Schedules that split each backward into input-gradient (B) and weight-gradient (W) passes.
SPLIT_BACKWARD_SCHEDULES = ("interleaved-zb", "zb-v", "dualpipe-v")
ATTENTION = ("flash", "math")
PLACEMENTS = ("tp,dp,pp", "tp,pp,dp", "dp,tp,pp")
PRECISIONS = ("bf16", "fp8", "fp8-rowwise", "mxfp8")
# The axes added after version 1's first fields, with their defaults: left out of the JSON at
# the default, so older plans and their files read and write unchanged.
AXIS_DEFAULTS = {"cp": 1, "ep": 1, "etp": 1, "precision": "bf16", "dp_shard": None}


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    attention: str = "flash"
    stages: tuple[tuple[int, int], ...] | None = None
    placement: str = "tp,dp,pp"
    runtime: str = "autopar"
    version: int = PLAN_VERSION
    # heterogeneous clusters (costmodels/profiles/cluster.py): the pools as searched, [profile, GPUs] each,
    # and the pool of every pipeline rank; both None on a uniform cluster (and then left out of
    # the JSON, so a uniform plan serialises exactly as before these fields existed)
    pools: tuple[tuple[str, int], ...] | None = None
    stage_pools: tuple[int, ...] | None = None
    # long sequences, experts, number format, HSDP (module docstring)
    cp: int = 1
    ep: int = 1
    etp: int = 1
    precision: str = "bf16"
    dp_shard: int | None = None

    def __post_init__(self):
        for name, top in (("dp", LIMITS["gpus"]), ("tp", LIMITS["gpus"]), ("pp", LIMITS["gpus"]),
                          ("cp", LIMITS["gpus"]), ("ep", LIMITS["gpus"]), ("etp", LIMITS["gpus"]),
                          ("vpp", LIMITS["layers"]), ("micro_batch_size", LIMITS["micro_batch"])):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= top:
                raise PlanError(f"plan field '{name}'={quote(v)} must be a positive integer (at most {top:,})")
        if self.world_size > LIMITS["gpus"]:
            raise PlanError(f"plan dp·cp·tp·pp = {self.world_size:,} GPUs is above autopar's limit of "
                            f"{LIMITS['gpus']:,} (LIMITS['gpus'] in costmodels/contracts/checks.py); "
                            "use smaller degrees")
        if not is_int(self.zero) or self.zero not in (0, 1, 2, 3):
            raise PlanError(f"plan field 'zero'={quote(self.zero)} must be 0, 1, 2 or 3")
        _choice("recompute", self.recompute, RECOMPUTE)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("attention", self.attention, ATTENTION)
        _choice("placement", self.placement, PLACEMENTS)
        if not isinstance(self.runtime, str) or not self.runtime.strip() or " " in self.runtime:
            raise PlanError(f"plan field 'runtime'={self.runtime!r} must name a runtime profile "
                            "(autopar, megatron, deepspeed, fsdp, or a path to a .toml file)")
        if not isinstance(self.sequence_parallel, bool):
            raise PlanError(f"plan field 'sequence_parallel'={quote(self.sequence_parallel)} must be true or false")
        if not is_int(self.version) or self.version != PLAN_VERSION:
            raise PlanError(f"plan version {quote(self.version)} is not supported (this autopar reads "
                            f"version {PLAN_VERSION}); re-run 'autopar search' to regenerate it")
        if self.vpp > 1 and self.schedule not in MULTI_STAGE_SCHEDULES:
            raise PlanError(f"plan field 'vpp'={self.vpp} needs a schedule with several stages per "
                            f"rank ({', '.join(MULTI_STAGE_SCHEDULES)}; got '{self.schedule}'); "
                            "set vpp=1 or change the schedule")
        if self.schedule in MULTI_STAGE_SCHEDULES and self.pp < 2:
            raise PlanError(f"schedule '{self.schedule}' needs pp >= 2; use '1f1b' for pp=1")
        if self.schedule in V_SCHEDULES and self.vpp != 2:
            raise PlanError(f"schedule '{self.schedule}' places exactly two stages per rank in a V; "
                            f"set vpp=2 (got vpp={self.vpp})")
        if self.sequence_parallel and self.tp < 2:
            raise PlanError("plan field 'sequence_parallel' needs tp >= 2; set it false for tp=1")
        self._check_axes()
        if self.stages is not None:
            object.__setattr__(self, "stages", _check_stages(self.stages, self.pp * self.vpp))
        if self.pools is not None or self.stage_pools is not None:
            from costmodels.contracts.plan_pools import check_pool_fields
            pools, stage_pools = check_pool_fields(self)
            object.__setattr__(self, "pools", pools)
            object.__setattr__(self, "stage_pools", stage_pools)

    def _check_axes(self) -> None:
        """cp / ep / etp / precision / dp_shard against each other and the degrees."""
        _choice("precision", self.precision, PRECISIONS)
        if self.tp % self.etp:
            raise PlanError(f"plan field 'etp'={self.etp} must divide tp={self.tp} (each expert is "
                            "tensor-parallel over part of the tp group); set etp=1 or a divisor of tp")
        ranks = self.dp * self.cp * self.tp
        if ranks % (self.ep * self.etp):
            raise PlanError(f"plan field 'ep'={self.ep} times 'etp'={self.etp} must divide dp·cp·tp = "
                            f"{self.dp}·{self.cp}·{self.tp} = {ranks} (the expert mesh, etp·ep·expert-dp, "
                            "is built over the tp, cp and dp ranks, as in Megatron-core); choose ep "
                            f"dividing dp·cp·tp/etp = {ranks // self.etp}")
        if self.dp_shard is None:
            return
        if not is_int(self.dp_shard) or not 1 <= self.dp_shard <= self.dp or self.dp % self.dp_shard:
            raise PlanError(f"plan field 'dp_shard'={quote(self.dp_shard)} must be a divisor of "
                            f"dp={self.dp} (the ZeRO shard group of HSDP); leave it out for plain ZeRO")
        if self.zero == 0:
            raise PlanError("plan field 'dp_shard' is the ZeRO shard group of HSDP and needs zero >= 1; "
                            "leave it out for zero=0")
        if self.dp_shard == self.dp:            # the whole dp: plain ZeRO, one spelling
            object.__setattr__(self, "dp_shard", None)

    # ---- derived quantities -------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def shard_size(self) -> int:
        """Ranks a ZeRO shard group spans: ``dp_shard`` under HSDP, else the whole dp."""
        return self.dp_shard or self.dp

    @property
    def replicas(self) -> int:
        """HSDP replica groups (1 without HSDP)."""
        return self.dp // self.shard_size

    def mesh_order(self) -> tuple[str, ...]:
        """The parallel dimensions innermost first: ``placement`` with cp right outside tp (as
        Megatron's tp-cp-dp-pp and torchtitan's mesh place it), e.g. ``('tp', 'cp', 'dp', 'pp')``.
        The one rank layout the cost model's topology and the runtime's process groups read."""
        order = []
        for d in self.placement.split(","):
            order.append(d)
            if d == "tp":
                order.append("cp")
        return tuple(order)

    def mesh_sizes(self) -> dict[str, int]:
        """{dimension: degree} for ``mesh_order``'s dimensions."""
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp

    def num_micro_batches(self, global_batch: int) -> int:
        """global batch / (dp · micro_batch_size); raises PlanError when it does not divide."""
        per = self.dp * self.micro_batch_size
        if isinstance(global_batch, bool) or not isinstance(global_batch, numbers.Integral) or global_batch < 1:
            raise PlanError(f"global batch {quote(global_batch)} must be a positive integer (samples per "
                            "optimizer step, over all data-parallel ranks)")
        if global_batch % per:
            raise PlanError(f"global batch {global_batch} is not divisible by dp·micro_batch_size = "
                            f"{self.dp}·{self.micro_batch_size} = {per}; change the batch, dp or "
                            "micro_batch_size")
        return global_batch // per

    def stages_of_rank(self, rank: int) -> tuple[int, ...]:
        """The virtual stages pipeline rank ``rank`` runs, in chunk order (``stages_of_rank``)."""
        return stages_of_rank(self.schedule, self.pp, self.vpp, rank)

    def with_(self, **changes) -> Plan:
        return replace(self, **changes)

    # ---- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stages"] = [list(s) for s in self.stages] if self.stages is not None else None
        for k, default in AXIS_DEFAULTS.items():
            if d[k] == default:
                del d[k]
        if self.pools is None:      # a uniform plan: exactly the JSON of before pools existed
            del d["pools"], d["stage_pools"]
        else:
            d["pools"] = [list(p) for p in self.pools]
            d["stage_pools"] = list(self.stage_pools)
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """Build from a dict of plan fields; any other key is a PlanError naming it (what other
        layers write beside a plan is split off by ``costmodels.contracts.plans_file.PlanResult``)."""
        if not isinstance(d, dict):
            raise PlanError(f"a plan must be a JSON object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(quote(k, 40) for k in d if k not in names)
        if unknown:
            hint = next((h for h in (nearest(k, names) for k in d if k not in names) if h), "")
            shown = ", ".join(unknown[:5]) + (", …" if len(unknown) > 5 else "")
            raise PlanError(f"unknown plan field(s) [{shown}]; {hint}allowed: {sorted(names)}")
        return cls(**d)          # __post_init__ checks each field, stages into tuples

    def label(self) -> str:
        """The plan on one line, e.g. ``dp16·tp8·pp8 vpp3 mb1 ZeRO-1 selective-recompute sp
        interleaved-1f1b``: the degrees and the micro-batch size always, every other field only
        when it is not its default (the schedule also whenever there is a pipeline), never the
        split points. The one rendering the CLI, explain, the search's messages and the report
        print, so a plan reads the same everywhere."""
        default = type(self)()
        cp = f"·cp{self.cp}" if self.cp > 1 else ""
        s = f"dp{self.dp}{cp}·tp{self.tp}·pp{self.pp}"
        if self.ep > 1:
            s += f" ep{self.ep}" + (f"·etp{self.etp}" if self.etp > 1 else "")
        elif self.etp > 1:
            s += f" etp{self.etp}"
        if self.dp_shard is not None:
            s += f" hsdp{self.replicas}x{self.dp_shard}"
        if self.vpp != default.vpp:
            s += f" vpp{self.vpp}"
        s += f" mb{self.micro_batch_size}"
        if self.zero != default.zero:
            s += f" ZeRO-{self.zero}"
        if self.recompute != default.recompute:
            s += f" {self.recompute}-recompute"
        if self.sequence_parallel:
            s += " sp"
        if self.pp > 1 or self.schedule != default.schedule:
            s += f" {self.schedule}"
        if self.attention != default.attention:
            s += f" {self.attention}-attention"
        if self.precision != default.precision:
            s += f" {self.precision}"
        if self.placement != default.placement:
            s += f" placement:{self.placement}"
        if self.runtime != default.runtime:
            s += f" runtime:{self.runtime}"
        if self.pools is not None:
            from costmodels.contracts.plan_pools import pools_label
            s += f" {pools_label(self)}"
        return s


def rank_of_stage(plan, stage: int) -> int:
    """The pipeline rank that runs virtual stage ``stage`` (the inverse of ``stages_of_rank``)."""
    pp = plan.pp
    if plan.schedule in V_SCHEDULES and stage >= pp:
        return 2 * pp - 1 - stage
    return stage % pp


# The plan's fields as they appear in a plan's JSON (all but the format ``version``).
PLAN_FIELDS = tuple(f.name for f in fields(Plan) if f.name != "version")


def stages_of_rank(schedule: str, pp: int, vpp: int, rank: int) -> tuple[int, ...]:
    """The virtual stages (indices into ``Plan.stages``) pipeline rank ``rank`` runs, its chunk
    0, 1, … in this order: ``(rank, 2·pp − 1 − rank)`` for the V schedules (torch's
    ``generate_rank_to_stage_mapping(pp, 2·pp, style="v")``: the model goes down the ranks and
    back up, so the first and last stages share rank 0 and the turn stays on rank pp − 1), else
    ``(rank, rank + pp, …, rank + (vpp − 1)·pp)`` (torch's "loop" style, Megatron's interleaving).
    The one mapping the cost model and the runtime share; torch-free."""
    if schedule in V_SCHEDULES:
        return (rank, 2 * pp - 1 - rank)
    return tuple(c * pp + rank for c in range(vpp))


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise PlanError(f"plan field '{name}'={quote(value)} is not one of {list(allowed)}")


def _check_stages(stages, n: int) -> tuple[tuple[int, int], ...]:
    """``stages`` as a tuple of (start, end) integer pairs: exactly ``n`` contiguous, non-empty
    half-open ranges from row 0 (floats, strings and booleans are refused, not rounded)."""
    form = ("plan field 'stages' must be a list of [start, end) row ranges (integers), e.g. "
            "[[0, 13], [13, 26]]")
    if isinstance(stages, (str, bytes, dict)) or not hasattr(stages, "__iter__"):
        raise PlanError(f"{form}; got {quote(stages)}")
    st = []
    for pair in stages:
        if isinstance(pair, (str, bytes, dict)) or not hasattr(pair, "__len__") or len(pair) != 2 \
                or not all(is_int(x) for x in pair):
            raise PlanError(f"{form}; got the range {quote(pair)}")
        st.append((int(pair[0]), int(pair[1])))
        if len(st) > n:
            break
    if len(st) != n:
        raise PlanError(f"plan field 'stages' has {len(st)}{'+' if len(st) > n else ''} ranges but "
                        f"pp·vpp = {n}; give one [start, end) range per virtual stage")
    st = tuple(st)
    if st[0][0] != 0 or any(a >= b for a, b in st) or any(st[i][1] != st[i + 1][0] for i in range(n - 1)):
        raise PlanError(f"plan field 'stages'={quote([list(s) for s in st])} must be contiguous, "
                        "non-empty [start, end) ranges starting at row 0")
    return st
