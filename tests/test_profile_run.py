"""`autopar profile --quick` on 2 local ranks: the fit reproduces what it measured, and the
profile it writes round-trips through costmodels.profiles.hardware_files.load_profile."""
import os

import numpy as np
import pytest

from autopar.profile import build_profile, fits, in_step_fits, write_profile
from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib
from costmodels.profiles.hardware_files import load_profile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def raw():
    from autopar.profile import profile_machine
    r = profile_machine(2, quick=True, progress=False)
    r["quick"] = True
    return r


def test_profile_round_trips_through_the_loader(raw, tmp_path):
    text, summary = build_profile(raw, "test-cpu")
    path = write_profile(tmp_path / "test-cpu.toml", text)
    prof = load_profile(str(path))
    assert prof.name == "test-cpu"
    assert prof.peak_flops["bf16"] == pytest.approx(summary["peak_flops_per_s"]["bf16"])
    assert prof.peak_flops["fp32"] == pytest.approx(summary["peak_flops_per_s"]["fp32"])
    assert prof.hbm_bandwidth_bytes_per_s == pytest.approx(raw["copy"]["bytes_per_s"])
    assert prof.memory_reserve_bytes == pytest.approx(raw["footprint_bytes"])
    assert prof.gpus_per_node == 2
    j = fits(raw)["joint"]
    assert prof.intra_node.latency_s == pytest.approx(j.alpha_s)
    assert prof.intra_node.bandwidth_bytes_per_s == pytest.approx(j.beta_bytes_per_s)
    assert list(prof.eff_flops) == sorted(prof.eff_flops)
    assert max(prof.eff_values) == pytest.approx(1.0)
    # the measured rates the cost model reads
    assert prof.elementwise_bandwidth_bytes_per_s == pytest.approx(raw["elementwise"]["bytes_per_s"])
    assert prof.optimizer_bandwidth_bytes_per_s == pytest.approx(raw["optimizer"]["bytes_per_s"])
    ce = raw["cross_entropy"]["rows"]
    assert list(prof.ce_logits) == [r[0] for r in ce]
    assert prof.cross_entropy_logits_per_s(ce[1][0]) == pytest.approx(ce[1][1])
    assert prof.attention_efficiency == pytest.approx(
        min(1.0, raw["attention"]["flops_per_s"] / summary["peak_flops_per_s"]["bf16"]), abs=1e-4)
    assert 0.0 <= prof.comm_overlap <= 1.0
    assert prof.comm_overlap == pytest.approx(raw["overlap"]["overlap"], abs=1e-4)
    # each collective's own in-step fit is the alpha-beta the cost model uses for it inside a node
    steps = in_step_fits(raw)
    assert set(steps) == set(fits(raw)) - {"joint"}
    for kind, f in steps.items():
        assert prof.intra_node.alpha_beta(kind) == pytest.approx((f.alpha_s, f.beta_bytes_per_s))
        assert prof.sources[f"collectives.{kind}.in_step"].startswith("measured by autopar profile")
    # FSDP2 on a CPU runs its collectives in line: ZeRO-2/3 get no overlap, the others the measured one
    assert prof.overlap(3) == 0.0 and prof.overlap(1) == prof.comm_overlap
    # every figure says how it was measured
    assert all("autopar profile" in s or "assumption" in s for s in prof.sources.values())
    # the per-collective measurements are kept in the file
    data = tomllib.loads(path.read_text())
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        c = data["collectives"][kind]
        assert len(c["bytes"]) == len(c["seconds"]) == len(c["bus_bandwidth_bytes_per_s"]) >= 5
        assert len(c["in_step_bytes"]) == len(c["in_step_seconds"]) >= 3
        assert set(c["in_step_bytes"]) <= set(c["bytes"])
        assert c["ranks"] == 2


