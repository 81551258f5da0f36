"""The package layers of docs/CONTRACTS.md hold in the code, so a package loop cannot come back.

The layers are read from CONTRACTS.md's "Layers" block (so the document and the code cannot
drift apart) and every import in ``autopar/`` and ``costmodels/`` — top-level, inside functions
and under ``TYPE_CHECKING`` alike, since a lazy import is still a dependency — is checked:

* a package imports only from its own package or from a strictly lower layer;
* every package is placed in a layer (a new package must be placed before it can land);
* no two modules of one package import each other, directly or round a longer cycle;
* no module takes another package's private (``_name``) name.

The checker is also run on a small tree with a loop written into it, to show it catches one.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("autopar", "costmodels")


def read_layers(contracts: Path) -> dict[str, int]:
    """{package: layer} from the ``layer N: pkg, pkg`` lines of CONTRACTS.md's Layers block."""
    layers = {}
    for m in re.finditer(r"^layer (\d+): (.+)$", contracts.read_text(), re.M):
        for pkg in m.group(2).split(","):
            layers[pkg.strip()] = int(m.group(1))
    return layers


def module_files(root: Path) -> dict[str, Path]:
    mods = {}
    for top in TOP_PACKAGES:
        for f in sorted((root / top).rglob("*.py")):
            mod = ".".join(f.relative_to(root).with_suffix("").parts)
            mods[mod.removesuffix(".__init__")] = f
    return mods


def package_of(mod: str) -> str:
    """``autopar.search.engine`` -> ``autopar.search``; ``costmodels.model.estimate`` ->
    ``costmodels.model`` (the cost model's sub-packages are layers of their own);
    ``autopar.scoring`` is its own package (a top-level module); ``autopar`` and ``costmodels``
    (the packages' ``__init__``, which only re-export) are themselves."""
    parts = mod.split(".")
    return parts[0] if len(parts) == 1 else ".".join(parts[:2])


def imports(mod: str, path: Path, mods: dict[str, Path]):
    """(imported module, imported name or None, line) for every import of a project module."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in TOP_PACKAGES:
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")[: len(mod.split(".")) - (0 if is_pkg else 1) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in TOP_PACKAGES:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                yield (sub, None, node.lineno) if sub in mods else (target, a.name, node.lineno)


def violations(root: Path, layers: dict[str, int]) -> list[str]:
    """Every breach of the layer rules in the tree at ``root``, one line each."""
    mods = module_files(root)
    out, graph = [], nx.DiGraph()
    for pkg in sorted({package_of(m) for m in mods} - set(layers)):
        out.append(f"package {pkg} has no layer in docs/CONTRACTS.md")
    for mod, path in mods.items():
        src = package_of(mod)
        for target, name, line in imports(mod, path, mods):
            dst = package_of(target)
            where = f"{path.relative_to(root)}:{line}"
            if dst != src and src in layers and dst in layers and layers[dst] >= layers[src]:
                out.append(f"{where}: {src} (layer {layers[src]}) imports {target} "
                           f"(layer {layers[dst]}); only lower layers may be imported")
            if dst != src and name and name.startswith("_") and not name.startswith("__"):
                out.append(f"{where}: {src} takes {dst}'s private name {name}")
            if dst == src and target in mods and target != mod:
                graph.add_edge(mod, target)
    for cycle in nx.simple_cycles(graph):
        out.append("import cycle inside a package: " + " -> ".join(cycle + cycle[:1]))
    return out


def test_layers_block_is_in_contracts():
    layers = read_layers(ROOT / "docs" / "CONTRACTS.md")
    assert layers.get("costmodels.contracts") == 0 and len(set(layers.values())) >= 9, layers
    assert layers["costmodels"] < min(v for k, v in layers.items() if k.startswith("autopar")), layers


def test_code_follows_the_layers():
    found = violations(ROOT, read_layers(ROOT / "docs" / "CONTRACTS.md"))
    assert not found, "\n".join(found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


LAYERS = {"costmodels.contracts": 0, "costmodels.profiles": 1, "costmodels.model": 2, "costmodels": 3,
          "autopar.search": 4, "autopar.report": 5, "autopar": 6}
CLEAN = {"costmodels/__init__.py": "from costmodels.model import m\n", "autopar/__init__.py": "",
         "costmodels/contracts/__init__.py": "", "costmodels/profiles/__init__.py": "",
         "costmodels/profiles/hardware.py": "from costmodels.contracts import plan\n",
         "costmodels/model/__init__.py": "", "costmodels/model/m.py": "from costmodels.profiles import hardware\n",
         "autopar/search/__init__.py": "from costmodels import x\n",
         "autopar/report/__init__.py": "from autopar.search import y\n"}


@pytest.mark.parametrize("change, expect", [
    ({"autopar/search/engine.py": "def f():\n    from autopar.report import z\n"},
     "autopar.search (layer 4) imports autopar.report (layer 5)"),
    ({"autopar/report/a.py": "from . import b\n", "autopar/report/b.py": "from .a import q\n"},
     "import cycle inside a package"),
    ({"autopar/report/a.py": "from autopar.search.engine import _hidden\n",
      "autopar/search/engine.py": ""}, "private name _hidden"),
    ({"autopar/newpkg/__init__.py": ""}, "package autopar.newpkg has no layer"),
    ({"costmodels/contracts/plan.py": "from costmodels.model.estimate import estimate\n"},
     "costmodels.contracts (layer 0) imports costmodels.model.estimate (layer 2)"),
    ({"costmodels/profiles/runtime.py": "def f():\n    from costmodels.model import comm\n"},
     "costmodels.profiles (layer 1) imports costmodels.model (layer 2)"),
    ({"costmodels/model/compute.py": "from costmodels import Plan\n"},
     "costmodels.model (layer 2) imports costmodels (layer 3)"),
    ({"costmodels/newsub/__init__.py": ""}, "package costmodels.newsub has no layer"),
])
def test_checker_catches_a_reintroduced_loop(tmp_path, change, expect):
    assert violations(_tree(tmp_path / "clean", CLEAN), LAYERS) == []
    found = violations(_tree(tmp_path / "broken", {**CLEAN, **change}), LAYERS)
    assert any(expect in line for line in found), found
