"""Where the tests find veRL: in its own virtual environment, as the README installs it (`.venv-verl`).

veRL 0.9.1 caps transformers below 5.11, so the main environment (`pip install -e '.[dev]'`) has no veRL and
runs on the transformers a plain install gets. ``$AGENTBOOST_VERL_PYTHON`` names veRL's interpreter; the
tests that need veRL run there (``tests/test_verl_environment.py``), and skip without it unless
``AGENTBOOST_REQUIRE_VERL=1`` (CI), where they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

PYTHON_ENV = "AGENTBOOST_VERL_PYTHON"
REQUIRE_ENV = "AGENTBOOST_REQUIRE_VERL"
NO_VERL = f"no veRL here: set {PYTHON_ENV} to veRL's own interpreter (.ci/run builds .venv-verl)"
"""Why a test that needs veRL skips."""


def verl_python() -> str | None:
    """An interpreter that imports veRL: ``$AGENTBOOST_VERL_PYTHON``, else this one if it has veRL, else None
    (the calling test fails instead where ``AGENTBOOST_REQUIRE_VERL=1``)."""
    python = os.environ.get(PYTHON_ENV)
    if python and not Path(python).is_file():
        pytest.fail(f"{PYTHON_ENV}={python!r} is not a file")
    if python:
        return python
    if importlib.util.find_spec("verl") is not None:
        return sys.executable
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but veRL is not importable here and {PYTHON_ENV} is not set")
    return None


def with_verl_first_on_path(env: dict[str, str], python: str) -> dict[str, str]:
    """``env`` with veRL's interpreter's directory first on PATH: a script's ``python`` is veRL's."""
    return {**env, "PATH": f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"}
