"""`agentboost` as a user runs it: a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentboost.rollout.results import read_results


def agentboost(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "agentboost.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_rollout_writes_trajectories_and_a_summary(memorized_qwen3, qwen_tokenizer, tmp_path):
    qwen_tokenizer.save_pretrained(memorized_qwen3)  # a model directory carries its tokenizer
    out = tmp_path / "runs" / "out.jsonl"
    result = agentboost(
        "rollout",
        "--model",
        str(memorized_qwen3),
        "-n",
        "3",
        "--max-new-tokens",
        "16",
        "--max-turns",
        "2",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("arithmetic: 3 rollouts (0 already done") and str(out) in summary
    results = list(read_results(out))
    assert sorted(r.task_id for r in results) == ["arith-d1-s0-0", "arith-d1-s0-1", "arith-d1-s0-2"]
    assert all(r.reward in (0.0, 1.0) and r.trajectory.generated_tokens > 0 for r in results)
    header, *lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert header["format"] == "agentboost.results" and header["run"]["environment"] == "arithmetic"
    assert all(line["trajectory"]["format"] == "agentboost.trajectory" for line in lines)
    same = ["--max-new-tokens", "16", "--max-turns", "2"]  # a resume must use the run's settings
    again = agentboost(
        "rollout", "--model", str(memorized_qwen3), "-n", "3", *same, "--out", str(out), cwd=tmp_path
    )
    assert again.returncode == 0 and "(3 already done" in again.stdout  # resumed: nothing re-run
    shown = agentboost("show", str(out), cwd=tmp_path)
    assert shown.returncode == 0 and '"role": "user"' in shown.stdout


def test_bad_arguments_end_with_a_clear_error(tmp_path):
    result = agentboost("rollout", "--engine", "sglang", cwd=tmp_path)
    assert result.returncode == 2 and "needs the server's address: --url" in result.stderr
    result = agentboost("rollout", "--env", "chess", cwd=tmp_path)
    assert result.returncode == 2 and "unknown environment 'chess'" in result.stderr
    result = agentboost("rollout", "--env-kwargs", "{bad", cwd=tmp_path)
    assert result.returncode == 2 and "--env-kwargs is not valid JSON" in result.stderr


def test_data_to_verl_writes_parquet_from_the_command_line(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "train.parquet"
    result = agentboost("data", "to-verl", "--env", "arithmetic", "-n", "3", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.num_rows == 3 and "agent_name" in table.column_names
