"""Hardware profiles: the shipped ones load and cite sources; malformed ones name the field."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from costmodels.contracts.errors import ProfileError
from costmodels.contracts.files import tomllib
from costmodels.profiles.hardware_files import PROFILES_DIR, list_profiles, load_profile, parse_profile

REQUIRED = ("a100-40g-sxm", "a100-80g-sxm", "h100-80g-sxm", "h200-141g-sxm", "b200-180g-sxm", "cpu-2core")
ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "tests" / "data" / "validation" / "gpu_specs.csv"


def test_required_profiles_ship():
    names = list_profiles()
    for n in REQUIRED:
        assert n in names


@pytest.mark.parametrize("name", REQUIRED)
def test_profile_loads_and_every_figure_has_a_source(name):
    p = load_profile(name)
    assert p.name == name
    assert p.peak_flops_per_s(2) > 0 and p.hbm_bytes > p.memory_reserve_bytes > 0
    assert p.gpus_per_node >= 1
    with open(PROFILES_DIR / f"{name}.toml", "rb") as f:
        raw = tomllib.load(f)
    # every { value = ... } figure in the file carries a non-empty source
    def walk(d, path=""):
        for k, v in d.items():
            if isinstance(v, dict):
                if "value" in v:
                    assert isinstance(v.get("source"), str) and v["source"].strip(), f"{path}{k}"
                else:
                    walk(v, f"{path}{k}.")
    walk(raw)
    assert raw["gpu"]["matmul_efficiency"]["source"].strip()
    # efficiency curve is monotone in (0, 1]
    eff = p.matmul_efficiency([1e6, 1e9, 1e12, 1e15])
    assert all(0 < e <= 1 for e in eff)


def _gpu_specs():
    with open(SPECS) as f:   # a missing file fails the test
        return {r["gpu"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("name,gpu", [("a100-40g-sxm", "A100-SXM4-40GB"), ("a100-80g-sxm", "A100-SXM4-80GB"),
                                      ("h100-80g-sxm", "H100-SXM5-80GB"), ("h200-141g-sxm", "H200-SXM-141GB"),
                                      ("b200-180g-sxm", "B200-SXM-180GB")])
def test_dense_peaks_match_vendor_figures(name, gpu):
    spec = _gpu_specs()[gpu]
    p = load_profile(name)
    assert p.peak_flops["bf16"] == pytest.approx(float(spec["bf16_dense_tflops"]) * 1e12)  # dense, not sparse
    # usable memory: at least the datasheet's decimal GB, at most as many GiB (CUDA keeps a little)
    assert float(spec["hbm_gb"]) * 1e9 <= p.hbm_bytes <= float(spec["hbm_gb"]) * 2 ** 30
    assert p.hbm_bandwidth_bytes_per_s == pytest.approx(float(spec["hbm_tb_per_s"]) * 1e12)


def test_load_by_path_and_name_are_the_same(tmp_path):
    src = PROFILES_DIR / "h100-80g-sxm.toml"
    dst = tmp_path / "mine.toml"
    dst.write_text(src.read_text())
    assert load_profile(str(dst)).peak_flops == load_profile("h100-80g-sxm").peak_flops


def test_unknown_name_suggests():
    with pytest.raises(ProfileError, match="did you mean a100-80g-sxm"):
        load_profile("a100-80g")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("/nonexistent/profile.toml")


def _raw():
    with open(PROFILES_DIR / "a100-80g-sxm.toml", "rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["gpu"].pop("hbm_bytes"), "gpu.hbm_bytes"),
    (lambda d: d["gpu"]["hbm_bytes"].pop("source"), "gpu.hbm_bytes.source"),
    (lambda d: d["gpu"]["hbm_bytes"].__setitem__("value", -1), "gpu.hbm_bytes.value"),
    (lambda d: d["gpu"]["peak_bf16_flops_per_s"].__setitem__("value", "fast"), "gpu.peak_bf16_flops_per_s.value"),
    (lambda d: d["gpu"].__setitem__("hbm_bandwidth_bytes_per_s", 2e12), "gpu.hbm_bandwidth_bytes_per_s"),
    (lambda d: d["node"]["gpus_per_node"].__setitem__("value", 2.5), "node.gpus_per_node.value"),
    (lambda d: d.pop("inter_node"), "inter_node"),
    (lambda d: d["intra_node"].pop("latency_s"), "intra_node.latency_s"),
    (lambda d: d["gpu"]["matmul_efficiency"].__setitem__("efficiency", [0.1, 0.2]), "gpu.matmul_efficiency.efficiency"),
    (lambda d: d["gpu"]["matmul_efficiency"].__setitem__("flops", [1e9, 1e8, 1e10, 1e11]),
     "gpu.matmul_efficiency.flops"),
    (lambda d: d["gpu"]["matmul_efficiency"].__setitem__("efficiency", [0.1, 0.2, 0.3, 1.5]),
     "gpu.matmul_efficiency.efficiency"),
    (lambda d: d["gpu"]["memory_reserve_bytes"].__setitem__("value", 1e12), "gpu.memory_reserve_bytes.value"),
    (lambda d: d.pop("name"), "name"),
    (lambda d: d["gpu"].__setitem__("attention_efficiency", {"value": 1.5, "source": "x"}),
     "gpu.attention_efficiency.value"),
    (lambda d: d["gpu"].__setitem__("comm_overlap", {"value": -0.1, "source": "x"}), "gpu.comm_overlap.value"),
    (lambda d: d["gpu"].__setitem__("cross_entropy", {"logits": [1e6, 1e5], "logits_per_s": [1e8, 1e8], "source": "x"}),
     "gpu.cross_entropy.logits"),
    (lambda d: d["gpu"].__setitem__("cross_entropy", {"logits": [1e5, 1e6], "logits_per_s": [1e8], "source": "x"}),
     "gpu.cross_entropy.logits_per_s"),
    (lambda d: d["gpu"].__setitem__("elementwise_bandwidth_bytes_per_s", {"value": 0, "source": "x"}),
     "gpu.elementwise_bandwidth_bytes_per_s.value"),
    (lambda d: d.__setitem__("collectives", {"allreduce": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x"}}),
     "collectives.allreduce"),
    (lambda d: d.__setitem__("collectives", {"all_reduce": {"alpha_s": 1e-5, "beta_bytes_per_s": 0, "source": "x"}}),
     "collectives.all_reduce.beta_bytes_per_s"),
    (lambda d: d.__setitem__("collectives", {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9}}),
     "collectives.p2p.source"),
    (lambda d: d.__setitem__("collectives", {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x",
                                                     "in_step_alpha_s": "slow", "in_step_beta_bytes_per_s": 1e9,
                                                     "in_step_source": "y"}}), "collectives.p2p.in_step_alpha_s"),
    (lambda d: d.__setitem__("collectives", {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x",
                                                     "in_step_alpha_s": 1e-3, "in_step_beta_bytes_per_s": 1e9}}),
     "collectives.p2p.in_step_source"),
    (lambda d: d["gpu"].__setitem__("fsdp_overlap", {"value": 2, "source": "x"}), "gpu.fsdp_overlap.value"),
    (lambda d: d["gpu"].__setitem__("collective_slowdown", {"value": 1.5, "source": "x"}),
     "gpu.collective_slowdown.value"),
    (lambda d: d["gpu"].__setitem__("collective_slowdown", {"value": 0.4}), "gpu.collective_slowdown.source"),
    (lambda d: d.__setitem__("collectives", {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x",
                                                     "ranks": 2, "in_step_bytes": [4, 8],
                                                     "in_step_seconds": [1, 2]}}), "collectives.p2p.in_step_alpha_s"),
    (lambda d: d.__setitem__("collectives", {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x",
                                                     "in_step_alpha_s": 1e-3, "in_step_beta_bytes_per_s": 1e9,
                                                     "in_step_source": "y", "ranks": 2,
                                                     "in_step_bytes": [8, 4], "in_step_seconds": [1, 2]}}),
     "collectives.p2p.in_step_bytes"),
    (lambda d: d.__setitem__("collectives", {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x",
                                                     "in_step_alpha_s": 1e-3, "in_step_beta_bytes_per_s": 1e9,
                                                     "in_step_source": "y",
                                                     "in_step_bytes": [4, 8], "in_step_seconds": [1, 2]}}),
     "collectives.p2p.ranks"),
])
def test_malformed_profile_names_the_field(mutate, field):
    d = _raw()
    mutate(d)
    with pytest.raises(ProfileError) as e:
        parse_profile(d, "bad.toml")
    assert f"'{field}'" in str(e.value)
    assert "bad.toml" in str(e.value)


def test_in_step_fit_and_fsdp_overlap_are_what_the_cost_model_reads():
    """A collective timed between compute replaces its back-to-back fit; ZeRO-2/3 take the
    FSDP2 overlap, the other stages the async one."""
    d = _raw()
    d["collectives"] = {"all_reduce": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x"},
                        "p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x",
                                "in_step_alpha_s": 2e-3, "in_step_beta_bytes_per_s": 5e8,
                                "in_step_source": "y", "ranks": 2,
                                "in_step_bytes": [1e3, 1e6], "in_step_seconds": [1e-3, 4e-3]}}
    d["gpu"]["comm_overlap"] = {"value": 0.4, "source": "x"}
    prof = parse_profile(d, "ok.toml")
    assert prof.intra_node.alpha_beta("all_reduce") == (1e-5, 1e9)
    assert prof.intra_node.alpha_beta("p2p") == (2e-3, 5e8)
    assert prof.sources["collectives.p2p.in_step"] == "y"
    assert prof.intra_node.curve("p2p", 2) == ((1e3, 1e6), (1e-3, 4e-3))
    assert prof.intra_node.curve("p2p", 4) is None and prof.inter_node.curve("p2p", 2) is None
    assert prof.overlap(0) == prof.overlap(3) == 0.4          # no fsdp_overlap: comm_overlap
    d["gpu"]["fsdp_overlap"] = {"value": 0.0, "source": "z"}
    prof = parse_profile(d, "ok.toml")
    assert (prof.overlap(1), prof.overlap(2), prof.overlap(3)) == (0.4, 0.0, 0.0)


def test_invalid_toml_is_a_profile_error(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("[gpu\npeak = 1\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(str(p))


def test_cli_hardware_lists_and_shows(capsys):
    from autopar.cli.main import main
    assert main(["hardware", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in out["profiles"]} >= set(REQUIRED)
    assert main(["hardware", "a100-80g-sxm", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert "Korthikanti" in one["sources"]["gpu.matmul_efficiency"]
    assert main(["hardware", "h100-80g-sxm"]) == 0          # the optional fitted figures are shown
    shown = capsys.readouterr().out
    assert "gpu.collective_slowdown" in shown and "gpu.attention_efficiency" in shown
    assert main(["hardware", "no-such-gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: error: unknown hardware profile") and "Traceback" not in err


def test_costmodels_never_imports_torch():
    import subprocess
    import sys
    mods = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "costmodels").rglob("*.py")
                  if p.stem != "__init__")
    assert len(mods) > 30, mods
    code = (f"import sys, {', '.join(mods)}, autopar.cli.estimate, autopar.cli.hardware, autopar.scoring, "
            "autopar.profile.build; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _same_profile(a, b) -> bool:
    """HardwareProfile compares by identity; two parses agree when every field and source does."""
    import dataclasses
    def fields(p):
        return {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "path"}
    return fields(a) == fields(b) and a.sources == b.sources


@pytest.mark.parametrize("name", list_profiles())
def test_dump_then_parse_gives_the_same_profile(name):
    """costmodels writes the format it reads: every shipped profile, parsed, dumped and parsed
    again, is the same profile, and the dumped document is the one read."""
    from costmodels.profiles.profile_format import dump_profile
    with open(PROFILES_DIR / f"{name}.toml", "rb") as f:
        doc = tomllib.load(f)
    text = dump_profile(doc)
    assert tomllib.loads(text) == doc
    assert _same_profile(parse_profile(tomllib.loads(text), "dumped"), load_profile(name))


def test_dump_writes_figures_inline_with_their_comments():
    from costmodels.profiles.profile_format import dump_profile
    doc = _raw()
    doc["description"] = 'quotes " and \\ backslash\nand a new line\ttab'
    doc["collectives"] = {"p2p": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "source": "x", "ranks": 2,
                                  "bytes": [8, 1 << 20], "seconds": [1e-5, float("inf")]}}
    text = dump_profile(doc, header="first line\nsecond line", table_comments={"collectives.p2p": "measured"})
    lines = text.splitlines()
    assert lines[:2] == ["# first line", "# second line"]
    assert "[collectives.p2p]   # measured" in lines and "[collectives]" not in lines
    assert any(line.startswith("hbm_bytes = { value = 84900000000.0, source = ") for line in lines)
    back = tomllib.loads(text)
    assert back["description"] == doc["description"]
    assert back["collectives"]["p2p"]["seconds"] == [1e-5, float("inf")]
    # plain keys of [gpu] come before its sub-tables, or TOML would read them into the sub-table
    assert back["gpu"] == doc["gpu"]


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["gpu"]["peak_bf16_flops_per_s"].__setitem__("value", "fast"), "gpu.peak_bf16_flops_per_s.value"),
    (lambda d: d["gpu"]["hbm_bytes"].pop("source"), "gpu.hbm_bytes.source"),
    (lambda d: d["gpu"]["hbm_bytes"].__setitem__("value", None), "gpu.hbm_bytes.value"),
    (lambda d: d["gpu"]["matmul_efficiency"].__setitem__("flops", [1e8, {1e9}]), "gpu.matmul_efficiency.flops[1]"),
])
def test_dump_refuses_a_malformed_document_naming_the_field(mutate, field):
    """What could not be read back (a value TOML cannot hold, a figure the reader refuses) is
    one ProfileError line naming the field, never a half-written file or a traceback."""
    from costmodels.profiles.profile_format import dump_profile
    d = _raw()
    mutate(d)
    with pytest.raises(ProfileError) as e:
        dump_profile(d, where="mine")
    assert f"'{field}'" in str(e.value) and "'mine'" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ProfileError, match="must be a dict"):
        dump_profile([("version", 1)])
