"""Every plan the search returns is one the runtime runs: it passes the runtime's own checks —
``costmodels.contracts.runnable.check_runnable`` and the pre-launch validation ``autopar.apply`` runs before
``init_process_group`` (``autopar.runtime.assemble.prelaunch.check_before_launch``, the tensor-parallel
rewrite probed on ``meta`` included) — for small models with awkward shapes (grouped-query
attention, 3 and 5 blocks, 6 heads), at batches small enough that few micro-batches fit. No
process is launched.

Before the rules were shared, the search proposed 1F1B with fewer micro-batches than stages
(``fix`` pins the schedule below so such plans would be among those returned)."""
from __future__ import annotations

import pytest

from autopar.models import load_model
from autopar.runtime.assemble.prelaunch import check_before_launch, config_dims
from autopar.search import search
from costmodels.contracts.runnable import check_runnable

MODELS = [
    "gpt:layers=4,hidden=64,heads=4,vocab=256,seq=16",
    "llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=16",
    "gpt:layers=5,hidden=48,heads=6,vocab=128,seq=12",
]
# (gpus, global batch, --fix): micro-batch counts 1 … 8 against pp up to 8 (interleaving needs
# blocks divisible by pp·vpp: only the 4-block model has any)
SEARCHES = [(4, 2, None), (8, 4, None), (8, 8, None), (4, 2, "schedule=1f1b"),
            (8, 4, "schedule=1f1b")]
INTERLEAVED = (8, 16, "schedule=interleaved-1f1b")


@pytest.mark.parametrize("spec", MODELS)
def test_every_plan_the_search_returns_passes_the_runtimes_checks(spec):
    source = load_model(spec)
    model = source.build("meta", seed=None)
    dims = config_dims(source.config, source.config.layers + 2)
    checked = []
    for gpus, batch, fix in SEARCHES + ([INTERLEAVED] if source.config.layers % 4 == 0 else []):
        for found in search(spec, "a100-80g-sxm", gpus, batch, fix=fix, top=25,
                            time_limit_s=30).plans:
            plan, m = found.plan, found.plan.num_micro_batches(batch)
            check_runnable(plan, dims, m)
            check_before_launch(model, plan, num_micro_batches=m, spec=spec,
                                example_inputs=source.example_inputs(plan.micro_batch_size, "cpu"))
            checked.append((gpus, batch, fix, plan.pp, plan.schedule, m))
    assert len(checked) >= 100, checked
    # the searches reached the plans the rules are about: pipelines with few micro-batches
    assert any(pp > 1 and s == "1f1b" and m == pp for *_, pp, s, m in checked), checked
    assert any(pp > 1 and s == "gpipe" and m < pp for *_, pp, s, m in checked), checked
