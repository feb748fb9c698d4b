"""`agentboost gateway` as a user runs it: a real process, a real SDK client; sessions are written as
they finish, Ctrl-C writes the rest and exits 130; bad names, big bodies and busy ports get one clear
answer."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import openai
import pytest
import requests
from conftest import tiny_qwen3

from agentboost.tokens.trajectory import read_jsonl


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_command_serves_sessions_and_writes_them_on_ctrl_c(qwen_tokenizer, tmp_path):
    model = tmp_path / "tiny"
    tiny_qwen3(seed=3, hidden=32).save_pretrained(model)
    qwen_tokenizer.save_pretrained(model)
    out, port = tmp_path / "sessions.jsonl", free_port()
    command = [sys.executable, "-m", "agentboost.cli", "gateway", "--model", str(model), "--port", str(port)]
    command += ["--template", "qwen3", "--temperature", "0", "--max-new-tokens", "6", "--out", str(out)]
    command += ["--max-request-mb", "0.01"]  # 10 KiB: a small body shows the limit
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        lines = []
        while not lines or "serving" not in lines[-1]:  # after the model loaded
            lines.append(process.stderr.readline())
            assert lines[-1], "".join(lines)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/alice/v1", api_key="-", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6
        # alice's turn reached --max-new-tokens: the session ended, and is on disk before the answer
        assert [trajectory.task_id for trajectory in read_jsonl(out)] == ["alice"]
        with pytest.raises(openai.BadRequestError) as ended:  # its name is not opened again
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert ended.value.code == "session_ended"
        keyed = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bob", max_retries=0)
        keyed.chat.completions.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hello"}]
        )
        assert requests.delete(f"http://127.0.0.1:{port}/sessions/bob", timeout=30).status_code == 204
        assert [trajectory.task_id for trajectory in read_jsonl(out)] == ["alice", "bob"]
        open_one = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/dave/v1", api_key="-", max_retries=0)
        open_one.chat.completions.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "yo"}]
        )
        # every request of carol's is refused: carol is never written
        refused = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/carol/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.BadRequestError):
            refused.chat.completions.create(model="tiny", n=2, messages=[{"role": "user", "content": "hi"}])
        # a body over --max-request-mb: 413 in the API's error shape
        with pytest.raises(openai.APIStatusError) as large:
            refused.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x" * 20_000}]
            )
        assert large.value.status_code == 413 and large.value.code == "request_too_large"
        # session names a path or a key can carry but the gateway does not take: a JSON 400, no traceback
        for key in ("../x", "a+b/c=="):
            bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.BadRequestError) as named:
                bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
            assert named.value.code == "invalid_session_name"
        response = requests.post(
            f"http://127.0.0.1:{port}/s/..%2Fx/v1/chat/completions", json={"messages": []}, timeout=30
        )
        assert response.status_code in (400, 404) and "error" in response.json()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    log = process.stderr.read()
    assert process.returncode == 130, log  # Ctrl-C, as for every agentboost command
    assert "Traceback" not in log and "1 with no served turn not written" in log
    sessions = {trajectory.task_id: trajectory for trajectory in read_jsonl(out)}
    assert list(sessions) == ["alice", "bob", "dave"]  # dave was open at Ctrl-C
    assert sum(sessions["alice"].loss_mask) == 6 and sessions["alice"].info["gateway"]["rows"] == 1


@pytest.mark.parametrize(
    "command",
    [
        ["gateway", "--port", "{port}"],
        ["serve", "--port", "{port}"],
        ["serve-vllm", "--port", "{port}"],
        ["mcp", "serve", "--env", "arithmetic", "--http", "127.0.0.1:{port}"],
    ],
    ids=["gateway", "serve", "serve-vllm", "mcp-serve"],
)
def test_a_port_in_use_is_one_line_and_status_2(command):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [part.format(port=port) for part in command]
        result = subprocess.run(
            [sys.executable, "-m", "agentboost.cli", *argv], capture_output=True, text=True, timeout=120
        )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0]
