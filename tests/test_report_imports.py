"""The report sits above search and validate: search never imports the report, the report never
imports validate (validate output reaches it as a PlansFile with a ``validate`` section). Checked
on the source, function-level imports included, since a lazy import is still a loop."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "autopar"


def imported_modules(package: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((ROOT / package).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names}
        out[path.name] = names
    return out


@pytest.mark.parametrize("package, forbidden", [("search", "autopar.report"),
                                                ("report", "autopar.validate")])
def test_no_package_loop(package, forbidden):
    files = imported_modules(package)
    assert files, f"no modules found in autopar/{package}"
    bad = {f: sorted(m for m in mods if m == forbidden or m.startswith(forbidden + "."))
           for f, mods in files.items()}
    assert not {f: m for f, m in bad.items() if m}, f"autopar.{package} imports {forbidden}"
