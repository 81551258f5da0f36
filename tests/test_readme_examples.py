"""The README's Python examples run, and the names it calls the public API exist.

Every ```python block of README.md is executed, in order, in one fresh interpreter inside a
temporary folder (the examples write a checkpoint), so an example that stops working — a renamed
function, a moved module, a changed signature — fails the suite instead of a user's script. The
block that defines the user-model function ``fn`` is also saved as ``my_model.py`` and loaded and
inspected as ``my_model.py:fn``, as the README says it can be.
"""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import autopar

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, re.M | re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2, "README.md lost its Python examples"


def test_every_python_example_runs(tmp_path):
    script = "\n\n".join(f"# --- README block {i + 1}\n{b}" for i, b in enumerate(BLOCKS))
    [user_block] = [b for b in BLOCKS if "def fn(" in b]
    (tmp_path / "my_model.py").write_text(user_block)
    script += ("\n\n# --- the user-model block as a file, as the README says\n"
               "m = autopar.load_model('my_model.py:fn')\n"
               "from autopar.cli.main import main\n"
               "assert main(['inspect', 'my_model.py:fn']) == 0\n"
               "print('README examples ran')\n")
    (tmp_path / "readme_examples.py").write_text(script)
    r = subprocess.run([sys.executable, "readme_examples.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "README examples ran" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])


def test_public_api_names_exist():
    """The README's "Public API" list is what ``autopar.__all__`` exports, and each name resolves."""
    section = README[README.index("### Public API"):]
    section = section[:section.index("\n## ", 1) if "\n## " in section[1:] else len(section)]
    listed = set(re.findall(r"`autopar\.(\w+)`", section))
    assert listed >= set(autopar.__all__) - {"__version__"}, sorted(set(autopar.__all__) - listed)
    for name in listed:   # a name of autopar's, or a module a script imports from (autopar.train)
        assert name in autopar.__all__ or importlib.import_module(f"autopar.{name}"), name
