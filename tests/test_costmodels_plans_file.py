"""costmodels.contracts.plans_file: the one reader and writer of plans files (docs/CONTRACTS.md "Plans
file"): every accepted form, a faithful round trip, an atomic write, one clear line per bad
input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PlanResult, PlansFile, load_plan, load_plans

FIX = Path(__file__).parent / "fixtures" / "report"
G256 = json.loads((FIX / "g256.json").read_text())          # a plans file (search's layout)
ESTIMATE = json.loads((FIX / "estimate_one.json").read_text())  # one estimate result


def _est(**changes):
    return dict(ESTIMATE, **changes)


def _plan_of(d):
    """The Plan of an estimate result, built from its plan fields alone."""
    return Plan.from_dict({k: v for k, v in d.items() if k in Plan().to_dict()})


# ---------------------------------------------------------------------------- accepted forms
@pytest.mark.parametrize("make, form, plans", [
    (lambda p: str(p), "plans file", [_plan_of(d) for d in G256["plans"]]),
    (lambda p: p, "plans file", None),                                   # a PathLike
    (lambda p: p.read_text(), "plans file", None),                       # JSON text
    (lambda p: json.loads(p.read_text()), "plans file", None),           # the dict
])
def test_reads_a_plans_file_from_a_path_text_or_dict(tmp_path, make, form, plans):
    p = tmp_path / "g256.json"
    p.write_text(json.dumps(G256))
    pf = PlansFile.read(make(p))
    assert pf.form == form and len(pf.results) == len(G256["plans"])
    assert (pf.model, pf.hardware, pf.gpus, pf.global_batch, pf.seq) == (
        G256["model"], G256["hardware"], G256["gpus"], G256["global_batch"], G256["seq"])
    assert (pf.objective, pf.optimal) == (G256["objective"], G256["optimal"])
    assert [r.rank for r in pf.results] == [d["rank"] for d in G256["plans"]]
    assert pf.results[0].values["step_time_s"] == G256["plans"][0]["step_time_s"]
    assert "dp" not in pf.results[0].values and pf.plans[0].dp == G256["plans"][0]["dp"]
    if plans is not None:
        assert pf.plans == plans
        assert pf.source == str(p)


@pytest.mark.parametrize("source, form, expect", [
    (ESTIMATE, "object", [_plan_of(ESTIMATE)]),
    ({"dp": 2, "tp": 2}, "object", [Plan(dp=2, tp=2)]),
    ({}, "object", [Plan()]),                                   # --plan '{}': the default plan
    ('{"pp": 2, "stages": [[0, 3], [3, 6]]}', "object", [Plan(pp=2, stages=((0, 3), (3, 6)))]),
    ([{"dp": 2}, {"tp": 2, "rank": 7}], "array", [Plan(dp=2), Plan(tp=2)]),
    ('[{"dp": 2}, {"tp": 2}]', "array", [Plan(dp=2), Plan(tp=2)]),
    ([Plan(dp=4), {"pp": 2}], "array", [Plan(dp=4), Plan(pp=2)]),
    ((p for p in [Plan(dp=3)]), "array", [Plan(dp=3)]),                   # any iterable
    (Plan(tp=4), "object", [Plan(tp=4)]),
    (PlanResult(Plan(tp=2), {"step_time_s": 1.0}), "object", [Plan(tp=2)]),
])
def test_reads_one_result_a_list_or_plan_objects(source, form, expect):
    pf = PlansFile.read(source)
    assert pf.form == form and pf.plans == expect
    assert pf.model is None and pf.context == {}                          # no file around them


def test_a_plans_file_passes_through_and_ranks_default_to_positions():
    pf = PlansFile.read([{"dp": 2}, {"tp": 2, "rank": 7}, _est()])
    assert PlansFile.read(pf) is pf
    assert [r.rank for r in pf.results] == [1, 7, 3]
    assert not pf.results[0].has_estimate and pf.results[2].has_estimate


def test_plan_load_and_load_plans_delegate_to_the_reader(tmp_path):
    p = tmp_path / "g.json"
    p.write_text(json.dumps(G256))
    assert load_plans(str(p)) == PlansFile.read(str(p)).plans
    assert load_plan(str(p)) == PlansFile.read(str(p)).plans[0]
    assert load_plan(ESTIMATE).tp == ESTIMATE["tp"]                      # an estimate dict too


# -------------------------------------------------------------------------------- round trip
def test_round_trip_keeps_unknown_sections_keys_and_their_order(tmp_path):
    data = {"version": 1, "model": G256["model"], "hardware": G256["hardware"],
            "hardware_path": "/x/a100.toml",      # validate's extra key, between known ones
            **{k: v for k, v in G256.items() if k not in ("version", "model", "hardware")}}
    data["plans"] = [dict(p, measured_step_s=1.5, note={"by": "hand"}) for p in G256["plans"]]
    data["validate"] = {"summary": {"step_time_mape": 0.1}, "method": {"clock": "wall"}}
    data["report"] = {"added_by": "a later tool"}
    pf = PlansFile.read(data)
    assert pf.extra == {"hardware_path": "/x/a100.toml", "report": {"added_by": "a later tool"}}
    assert pf.validate == data["validate"]
    out = tmp_path / "out.json"
    pf.write(out)
    text = out.read_text()
    assert text == json.dumps(data, indent=2) + "\n"                     # byte for byte, order kept
    again = PlansFile.read(str(out))
    assert again.to_dict() == data and list(again.to_dict()) == list(data)
    assert again.results[0].values["note"] == {"by": "hand"}


def test_search_layout_is_written_as_search_wrote_it():
    """search's plans_file() dict through the writer: ``json.dumps(indent=2)`` plus a newline,
    the bytes 'autopar search -o' has always written."""
    for name in ("g256", "g512", "g1024", "other_model"):
        data = json.loads((FIX / f"{name}.json").read_text())
        data["search"] = {"configurations": 10, "solver_objective_s": [1.0]}
        assert PlansFile.read(data).to_json() == json.dumps(data, indent=2) + "\n"


def test_filled_view_adds_the_file_context_and_rank_to_each_plan():
    context = ("model", "hardware", "gpus", "global_batch", "seq")
    bare = {k: v for k, v in ESTIMATE.items() if k not in context}
    pf = PlansFile.read({"version": 1, "model": "m", "hardware": "h", "gpus": 8, "global_batch": 16,
                         "plans": [bare, dict(bare, model="other")]})
    filled = pf.to_dict(filled=True)["plans"]
    assert [d["model"] for d in filled] == ["m", "other"]               # a plan's own field wins
    assert filled[0]["gpus"] == 8 and [d["rank"] for d in filled] == [1, 2]
    assert "model" not in pf.to_dict()["plans"][0]                      # the file itself unchanged
    pf.check_estimates()


# ------------------------------------------------------------------------------------- writing
def test_atomic_write_leaves_the_old_file_whole_when_serialisation_fails(tmp_path):
    out = tmp_path / "plans.json"
    PlansFile.read(G256).write(out)
    before = out.read_text()
    bad = PlansFile([PlanResult(Plan(dp=2), {"step_time_s": 1.0, "oops": {1, 2}})])
    with pytest.raises(PlanError, match="cannot write the plans of .* as JSON .*set") as e:
        bad.write(out)
    assert "\n" not in str(e.value)
    assert out.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["plans.json"]               # no temporary file left


def test_write_refuses_a_missing_folder_unless_asked(tmp_path):
    pf = PlansFile.read({"dp": 2})
    with pytest.raises(PlanError, match="does not exist; create it first"):
        pf.write(tmp_path / "no" / "p.json")
    pf.write(tmp_path / "no" / "p.json", create_folder=True)
    assert PlansFile.read(str(tmp_path / "no" / "p.json")).plans == [Plan(dp=2)]


# --------------------------------------------------------------------------------- bad input
def _bad_files(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "bin.json").write_bytes(bytes(range(256)) * 4)
    return {"missing": str(tmp_path / "nope.json"), "dir": str(tmp_path / "dir"),
            "bin": str(tmp_path / "bin.json")}


@pytest.mark.parametrize("source, words", [
    ("{not json", "not valid JSON (Expecting property name"),
    ("[]", "not a plans file, an estimate result or a plan: an empty array"),
    ('"text"', "does not exist"),
    ('{"heads": 3}', "unknown plan field(s) ['heads'] (allowed: ['attention'"),
    ('{"tp": 8, "heads": 3}', "unknown plan field(s) ['heads']; allowed: ['attention'"),
    ('{"version": 1, "plans": []}', "holds no plans"),
    ('{"plans": 3}', "field 'plans' must be an array of plans"),
    ('{"version": 2, "plans": [{"dp": 1}]}', "version 2 plans file"),
    ('{"plans": [{"dp": 1}], "gpus": "many"}', "field 'gpus'='many' must be a positive integer"),
    ('{"plans": [{"dp": 1}], "optimal": "yes"}', "field 'optimal'='yes' must be true or false"),
    ('{"plans": [[1]]}', "plan 1 is a JSON array, not an object"),
    ('[{"dp": 2}, {"dp": 0}]', "plan 2: plan field 'dp'=0 must be a positive integer"),
    ('{"pp": 2, "stages": 5}', "plan field 'stages' must be a list of [start, end) row ranges"),
    (42, "cannot read plans from a int"),
    (b"{}", "cannot read plans from a bytes"),
    ("missing", "does not exist; pass the path of a plans file"),
    ("dir", "is a directory, not a plans file"),
    ("bin", "is not a text file"),
])
def test_each_bad_input_is_one_clear_line(tmp_path, source, words):
    source = _bad_files(tmp_path).get(source, source) if isinstance(source, str) else source
    with pytest.raises(PlanError) as e:
        PlansFile.read(source)
    msg = str(e.value)
    assert words in msg and "\n" not in msg
    if isinstance(source, str) and source.startswith(str(tmp_path)):
        assert source in msg                                            # names the file


@pytest.mark.parametrize("change, words", [
    ({"step_time_s": None}, "'step_time_s'=None must be a non-negative number"),
    ({"breakdown_s": {"compute": "fast"}}, "'breakdown_s.compute'='fast' must be a number"),
    ({"memory_bytes": 5}, "'memory_bytes' must be an object with 'total'"),
    ({"gpus": "8"}, "'gpus'='8' must be a positive integer"),
    ({"model": None}, "does not say its model"),
])
def test_check_estimates_names_the_file_plan_and_field(tmp_path, change, words):
    p = tmp_path / "e.json"
    p.write_text(json.dumps([_est(), _est(**change)]))
    pf = PlansFile.read(str(p))
    with pytest.raises(PlanError) as e:
        pf.check_estimates()
    assert words in str(e.value) and f"'{p}' plan 2" in str(e.value)


def test_check_estimates_refuses_a_bare_plan():
    pf = PlansFile.read('{"model": "m", "hardware": "h", "gpus": 2, "global_batch": 8, '
                        '"plans": [{"dp": 2}]}')
    with pytest.raises(PlanError, match="it is a bare plan, not an estimate"):
        pf.check_estimates()


def test_the_reader_imports_no_torch_or_numpy():
    code = ("import sys, costmodels.contracts.plans_file as m; m.PlansFile.read('{\"dp\": 2}'); "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
