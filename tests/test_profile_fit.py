"""The alpha-beta fit and the bus-bandwidth convention (no processes)."""
import numpy as np
import pytest

from autopar.profile.fit import bus_bandwidth, bus_factor, fit_alpha_beta, fit_joint
from costmodels.model.comm import collective_time
from costmodels.profiles.hardware import LinkTier

SIZES = np.array([8, 64, 512, 4096, 32768, 262144, 2097152, 16777216], dtype=float)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "p2p"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_fit_recovers_exact_alpha_beta(kind, n):
    tier = LinkTier("intra_node", 3.2e9, 4e-5)
    _, t = collective_time(kind, SIZES, n, tier)
    f = fit_alpha_beta(kind, n, SIZES, t)
    assert f.alpha_s == pytest.approx(4e-5, rel=1e-6)
    assert f.beta_bytes_per_s == pytest.approx(3.2e9, rel=1e-6)
    assert f.max_rel_error < 1e-9
    # the fitted model is costmodels.model.comm's formula
    np.testing.assert_allclose(f.predict(SIZES), t, rtol=1e-9)


def test_joint_fit_is_the_single_tier_of_the_cost_model():
    tier = LinkTier("intra_node", 1.1e9, 2e-4)
    series = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        _, t = collective_time(kind, SIZES, 2, tier)
        series.append((kind, 2, SIZES, t))
    j = fit_joint(series)
    assert j.alpha_s == pytest.approx(2e-4, rel=1e-6)
    assert j.beta_bytes_per_s == pytest.approx(1.1e9, rel=1e-6)


def test_fit_with_noise_stays_close_and_alpha_is_not_negative():
    rng = np.random.default_rng(0)
    tier = LinkTier("intra_node", 2e9, 1e-5)
    _, t = collective_time("all_reduce", SIZES, 2, tier)
    noisy = t * rng.uniform(0.9, 1.1, size=t.shape)
    f = fit_alpha_beta("all_reduce", 2, SIZES, noisy)
    assert f.alpha_s >= 0
    assert f.max_rel_error < 0.25
    assert f.beta_bytes_per_s == pytest.approx(2e9, rel=0.15)
    # pure bandwidth data: alpha would go negative unconstrained; it is clamped to 0
    t0 = SIZES / 1e9 * 1.0
    g = fit_alpha_beta("p2p", 2, SIZES, t0 * rng.uniform(0.95, 1.05, size=t0.shape))
    assert g.alpha_s >= 0


def test_bus_bandwidth_follows_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("p2p", 2) == 1.0
    # 1 GB all-reduced in 1 s on 8 ranks: algbw 1e9, busbw 1.75e9
    assert float(bus_bandwidth("all_reduce", 1e9, 8, 1.0)) == pytest.approx(1.75e9)


def test_a_measured_collective_uses_its_own_alpha_beta_inside_a_node():
    """A profile's [collectives.<kind>] fit replaces the tier's alpha-beta for that kind only."""
    own = LinkTier("intra_node", 1e9, 1e-4, collectives=(("reduce_scatter", 5e-4, 2.5e8),))
    plain = LinkTier("intra_node", 1e9, 1e-4)
    n, S = 2, 8e6
    _, t_rs = collective_time("reduce_scatter", S, n, own)
    assert t_rs == pytest.approx(5e-4 + (n - 1) / n * S / 2.5e8)
    assert collective_time("all_reduce", S, n, own) == collective_time("all_reduce", S, n, plain)


def test_fsdp_tensor_collectives_fall_back_to_their_base_kind():
    """reduce_scatter_tensor (FSDP2's call) costs what reduce_scatter costs unless measured apart."""
    base = LinkTier("intra_node", 1e9, 1e-4, collectives=(("reduce_scatter", 5e-4, 2.5e8),))
    own = LinkTier("intra_node", 1e9, 1e-4, collectives=(("reduce_scatter", 5e-4, 2.5e8),
                                                         ("reduce_scatter_tensor", 1e-3, 1e8)))
    S = 4e6
    assert collective_time("reduce_scatter_tensor", S, 2, base) == collective_time("reduce_scatter", S, 2, base)
    _, t = collective_time("reduce_scatter_tensor", S, 2, own)
    assert t == pytest.approx(1e-3 + S / 2 / 1e8)


def test_measured_in_step_points_are_interpolated_for_their_group_size():
    """A collective with in-step points over n ranks reads them (linear between points, made
    non-decreasing, the last slope beyond); other group sizes and the gradient sync (``line``)
    keep the α-β line."""
    pts = ((1e4, 1e6, 4e6), (2e-3, 1.5e-3, 10e-3))     # 1 MB measured cheaper than 10 KB: noise
    tier = LinkTier("intra_node", 1e9, 1e-4, collectives=(("all_gather", 5e-4, 5e8),),
                    curves=(("all_gather", 2, pts[0], pts[1]),))
    t = lambda S, n=2, **kw: collective_time("all_gather", S, n, tier, **kw)[1]  # noqa: E731
    assert t(1e3) == pytest.approx(2e-3)                        # below: the smallest point
    assert t(1e6) == pytest.approx(2e-3)                        # never below a smaller buffer
    assert t(2.5e6) == pytest.approx(2e-3 + 0.5 * 8e-3)          # between 1 MB and 4 MB
    assert t(8e6) == pytest.approx(10e-3 + 4e6 * 8e-3 / 3e6)     # the last segment's slope on
    assert t(0.0) == 0.0
    arr = collective_time("all_gather", np.array([0.0, 2.5e6]), 2, tier)[1]
    assert arr == pytest.approx([0.0, 6e-3])
    line = 5e-4 + 0.5 * 8e6 / 5e8
    assert t(8e6, line=True) == pytest.approx(line)
    assert t(8e6, n=4) == pytest.approx(3 * 5e-4 + 0.75 * 8e6 / 5e8)   # measured on 2 ranks only
    assert collective_time("all_gather_into_tensor", 8e6, 2, tier)[1] == pytest.approx(line)
