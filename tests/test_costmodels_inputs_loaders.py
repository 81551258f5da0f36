"""The loaders' refusals, case by case (tests/test_costmodels_inputs_fuzz.py throws generated
documents at the same loaders): each bad value is one line naming the field and the fix."""
from __future__ import annotations

import copy
import json

import pytest
from synthetic_tables import tiny_gpt

from costmodels.contracts.errors import PlanError, ProfileError, SpecError
from costmodels.contracts.files import tomllib
from costmodels.contracts.layer_table import LayerTable
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PlansFile
from costmodels.profiles.hardware_files import PROFILES_DIR, load_profile, parse_profile

A100 = tomllib.loads((PROFILES_DIR / "a100-80g-sxm.toml").read_text())


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 700, msg
    return msg


@pytest.mark.parametrize("doc,words", [
    ({"stages": 2}, "plan field 'stages' must be a list of [start, end) row ranges (integers)"),
    ({"stages": [0, 4]}, "got the range 0"),
    ({"stages": [[0, 1.5]]}, "got the range [0, 1.5]"),        # used to be truncated to (0, 1)
    ({"stages": [[True, 2]]}, "got the range [True, 2]"),
    ({"stages": [["0", "2"]]}, "got the range ['0', '2']"),
    ({"zero": 1.0}, "plan field 'zero'=1.0 must be 0, 1, 2 or 3"),
    ({"dp": 2 ** 70}, "plan field 'dp'=1180591620717411303424 must be a positive integer (at most 262,144)"),
    ({"dp": 1024, "tp": 1024}, "dp·cp·tp·pp = 1,048,576 GPUs is above autopar's limit"),
    ({"version": True}, "plan version True is not supported"),
    ({1: 2, "tpp": 2}, "unknown plan field(s) ['tpp', 1]; did you mean 'tp'?"),
    ({"recompute": "x" * 10 ** 6}, "plan field 'recompute'='xxxx"),
])
def test_plan_from_dict_refusals(doc, words):
    with pytest.raises(PlanError) as e:
        Plan.from_dict(doc)
    assert words in one_line(e)


def test_plan_stages_keep_their_integers():
    assert Plan.from_dict({"pp": 2, "stages": [[0, 3], [3, 6]]}).stages == ((0, 3), (3, 6))
    assert Plan(pp=2, stages=((0, 3), (3, 6))).stages == ((0, 3), (3, 6))


def table_doc() -> dict:
    return json.loads(tiny_gpt().to_json())


