"""The trace's disk cache (``autopar.trace.disk_cache``): a hit returns the table the trace
builds, a corrupt or foreign entry is ignored and rewritten, AUTOPAR_NO_CACHE and user models
bypass it, and the suite writes only into a tmp directory."""
from __future__ import annotations

import json
import os

import pytest

from autopar.trace import disk_cache
from autopar.trace.driver import trace_model

SPEC = "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("AUTOPAR_NO_CACHE", raising=False)
    return tmp_path / "autopar" / "tables"


def _trace(calls, table=None):
    """A trace that counts its calls: the real one, or ``table`` (a table traced before)."""
    from autopar.models import load_model

    def run():
        calls.append(1)
        return table if table is not None else trace_model(load_model(SPEC), 1)
    return run


def test_a_hit_is_the_traced_table_and_a_bad_entry_is_rebuilt(cache):
    calls: list = []
    first = disk_cache.cached_trace(SPEC, 1, None, (), _trace(calls))
    (entry,) = cache.glob("*.json")
    assert list(cache.iterdir()) == [entry]            # no temporary file left behind
    second = disk_cache.cached_trace(SPEC, 1, None, (), _trace(calls))
    assert second is not first
    assert len(calls) == 1 and second == first         # read back equal, field for field
    entry.write_text(entry.read_text()[:200])          # truncated: ignored, traced and rewritten
    assert disk_cache.cached_trace(SPEC, 1, None, (), _trace(calls, first)) == first and len(calls) == 2
    data = json.loads(entry.read_text())
    data["table"]["rows"][0]["fwd_flops"] = -1.0       # fails from_dict's checks: a miss
    entry.write_text(json.dumps(data))
    assert disk_cache.cached_trace(SPEC, 1, None, (), _trace(calls, first)) == first and len(calls) == 3
    data = json.loads(entry.read_text())
    data["key"] = "another"                            # an entry under another key: a miss
    entry.write_text(json.dumps(data))
    disk_cache.cached_trace(SPEC, 1, None, (), _trace(calls, first))
    assert len(calls) == 4


def test_the_key_moves_with_config_micro_batch_leaves_and_code(cache, monkeypatch):
    from autopar.models import load_model
    cfg = load_model(SPEC).config
    base = disk_cache.entry_key(cfg, 1, ())
    assert base == disk_cache.entry_key(load_model(SPEC).config, 1, ())
    others = {disk_cache.entry_key(load_model(SPEC, seq=64).config, 1, ()), disk_cache.entry_key(cfg, 2, ()),
              disk_cache.entry_key(cfg, 1, ("Block",))}
    monkeypatch.setattr(disk_cache, "code_hash", lambda: "0" * 64)
    others.add(disk_cache.entry_key(cfg, 1, ()))
    assert base not in others and len(others) == 4


def test_off_by_env_and_for_user_models(cache, monkeypatch):
    calls: list = []
    monkeypatch.setenv("AUTOPAR_NO_CACHE", "1")
    disk_cache.cached_trace(SPEC, 1, None, (), _trace(calls))
    assert not cache.exists() and len(calls) == 1
    monkeypatch.delenv("AUTOPAR_NO_CACHE")
    for user in ("hf:config.json", "my_model.py:build"):   # a user's model: never cached
        assert disk_cache.cached_trace(user, 1, None, (), lambda: "traced") == "traced"
    assert not cache.exists()
    from autopar.cli.main import build_parser
    args = build_parser().parse_args(["inspect", SPEC, "--no-cache"])
    assert args.no_cache and os.environ["AUTOPAR_NO_CACHE"] == "1"
