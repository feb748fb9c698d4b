"""JavaScript agents through the gateway: the npm ``openai`` package's ``responses.create`` and the
Vercel AI SDK's default OpenAI provider (``openai(model)``: the Responses API, with ``item_reference``
inputs), each a calculator session on a scripted engine: one exact row each.

Needs ``node`` and the packages in a folder outside the repository: ``AGENTBOOST_NODE_MODULES``
(default ``~/.cache/agentboost/node-clients``). With ``AGENTBOOST_NODE_INSTALL=1`` the test runs
``npm install`` there first; otherwise it is skipped when they are missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TOOL_SCRIPT, run
from gateway_support import serving

from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.trajectory import TerminationReason

PACKAGES = ("openai@6.49.0", "ai@6.0.326", "@ai-sdk/openai@3.0.141", "zod@4.6.7")
SCRIPT = Path(__file__).parent / "node" / "agents.mjs"


@pytest.fixture(scope="module")
def node_folder() -> Path:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    folder = Path(os.environ.get("AGENTBOOST_NODE_MODULES", Path.home() / ".cache/agentboost/node-clients"))
    names = [package.rsplit("@", 1)[0] for package in PACKAGES]
    if not all((folder / "node_modules" / name / "package.json").exists() for name in names):
        if os.environ.get("AGENTBOOST_NODE_INSTALL") != "1" or shutil.which("npm") is None:
            pytest.skip(f"the npm packages are not in {folder} (AGENTBOOST_NODE_INSTALL=1 installs them)")
        folder.mkdir(parents=True, exist_ok=True)
        command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(folder), *PACKAGES]
        installed = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if installed.returncode != 0:
            pytest.skip(f"npm install failed: {installed.stderr[-300:]}")
    shutil.copy(SCRIPT, folder / SCRIPT.name)  # ES modules resolve packages next to the script
    return folder


def test_npm_openai_and_the_vercel_ai_sdk_default_provider_are_one_exact_row_each(
    qwen_tokenizer, say, node_folder
):
    engine = ScriptedEngine([say(text) for text in TOOL_SCRIPT], cycle=True)

    async def go():
        async with serving(engine, qwen_tokenizer, open_sessions=True) as gateway:
            agents = await asyncio.create_subprocess_exec(
                "node", SCRIPT.name, gateway.url, cwd=node_folder, stdout=-1, stderr=-1
            )
            out, err = await asyncio.wait_for(agents.communicate(), timeout=120)
            assert agents.returncode == 0, err.decode()[-2000:]
            trajectories = {
                name: session.trajectory(name, TerminationReason.COMPLETED)
                for name, session in gateway.sessions.items()
            }
            return json.loads(out), trajectories, gateway.stats.errors

    answers, trajectories, errors = run(go())
    assert errors == 0 and set(trajectories) == {"npm-openai", "vercel"}
    generated = [token for text in TOOL_SCRIPT for token in say(text)]
    for name, trajectory in trajectories.items():
        assert answers[name].endswith("Answer: 84")
        assert trajectory.forked_rows == [] and trajectory.info["gateway"]["drift"] == []  # one row
        assert [
            t for t, bit in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if bit
        ] == generated
