"""From raw measurements to the profile file, without measuring: ``build_profile`` on a stored
``autopar profile --nproc 2 --quick`` run (tests/fixtures/profile_raw_cpu_2rank_quick.json, this
2-core VM), and where ``autopar profile`` writes. The measuring itself: test_profile_run.py."""
import json
from pathlib import Path

import pytest

from autopar.profile import build_profile, default_name, fits, in_step_fits, output_path
from costmodels.contracts.files import tomllib
from costmodels.profiles.hardware_files import PROFILES_DIR, load_profile

RAW = Path(__file__).parent / "fixtures" / "profile_raw_cpu_2rank_quick.json"


@pytest.fixture
def raw():
    return json.loads(RAW.read_text())


def test_every_measurement_lands_in_its_field(raw):
    text, summary = build_profile(raw, "vm-test")
    data = tomllib.loads(text)
    gpu = data["gpu"]
    assert data["name"] == "vm-test" and data["version"] == 1
    assert gpu["peak_bf16_flops_per_s"]["value"] == max(r[2] for r in raw["matmul"]["bf16"])
    assert gpu["hbm_bandwidth_bytes_per_s"]["value"] == raw["copy"]["bytes_per_s"]
    assert gpu["hbm_bytes"]["value"] == raw["mem_total_bytes"] / 2
    assert gpu["memory_reserve_bytes"]["value"] == raw["footprint_bytes"]
    assert gpu["optimizer_bandwidth_bytes_per_s"]["value"] == raw["optimizer"]["bytes_per_s"]
    assert gpu["comm_overlap"]["value"] == round(raw["overlap"]["overlap"], 4)
    assert gpu["fsdp_overlap"]["value"] == 0.0               # a CPU: FSDP2 runs in line
    assert gpu["cross_entropy"]["logits"] == [r[0] for r in raw["cross_entropy"]["rows"]]
    assert data["node"]["gpus_per_node"]["value"] == 2
    joint = fits(raw)["joint"]
    assert data["intra_node"]["latency_s"]["value"] == joint.alpha_s
    assert "assumption" in data["inter_node"]["latency_s"]["source"]
    steps = in_step_fits(raw)
    for kind, rows in raw["collectives"].items():
        c = data["collectives"][kind]
        assert c["bytes"] == [r[0] for r in rows]
        assert c["seconds"] == [float(f"{r[1]:.6g}") for r in rows]
        assert c["in_step_alpha_s"] == steps[kind].alpha_s
        assert c["ranks"] == 2
    last_eff = gpu["matmul_efficiency"]["efficiency"][-1]
    assert summary["matmul_efficiency"]["efficiency"][-1] == pytest.approx(last_eff, abs=1e-4)


def test_the_file_is_commented_and_every_figure_cites_its_measurement(raw, tmp_path):
    text, _ = build_profile(raw, "vm-test")
    lines = text.splitlines()
    assert lines[0].startswith("# Measured by `autopar profile --nproc 2 --quick` (2026-11-24 07:56 UTC")
    assert "[collectives.p2p]   # measured; inside a node the cost model uses the in-step points" \
           " (their alpha-beta for other group sizes)" in lines
    path = tmp_path / "vm-test.toml"
    path.write_text(text)
    prof = load_profile(str(path))
    assert prof.sources and all(s.startswith("measured by autopar profile on vm, 2026-11-24 07:56 UTC")
                                or "(assumption)" in s for s in prof.sources.values())


def test_autopar_profile_writes_into_the_current_directory(raw, tmp_path, monkeypatch, capsys):
    """Without -o the profile goes to ./<default name>.toml, not into the package's
    hardware-profiles/ (measurement replaced by the stored run)."""
    import autopar.profile
    from autopar.cli.main import main
    monkeypatch.setattr(autopar.profile, "profile_machine", lambda *a, **k: json.loads(RAW.read_text()))
    monkeypatch.chdir(tmp_path)
    before = sorted(PROFILES_DIR.glob("*.toml"))
    assert main(["profile", "--json", "--no-progress"]) == 0
    want = tmp_path / f"{default_name(2)}.toml"
    assert json.loads(capsys.readouterr().out)["path"] == str(want)
    assert load_profile(str(want)).name == default_name(2)
    assert sorted(PROFILES_DIR.glob("*.toml")) == before
    assert main(["profile", "--json", "--no-progress", "--name", "mine"]) == 0
    assert (tmp_path / "mine.toml").is_file()


def test_output_path_resolution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output_path(None, None, 2) == (tmp_path / f"{default_name(2)}.toml", default_name(2))
    assert output_path(None, "box", 2) == (tmp_path / "box.toml", "box")
    assert output_path("out/a.toml", None, 2) == (Path("out/a.toml"), "a")
    assert output_path("out/a.toml", "box", 2) == (Path("out/a.toml"), "box")


def test_one_rank_measures_no_collective_and_still_writes_a_loadable_profile(raw, tmp_path):
    """On one GPU a collective moves nothing; its fit went to 1e30 B/s and the written profile
    was refused by its own checks (seen on a 1×H100). One rank now measures none, and the link
    tiers take the copy rate with the assumption said."""
    from autopar.profile.run import collective_kinds
    assert collective_kinds(1) == []
    assert "p2p" in collective_kinds(2) and "all_reduce" in collective_kinds(8)
    one = dict(raw, nproc=1, world_size=1, collectives={}, in_step={})
    one.pop("overlap", None)
    text, summary = build_profile(one, "one-rank")
    assert summary["collectives"] == {}
    path = tmp_path / "one-rank.toml"
    path.write_text(text)
    prof = load_profile(str(path))
    assert prof.intra_node.bandwidth_bytes_per_s == raw["copy"]["bytes_per_s"]
    assert "no collective to measure" in tomllib.loads(text)["inter_node"]["latency_s"]["source"]
