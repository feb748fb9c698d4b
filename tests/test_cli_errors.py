"""Bad input and faults, as a user meets them: the real `agentboost` command in a subprocess.

Every case ends with a non-zero status and one `agentboost...: error: ...` line that names the
problem and what to do (no traceback), leaves the user's files as they were, and never hangs.
docs/errors.md lists these cases; test_the_errors_table_matches_what_the_command_says keeps it honest.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import FaultConfig, start_server
from agentboost.rollout.results import read_results
from agentboost.tokens.trajectory import TerminationReason

ROOT = Path(__file__).resolve().parents[1]
ERRORS_DOC = ROOT / "docs" / "errors.md"


def agentboost(*args, cwd, env=None, preexec_fn=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "agentboost.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )


def one_error(result, status=2):
    """The command failed with ``status`` and said why in one error line (and no traceback)."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if re.match(r"agentboost[\w -]*: error: ", line)]
    assert len(errors) == 1, result.stderr
    return errors[0]


class BackgroundServer:
    """`agentboost serve`'s server on a scripted engine, in a thread, for the subprocess to reach."""

    def __init__(self, engine, faults=None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        coroutine = start_server(engine, context_length=40960, faults=faults)
        self.server = asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)
        self.url = self.server.url

    def close(self):
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def server(say):
    running = BackgroundServer(ScriptedEngine([say("Answer: 7")], cycle=True))
    yield running
    running.close()


def remote(server, tokenizer_dir, *args):
    return ["rollout", "--engine", "sglang", "--url", server.url, "--model", tokenizer_dir, *args]


# --- the results file -----------------------------------------------------------------------------


@pytest.mark.parametrize("fresh", [False, True], ids=["resume", "fresh"])
def test_out_that_is_not_a_results_file_is_left_byte_identical(tokenizer_dir, tmp_path, fresh):
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"line one\nline two, no newline at the end")
    model = tmp_path / "model.safetensors"
    model.write_bytes(os.urandom(1 << 20) * 24)  # 24 MiB of binary that happens to hold newlines
    before = {path: path.read_bytes() for path in (notes, model)}
    for path in (notes, model):
        flags = ["--fresh"] if fresh else []
        result = agentboost("rollout", "--model", tokenizer_dir, "--out", path, *flags, cwd=tmp_path)
        assert "not an agentboost results file, so it was left untouched" in one_error(result)
        assert path.read_bytes() == before[path]


def test_out_on_a_device_is_refused_at_once(tokenizer_dir, tmp_path):
    result = agentboost("rollout", "--model", tokenizer_dir, "--out", "/dev/full", cwd=tmp_path)
    assert "/dev/full is not a regular file" in one_error(result)


def test_out_a_directory_or_under_a_file_is_one_line(tokenizer_dir, tmp_path):
    assert "is a directory" in one_error(
        agentboost("rollout", "--model", tokenizer_dir, "--out", tmp_path, cwd=tmp_path)
    )
    (tmp_path / "file").write_text("x")
    line = one_error(
        agentboost("rollout", "--model", tokenizer_dir, "--out", tmp_path / "file" / "r.jsonl", cwd=tmp_path)
    )
    assert f"cannot use {tmp_path / 'file' / 'r.jsonl'}: Not a directory" in line


