"""Errors a user can fix: one line, no traceback, exit code 2, naming the problem and the fix."""
import os
import subprocess
import sys

import pytest

from autopar.cli.main import main
from autopar.models import load_model
from autopar.trace import trace_model
from costmodels.contracts.errors import SpecError, TraceError

UNTRACEABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "untraceable.py") + ":build"


def _err(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def test_untraceable_model_names_operation_line_and_leaf_fix(capsys):
    code, err = _err(capsys, ["inspect", UNTRACEABLE])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error: cannot trace")
    assert "untraceable.py:" in err and "bias_gelu(self.fc_bias, self.fc(x))" in err   # the source line
    assert "bias_gelu" in err                                                           # the operation
    assert "--leaf FusedMLP" in err                                                     # the fix


def test_leaf_fix_works(capsys):
    assert main(["inspect", UNTRACEABLE, "--leaf", "FusedMLP", "--json"]) == 0
    assert '"total_params"' in capsys.readouterr().out


def test_untraceable_raises_trace_error_in_python():
    with pytest.raises(TraceError, match="--leaf FusedMLP"):
        trace_model(load_model(UNTRACEABLE))


def test_unknown_leaf_class_lists_close_names(capsys):
    code, err = _err(capsys, ["inspect", UNTRACEABLE, "--leaf", "FusedMPL"])
    assert code == 2 and "FusedMLP" in err and len(err.strip().splitlines()) == 1


def test_unknown_preset_lists_closest_names(capsys):
    code, err = _err(capsys, ["inspect", "llama3-7b"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown model 'llama3-7b'" in err and "llama3-8b" in err


def test_bad_family_setting_names_key_and_allowed(capsys):
    code, err = _err(capsys, ["inspect", "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,depth=3"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'depth'" in err and "allowed: layers, hidden, heads, ffn, vocab, seq" in err


def test_bad_micro_batch(capsys):
    code, err = _err(capsys, ["inspect", "gpt2-small", "--micro-batch", "0"])
    assert code == 2 and "--micro-batch" in err


def test_cli_error_has_no_traceback_subprocess():
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    p = subprocess.run([sys.executable, "-m", "autopar.cli.main", "inspect", UNTRACEABLE],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "--leaf FusedMLP" in p.stderr


def test_spec_errors_are_spec_errors():
    with pytest.raises(SpecError, match="did you mean"):
        load_model("gpt3-157b")
    with pytest.raises(SpecError, match="allowed"):
        load_model("llama3-8b:dropout=0.1")


DATA_DEPENDENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data_dependent.py") + ":build"


@pytest.mark.parametrize("extra", [[], ["--leaf", "ClampingBlock"]])
def test_value_dependent_code_names_line_and_says_leaf_cannot_help(capsys, extra):
    code, err = _err(capsys, ["inspect", DATA_DEPENDENT, *extra])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "data_dependent.py:14" in err and "if y.abs().max() > 1e4" in err
    assert "torch.where" in err and "--leaf" not in err
