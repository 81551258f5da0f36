"""The hardware flags ``search``, ``estimate`` and ``report --scale`` share: ``--hardware`` (one
profile, or pools ``NAME:COUNT,...``), ``--cluster cluster.toml`` and ``--gpus``
(``costmodels.profiles.cluster`` has the formats). Kept in one place so the three commands read pools the
same way and refuse the same bad input in one line."""
from __future__ import annotations

HARDWARE_HELP = ("hardware profile name or path (autopar hardware), or pools of them with GPU counts: "
                 "a100-80g-sxm:256,h100-80g-sxm:128 (a heterogeneous cluster)")


def add_hardware_args(p, gpus_help: str) -> None:
    from autopar.cli.common import int_arg
    p.add_argument("--hardware", default=None, metavar="H", help=HARDWARE_HELP)
    p.add_argument("--cluster", default=None, metavar="cluster.toml",
                   help="a cluster file: pools (profile, nodes) and the links between them "
                        "(docs/guide-clusters.md); instead of --hardware")
    p.add_argument("--gpus", type=int_arg(limit="gpus"), default=None, metavar="N", help=gpus_help)


def hardware_of(args):
    """(profile or Cluster, GPUs or None) from the parsed flags; a bad one is one ProfileError line."""
    from costmodels.profiles.cluster import resolve_hardware
    return resolve_hardware(args.hardware, args.cluster, args.gpus)
