"""``autopar.search.search``: model spec + hardware name in, ``SearchResult`` out."""
from __future__ import annotations

from typing import Any

from costmodels.contracts.errors import PlanError


def search(model: str, hardware: str, gpus: int, global_batch: int, *, seq: int | None = None,
           fix: dict[str, Any] | str | None = None, top: int = 5, objective: str = "step_time",
           target_step_time_s: float | None = None, target_tokens_per_s: float | None = None,
           allow_cross_node_tp: bool = False, max_micro_batch: int | None = None,
           time_limit_s: float = 600.0, progress: bool = False, table=None, runtime: str | None = None,
           cluster_file=None, zero_bubble: bool = False):
    """Top-``top`` plans for ``model`` on ``gpus`` × ``hardware`` at ``global_batch`` sequences.

    ``fix``: pinned plan fields (a dict or ``"tp=8,schedule=1f1b"``). ``objective``:
    ``step_time`` (default; exactly ``gpus`` GPUs), ``throughput_per_gpu`` (any count up to
    ``gpus``), ``fewest_gpus`` (the fewest GPUs up to ``gpus`` whose step time reaches the target;
    give ``target_step_time_s`` or ``target_tokens_per_s``). ``table``: a LayerTable to use instead
    of tracing ``model``. ``runtime``: the software that will run the plans (a runtime profile,
    ``costmodels.profiles.runtime``; default autopar's): the search then proposes only what it can run and
    scores them as it runs them. Raises ``NoFeasiblePlanError`` with the explanation when nothing
    fits. ``hardware`` may name pools (``a100-80g-sxm:256,h100-80g-sxm:128``) or be a
    ``costmodels.profiles.cluster.Cluster``, or ``cluster_file`` a cluster.toml: the search then places
    stages on pools (``autopar.search.pools``); ``gpus`` may then be None (the pools' sum).
    ``zero_bubble``: also search interleaved-zb, zb-v and dualpipe-v (slower:
    ``autopar.search.space._schedules``; a pinned one is searched either way).
    """
    from autopar.search.costs import Costs
    from autopar.search.engine import Progress, run_search
    from autopar.search.space import parse_fix
    from costmodels.profiles.hardware_files import load_profile
    if isinstance(fix, str):
        fix = parse_fix(fix)
    if runtime is not None:
        from costmodels.profiles.runtime import load_runtime
        fix = {**(fix or {}), "runtime": load_runtime(runtime).name}
    from costmodels.profiles.cluster import Cluster, resolve_hardware
    hw, gpus = resolve_hardware(hardware, cluster_file, gpus)
    if gpus is None:
        raise PlanError("--gpus N is needed with a single hardware profile")
    if gpus < 1:
        raise PlanError(f"--gpus {gpus} must be at least 1")
    if global_batch < 1:
        raise PlanError(f"--global-batch {global_batch} must be at least 1")
    from autopar.search.request_checks import check_targets
    check_targets(objective, target_step_time_s, target_tokens_per_s)   # before the trace
    if table is None:
        from autopar.trace import table_for
        table = table_for(model, micro_batch=1, seq=seq)
    if target_tokens_per_s is not None:
        if target_tokens_per_s <= 0:
            raise PlanError("--target-tokens-per-s must be positive")
        target_step_time_s = global_batch * table.seq / target_tokens_per_s
    if objective == "fewest_gpus" and target_step_time_s is None:
        raise PlanError("--objective fewest_gpus needs a target: --target-step-time SECONDS or "
                        "--target-tokens-per-s N")
    if isinstance(hw, Cluster):
        if objective != "step_time":
            raise PlanError(f"--objective {objective} is not searched on a cluster of pools yet; use step_time")
        from autopar.search.pools import search_pools
        return search_pools(table, hw, global_batch, fix=fix, top=top, max_micro_batch=max_micro_batch,
                            time_limit_s=time_limit_s, progress=Progress(progress), context={"model": model})
    profile = load_profile(hw)
    costs = Costs(table, profile, global_batch)
    return run_search(costs, gpus=gpus, global_batch=global_batch, fix=fix, top=top,
                      objective=objective, target_step_time_s=target_step_time_s,
                      allow_cross_node_tp=allow_cross_node_tp, max_micro_batch=max_micro_batch,
                      time_limit_s=time_limit_s, progress=Progress(progress),
                      context={"model": model, "hardware": profile.name}, zero_bubble=zero_bubble)