def test_a_full_disk_ends_the_run_with_one_line_and_keeps_the_file(server, tokenizer_dir, tmp_path):
    out = tmp_path / "r.jsonl"

    def small_files():  # what a full disk looks like to the writer: the next write fails
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = agentboost(
        *remote(server, tokenizer_dir, "-n", "8", "--out", out), cwd=tmp_path, preexec_fn=small_files
    )
    assert f"cannot write results to {out}: File too large" in one_error(result)
    assert out.stat().st_size <= 4096
    resumed = agentboost(*remote(server, tokenizer_dir, "-n", "8", "--out", out), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(list(read_results(out))) == 8


def test_resume_with_other_settings_is_refused_with_the_differences(server, tokenizer_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    assert agentboost(*remote(server, tokenizer_dir, "-n", "2", "--out", out), cwd=tmp_path).returncode == 0
    before = out.read_bytes()
    changed = agentboost(
        *remote(server, tokenizer_dir, "-n", "2", "--temperature", "0.9", "--out", out), cwd=tmp_path
    )
    assert (
        "sampling.temperature: 0.7 -> 0.9" in one_error(changed)
        and "--allow-different-settings" in changed.stderr
    )
    assert out.read_bytes() == before
    extra = "--allow-different-settings"
    allowed = agentboost(
        *remote(server, tokenizer_dir, "-n", "3", "--temperature", "0.9", extra, "--out", out), cwd=tmp_path
    )
    assert allowed.returncode == 0 and "(2 already done" in allowed.stdout


def test_failed_rollouts_exit_non_zero_and_run_again_on_resume(say, server, tokenizer_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    broken = BackgroundServer(
        ScriptedEngine([say("x")], cycle=True), faults=FaultConfig(probabilities={"http_400": 1.0})
    )
    try:
        args = [
            "rollout",
            "--engine",
            "sglang",
            "--url",
            broken.url,
            "--model",
            tokenizer_dir,
            "-n",
            "3",
            "--out",
            out,
        ]
        failed = agentboost(*args, cwd=tmp_path)
    finally:
        broken.close()
    line = one_error(failed, status=1)
    assert "3 of 3 rollouts failed; the first: task 'arith-d1-s0-" in line and "engine_error" in line
    fixed = agentboost(
        *remote(server, tokenizer_dir, "-n", "3", "--out", out), cwd=tmp_path
    )  # another URL is fine
    assert fixed.returncode == 0 and "(0 already done, 0 failed" in fixed.stdout, fixed.stderr
    assert "running 3 failed rollouts" in fixed.stderr
    results = list(read_results(out))
    assert len(results) == 3 and all(r.termination is TerminationReason.COMPLETED for r in results)
    assert len(out.read_text().splitlines()) == 1 + 3 + 3  # the failures are kept for inspection


# --- arguments --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rollout", "--concurrency", "0"], "argument --concurrency: must be >= 1, got 0"),
        (["rollout", "--concurrency", "-1"], "argument --concurrency: must be >= 1, got -1"),
        (["rollout", "-n", "0"], "argument -n/--n: must be >= 1, got 0"),
        (["rollout", "-n", "-1"], "argument -n/--n: must be >= 1, got -1"),
        (["rollout", "--samples", "0"], "argument --samples: must be >= 1, got 0"),
        (["rollout", "--retries", "-1"], "argument --retries: must be >= 0, got -1"),
        (["rollout", "--workers", "-1"], "argument --workers: must be >= 0, got -1"),
        (["rollout", "--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
        (["rollout", "--max-turns", "0"], "argument --max-turns: must be >= 1, got 0"),
        (["rollout", "--timeout", "0"], "argument --timeout: must be > 0, got 0"),
        (["rollout", "--top-p", "0"], "argument --top-p: must be > 0 and <= 1, got 0"),
        (["rollout", "--temperature", "nan"], "argument --temperature: must be >= 0, got nan"),
        (["show", "x.jsonl", "--index", "-1"], "argument --index: must be >= 0, got -1"),
        (["serve", "--port", "70000"], "argument --port: must be a port number (1-65535), got 70000"),
        (["serve", "--fault-slow-delay", "-3"], "argument --fault-slow-delay: must be >= 0, got -3"),
        (
            ["train", "empty.yaml", "rollout.concurrency=0", "--print-config"],
            "rollout.concurrency must be >= 1",
        ),
        (["train", "empty.yaml", "rollout.retries=-1", "--print-config"], "rollout.retries must be >= 0"),
        (
            ["train", "empty.yaml", "rollout.max_new_tokens=0", "--print-config"],
            "rollout.max_new_tokens must be >= 1",
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_bad_values_are_rejected_where_they_enter(tmp_path, args, message):
    (tmp_path / "empty.yaml").write_text("{}\n")
    assert message in one_error(agentboost(*args, cwd=tmp_path))


def test_explicit_limits_win_over_the_environments(server, tokenizer_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    result = agentboost(
        *remote(server, tokenizer_dir, "-n", "1", "--max-new-tokens", "1", "--out", out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    (only,) = read_results(out)
    assert only.termination is TerminationReason.MAX_TOKENS and only.trajectory.generated_tokens == 1
    assert json.loads(out.read_text().splitlines()[0])["run"]["limits"]["max_new_tokens"] == 1


def test_template_is_used_and_an_unknown_one_is_refused(server, tokenizer_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    result = agentboost(
        *remote(server, tokenizer_dir, "-n", "1", "--template", "chatml", "--out", out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert next(read_results(out)).trajectory.info["template"] == "chatml"
    bad = agentboost(
        *remote(server, tokenizer_dir, "-n", "1", "--template", "nope", "--out", tmp_path / "b.jsonl"),
        cwd=tmp_path,
    )
    assert "nope" in one_error(bad)


def test_train_output_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("x")
    (tmp_path / "empty.yaml").write_text("{}\n")
    line = one_error(agentboost("train", "empty.yaml", "output_dir=taken", "--print-config", cwd=tmp_path))
    assert "output_dir taken is a file" in line


def test_version(tmp_path):
    import agentboost as package

    result = agentboost("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == f"agentboost {package.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package.__version__)


# --- engines and models -----------------------------------------------------------------------------


def test_a_closed_port_is_waited_for_then_fails_naming_the_url_and_the_fix(tokenizer_dir, tmp_path):
    """A server still starting refuses connections: the run waits --server-down-timeout seconds for it,
    saying so, then stops in one line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = agentboost(
        "rollout",
        "--engine",
        "sglang",
        "--url",
        url,
        "--model",
        tokenizer_dir,
        "--server-down-timeout",
        "1",
        "--out",
        tmp_path / "r.jsonl",
        cwd=tmp_path,
    )
    error = one_error(result)
    assert f"the sglang server at {url} cannot be reached (Connection refused) after waiting 1 s" in error
    assert "start it or fix --url" in error and "--server-down-timeout SECONDS" in error
    assert f"agentboost: waiting for the engine at {url} (cannot be reached" in result.stderr
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("model", ["/no/such/model", "SomeOrg/NotCached-1B"])
def test_a_model_that_cannot_be_found_fails_fast_naming_what_works(tmp_path, model):
    result = agentboost("rollout", "--model", model, cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"}, timeout=60)
    assert "smollm2-135m-instruct" in one_error(result) and model in result.stderr


def test_a_config_error_inside_a_worker_ends_the_run_like_without_workers(server, tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    lines = []
    for workers in ("0", "1"):
        result = agentboost(
            *remote(server, empty, "-n", "2", "--workers", workers, "--out", tmp_path / f"{workers}.jsonl"),
            cwd=tmp_path,
            timeout=120,
        )
        lines.append(one_error(result))
    assert lines[0] == lines[1] and "cannot load a tokenizer from" in lines[0]


# --- show -----------------------------------------------------------------------------------------------


def test_show_on_bad_input_is_one_line(server, tokenizer_dir, tmp_path):
    assert "No such file" in one_error(agentboost("show", tmp_path / "missing.jsonl", cwd=tmp_path))
    (tmp_path / "other.json").write_text('{"not": "a trajectory"}\n')
    assert "not a rollout result" in one_error(agentboost("show", tmp_path / "other.json", cwd=tmp_path))
    out = tmp_path / "r.jsonl"
    assert agentboost(*remote(server, tokenizer_dir, "-n", "2", "--out", out), cwd=tmp_path).returncode == 0
    assert "has 2 results, so there is no --index 5; use 0 to 1" in one_error(
        agentboost("show", out, "--index", "5", cwd=tmp_path)
    )
    assert agentboost("show", out, "--index", "1", cwd=tmp_path).returncode == 0


# --- the table in docs/errors.md ---------------------------------------------------------------------------


def test_the_errors_table_matches_what_the_command_says(tmp_path):
    """Each row: a command and the message it prints. Run every row that needs no model or server."""
    rows = re.findall(
        r"^\| `agentboost ([^`]+)` \| (\d) \| `([^`]+)` \|", ERRORS_DOC.read_text(), re.MULTILINE
    )
    assert len(rows) >= 15
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "taken").write_text("x")
    (tmp_path / "empty.yaml").write_text("{}\n")
    (tmp_path / "other.json").write_text('{"not": "a trajectory"}\n')
    for command, status, message in rows:
        result = agentboost(*command.split(), cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"}, timeout=120)
        assert message in one_error(result, status=int(status)), command


# --- eval in worker processes -------------------------------------------------------------------------------


def test_eval_in_worker_processes_gives_the_in_process_results(server, tokenizer_dir, tmp_path):
    from agentboost.eval.evaluate import load_report

    results = {}
    for workers in ("0", "2"):
        out = tmp_path / f"w{workers}.jsonl"
        command = ["eval", "--engine", "sglang", "--url", server.url, "--model", tokenizer_dir, "-n", "3"]
        command += ["--samples", "2", "--workers", workers, "--out", out, "--quiet"]
        done = agentboost(*command, cwd=tmp_path, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        report = load_report(out.with_suffix(".json"))
        assert report["rollouts"] == 6 and report["scored"] == 6
        header = json.loads(out.read_text().splitlines()[0])
        assert header["run"]["workers"] == int(workers)
        results[workers] = {(r.task_id, r.sample): r for r in read_results(out)}
    assert results["0"].keys() == results["2"].keys()
    for key, alone in results["0"].items():
        pooled = results["2"][key]
        assert pooled.trajectory.token_ids == alone.trajectory.token_ids
        assert pooled.trajectory.loss_mask == alone.trajectory.loss_mask
        assert pooled.reward == alone.reward


def test_eval_refuses_a_url_without_a_remote_engine(tmp_path):
    result = agentboost("eval", "--url", "http://127.0.0.1:9", "--out", tmp_path / "e.jsonl", cwd=tmp_path)
    assert "--url is for remote engines" in one_error(result)
    assert not (tmp_path / "e.jsonl").exists()
