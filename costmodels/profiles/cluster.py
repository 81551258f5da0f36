"""Heterogeneous clusters: pools of GPUs of different hardware profiles, and the links between them.

Why its own module: a uniform cluster is one hardware profile and a GPU count, and every layer
below the search takes exactly that. A cluster of *pools* (256 A100s and 128 H100s on one fabric)
adds two things only — which profile prices which pipeline rank, and which link carries the
pipeline sends between two pools — so it lives beside the profile, not inside it.

Two ways in (``autopar search|estimate|report``):

* ``--hardware a100-80g-sxm:256,h100-80g-sxm:128``: pools of shipped profile names or ``.toml``
  paths, each with its GPU count (a whole number of its nodes). One name without a count is the
  uniform cluster as before (``--gpus`` gives the count); ``name:COUNT`` alone is the uniform
  cluster of COUNT GPUs.
* ``--cluster cluster.toml``::

      [[pool]]                       # one table per pool, in order
      name = "old"                   # a label (default: the profile's name)
      profile = "a100-80g-sxm"       # a shipped name or a path (relative to this file)
      nodes = 32                     # GPUs = nodes × gpus_per_node
      gpus_per_node = 8              # optional; default the profile's

      [[link]]                       # optional: the network between two pools
      pools = ["old", "new"]
      bandwidth_bytes_per_s = 25e9   # per GPU, one direction
      latency_s = 2e-5

The link between two pools, unless a ``[[link]]`` gives it, is the slower of the two pools'
inter-node tiers as each prices this plan's pipeline sends (``HardwareProfile.group_link``;
the lower bandwidth, the higher latency): pools are whole nodes, so a send between them always
leaves a node.

Pools of one profile with no ``[[link]]`` between them are one pool: they are merged (counts
added, first position kept), so such a cluster *is* the uniform cluster of that profile and
plans and predicts exactly as it does (issue 15's must-show; the pricing path over two pools of
one profile equals the uniform one too, ``tests/test_cluster_estimate.py``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from costmodels.contracts.checks import LIMITS, quote
from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib
from costmodels.profiles.hardware import HardwareProfile, LinkTier
from costmodels.profiles.hardware_files import load_profile


@dataclass(frozen=True)
class Pool:
    name: str                  # label (the profile's reference for --hardware)
    profile: HardwareProfile
    gpus: int
    ref: str = ""              # the profile as given: a shipped name or a path (Plan.pools)

    @property
    def nodes(self) -> int:
        return self.gpus // self.profile.gpus_per_node


@dataclass(frozen=True)
class Cluster:
    pools: tuple[Pool, ...]
    links: dict = field(default_factory=dict, compare=False, hash=False)   # frozenset({i, j}) -> LinkTier

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def spec(self) -> tuple[tuple[str, int], ...]:
        """What a plan records (``Plan.pools``): each pool's profile reference and GPU count."""
        return tuple((p.ref or p.profile.name, p.gpus) for p in self.pools)

    def label(self) -> str:
        """``a100-80g-sxm:512,h100-80g-sxm:256`` (the ``--hardware`` form)."""
        return ",".join(f"{p.name}:{p.gpus}" for p in self.pools)

    def link(self, i: int, j: int, plan) -> LinkTier:
        """The link a pipeline send between pools ``i`` and ``j`` crosses (module docstring)."""
        if i == j:
            return self.pools[i].profile.group_link(plan, "pp")
        given = self.links.get(frozenset((i, j)))
        if given is not None:
            return given
        a, b = (_inter_node_pp(self.pools[k].profile, plan) for k in (i, j))
        if a == b:
            return a
        return LinkTier("inter_node", min(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s),
                        max(a.latency_s, b.latency_s))


def _inter_node_pp(profile: HardwareProfile, plan) -> LinkTier:
    """The profile's pipeline link for ``plan`` when the send leaves the node."""
    link = profile.group_link(plan, "pp")
    return link if link.name == "inter_node" else profile.inter_node


