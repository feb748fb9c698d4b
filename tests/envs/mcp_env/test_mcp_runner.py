"""An MCP environment runs through the runner in worker processes, rebuilt from its name and JSON kwargs."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from conftest import run
from mcp_support import STORE_KWARGS as KWARGS
from mcp_support import descendants

from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.envs.registry import make_environment
from agentboost.rollout.results import ResultStore, read_results
from agentboost.rollout.runner import RunConfig, plan_jobs, run_jobs
from agentboost.rollout.spec import RunSpec
from agentboost.rollout.workers import WorkerPool
from agentboost.tokens.trajectory import TerminationReason


def restocker(qwen_tokenizer, say):
    """Restocks what a 'Restock ... (sku X) with N' task asks for, lists the products otherwise."""

    def script(prompt, index):
        text = qwen_tokenizer.decode(prompt)
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            return say("Done.")
        asked = re.findall(r"Restock .*\(sku (\S+)\) with (\d+)", text)
        if asked:
            sku, quantity = asked[-1]
            arguments = {"sku": sku, "quantity": int(quantity)}
            return say(
                f"<tool_call>\n{json.dumps({'name': 'restock', 'arguments': arguments})}\n</tool_call>"
            )
        return say('<tool_call>\n{"name": "list_products", "arguments": {}}\n</tool_call>')

    return ScriptedEngine(script)


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


def test_mcp_rollouts_in_worker_processes(tokenizer_dir, qwen_tokenizer, say, tmp_path):
    environment = make_environment("mcp", KWARGS)
    config = RunConfig(samples=1, concurrency=4, retry_backoff_s=0.01, progress=False)
    before = descendants()

    async def main():
        server = await start_server(restocker(qwen_tokenizer, say), context_length=40960)
        spec = RunSpec(
            environment="mcp",
            environment_kwargs=KWARGS,
            model=str(tokenizer_dir),
            engine="sglang",
            urls=(server.url,),
            concurrency=4,
        )
        try:
            async with WorkerPool(spec, workers=2, restart_backoff_s=0.01) as pool:
                with ResultStore(tmp_path / "r.jsonl") as store:
                    jobs = plan_jobs(environment, environment.tasks(), config)
                    return await asyncio.wait_for(run_jobs(jobs, pool.execute, store, config), 240)
        finally:
            await server.close()

    summary = run(main())
    results = {result.task_id: result for result in read_results(tmp_path / "r.jsonl")}
    assert summary.completed == len(environment.tasks()) == 8 and summary.failed == 0
    assert all(result.termination is TerminationReason.COMPLETED for result in results.values())
    restocks = {task_id for task_id in results if task_id.startswith("restock-")}
    assert {task_id for task_id, result in results.items() if result.reward == 1.0} == restocks
    (listed,) = [m for m in results["price-gadget"].trajectory.messages if m["role"] == "tool"]
    assert listed["metadata"]["server"] == "store" and '"sku": "G-2"' in listed["content"]
    assert descendants() - before == set()  # workers and their per-episode servers are gone


def test_verl_rows_rebuild_the_mcp_environment(tmp_path):
    import pyarrow.parquet as pq

    from agentboost.integrations.verl.data import read_row, write_verl_dataset

    path, count = write_verl_dataset("mcp", tmp_path / "train.parquet", environment_kwargs=KWARGS, n=2)
    rows = pq.read_table(path).to_pylist()
    assert count == len(rows) == 2
    row = read_row(rows[1])
    rebuilt = make_environment(row.environment, row.environment_kwargs)
    assert row.environment.endswith(":MCPEnvironment") and rebuilt.tasks()[1].to_dict() == row.task
