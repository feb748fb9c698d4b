"""Per-episode directories for stdio servers, non-text content named, connection errors worded as such.

The npm reference servers (``@modelcontextprotocol/server-memory``, ``-everything``) are installed once
into a cache outside the repository (``AGENTBOOST_NPM_CACHE``, default ``~/.cache/agentboost/npm-mcp``);
the tests that need them skip when ``npm`` is missing or the install fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from mcp_support import HERE, free_port, stdio

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.mcp.servers import ServerSpec, omitted_content_note
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import TerminationReason

EPISODE_SERVER = HERE / "episode_server.py"

pytestmark = pytest.mark.filterwarnings("ignore:coroutine .MCPClient.stop:RuntimeWarning")

NPM_SERVERS = (
    "@modelcontextprotocol/server-memory@2026.8.31",
    "@modelcontextprotocol/server-everything@2026.8.31",
)

NPM_FLAGS = ("--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-timeout=30000")
"""A registry that does not answer makes the install fail (and the tests skip) within about a minute."""


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="session")
def npm_bin() -> Path:
    """The ``node_modules/.bin`` of the cached reference servers (installed on first use)."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node/npm are not installed")
    prefix = Path(os.environ.get("AGENTBOOST_NPM_CACHE", Path.home() / ".cache" / "agentboost" / "npm-mcp"))
    binaries = prefix / "node_modules" / ".bin"
    if not (binaries / "mcp-server-memory").exists() or not (binaries / "mcp-server-everything").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["npm", "install", *NPM_FLAGS, "--prefix", str(prefix), *NPM_SERVERS],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.skip(f"npm could not install the reference MCP servers: {done.stderr[-300:]}")
    return binaries


def tool_texts(result) -> list[str]:
    return [message["content"] for message in result.trajectory.messages if message["role"] == "tool"]


def run(env, script, qwen_tokenizer, tasks):
    engine = ScriptedEngine(script, cycle=True)
    return asyncio.run(_run_all(env, engine, qwen_tokenizer, tasks))


async def _run_all(env, engine, tokenizer, tasks):
    results = []
    for task in tasks:  # one after another: the second would read what the first left behind
        results.append(await env.run_episode(task, engine, tokenizer))
    return results


def memory_environment(npm_bin: Path, **server):
    return make_environment(
        "mcp",
        {
            "servers": [{"name": "memory", "command": [str(npm_bin / "mcp-server-memory")], **server}],
            "reward": {"python": "mcp_support:constant_reward"},
            "template": "qwen3",
        },
    )


def remember_then_read(say, qwen_tokenizer):
    """Each episode first reads the graph, then stores an entity named after its task, then stops."""

    def script(prompt_ids, index):
        text = qwen_tokenizer.decode(prompt_ids)
        turns = text.count("<|im_start|>assistant") - 1  # the assistant turns before this one
        name = text.split("Remember ", 1)[1].split(".", 1)[0]
        if turns == 0:
            return say(call("read_graph"))
        if turns == 1:
            entity = {"name": name, "entityType": "person", "observations": ["met today"]}
            return say(call("create_entities", entities=[entity]))
        return say("Done.")

    return script


def test_a_file_backed_server_gets_a_fresh_file_each_episode(npm_bin, say, qwen_tokenizer, tmp_path):
    """server-memory keeps its graph in MEMORY_FILE_PATH: under {episode_dir}, no episode sees another's."""
    tasks = [Task("a", "Remember Ada."), Task("b", "Remember Bob.")]
    script = remember_then_read(say, qwen_tokenizer)
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("agentboost-mcp-*"))

    isolated = memory_environment(
        npm_bin, cwd="{episode_dir}", env={"MEMORY_FILE_PATH": "{episode_dir}/memory.jsonl"}
    )
    first, second = run(isolated, script, qwen_tokenizer, tasks)
    for result in (first, second):
        assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
    assert "Ada" in tool_texts(first)[1] and "Bob" in tool_texts(second)[1]  # each stored its own entity
    assert "Ada" not in tool_texts(second)[0]  # ... and the second episode's first read saw none of it
    assert '"entities": []' in tool_texts(second)[0].replace(" ", "").replace('":[', '": [')
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("agentboost-mcp-*")) == before  # removed

    shared = memory_environment(npm_bin, env={"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")})
    _, leaked = run(shared, script, qwen_tokenizer, tasks)  # the control: one file for every episode leaks
    assert "Ada" in tool_texts(leaked)[0]