def parse_hardware(text: str) -> Cluster | None:
    """``--hardware`` → a Cluster, or None for one profile name without a count (the uniform path,
    ``--gpus`` giving the count). A cluster whose pools merge into one (module docstring) comes
    back with a single pool; callers read it as the uniform cluster of that pool."""
    items = [s.strip() for s in str(text).split(",")]
    if any(not s for s in items):
        raise ProfileError(f"--hardware {quote(text)} has an empty pool; write e.g. "
                           "--hardware a100-80g-sxm:256,h100-80g-sxm:128")
    if len(items) == 1 and _count_of(items[0]) is None:
        return None
    pools = []
    for item in items:
        count = _count_of(item)
        if count is None:
            raise ProfileError(f"--hardware pool {quote(item)} has no GPU count; with several pools "
                               f"each needs one, e.g. {item}:64")
        ref = item.rsplit(":", 1)[0]
        prof = load_profile(ref)
        pools.append(_pool(ref, prof, count, ref, "--hardware"))
    return merge_pools(Cluster(tuple(pools)))


def _count_of(item: str) -> int | None:
    if ":" not in item:
        return None
    raw = item.rsplit(":", 1)[1].strip()
    if not raw.isdigit():
        if os.sep in item or item.endswith(".toml"):
            return None       # a path with a colon in it
        raise ProfileError(f"--hardware pool {quote(item)}: the count {quote(raw)} is not a whole "
                           "number of GPUs; write NAME:COUNT, e.g. a100-80g-sxm:256")
    return int(raw)


def _pool(name: str, prof: HardwareProfile, count: int, ref: str, where: str) -> Pool:
    if count < 1 or count > LIMITS["gpus"]:
        raise ProfileError(f"{where} pool {quote(name)}: {count} GPUs must be between 1 and "
                           f"{LIMITS['gpus']:,}")
    gpn = prof.gpus_per_node
    if count < gpn:   # a pool is whole nodes (module docstring): part of one node is --gpus N
        raise ProfileError(f"{where} pool {quote(name)}: {count} GPUs is not a whole number of "
                           f"{gpn}-GPU nodes (pools are whole nodes); for part of one node give "
                           f"--hardware {ref} --gpus {count}")
    if count > gpn and count % gpn:
        raise ProfileError(f"{where} pool {quote(name)}: {count} GPUs is not a whole number of "
                           f"{gpn}-GPU nodes; use a multiple of {gpn} (e.g. {count - count % gpn or gpn})")
    return Pool(name, prof, int(count), ref)


def merge_pools(cluster: Cluster) -> Cluster:
    """Pools of one profile with no link of their own between them become one (module docstring)."""
    pools: list[Pool] = []
    index: list[int] = []       # old pool -> new pool
    for i, p in enumerate(cluster.pools):
        j = next((k for k, q in enumerate(pools) if q.profile is p.profile
                  and not any(frozenset((i, o)) in cluster.links
                              for o, ni in enumerate(index) if ni == k)), None)
        if j is None:
            pools.append(p)
            index.append(len(pools) - 1)
        else:
            pools[j] = replace(pools[j], gpus=pools[j].gpus + p.gpus)
            index.append(j)
    links = {frozenset(index[k] for k in key): v for key, v in cluster.links.items()
             if len({index[k] for k in key}) == 2}
    return Cluster(tuple(pools), links)


def load_cluster(path: str | os.PathLike) -> Cluster:
    """A cluster file (format in the module docstring); every problem is one ProfileError line."""
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"cluster file {quote(str(path))} does not exist; pass a .toml file with "
                           "[[pool]] tables (docs/guide.md, 'Heterogeneous clusters')")
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"cluster file {quote(str(path))} is not valid TOML ({e}); fix the file") from None
    unknown = sorted(set(data) - {"pool", "link"})
    if unknown:
        raise ProfileError(f"cluster file {quote(str(path))}: unknown table(s) {unknown}; allowed: pool, link")
    raw = data.get("pool")
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"cluster file {quote(str(path))} has no [[pool]] tables; add one per pool "
                           "(name, profile, nodes)")
    pools, names = [], []
    for k, d in enumerate(raw):
        pools.append(_file_pool(d, k, p))
        if pools[-1].name in names:
            raise ProfileError(f"cluster file: two pools are named {quote(pools[-1].name)}; give each its own name")
        names.append(pools[-1].name)
    links = {}
    for d in data.get("link", []) or []:
        key, tier = _file_link(d, names)
        links[key] = tier
    return merge_pools(Cluster(tuple(pools), links))


