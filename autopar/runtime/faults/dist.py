"""Process groups for a plan: start-up from torchrun's environment, the (tp, cp, dp, pp) layout
and its DeviceMesh.

Layout. ``plan.mesh_order()`` lists the mesh dimensions innermost first: ``plan.placement``
(default ``"tp,dp,pp"``: the tp peers of a rank are adjacent ranks, then dp, then pp — tp inside
a node, pp across nodes) with cp right outside tp (Megatron's tp-cp-dp-pp). The gradient-sync
and HSDP groups over dp·cp are ``autopar.runtime.faults.sync_groups``'.
Position ``i`` of a rank in the runner's rank list has coordinates

    i = c[inner] + size[inner] · (c[middle] + size[middle] · c[outer])

The DeviceMesh is built outer-first, ``mesh_dim_names`` e.g. ``("pp", "dp", "tp")``.

Groups are created by ``create_groups`` — on every rank of the world, in one fixed order, as
torch's ``new_group`` requires — and cached by their rank set, so many runners in one process
(tests, ``autopar verify``) reuse them.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from costmodels.contracts.errors import PlanError

DEFAULT_TIMEOUT_S = float(os.environ.get("AUTOPAR_COLLECTIVE_TIMEOUT", "300"))
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

_GROUPS: dict[tuple[int, ...], object] = {}
_TIMEOUT = datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)  # also for every group created here
_MESHES: dict[tuple, object] = {}


def backend_for_device() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def ensure_initialized(world_needed: int, timeout_s: float | None = None) -> None:
    """Initialise the default process group from torchrun's environment when none exists.

    Raises PlanError (one line, before any collective) when there is no torchrun environment
    and the plan needs more than one process. A plan of one process runs without torchrun, on
    NCCL where CUDA is available (before: gloo, so a one-GPU run silently trained on the CPU).
    """
    global _TIMEOUT
    _TIMEOUT = datetime.timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S)
    if dist.is_initialized():
        return
    timeout = _TIMEOUT
    missing = [k for k in _TORCHRUN_ENV if k not in os.environ]
    if missing:
        if world_needed == 1:   # one process: on a GPU NCCL (so the Runner's device is CUDA), else gloo
            backend = backend_for_device()
            if backend == "nccl":
                from autopar.runtime.step.gpu_defaults import set_env
                set_env()   # on the current CUDA device, which the Runner then uses
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
            return
        raise PlanError(f"autopar.apply needs {world_needed} processes but was not launched by "
                        f"torchrun ({', '.join(missing)} not set); run it as 'torchrun "
                        f"--nproc-per-node {world_needed} your_script.py' or call "
                        "torch.distributed.init_process_group first")
    world = int(os.environ["WORLD_SIZE"])
    if world != world_needed:
        raise PlanError(f"world size {world} (torchrun's WORLD_SIZE) != dp·cp·tp·pp = {world_needed} "
                        f"for this plan; launch with 'torchrun --nproc-per-node {world_needed}' "
                        "or change the plan's dp, tp or pp")
    backend = backend_for_device()
    if backend == "nccl":
        from autopar.runtime.step.gpu_defaults import set_env
        set_env()   # allocator, NCCL flight recorder per rank: before CUDA and NCCL start
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timeout)


def timeout_s() -> float:
    """Seconds a collective waits for a silent peer (AUTOPAR_COLLECTIVE_TIMEOUT, or apply's
    ``timeout_s``)."""
    return _TIMEOUT.total_seconds()


def device_for_backend() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group(ranks) -> object:
    """The process group of ``ranks``, created earlier by ``create_groups`` on every rank."""
    key = tuple(sorted(int(r) for r in ranks))
    if key == tuple(range(dist.get_world_size())):
        return dist.group.WORLD
    if key not in _GROUPS:
        raise RuntimeError(f"no process group for ranks {list(key)}: call "
                           "autopar.runtime.faults.dist.create_groups(plan, ranks) on every rank of the "
                           "world first (apply does it itself when it runs on the whole world)")
    return _GROUPS[key]


def create_groups(plan, ranks=None, extra=()) -> None:
    """Create every process group a runner of ``plan`` over ``ranks`` (default: the world) may
    use — tp, dp and pp groups, the first/last pipeline-stage (embedding) groups, the whole
    plan, and ``extra`` rank sets — in one fixed order. A collective over the WHOLE world: every
    rank calls it with the same arguments, members or not (torch's ``new_group`` contract).
    Groups are cached by rank set, so calling it again with known groups costs nothing."""
    ranks = tuple(ranks) if ranks is not None else tuple(range(dist.get_world_size()))
    for key in layout_rank_sets(plan, ranks) + [tuple(sorted(e)) for e in extra]:
        if key in _GROUPS or key == tuple(range(dist.get_world_size())):
            continue
        _GROUPS[key] = dist.new_group(list(key), timeout=_TIMEOUT)


def layout_rank_sets(plan, ranks) -> list[tuple[int, ...]]:
    order = plan.mesh_order()
    sizes = plan.mesh_sizes()
    coords = []
    for i in range(len(ranks)):
        c = {}
        for d in order:
            c[d] = i % sizes[d]
            i //= sizes[d]
        coords.append(c)
    out: list[tuple[int, ...]] = []

    def along(dim, keep=lambda c: True):
        groups: dict[tuple, list[int]] = {}
        for i, c in enumerate(coords):
            if keep(c):
                groups.setdefault(tuple(c[d] for d in order if d != dim), []).append(ranks[i])
        for g in groups.values():
            t = tuple(sorted(g))
            if len(t) > 1 and t not in out:
                out.append(t)

    for dim in ("tp", "dp", "pp"):
        along(dim)
    if plan.cp > 1 or getattr(plan, "dp_shard", None):   # context parallel / HSDP groups
        for t in sync_rank_sets(plan, ranks, coords):
            if len(t) > 1 and t not in out:
                out.append(t)
    if plan.pp > 2:
        along("pp", keep=lambda c: c["pp"] in (0, plan.pp - 1))
    if tuple(sorted(ranks)) not in out:  # the whole plan (size 1 too: a runner's own group)
        out.append(tuple(sorted(ranks)))
    return out


def coord_to_sync(plan, c) -> tuple[int, int]:
    """(replica index, index inside the shard group) of coordinates ``c``."""
    shard = plan.shard_size
    d = c.get("dp", 0)
    return d // shard, (d % shard) * plan.cp + c.get("cp", 0)


def sync_rank_sets(plan, ranks, coords) -> list[tuple[int, ...]]:
    """Rank sets of the cp groups, the dp·cp sync groups and (HSDP) the shard and replicate
    groups, for the rank list ``ranks`` whose coordinates are ``coords``."""
    out: list[tuple[int, ...]] = []

    def add(key_of):
        groups: dict[tuple, list[int]] = {}
        for r, c in zip(ranks, coords):
            groups.setdefault(key_of(c), []).append(r)
        for g in groups.values():
            t = tuple(sorted(g))
            if len(t) > 1 and t not in out:
                out.append(t)

    fixed = ("tp", "pp")
    add(lambda c: tuple(c[d] for d in fixed) + (c["dp"],))            # cp group
    add(lambda c: tuple(c[d] for d in fixed))                           # dp·cp sync group
    if plan.dp_shard:
        add(lambda c: tuple(c[d] for d in fixed) + (coord_to_sync(plan, c)[0],))  # shard group
        add(lambda c: tuple(c[d] for d in fixed) + (coord_to_sync(plan, c)[1],))  # replicas
    return out



@dataclass
class Layout:
    """Where this rank sits in the plan's (tp, dp, pp) grid, and its groups."""

    ranks: tuple[int, ...]          # global ranks running the plan, in position order
    sizes: dict[str, int]           # {"tp": .., "dp": .., "pp": ..}
    order: tuple[str, ...]          # innermost first, from plan.placement
    rank: int                       # this process's global rank
    coord: dict[str, int]           # this rank's coordinate per dimension

    @property
    def tp_rank(self) -> int:
        return self.coord["tp"]

    @property
    def dp_rank(self) -> int:
        return self.coord["dp"]

    @property
    def pp_rank(self) -> int:
        return self.coord["pp"]

    @property
    def cp_rank(self) -> int:
        return self.coord.get("cp", 0)

    def peers_along(self, dims) -> list[int]:
        """Global ranks that differ from this one only along ``dims`` (the first dim varying
        slowest), e.g. ``("dp", "cp")``: the ranks gradients are averaged over."""
        out = [{}]
        for d in dims:
            out = [{**c, d: k} for c in out for k in range(self.sizes[d])]
        return [self.rank_at(**c) for c in out]

    def rank_at(self, **coord) -> int:
        """Global rank at this rank's coordinates with some of them replaced."""
        c = {**self.coord, **coord}
        i, stride = 0, 1
        for d in self.order:
            i += c[d] * stride
            stride *= self.sizes[d]
        return self.ranks[i]

    def peers(self, dim: str) -> list[int]:
        """Global ranks that differ from this one only along ``dim`` (in coordinate order)."""
        return [self.rank_at(**{dim: k}) for k in range(self.sizes[dim])]

    def group(self, dim: str):
        return group(self.peers(dim))

    def mesh(self, device_type: str):
        """A DeviceMesh over the plan's ranks, outer dimension first (dimensions of size 1 are
        left out, e.g. ("pp", "tp") for dp=1)."""
        from torch.distributed.device_mesh import DeviceMesh
        names = tuple(d for d in reversed(self.order) if self.sizes[d] > 1)
        key = (self.ranks, names, device_type)
        if key not in _MESHES:
            shape = tuple(self.sizes[d] for d in names)
            mesh = torch.tensor(self.ranks, dtype=torch.int).reshape(shape)
            _MESHES[key] = DeviceMesh.from_group([self.group(d) for d in names], device_type,
                                                 mesh=mesh, mesh_dim_names=names)
        return _MESHES[key]

    def dim_mesh(self, dim: str, device_type: str):
        """A 1-D DeviceMesh along ``dim`` (what FSDP2 takes for the dp dimension)."""
        from torch.distributed.device_mesh import DeviceMesh
        key = (tuple(self.peers(dim)), (dim,), device_type)
        if key not in _MESHES:
            _MESHES[key] = DeviceMesh.from_group(self.group(dim), device_type,
                                                 mesh_dim_names=(dim,))
        return _MESHES[key]


def make_layout(plan, pg=None) -> Layout:
    """The layout of ``plan`` over the ranks of ``pg`` (default: the whole world)."""
    ranks = tuple(dist.get_process_group_ranks(pg)) if pg is not None else tuple(
        range(dist.get_world_size()))
    if len(ranks) != plan.world_size:
        raise PlanError(f"world size {len(ranks)} != dp·cp·tp·pp = {plan.dp}·{plan.cp}·{plan.tp}·{plan.pp} = "
                        f"{plan.world_size} for this plan; launch with 'torchrun --nproc-per-node "
                        f"{plan.world_size}' or change the plan's dp, tp or pp")
    me = dist.get_rank()
    if me not in ranks:
        raise PlanError(f"rank {me} is not in the group the plan runs on ({list(ranks)})")
    order = plan.mesh_order()            # cp right outside tp
    sizes = plan.mesh_sizes()
    i = ranks.index(me)
    coord = {}
    for d in order:
        coord[d] = i % sizes[d]
        i //= sizes[d]
    return Layout(ranks=ranks, sizes=sizes, order=order, rank=me, coord=coord)
