"""The runtime's host time per block pass (compute docstring, "Host"): a block's forward,
backward and recompute forward each take at least the host's time to issue it, and no more
where the GPU is the slower of the two."""
import dataclasses

import numpy as np
from synthetic_tables import gpt_table

from costmodels.contracts.plan import Plan
from costmodels.model.compute import row_times
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import _REGISTERED, load_runtime, register_runtime

H = 1e-3


def _runtime(h: float) -> str:
    name = f"autopar-host-test-{h:g}"
    if name not in _REGISTERED:
        register_runtime(dataclasses.replace(load_runtime("autopar"), name=name, host_block_s=h))
    return name


def test_a_block_pass_takes_the_longer_of_gpu_and_host():
    t = gpt_table(layers=4, hidden=512, heads=8, vocab=1024, seq=256)
    prof = load_profile("h100-80g-sxm")
    gpu = row_times(t, prof, 1, False, 1, "full", "flash")
    host = row_times(t, prof, 1, False, 1, "full", "flash", host_block_s=H)
    blk = np.array([r.kind == "block" for r in t.rows])
    assert (gpu.fwd_s[blk] < H).all()                      # a small block: the host sets the pass
    assert np.allclose(host.fwd_s[blk], H) and np.allclose(host.bwd_s[blk], np.maximum(gpu.bwd_s[blk], H))
    assert np.allclose(host.recompute_s[blk], H)           # the recompute forward pays it too
    assert np.array_equal(host.fwd_s[~blk], gpu.fwd_s[~blk])   # embedding and head: untouched


def test_the_floor_moves_small_micro_batches_and_leaves_large_ones():
    t = gpt_table(layers=8, hidden=1024, heads=16, vocab=50304, seq=1024)
    small, large = Plan(micro_batch_size=1), Plan(micro_batch_size=32)
    for plan, moved in ((small, True), (large, False)):
        base = estimate(t, "h100-80g-sxm", plan.with_(runtime=_runtime(0.0)), 1, 32).step_time_s
        host = estimate(t, "h100-80g-sxm", plan.with_(runtime=_runtime(H)), 1, 32).step_time_s
        assert (host > base * 1.05) if moved else host == base, (plan.micro_batch_size, base, host)


def test_a_cpu_profile_takes_no_host_floor():
    """On a CPU host and compute are one thread (the measured rates hold the host's time): the
    same plan under a host-floored runtime estimates the same as without it."""
    t = gpt_table(layers=4, hidden=64, heads=4, vocab=256, seq=32)
    plan = Plan(micro_batch_size=1)
    for hw in ("cpu-2core", "cpu-2core-measured"):
        base = estimate(t, hw, plan.with_(runtime=_runtime(0.0)), 1, 8).step_time_s
        assert estimate(t, hw, plan.with_(runtime=_runtime(H)), 1, 8).step_time_s == base, hw
    gpu = [estimate(t, "h100-80g-sxm", plan.with_(runtime=_runtime(h)), 1, 8).step_time_s for h in (0.0, H)]
    assert gpu[1] > gpu[0]                                  # the same tiny model on a GPU: floored
