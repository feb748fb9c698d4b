"""The public face: ``from agentboost import ...`` gives what a user needs, importing nothing heavy
until a name is used."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import agentboost

HEAVY = ("torch", "transformers", "strands", "numpy", "aiohttp", "agentboost.envs", "agentboost.engines")


def _modules_after(code: str) -> set[str]:
    program = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_import_agentboost_loads_no_heavy_module():
    loaded = _modules_after("import agentboost")
    assert not [name for name in loaded if name.split(".")[0] in HEAVY or name.startswith(HEAVY)]


def test_a_public_name_imports_its_module_only_when_used():
    loaded = _modules_after("from agentboost import RunSpec")
    assert "agentboost.rollout.spec" in loaded
    assert not {"torch", "transformers", "strands"} & loaded


def test_every_public_name_is_the_object_its_module_defines():
    assert set(agentboost.__all__) == {"__version__", *agentboost._PUBLIC}
    for name, module in agentboost._PUBLIC.items():
        assert getattr(agentboost, name) is getattr(importlib.import_module(module), name), name
    assert set(agentboost.__all__) <= set(dir(agentboost))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        agentboost.NoSuchThing  # noqa: B018
