"""`agentboost gateway` as a user runs it: a real process, a real SDK client, Ctrl-C writes the sessions."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import openai
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
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        lines = []
        while not lines or "serving" not in lines[-1]:  # after the model loaded
            lines.append(process.stderr.readline())
            assert lines[-1], "".join(lines)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/alice/v1", api_key="-", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6
        keyed = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bob", max_retries=0)
        keyed.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0
    sessions = {trajectory.task_id: trajectory for trajectory in read_jsonl(out)}
    assert sorted(sessions) == ["alice", "bob"]
    assert sum(sessions["alice"].loss_mask) == 6 and sessions["alice"].info["gateway"]["rows"] == 1
