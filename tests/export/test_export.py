"""Exports round-trip: chat form, SFT JSONL, parquet and a datasets directory, from real rollouts."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
from results_support import HOSTILE, scripted_results

from agentboost.cli import main
from agentboost.export import ExportFilter, chat_record, tool_schemas_for, write_chat
from agentboost.rollout.results import read_results


@pytest.fixture(scope="module")
def results_path(qwen_tokenizer, tmp_path_factory):
    return scripted_results(qwen_tokenizer, tmp_path_factory.mktemp("export") / "results.jsonl")


@pytest.fixture(scope="module")
def results(results_path):
    return list(read_results(results_path))


def _without_raw(messages):
    return [{key: value for key, value in message.items() if key != "raw"} for message in messages]


def test_chat_form_keeps_every_message_tool_call_and_result(results, results_path, tmp_path):
    out = tmp_path / "chat.jsonl"
    assert main(["export", str(results_path), "-o", str(out), "--format", "chat"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["sample"]) for r in records] == [(r.task_id, r.sample) for r in results]
    for record, result in zip(records, results, strict=True):
        assert record["reward"] == result.reward
        assert record["termination"] == result.termination.value
        original = _without_raw(result.trajectory.messages)
        assert len(record["messages"]) == len(original)
        for exported, message in zip(record["messages"], original, strict=True):
            assert exported["role"] == message["role"]
            assert exported["content"] == message["content"]
            assert exported.get("tool_calls") == message.get("tool_calls")
            assert exported.get("reasoning_content") == message.get("reasoning_content")
            if message["role"] == "tool":
                assert exported["tool_call_id"] == message["tool_call_id"]
                assert exported.get("error", False) == message.get("error", False)
                assert exported["name"] == (message["name"] or "agentboost_invalid_tool_call")
    # the model's text survives byte for byte, hostile markup included
    assert records[4]["messages"][-1]["content"] == HOSTILE
    # a .json path writes one indented list (the form examples ship)
    listed = tmp_path / "chat.json"
    assert write_chat(results, listed, ExportFilter(min_reward=1.0)) == 3
    assert [r["reward"] for r in json.loads(listed.read_text())] == [1.0, 1.0, 1.0]
    assert json.loads(listed.read_text())[0] == chat_record(results[0])


def test_chat_form_loads_with_datasets(results_path, tmp_path):
    from datasets import Dataset

    out = tmp_path / "chat.jsonl"
    main(["export", str(results_path), "-o", str(out)])
    loaded = Dataset.from_json(str(out), cache_dir=str(tmp_path / "cache"))
    assert loaded.num_rows == 6
    assert loaded[4]["messages"][-1]["content"] == HOSTILE
    assert loaded[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "add"


def test_sft_keeps_scored_clean_rollouts_and_lists_the_tool_schemas(
    results, results_path, tmp_path, qwen_tokenizer
):
    out = tmp_path / "sft.jsonl"
    code = main(["export", str(results_path), "-o", str(out), "--format", "sft", "--min-reward", "1"])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # reward 1: t-good 0, t-good 1, t-bad 0; t-bad 0 wrote a malformed call, so SFT drops it
    assert len(records) == 2
    names = [tool["function"]["name"] for tool in records[0]["tools"]]
    assert names == ["add", "multiply"]
    assert records[0]["tools"] == tool_schemas_for("results_support:ToolEnvironment")
    assert records[0]["tools"][0]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    messages = records[0]["messages"]
    roles = ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["role"] for m in messages] == roles
    assert messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 12, "b": 30}}
    assert messages[3] == {
        "role": "tool",
        "content": "42",
        "tool_call_id": messages[2]["tool_calls"][0]["id"],
        "name": "add",
    }
    assert all("raw" not in m and "error" not in m for m in messages)
    # a chat template renders it with its tools, calls and results (what TRL's SFT trainer does)
    text = qwen_tokenizer.apply_chat_template(messages, tools=records[0]["tools"], tokenize=False)
    assert '"name": "add"' in text and "<tool_response>\n42\n</tool_response>" in text
    assert text.rstrip().endswith("Answer: 84<|im_end|>")
    # --keep-parse-errors brings the third one back; with no filter the unscored one stays out
    code = main(
        ["export", str(results_path), "-o", str(out), "--format", "sft", "--keep-parse-errors", "--force"]
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5
    from datasets import Dataset

    loaded = Dataset.from_json(str(out), cache_dir=str(tmp_path / "cache"))
    assert loaded.num_rows == 5
    assert loaded[0]["tools"][1]["function"]["name"] == "multiply"
    assert loaded[0]["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"a": 12, "b": 30}


def test_sft_without_known_environment_is_a_clear_error(results_path, tmp_path, capsys):
    code = main(
        ["export", str(results_path), "-o", str(tmp_path / "x.jsonl"), "--format", "sft", "--env", "nope"]
    )
    assert code == 2
    assert "unknown environment 'nope'" in capsys.readouterr().err
    schemas = tmp_path / "tools.json"
    schemas.write_text(json.dumps([{"type": "function", "function": {"name": "f", "parameters": {}}}]))
    out = tmp_path / "x.jsonl"
    args = ["export", str(results_path), "-o", str(out), "--format", "sft", "--tools", str(schemas)]
    assert main(args) == 0
    assert json.loads(out.read_text().splitlines()[0])["tools"][0]["function"]["name"] == "f"


def _assert_token_rows(rows, results):
    assert len(rows) == len(results)
    for row, result in zip(rows, results, strict=True):
        trajectory = result.trajectory
        assert row["task_id"] == result.task_id and row["sample"] == result.sample
        assert row["reward"] == result.reward
        assert row["input_ids"] == trajectory.token_ids
        assert row["loss_mask"] == trajectory.loss_mask
        assert row["logprobs"] == trajectory.logprobs  # exact: float64, null where the mask is 0
        assert [(s["role"], s["start"], s["end"]) for s in row["segments"]] == [
            (s.role, s.start, s.end) for s in trajectory.segments
        ]
        assert json.loads(row["messages"]) == chat_record(result)["messages"]


def test_parquet_round_trips_tokens_mask_and_logprobs(results, results_path, tmp_path):
    import pyarrow.parquet as pq
    from datasets import Dataset

    out = tmp_path / "tokens.parquet"
    assert main(["export", str(results_path), "-o", str(out), "--format", "parquet"]) == 0
    _assert_token_rows(pq.read_table(out).to_pylist(), results)
    loaded = Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "cache"))
    _assert_token_rows(list(loaded), results)
    assert sum(loaded[0]["loss_mask"]) == results[0].trajectory.generated_tokens > 0
    assert loaded[0]["logprobs"][0] is None


def test_datasets_directory_round_trips(results, results_path, tmp_path):
    from datasets import load_from_disk

    out = tmp_path / "hf"
    args = ["export", str(results_path), "-o", str(out), "--format", "hf", "--termination", "completed"]
    assert main(args) == 0
    _assert_token_rows(list(load_from_disk(str(out))), results)
    # filters apply to every format: the unscored sample is dropped with --scored-only
    assert main([*args, "--scored-only", "-o", str(tmp_path / "hf2")]) == 0
    assert load_from_disk(str(tmp_path / "hf2")).num_rows == 5


def test_skip_failed_drops_every_ending_the_termination_table_marks_failed(qwen_tokenizer, say, tmp_path):
    """An environment error is a failure (TERMINATIONS), so --skip-failed drops it like an engine error."""
    import asyncio

    from agentboost.engines.scripted import ScriptedEngine
    from agentboost.envs.base import Environment
    from agentboost.envs.task import Task
    from agentboost.rollout.results import ResultStore
    from agentboost.tokens.trajectory import TERMINATIONS

    class ResetFails(Environment):
        name = "reset-fails"

        async def reset(self, task, *, sample=0):
            if task.id == "broken":
                raise RuntimeError("the database copy failed")
            return await super().reset(task, sample=sample)

        def reward(self, trajectory, episode):
            return 1.0

    environment = ResetFails()
    engine = ScriptedEngine([say("Answer: 1")], cycle=True)

    async def both():
        tasks = [Task("fine", "Say 1."), Task("broken", "Say 1.")]
        return [await environment.run_episode(task, engine, qwen_tokenizer) for task in tasks]

    fine, broken = asyncio.run(both())
    assert broken.termination.value == "env_error" and TERMINATIONS[broken.termination].failed
    path = tmp_path / "r.jsonl"
    with ResultStore(path) as store:
        store.write(fine)
        store.write(broken)
    out = tmp_path / "chat.jsonl"
    assert main(["export", str(path), "-o", str(out), "--skip-failed"]) == 0
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(kept) == 1 and kept[0]["task_id"] == "fine"


def test_sft_finds_the_tools_of_an_environment_the_run_imported_by_reference(qwen_tokenizer, say, tmp_path):
    """A run of `--env results_support:ToolEnvironment` records the reference in its header and the
    environment's short name ('tooltest') in each trajectory: the export builds the environment from
    the header, as the README's `my_package.envs:Capitals` needs."""
    import asyncio

    from results_support import ToolEnvironment

    from agentboost.engines.scripted import ScriptedEngine
    from agentboost.rollout.results import ResultStore
    from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs
    from agentboost.rollout.spec import RunSpec

    environment = ToolEnvironment()
    spec = RunSpec(environment="results_support:ToolEnvironment", tasks=2)
    identity = spec.identity(environment_name=environment.name, limits=environment.limits, tasks=2)
    path = tmp_path / "imported.jsonl"
    config = RunConfig(samples=1, concurrency=1, progress=False)
    execute = in_process(environment, ScriptedEngine([say("Answer: 84")], cycle=True), qwen_tokenizer)
    with ResultStore(path, identity=identity, fsync=False) as store:
        asyncio.run(run_jobs(plan_jobs(environment, environment.tasks(2), config), execute, store, config))
    assert next(read_results(path)).trajectory.info["environment"] == "tooltest"
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(path), "-o", str(out), "--format", "sft"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2
    assert [tool["function"]["name"] for tool in records[0]["tools"]] == ["add", "multiply"]