def _file_pool(d, k: int, path: Path) -> Pool:
    where = f"cluster file [[pool]] #{k + 1}"
    if not isinstance(d, dict):
        raise ProfileError(f"{where} must be a table (name, profile, nodes)")
    extra = sorted(set(d) - {"name", "profile", "nodes", "gpus_per_node"})
    if extra:
        raise ProfileError(f"{where}: unknown key(s) {extra}; allowed: name, profile, nodes, gpus_per_node")
    ref = d.get("profile")
    if not isinstance(ref, str) or not ref:
        raise ProfileError(f"{where} needs profile = \"<shipped name or path>\"")
    if (ref.endswith(".toml") or os.sep in ref) and not os.path.isabs(ref):
        ref = str(path.parent / ref)
    prof = load_profile(ref)
    gpn = d.get("gpus_per_node", prof.gpus_per_node)
    nodes = d.get("nodes")
    for key, v in (("nodes", nodes), ("gpus_per_node", gpn)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(f"{where}: {key} = {quote(v)} must be a positive integer")
    if gpn != prof.gpus_per_node:
        prof = replace(prof, gpus_per_node=int(gpn))
    name = d.get("name", prof.name)
    if not isinstance(name, str) or not name.strip() or "," in name or ":" in name:
        raise ProfileError(f"{where}: name = {quote(name)} must be a non-empty label without ',' or ':'")
    return _pool(name, prof, int(nodes) * int(gpn), ref, "cluster file")


def _file_link(d, names: list[str]):
    if not isinstance(d, dict) or sorted(d) != ["bandwidth_bytes_per_s", "latency_s", "pools"]:
        raise ProfileError("cluster file [[link]] needs exactly pools = [\"a\", \"b\"], "
                           "bandwidth_bytes_per_s and latency_s")
    pair = d["pools"]
    if not isinstance(pair, list) or len(pair) != 2 or any(n not in names for n in pair) or pair[0] == pair[1]:
        raise ProfileError(f"cluster file [[link]] pools = {quote(pair)} must name two different pools of {names}")
    bw, lat = d["bandwidth_bytes_per_s"], d["latency_s"]
    for key, v in (("bandwidth_bytes_per_s", bw), ("latency_s", lat)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
            raise ProfileError(f"cluster file [[link]] {key} = {quote(v)} must be a finite number >= 0")
    if bw <= 0:
        raise ProfileError("cluster file [[link]] bandwidth_bytes_per_s must be above 0")
    return frozenset(names.index(n) for n in pair), LinkTier("inter_pool", float(bw), float(lat))


def cluster_of_plan(pools) -> Cluster:
    """The cluster a plan's ``pools`` field names (default links): for ``estimate`` on a plan
    given without ``--hardware`` / ``--cluster``."""
    out = []
    for ref, count in pools:
        prof = load_profile(ref)
        out.append(Pool(ref, prof, int(count), ref))
    return Cluster(tuple(out))


def resolve_hardware(hardware=None, cluster_file=None, gpus: int | None = None):
    """``(profile or Cluster, GPUs)`` from ``--hardware`` / ``--cluster`` / ``--gpus`` as the CLI
    and the Python API take them: a cluster of one pool (after merging) is that pool's profile with
    its GPU count; ``gpus`` must then agree with the pools' sum (one line when not)."""
    if isinstance(hardware, Cluster):
        cluster = hardware
    elif cluster_file is not None:
        if hardware is not None:
            raise ProfileError("give either --hardware or --cluster, not both (the cluster file names "
                               "each pool's profile)")
        cluster = load_cluster(cluster_file)
    elif hardware is None:
        raise ProfileError("--hardware (a profile, or pools NAME:COUNT,...) or --cluster FILE is needed")
    elif isinstance(hardware, HardwareProfile):
        return hardware, gpus
    else:
        cluster = parse_hardware(hardware)
        if cluster is None:
            return load_profile(hardware), gpus
    if gpus is not None and gpus != cluster.gpus:
        raise ProfileError(f"--gpus {gpus} but the pools add up to {cluster.gpus} GPUs "
                           f"({cluster.label()}); drop --gpus or change the pool counts")
    if len(cluster.pools) == 1:
        return cluster.pools[0].profile, cluster.pools[0].gpus
    return cluster, cluster.gpus
