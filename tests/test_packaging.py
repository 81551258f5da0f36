"""A non-editable install carries what autopar reads at run time.

Builds the wheel as ``pip install .`` would, installs it (without dependencies) into a fresh
folder, and from a directory outside the repository checks that the installed cost model finds
and loads every shipped hardware profile — the files an editable checkout finds by accident of
its layout. ``costmodels`` needs no torch, so the check runs in seconds.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from costmodels.contracts.files import tomllib

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "hardware-profiles").glob("*.toml"))
RUNTIMES = sorted(p.stem for p in (ROOT / "runtime-profiles").glob("*.toml"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "autopar"
    # a clean copy: an in-tree build/ or egg-info left by an earlier build would hide a missing
    # package-data rule
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", "tests"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    [whl] = out.glob("autopar-*.whl")
    return whl


def test_wheel_holds_every_shipped_profile(wheel):
    assert len(SHIPPED) >= 5, SHIPPED
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [s for s in SHIPPED if f"costmodels/hardware_profiles/{s}.toml" not in names]
    missing += [s for s in RUNTIMES if f"costmodels/runtime_profiles/{s}.toml" not in names]
    missing += [] if "costmodels/profiles/error_bands.toml" in names else ["error_bands.toml"]
    assert len(RUNTIMES) >= 4 and not missing, f"not in the wheel: {missing}"


def test_installed_package_finds_its_profiles_outside_the_repo(wheel, tmp_path):
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    code = ("import json, costmodels.profiles.hardware_files as h, costmodels.profiles.runtime as r, "
            "costmodels.profiles.error_bands as b; "
            "print(json.dumps([h.__file__, h.list_profiles(), [h.load_profile(n).name for n in h.list_profiles()], "
            "[r.load_runtime(n).name for n in r.list_runtimes()], len(b.load_bands())]))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    where, listed, loaded, runtimes, bands = json.loads(r.stdout)
    assert Path(where).is_relative_to(target), f"imported {where}, not the installed copy"
    assert listed == SHIPPED and len(loaded) == len(SHIPPED)
    assert runtimes == RUNTIMES and bands >= 3   # the runtime profiles and the error bands ship too


def test_pyproject_lists_every_package():
    """pyproject.toml names the packages one by one (the profile folders are mapped in beside
    them), so a new sub-package must be added there or a wheel would silently lack it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for top in ("autopar", "costmodels")
               for p in (ROOT / top).rglob("__init__.py")}
    mapped = {"costmodels.hardware_profiles", "costmodels.runtime_profiles"}
    assert listed == on_disk | mapped, (sorted(on_disk | mapped - listed), sorted(listed - on_disk - mapped))
