"""The default model (SmolLM2-135M-Instruct) through eval, stats, view and export (slow: real weights)."""

from __future__ import annotations

import json

import pytest

from agentboost.cli import main
from agentboost.models.weights import DEFAULT_MODEL
from agentboost.rollout.results import read_results


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_default_model_eval_then_every_inspection_command(tmp_path, capsys):
    out = tmp_path / "eval.jsonl"
    args = ["eval", "--env", "arithmetic", "-n", "1", "--samples", "2", "--out", str(out), "--quiet"]
    assert main([*args, "--max-new-tokens", "48", "--max-turns", "2"]) == 0
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["rollouts"] == 2 and report["run"]["model"] == DEFAULT_MODEL
    assert set(report["pass@k"]) == {"1", "2"} and report["tokens"]["generated_total"] > 0
    results = list(read_results(out))
    assert len(results) == 2

    assert main(["stats", str(out), "-o", str(tmp_path / "stats")]) == 0
    assert json.loads((tmp_path / "stats.json").read_text())["summary"]["rollouts"] == 2

    page = tmp_path / "view.html"
    assert main(["view", str(out), "-o", str(page), "--tokenizer", DEFAULT_MODEL]) == 0
    assert "Answer" in page.read_text() or "calculator" in page.read_text()

    assert main(["export", str(out), "-o", str(tmp_path / "chat.jsonl")]) == 0
    chat = [json.loads(line) for line in (tmp_path / "chat.jsonl").read_text().splitlines()]
    assert [m["content"] for m in chat[0]["messages"][:2]] == [
        m["content"] for m in results[0].trajectory.messages[:2]
    ]
    assert main(["export", str(out), "-o", str(tmp_path / "sft.jsonl"), "--format", "sft"]) == 0
    sft = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert all(record["tools"][0]["function"]["name"] == "calculator" for record in sft)
    capsys.readouterr()
