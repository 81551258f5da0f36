"""Meta build and weights in one process: ``autopar.init_serial`` is deterministic per (seed,
row), keeps tied tensors tied, and reads ``weights=`` from a torch.save state dict or a
safetensors file under the model's own names; bad weights are one PlanError line."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autopar.models import load_model
from autopar.runtime.assemble.materialize import init_serial
from costmodels.contracts.errors import PlanError

SPEC = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16,dropout=0,tied=true"


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_init_serial_is_seeded_per_row_and_keeps_ties():
    source = load_model(SPEC)
    a = init_serial(source.build_meta(), seed=3)
    b = init_serial(source.build_meta(), seed=3)
    c = init_serial(source.build_meta(), seed=4)
    assert _equal(a.state_dict(), b.state_dict())
    assert not torch.equal(a.blocks[0].attn.c_attn.weight, c.blocks[0].attn.c_attn.weight)
    assert a.head.lm_head.weight is a.embedding.wte.weight
    assert abs(float(a.blocks[1].attn.c_attn.weight.detach().std()) - 0.02) < 0.005  # its init
    assert not any(p.is_meta for p in a.parameters())


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_weights_from_a_state_dict_file(tmp_path, suffix):
    source = load_model(SPEC)
    trained = source.build("cpu", seed=11)
    state = {k: v.clone() for k, v in trained.state_dict().items()}
    path = str(tmp_path / f"model{suffix}")
    if suffix == ".pt":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file
        save_file({k: v for k, v in state.items() if k != "head.lm_head.weight"}, path)  # tied: once
    loaded = init_serial(source.build_meta(), weights=path)
    assert _equal(loaded.state_dict(), state)


def test_bad_weights_are_one_line(tmp_path):
    source = load_model(SPEC)
    with pytest.raises(PlanError, match="do not exist"):
        init_serial(source.build_meta(), weights=str(tmp_path / "missing.pt"))
    torch.save({"embedding.wte.weight": torch.zeros(64, 32)}, tmp_path / "partial.pt")
    with pytest.raises(PlanError, match="no tensor for 'embedding.wpe.weight'"):
        init_serial(source.build_meta(), weights=str(tmp_path / "partial.pt"))
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(PlanError, match="cannot be read by torch.load"):
        init_serial(source.build_meta(), weights=str(tmp_path / "junk.pt"))


def test_a_module_without_an_initialiser_is_one_line():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.g

    class Model(nn.Module):   # the built-in layout (embedding, blocks, head): rows without a trace
        def __init__(self):
            super().__init__()
            self.embedding, self.head = nn.Linear(4, 4), nn.Linear(4, 4)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), Scale()) for _ in range(2))

        def forward(self, x):
            x = self.embedding(x)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    with torch.device("meta"):
        model = Model()
    with pytest.raises(PlanError, match="Scale .* no reset_parameters"):
        init_serial(model)
    init_serial(model, init_fn=lambda row: [nn.init.ones_(p) for p in row.parameters()])
    assert all(torch.equal(p, torch.ones_like(p)) for p in model.parameters())


def test_a_buffer_built_on_meta_is_one_line(tmp_path):
    source = load_model(SPEC)
    torch.save(source.build("cpu", seed=1).state_dict(), tmp_path / "w.pt")
    with torch.device("meta"):   # the causal mask too: nothing would give it values
        model = source.build("meta", seed=None)
    with pytest.raises(PlanError, match="buffer .*bias.* built on meta"):
        init_serial(model, weights=str(tmp_path / "w.pt"))
    with pytest.raises(PlanError, match="buffer .*built on meta"):
        init_serial(source.build("meta", seed=None))
