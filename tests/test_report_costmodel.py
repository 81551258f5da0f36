"""autopar report on the real cost model's output (costmodels.model.estimate on the analytic GPT-3
175B table of tests/synthetic_tables.py, no torch), and --scale through the search API."""
import json
import os

import pytest
from synthetic_tables import gpt3_175b, tiny_gpt

from autopar.cli.main import main
from autopar.report import build, make_report
from autopar.report.analysis import one_gpu_time_from_cost_model
from autopar.report.load import read_inputs
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

PLANS = [dict(tp=8, pp=8, vpp=2, schedule="interleaved-1f1b", recompute="selective", sequence_parallel=True, zero=1),
         dict(tp=8, pp=16, recompute="selective", sequence_parallel=True, zero=1),
         dict(tp=8, pp=4, recompute="full", zero=1, schedule="gpipe")]


def plans_file(table, gpus, batch=1536):
    profile = load_profile("a100-80g-sxm")
    res = []
    for kw in PLANS:
        dp = gpus // (kw["tp"] * kw["pp"])
        res.append(estimate(table, profile, Plan(dp=dp, **kw), gpus, batch).to_dict())
    res.sort(key=lambda d: (not d["fits"], d["step_time_s"]))
    for i, d in enumerate(res, 1):
        d["rank"] = i
    return {"version": 1, "model": "gpt3-175b", "hardware": "a100-80g-sxm", "gpus": gpus,
            "global_batch": batch, "seq": table.seq, "objective": "step_time", "optimal": False,
            "search_time_s": 0.0, "plans": res}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    table = gpt3_175b()
    d = tmp_path_factory.mktemp("plans")
    paths = []
    for n in (256, 512, 1024):
        p = d / f"g{n}.json"
        p.write_text(json.dumps(plans_file(table, n)))
        paths.append(str(p))
    return paths, table


@pytest.fixture(scope="module")
def report(files):
    """The report of ``files`` and its HTML, rendered once (matplotlib's charts are most of its
    time) for the section checks and the browser; ``make_report(paths)`` is the same
    ``build(read_inputs(paths)).render``."""
    paths, table = files
    rep = build(read_inputs(paths), one_gpu_time=lambda *key: one_gpu_time_from_cost_model(*key, table=table))
    return rep, rep.render("html")


def test_every_section_from_cost_model_output(report):
    rep, html = report
    assert len(rep.records) == 9 and len(rep.groups) == 3
    assert set(rep.timelines) == {r.id for r in rep.records}       # every plan has stages_detail
    [s] = rep.scaling
    assert "cost model's step time on one GPU" in s.one_gpu_note
    for p in s.points:
        assert p.speedup == pytest.approx(s.one_gpu_time_s / p.step_time_s)
        assert 0 < p.efficiency <= 1.0
    for c in ("step-time", "memory", "timeline", "comm", "scaling"):
        assert f"data-chart='{c}'" in html
    # the drawn timeline of the real interleaved plan has the estimate's per-chunk times
    r = next(r for r in rep.records if r.plan.vpp == 2)
    t = rep.timelines[r.id]
    det = r["stages_detail"][0]
    f0 = [o for o in t.ops if o.rank == 0 and o.kind == "F" and o.chunk == 1][0]
    assert f0.end - f0.start == pytest.approx(det["fwd_s"][1])
    md = rep.render("md")
    assert "inter_node" in md and "intra_node" in md      # the cost model's link tiers


def test_browser_on_cost_model_report(report, tmp_path):
    pytest.importorskip("selenium")
    import test_report_browser as tb
    if not (os.path.exists(tb.CHROMIUM) and os.path.exists(tb.DRIVER)):
        pytest.skip("needs chromium and chromium-driver")
    out = tmp_path / "report.html"
    out.write_text(report[1])
    driver = tb.start_browser()
    try:
        tb.assert_report_renders(driver, str(out), str(tmp_path / "shot.png"), n_plans=9)
    finally:
        driver.quit()


def test_scale_runs_the_search_at_each_count(files, capsys, monkeypatch, tmp_path):
    """--scale N,... calls autopar.report.scale_search (the search API) for each count the files
    lack; here the search is replaced by the cost model on fixed plans."""
    paths, table = files
    calls = []

    def fake_scale_search(model, hardware, gpus, global_batch, seq=None, top=3):
        calls.append((model, hardware, gpus, global_batch))
        return plans_file(table, gpus, global_batch)

    import autopar.report
    monkeypatch.setattr(autopar.report, "scale_search", fake_scale_search)
    out = tmp_path / "r.md"
    assert main(["report", paths[0], "--scale", "128,256,2048", "-o", str(out)]) == 0
    assert calls == [("gpt3-175b", "a100-80g-sxm", 128, 1536), ("gpt3-175b", "a100-80g-sxm", 2048, 1536)]
    md = out.read_text()
    scaling = md[md.index("## Scaling"):]
    for n in ("| 128 |", "| 256 |", "| 2048 |"):
        assert n in scaling
    capsys.readouterr()
    assert main(["report", "--scale", "64", "--format", "md"]) == 2
    assert "--scale needs a model" in capsys.readouterr().err


