"""A forked gateway session exports every training row, each with its rollout's reward."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
from gateway_support import OPENAI_TOOLS, forked_results

from agentboost.cli import main


@pytest.fixture(scope="module")
def forked(qwen_tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("forked") / "results.jsonl"
    return path, forked_results(qwen_tokenizer, path)


def _rows(results):
    return [
        (result, index, row)
        for result in results
        for index, row in enumerate(result.trajectory.training_rows)
    ]


@pytest.mark.parametrize("form", ["parquet", "hf"])
def test_token_tables_hold_every_row_of_a_forked_session(forked, tmp_path, form, capsys):
    import pyarrow.parquet as pq
    from datasets import load_from_disk

    path, results = forked
    out = tmp_path / ("tokens.parquet" if form == "parquet" else "tokens")
    assert main(["export", str(path), "-o", str(out), "--format", form]) == 0
    assert "2 rollouts in 4 rows (forked gateway sessions)" in capsys.readouterr().out
    table = pq.read_table(out).to_pylist() if form == "parquet" else list(load_from_disk(str(out)))
    expected = _rows(results)
    assert len(table) == len(expected) == 4
    for exported, (result, index, row) in zip(table, expected, strict=True):
        assert (exported["task_id"], exported["sample"]) == (result.task_id, result.sample)
        assert (exported["row"], exported["rows"]) == (index, 2)
        assert exported["reward"] == result.reward  # every row carries its rollout's reward
        assert exported["input_ids"] == row.token_ids and exported["loss_mask"] == row.loss_mask
        assert exported["logprobs"] == row.logprobs
    # each row counts its own turns and calls (the trajectory's metrics count the whole rollout)
    assert [(exported["turns"], exported["tool_calls"]) for exported in table] == [(1, 1), (1, 0)] * 2
    # the first row is the served conversation; the second starts from the edited history
    first, second = expected[0][2], expected[1][2]
    assert (
        first.messages[1]["content"] == "I will add first." and second.messages[1]["content"] == "Let me add."
    )
    assert sorted({row["reward"] for row in table}) == [0.0, 1.0]


def test_sft_writes_one_example_per_row_with_the_tools_the_client_declared(forked, tmp_path):
    path, results = forked
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(path), "-o", str(out), "--format", "sft", "--min-reward", "1"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    (winner,) = [result for result in results if result.reward == 1.0]
    assert len(records) == 2
    for record, row in zip(records, winner.trajectory.training_rows, strict=True):
        assert [m["content"] for m in record["messages"]] == [m.get("content") or "" for m in row.messages]
        assert record["tools"] == OPENAI_TOOLS


def test_the_chat_form_keeps_the_forked_rows_with_the_rollout(forked, tmp_path):
    path, results = forked
    out = tmp_path / "chat.jsonl"
    assert main(["export", str(path), "-o", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2
    for record, result in zip(records, results, strict=True):
        (earlier,) = record["forked_rows"]
        assert [m["content"] for m in earlier] == [
            m.get("content") or "" for m in result.trajectory.forked_rows[0].messages
        ]
        assert record["messages"][1]["content"] == "Let me add."