def test_fitted_alpha_beta_reproduces_its_measurements(raw):
    """Each collective's fitted α-β models (back to back, and in-step) against the very points
    they were fitted from. A loaded 2-core VM with gloo is noisy: a collective pays the wake-up of
    the ranks' threads (a scheduler tick, ~2 ms, in some calls and not others), which no α-β line
    can follow, so a single point may sit ~3x off the line (seen in CI: a 2 MiB all-gather at
    2.9 ms against a line through 1.0 ms). What must hold on any machine is that the fit is the
    relative least-squares optimum of its own points (no nudge of α or β lowers its error) and
    that the bandwidth term is really there: at the largest back-to-back size (2 MiB) a line
    without it would sit 20-50x low, so a factor of 5 still catches that. The fitter's exactness
    on clean data is test_profile_fit.py; --quick's in-step sizes (4 KiB … 2 MiB) are all
    latency-bound, and the cost model reads those points themselves
    (test_cost_model_reads_the_in_step_points)."""
    from costmodels.model.comm import collective_bytes, collective_steps
    F, S = fits(raw), in_step_fits(raw)
    for kind, rows, fit, bw_end in ([(k, r, F[k], True) for k, r in raw["collectives"].items()]
                                    + [(k, r, S[k], False) for k, r in raw["in_step"].items()]):
        sizes = np.array([r[0] for r in rows], dtype=float)
        times = np.array([r[1] for r in rows], dtype=float)
        pred = fit.predict(sizes)
        rel = np.abs(pred - times) / times
        assert np.median(rel) == pytest.approx(fit.median_rel_error)
        assert rel.max() == pytest.approx(fit.max_rel_error)
        assert np.median(rel) < 1.0, (kind, rel)
        if bw_end:   # the back-to-back sizes reach where the bandwidth term is visible
            steps, nbytes = collective_steps(kind, 2), collective_bytes(kind, sizes, 2)

            def sq_err(alpha, inv_beta, steps=steps, nbytes=nbytes, times=times):
                return float(np.sum(((steps * alpha + nbytes * inv_beta) / times - 1.0) ** 2))
            best = sq_err(fit.alpha_s, 1.0 / fit.beta_bytes_per_s)
            X = np.column_stack([np.full(sizes.size, float(steps)), nbytes]) / times[:, None]
            _, inv_beta_free = np.linalg.lstsq(X, np.ones(sizes.size), rcond=None)[0]
            if inv_beta_free <= 0:   # a loaded host hid the bandwidth term: the documented fallback
                continue             # (1/β from the largest point) is no least-squares optimum
            for da, db in ((1.05, 1.0), (0.95, 1.0), (1.0, 1.05), (1.0, 0.95)):
                nudged = sq_err(fit.alpha_s * da, db / fit.beta_bytes_per_s)
                assert nudged >= best * (1 - 1e-9), (kind, da, db, nudged, best)
            assert 0.2 < pred[-1] / times[-1] < 5.0, (kind, pred[-1], times[-1])


def test_cost_model_reads_the_in_step_points(raw, tmp_path):
    """Through the written profile, the cost model prices each collective, for the measured
    group size, at exactly its measured in-step times (made non-decreasing)."""
    from costmodels.model.comm import collective_time
    text, _ = build_profile(raw, "t")
    prof = load_profile(str(write_profile(tmp_path / "t.toml", text)))
    for kind, rows in raw["in_step"].items():
        sizes = np.array([r[0] for r in rows], dtype=float)
        want = np.maximum.accumulate([float(f"{r[1]:.6g}") for r in rows])
        got = collective_time(kind, sizes, 2, prof.intra_node)[1]
        assert got == pytest.approx(want, rel=1e-9), kind


def test_write_is_atomic_and_validates(raw, tmp_path):
    text, _ = build_profile(raw, "x")
    target = tmp_path / "x.toml"
    target.write_text("old")
    with pytest.raises(ProfileError):
        write_profile(target, text.replace("peak_bf16_flops_per_s", "peak_bf17_flops_per_s"))
    assert target.read_text() == "old"            # a bad profile never replaces a file
    write_profile(target, text)
    assert target.read_text() == text
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
