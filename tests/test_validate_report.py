"""`autopar report` on autopar validate's output: reads it as a plans file and adds the
predicted-vs-measured chart (the PlansFile's validate section, read in autopar/report/load.py, drawn by render.py)."""
import json
from pathlib import Path

import pytest

RESULT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_validate_cpu2core.json"


@pytest.mark.skipif(not RESULT.is_file(), reason="no committed validate result")
def test_report_reads_validate_output_and_draws_the_chart(tmp_path):
    from autopar.report.core import make_report
    text = make_report([str(RESULT)], fmt="html")
    assert "Predicted vs measured" in text
    assert "data-chart='validate'" in text
    assert text.count("<svg") >= 2


def test_plain_plans_files_get_no_validate_section(tmp_path):
    from autopar.report.load import records_of
    data = json.loads(RESULT.read_text())
    data.pop("validate")
    for p in data["plans"]:
        for k in [k for k in p if k.startswith(("measured_", "predicted_")) or k in
                  ("step_time_error", "memory_error", "loss", "error")]:
            p.pop(k)
    recs = records_of(data, "plain.json")
    assert recs and all("validate" not in r.file_meta for r in recs)
