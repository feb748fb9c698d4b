"""veRL's tests run in veRL's own virtual environment, as part of this suite.

veRL 0.9.1 caps transformers below 5.11, so the main environment has no veRL (it runs on the transformers a
plain install gets) and ``tests/integrations/test_verl_*.py`` skip there. With ``$AGENTBOOST_VERL_PYTHON``
set (``.ci/run`` builds ``.venv-verl``), the test below runs those files in that interpreter on this
checkout and fails with the tail of their output when they fail; the main process never imports veRL.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest
from verl_support import NO_VERL, PYTHON_ENV, verl_python

ROOT = Path(__file__).resolve().parents[1]
VERL_TESTS = sorted((ROOT / "tests" / "integrations").glob("test_verl_*.py"))
"""Every test module that imports veRL (the check below keeps it so)."""
IMPORTS_VERL = re.compile(
    r"^\s*(?:import verl\b|from verl[ .]|.*importorskip\([\"']verl[\"']\))", re.MULTILINE
)
NO_TESTS_SELECTED = 5
"""pytest's exit status when a marker expression (``-m vllm``) selects none of veRL's tests."""


def test_every_test_that_imports_verl_runs_in_verls_environment():
    """A test module that imports veRL outside ``tests/integrations/test_verl_*.py`` would skip in the
    main environment and never run anywhere."""
    assert VERL_TESTS, "no tests/integrations/test_verl_*.py"
    elsewhere = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path not in VERL_TESTS and IMPORTS_VERL.search(path.read_text(encoding="utf-8"))
    ]
    assert not elsewhere, f"these import veRL but do not run in veRL's environment: {elsewhere}"


@pytest.mark.timeout(3600)  # the two-node Ray cluster's tests take 1-4 minutes, more on a loaded machine
def test_verls_tests_pass_in_its_own_environment(request):
    if importlib.util.find_spec("verl") is not None:
        pytest.skip("this interpreter imports veRL: its tests ran here with the rest of the suite")
    python = verl_python()
    if python is None:
        pytest.skip(NO_VERL)
    probe = subprocess.run(
        [python, "-c", "import verl.experimental.agent_loop, agentboost"], capture_output=True, text=True
    )
    assert probe.returncode == 0, (
        f"{PYTHON_ENV}={python} cannot import veRL's agent loop:\n{probe.stderr[-3000:]}"
    )
    command = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *map(str, VERL_TESTS)]
    selection = request.config.getoption("markexpr")  # `-m "not slow"` runs veRL's fast tests only
    if selection:
        command += ["-m", selection]
    # this checkout's agentboost (and its Ray workers'), whatever that interpreter has installed
    path = os.pathsep.join(part for part in (str(ROOT), os.environ.get("PYTHONPATH", "")) if part)
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=3300,
    )
    output = done.stdout + done.stderr
    passed = done.returncode == 0 or (selection and done.returncode == NO_TESTS_SELECTED)
    failures = output[output.find("= FAILURES =") :][:6000] if "= FAILURES =" in output else ""
    failed = f"veRL's tests failed in {python} (exit {done.returncode}):"
    assert passed, f"{failed}\n{failures}\n...\n{output[-3000:]}"
    assert "could not import 'verl'" not in output, output[-8000:]
    print(output.strip().splitlines()[-1])  # veRL's own count, in this run's log with -s