def test_scale_with_the_real_search(monkeypatch):
    import autopar.search as search_mod
    from autopar.report import scale_search
    table = tiny_gpt(layers=4, hidden=64, heads=4, vocab=256, seq=32)
    real = search_mod.search
    monkeypatch.setattr(search_mod, "search", lambda *a, **k: real(*a, table=table, **k))
    data = [scale_search("gpt:layers=4,hidden=64,heads=4,vocab=256,seq=32", "a100-80g-sxm", n, 16, top=2)
            for n in (1, 2, 4)]
    text = make_report([], fmt="md", extra=data,
                       one_gpu_time=lambda *k: one_gpu_time_from_cost_model(*k, table=table))
    assert "## Scaling" in text and "| 4 |" in text


def test_gpt3_175b_search_at_256_512_1024_gives_every_section(tmp_path):
    """The must-show run through the Python API: search gpt3-175b on 256, 512, 1024 × A100-80G
    (global batch 1536), write the plans files, report them."""
    from autopar.search import search
    from costmodels.contracts.plans_file import PlansFile
    table = gpt3_175b()
    paths = []
    for n in (256, 512, 1024):
        res = search("gpt3-175b", "a100-80g-sxm", n, 1536, top=3, table=table)
        p = tmp_path / f"g{n}.json"
        PlansFile.read(res.plans_file()).write(str(p))
        paths.append(str(p))
    t1 = lambda *k: one_gpu_time_from_cost_model(*k, table=table)
    html = make_report(paths, one_gpu_time=t1)
    for s in ("ranked", "why", "step-time", "memory", "timeline", "comm", "scaling", "diff"):
        assert f"<section id='{s}'>" in html
    for c in ("step-time", "memory", "timeline", "comm", "scaling"):
        assert f"data-chart='{c}'" in html
    md = make_report(paths, fmt="md", one_gpu_time=t1)
    scaling = md[md.index("## Scaling"):]
    assert all(f"| {n} |" in scaling for n in (256, 512, 1024))


def test_schedule_simulation_agrees_with_the_cost_model_bubble():
    """Cross-check of two independent models: simulating the whole step's schedule with the
    estimate's per-chunk times gives the estimate's own bubble for balanced stages (gpipe, 1f1b;
    interleaved: at most 1 % of the step above, the closed form's per-chunk-column maxima count
    the embedding and head chunks in full — 0.5 % before issue 31 gave autopar's runtime its
    per-micro-batch fp32 gradient accumulation, which weighs most on the embedding's and head's
    vocabulary-sized parameters), and a warning when a rank's virtual chunks are very uneven."""
    from autopar.report.load import records_of
    from autopar.report.timeline import schedule_check
    table, profile = gpt3_175b(), load_profile("a100-80g-sxm")
    for kw in (dict(dp=8, tp=8, pp=8, schedule="gpipe", recompute="full"),
               dict(dp=8, tp=8, pp=8), dict(dp=4, tp=8, pp=16),
               dict(dp=8, tp=8, pp=8, vpp=2, schedule="interleaved-1f1b"),
               dict(dp=16, tp=8, pp=4, vpp=3, schedule="interleaved-1f1b")):
        d = estimate(table, profile, Plan(**kw), 512, 1536).to_dict()
        [r] = records_of(d)
        c = schedule_check(r)
        assert c is not None and not c.flagged, kw
        if "vpp" in kw:
            assert 0 <= c.estimated_bubble_s - c.simulated_bubble_s <= 1e-2 * c.step_time_s, kw
        else:
            assert c.simulated_bubble_s == pytest.approx(c.estimated_bubble_s, rel=1e-3, abs=1e-3 * c.step_time_s)
    # same per-rank totals, uneven chunks: rank 0 runs the embedding then 48 blocks, rank 1 one
    # block then 47 blocks and the head — chunks 48× apart, beyond what the closed form tracks
    # (costmodels.model.pipeline; the search balances chunk columns and does not pick such a split)
    uneven = Plan(dp=16, tp=8, pp=2, vpp=2, schedule="interleaved-1f1b", zero=3, recompute="full",
                  stages=((0, 1), (1, 2), (2, 50), (50, 98)))
    [r] = records_of(estimate(table, profile, uneven, 256, 1536).to_dict())
    c = schedule_check(r)
    assert c.flagged and c.simulated_step_s > c.step_time_s
    rep = build([r], one_gpu_time=lambda *k: (None, ""))
    assert "uneven" in rep.check_text(r) and "⚠" in rep.render("md")
