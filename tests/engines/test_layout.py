"""The engines' layout: every file named in docs/architecture.md, the public names importable from
``agentboost.engines`` without importing the rooms until used."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import agentboost.engines

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "agentboost" / "engines"


def _engine_files() -> list[str]:
    """Every source file under agentboost/engines/, as ``engines/...``; an ``__init__.py`` that holds
    only its docstring is the folder's label, not a file with a concept of its own."""
    files = []
    for path in sorted(ENGINES.rglob("*")):
        if "__pycache__" in path.parts or path.suffix not in {".py", ".c"}:
            continue
        if path.name == "__init__.py":
            body = ast.parse(path.read_text()).body
            if len(body) <= 1:
                continue
        files.append(path.relative_to(ENGINES.parent).as_posix())
    return files


def test_every_engine_file_is_in_the_architecture_table():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("### Engines, file by file", 1)[1].split("\n### ", 1)[0]
    missing = [name for name in _engine_files() if f"`{name}`" not in table]
    assert not missing, f"add these to docs/architecture.md's 'Engines, file by file' table: {missing}"
    listed = {cell for cell in table.split("`") if cell.startswith("engines/")}
    assert not listed - set(_engine_files()), "the table names files that do not exist"


def test_public_names_are_the_objects_their_modules_define():
    for name, module in agentboost.engines._PUBLIC.items():
        assert getattr(agentboost.engines, name) is getattr(importlib.import_module(module), name), name
    assert set(agentboost.engines.__all__) == set(agentboost.engines._PUBLIC)


def test_the_protocol_imports_no_room():
    program = "import json, sys\nimport agentboost.engines.base\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert not {"torch", "aiohttp", "transformers"} & loaded
    rooms = ("agentboost.engines.embedded", "agentboost.engines.remote", "agentboost.engines.servers")
    assert not [name for name in loaded if name.startswith(rooms)]