def test_episode_placeholders_fill_env_and_cwd_and_typos_are_refused(say, qwen_tokenizer):
    spec = ServerSpec.from_dict(
        {
            "name": "s",
            "command": ["x"],
            "cwd": "{episode_dir}",
            "env": {"ID": "{episode_id}", "F": "{episode_dir}/f"},
        }
    )
    assert (
        spec.uses_episode_dir and not ServerSpec.from_dict({"name": "s", "command": ["x"]}).uses_episode_dir
    )
    client = spec.client("ep1", "/tmp/ep-dir")
    with pytest.raises(ConfigError, match="episode_dir"):
        spec.client("ep1")
    assert client is not None
    with pytest.raises(ConfigError, match=r"unknown placeholder \{episode_directory\}"):
        ServerSpec.from_dict({"name": "s", "command": ["x"], "env": {"F": "{episode_directory}/f"}})
    with pytest.raises(ConfigError, match="'env' must map names to strings"):
        ServerSpec.from_dict({"name": "s", "command": ["x"], "env": {"N": 3}})

    # the server process really runs in the episode's directory, with its id in its environment
    env = make_environment(
        "mcp",
        {
            "servers": [stdio(EPISODE_SERVER, cwd="{episode_dir}", env={"EPISODE": "{episode_id}"})],
            "reward": {"tool": "reward"},
            "template": "qwen3",
        },
    )
    engine = ScriptedEngine([say(call("where")), say("ok")])
    result = asyncio.run(env.run_episode(Task("w", "where?"), engine, qwen_tokenizer))
    cwd, episode = json.loads(tool_texts(result)[0])
    assert Path(cwd).name.startswith("agentboost-mcp-") and episode == result.trajectory.info["mcp_episode"]
    assert not Path(cwd).exists()  # removed once the server stopped


def test_resource_links_and_binary_resources_are_named_for_the_model(npm_bin, say, qwen_tokenizer):
    env = make_environment(
        "mcp",
        {
            "servers": [{"name": "everything", "command": [str(npm_bin / "mcp-server-everything")]}],
            "reward": {"python": "mcp_support:constant_reward"},
            "template": "qwen3",
        },
    )
    script = [
        say(call("get-resource-links", count=2)),
        say("ok"),
    ]
    (result,) = run(env, script, qwen_tokenizer, [Task("e", "links")])
    (links,) = tool_texts(result)
    assert links.count("[resource_link ") == 2 and "omitted: only text reaches the model" in links
    assert "demo://resource/" in links  # the link's address reaches the model

    # a binary resource Strands would drop is named too (mapped by the client every connection uses)
    from mcp.types import BlobResourceContents, EmbeddedResource

    client = ServerSpec.from_dict({"name": "s", "command": ["x"]}).client("ep")
    blob = BlobResourceContents(uri="file:///a.bin", blob="AAAA", mime_type="application/octet-stream")
    assert client.map_mcp_content_to_tool_result_content(
        EmbeddedResource(type="resource", resource=blob)
    ) == {"text": "[resource file:///a.bin (application/octet-stream) omitted: only text reaches the model]"}


def test_audio_and_unknown_parts_are_named(say, qwen_tokenizer):
    env = make_environment(
        "mcp", {"servers": [stdio(EPISODE_SERVER)], "reward": {"tool": "reward"}, "template": "qwen3"}
    )
    (result,) = run(env, [say(call("clip")), say("ok")], qwen_tokenizer, [Task("c", "clip")])
    assert tool_texts(result) == [
        "here it is\n[audio content (audio/wav) omitted: only text reaches the model]"
    ]

    class Hologram:  # a content kind newer than this SDK
        type = "hologram"

    assert omitted_content_note(Hologram()) == "[hologram content omitted: only text reaches the model]"


def test_an_unreachable_url_is_named_a_connection_failure(say, qwen_tokenizer):
    server = {"name": "tools", "url": f"http://127.0.0.1:{free_port()}/mcp", "startup_timeout_s": 5}
    env = make_environment("mcp", {"servers": [server], "reward": {"tool": "r"}, "template": "qwen3"})
    (result,) = run(env, [say("unused")], qwen_tokenizer, [Task("u", "x")])
    detail = result.trajectory.termination_detail
    assert result.termination is TerminationReason.ENV_ERROR
    assert "connection failed (ConnectError" in detail and "WouldBlock" not in detail