def edit(path, value):
    def apply(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return d
    return apply


@pytest.mark.parametrize("change,words", [
    (edit(("seq",), 0), "layer table field seq=0 must be an integer from 1 to 2,097,152"),
    (edit(("micro_batch",), -2), "field micro_batch=-2 must be an integer"),
    (edit(("vocab",), 0), "field vocab=0 must be an integer"),
    (edit(("act_dtype_bytes",), 3), "field act_dtype_bytes=3 must be one of 1, 2, 4, 8"),
    (edit(("rows",), []), "field 'rows' must be a list of 1 to"),
    (edit(("rows", 1, "fwd_flops"), "12"), "row 1: field fwd_flops='12' must be a finite number"),
    (edit(("rows", 1, "fwd_flops"), 1e308), "row 1: field fwd_flops=1e+308 must be a finite number >= 0 and <= 1e+21"),
    (edit(("rows", 1, "saved_activation_bytes"), -1), "saved_activation_bytes=-1"),
    (edit(("rows", 1, "act_tp_bytes"), 10 ** 12), "the saved bytes must nest"),
    (edit(("rows", 1, "kind"), "blok"), "field kind='blok' must be one of embedding, block, head, other"),
    (edit(("rows", 1, "boundry_bytes"), 1), "unknown field 'boundry_bytes'; did you mean 'boundary_bytes'?"),
    (edit(("rows", 1, "name"), KeyError), "row 1: has no name"),
    (edit(("rows", 1, "matmul_dims"), [[1, 2]]), "each matmul_dims entry must be [m, n, k]"),
    (edit(("rows", 1, "tp_pairs"), [{"column": "c_attn", "row": "c_proj"}]), "tp_pairs.column='c_attn' must be a list"),
    (edit(("rows", 1), "blocks.0"), "row 1: must be an object, got str"),
    (lambda d: [d], "a layer table must be a JSON object, got list"),
    (lambda d: {**d, "rows": [{**r, "fwd_flops": 0} for r in d["rows"]]}, "no row has forward FLOPs"),
])
def test_layer_table_from_dict_refusals(change, words):
    with pytest.raises(SpecError) as e:
        LayerTable.from_dict(change(table_doc()))
    assert words in one_line(e)


def test_layer_table_reads_both_of_its_json_forms():
    t = tiny_gpt()
    d = table_doc()
    d["num_layers"], d["layers"] = d["layers"], d.pop("rows")
    assert LayerTable.from_dict(table_doc()) == t == LayerTable.from_dict(d)


def profile(change) -> dict:
    d = copy.deepcopy(A100)
    change(d)
    return d


@pytest.mark.parametrize("change,words", [
    (lambda d: d["gpu"]["peak_bf16_flops_per_s"].update(value=312),
     "'gpu.peak_bf16_flops_per_s.value' = 312 is implausible: it must be above 1e9 and at most 1e17, in FLOP/s"),
    (lambda d: d["gpu"]["peak_bf16_flops_per_s"].update(value=5e-324), "is implausible"),
    (lambda d: d["gpu"]["hbm_bytes"].update(value=80), "'gpu.hbm_bytes.value' = 80 is implausible"),
    (lambda d: d["gpu"]["hbm_bandwidth_bytes_per_s"].update(value=2039), "(not GB/s)"),
    (lambda d: d["intra_node"]["latency_s"].update(value=5), "(not microseconds)"),
    (lambda d: d["gpu"]["matmul_efficiency"]["efficiency"].__setitem__(0, 1e-321), "efficiency"),
    (lambda d: d["gpu"].update(comm_overlapp={"value": 0.5, "source": "x"}),
     "'gpu.comm_overlapp' is not a profile field; did you mean 'comm_overlap'?"),
    (lambda d: d.update(nodes={}), "'nodes' is not a profile field; did you mean 'node'?"),
    (lambda d: d["gpu"]["hbm_bytes"].update(unit="GB"), "'gpu.hbm_bytes.unit' is not part of a figure"),
    (lambda d: d.update(version=True), "field 'version' is True"),
])
def test_profile_refusals(change, words):
    with pytest.raises(ProfileError) as e:
        parse_profile(profile(change), "p.toml")
    assert words in one_line(e)


def test_shipped_profiles_are_plausible():
    for name in ("a100-80g-sxm", "cpu-2core", "cpu-2core-measured", "b200-180g-sxm"):
        load_profile(name)


@pytest.mark.parametrize("content,words", [
    (b"\x00\xff\xfe binary", "is not a text file"),
    (b"a = " + b"[" * 100_000 + b"]" * 100_000, "nests its tables or arrays too deeply"),
])
def test_profile_files_that_are_not_profiles(tmp_path, content, words):
    path = tmp_path / "p.toml"
    path.write_bytes(content)
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert words in one_line(e)
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(str(tmp_path) + "/")
    with pytest.raises(ProfileError) as e:
        load_profile("x" * 100_000)
    assert "(100002 characters)" in one_line(e)


@pytest.mark.parametrize("text,words", [
    ('{"dp": 2, "dp": 4}', "key 'dp' appears twice in one object"),
    ("[" * 100_000 + "]" * 100_000, "nests arrays or objects too deeply"),
    ('{"dp": 1' + "0" * 5000 + "}", "holds an integer of thousands of digits"),
])
def test_plans_json_that_used_to_crash_or_mislead(text, words):
    with pytest.raises(PlanError) as e:
        PlansFile.read(text)
    assert words in one_line(e)
