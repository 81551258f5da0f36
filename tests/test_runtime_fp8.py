"""FP8 plans in autopar's runtime: refused before launch, in one line, where they cannot run (a CPU,
a GPU without FP8 tensor cores, no torchao). The conversion itself needs CUDA (not run here)."""
from __future__ import annotations

import pytest
import torch

from autopar.models import load_model
from autopar.runtime.assemble.prelaunch import check_before_launch
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

SPEC = "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal: this machine has CUDA")
@pytest.mark.parametrize("precision", ["fp8", "fp8-rowwise", "mxfp8"])
def test_fp8_plan_on_a_cpu_is_refused_before_launch_in_one_line(precision):
    model = load_model(SPEC).build("meta")
    with pytest.raises(PlanError) as e:
        check_before_launch(model, Plan(dp=2, precision=precision), num_micro_batches=1, spec=SPEC)
    msg = str(e.value)
    assert "\n" not in msg and "CUDA" in msg and "precision='bf16'" in msg
    check_before_launch(model, Plan(dp=2), num_micro_batches=1, spec=SPEC)   # bf16 runs


def test_fp8_plan_on_a_gpu_without_fp8_is_refused(monkeypatch):
    """An A100 (sm_80): the capability check, with CUDA faked present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    from autopar.runtime.assemble.float8 import check_float8
    with pytest.raises(PlanError, match="A100.*sm_80.*no FP8 tensor cores"):
        check_float8(Plan(precision="fp8"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with pytest.raises(PlanError, match="no MXFP8 tensor cores"):
        check_float8(Plan(precision="mxfp8"))
