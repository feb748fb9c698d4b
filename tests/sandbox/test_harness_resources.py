"""The programs that run in the sandbox are real .py files, shipped as package data and read from it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import agentboost
from agentboost.sandbox import testcases

HARNESSES = ("prelude", "function", "codec", "candidate", "checker")
ROOT = Path(agentboost.__file__).parent.parent


def test_every_harness_is_a_python_file_read_through_importlib_resources():
    folder = resources.files("agentboost.sandbox") / "harness"
    assert sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".py")) == sorted(
        f"{name}.py" for name in HARNESSES
    )
    for name in HARNESSES:
        ast.parse(testcases._harness(name), filename=f"{name}.py")  # plain Python, not a template
    assert testcases._CANDIDATE_HARNESS.startswith(testcases._harness("codec"))
    assert testcases._CHECKER_HARNESS.endswith(testcases._harness("checker"))
    assert testcases._FUNCTION_HARNESS.endswith(testcases._harness("function"))


def test_a_built_wheel_ships_the_harnesses(tmp_path):
    """A non-editable install has them: build a wheel from a copy of the tree and look inside."""
    source = tmp_path / "src"
    shutil.copytree(ROOT / "agentboost", source / "agentboost", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    build = "from setuptools import build_meta; print(build_meta.build_wheel(r'%s'))" % (tmp_path / "dist")
    (tmp_path / "dist").mkdir()
    wheel = subprocess.run(
        [sys.executable, "-c", build], cwd=source, capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    with zipfile.ZipFile(tmp_path / "dist" / wheel) as archive:
        names = set(archive.namelist())
        shipped = {name: archive.read(f"agentboost/sandbox/harness/{name}.py").decode() for name in HARNESSES}
    assert "agentboost/tokens/templates/hermes.jinja" in names  # the package data beside them, as before
    assert shipped == {name: testcases._harness(name) for name in HARNESSES}
