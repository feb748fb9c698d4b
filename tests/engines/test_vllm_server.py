"""The vLLM launcher without vLLM: the command line and environment it builds, and its process handling,
against a stand-in ``vllm.entrypoints.openai.api_server`` module (a real subprocess on loopback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from agentboost.cli import main
from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig, VLLMServerError
from agentboost.errors import ConfigError


@pytest.fixture
def model_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return str(directory)


def stand_in(tmp_path, body: str) -> dict[str, str]:
    """A fake ``vllm`` package whose api_server runs ``body`` (with ``port`` parsed); its PYTHONPATH."""
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for level in (package, package.parent, package.parent.parent):
        (level / "__init__.py").write_text("")
    (package / "api_server.py").write_text(
        textwrap.dedent(
            """
            import http.server, sys, time
            port = int(sys.argv[sys.argv.index("--port") + 1])
            class Health(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    self.send_response(200 if self.path == "/health" else 404)
                    self.end_headers()
                def log_message(self, *args):
                    pass
            """
        )
        + textwrap.dedent(body)
    )
    return {"PYTHONPATH": str(tmp_path / "fake")}


def test_the_command_carries_every_setting_agentboost_relies_on(model_dir):
    config = VLLMServerConfig(model=model_dir, served_model_name="m", extra_args=["--max-num-seqs", "8"])
    command = config.command(8123)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(command[3::2], command[4::2], strict=False))
    assert pairs["--logprobs-mode"] == "processed_logprobs"
    assert pairs["--dtype"] == "float32"
    assert pairs["--port"] == "8123" and pairs["--served-model-name"] == "m"
    assert "--no-enable-chunked-prefill" in command
    assert command[command.index("--max-num-batched-tokens") + 1] == str(config.max_model_len)
    assert command[-2:] == ["--max-num-seqs", "8"]  # the user's arguments come last and win
    env = VLLMServerConfig(model=model_dir, cpus="0-1").environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "VLLM_SERVER_DEV_MODE" not in env
    assert "--worker-extension-cls" not in command and "PYTHONPATH" not in env
    syncing = VLLMServerConfig(model=model_dir, weight_sync=True)
    env = syncing.environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    # the worker extension whose reload refreshes a tied head: a standalone file on the server's path
    extension = syncing.command(8123)[syncing.command(8123).index("--worker-extension-cls") + 1]
    source = (Path(env["PYTHONPATH"]) / f"{extension.rpartition('.')[0]}.py").read_text()
    assert f"class {extension.rpartition('.')[2]}" in source and "def agentboost_reload_weights" in source
    assert not any(line.startswith(("from agentboost", "import agentboost")) for line in source.splitlines())


def test_nonsense_settings_are_refused(model_dir):
    with pytest.raises(ConfigError):
        VLLMServerConfig(model=model_dir, max_model_len=0)
    with pytest.raises(ConfigError, match="not a model directory"):
        VLLMServer(VLLMServerConfig(model=os.path.dirname(model_dir))).start()


def test_start_waits_for_health_and_stop_ends_the_server(model_dir, tmp_path):
    env = stand_in(
        tmp_path,
        """
        time.sleep(1.0)  # loading
        http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
        """,
    )
    server = VLLMServer(VLLMServerConfig(model=model_dir, python=sys.executable, env=env, ready_timeout_s=30))
    with server:
        with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
            assert response.status == 200
        pid = server.process.pid
    assert server.process is None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole group is gone


def test_a_server_dying_at_start_up_is_one_line_quoting_its_log(model_dir, tmp_path):
    env = stand_in(tmp_path, 'print("RuntimeError: operator torchvision::nms does not exist"); sys.exit(3)\n')
    server = VLLMServer(VLLMServerConfig(model=model_dir, python=sys.executable, env=env, ready_timeout_s=30))
    with pytest.raises(VLLMServerError) as caught:
        server.start()
    message = str(caught.value)
    assert "exited with status 3" in message and "torchvision::nms" in message and "\n" not in message


def test_serve_vllm_refuses_a_missing_interpreter_in_one_line(model_dir, capsys):
    status = main(["serve-vllm", "--model", model_dir, "--python", "/nonexistent/python"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("agentboost serve-vllm: no Python interpreter at /nonexistent/python")


def test_serve_vllm_prints_the_url_and_stops_the_server_on_sigterm(model_dir, tmp_path):
    env = stand_in(tmp_path, 'http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()\n')
    python = tmp_path / "python"  # the "venv's python": the stand-in on its path
    python.write_text(f'#!/bin/sh\nPYTHONPATH={env["PYTHONPATH"]} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    port = _free_port()
    command = ["serve-vllm", "--model", model_dir, "--python", str(python), "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "agentboost.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = process.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
