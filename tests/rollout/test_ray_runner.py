"""``--workers ray``: rollouts in actors on a real 2-node Ray cluster on loopback (one for the module).

What a user relies on: the rollouts (ids, masks, endings, rewards) are those of an in-process run,
against a scripted server and a real model's server; an interrupted run resumes into the same file;
an actor killed mid-run has its rollouts rerun, none lost or written twice; a cluster that cannot
reach the engine is refused before any rollout, in one line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from conftest import run  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from agentboost.engines.embedded.engine import LocalEngine  # noqa: E402
from agentboost.engines.scripted import ScriptedEngine  # noqa: E402
from agentboost.engines.servers.faults import FaultConfig  # noqa: E402
from agentboost.engines.servers.serve import start_server  # noqa: E402
from agentboost.envs.registry import make_environment  # noqa: E402
from agentboost.errors import ClusterPreflightError, ConfigError  # noqa: E402
from agentboost.rollout.ray_pool import RayPool, import_ray  # noqa: E402
from agentboost.rollout.results import ResultStore, read_results  # noqa: E402
from agentboost.rollout.run import run_rollouts_async  # noqa: E402
from agentboost.rollout.runner import RunConfig, plan_jobs, run_jobs  # noqa: E402
from agentboost.rollout.spec import RunSpec  # noqa: E402
from agentboost.tokens.trajectory import TerminationReason  # noqa: E402

ROOT = Path(__file__).parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def ray_cluster():
    """Two 1-CPU Ray nodes on loopback with their own temp dir and ports, stopped afterwards."""
    temp_dir = tempfile.mkdtemp(prefix="ab-ray-runner-", dir="/tmp")
    loopback = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", temp_dir)  # Ray's files (its address file too) stay in temp_dir
        # a loopback address is not rewritten to the machine's outside IP, where nothing listens
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        nodes = Cluster(shutdown_at_exit=True)
        try:
            nodes.add_node(**loopback, gcs_server_port=_free_port(), include_dashboard=False)
            nodes.add_node(**loopback)
            ray.init(address=nodes.address, log_to_driver=False, configure_logging=False)
            yield nodes
        finally:
            ray.shutdown()
            nodes.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def cluster(ray_cluster):
    """The module's cluster with every CPU free: a test starts once the actors of the one before are gone
    (an actor pinned to a busy 1-CPU node would wait for its CPU past the preflight's timeout)."""
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        assert time.monotonic() < deadline, (
            f"an earlier test's actors still hold CPUs: {ray.available_resources()}"
        )
        time.sleep(0.5)
    return ray_cluster


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


def calculating_engine(qwen_tokenizer, say):
    """Calls the calculator once per rollout, then answers: right for every other task, else 7."""
    right = {task.prompt: task.ground_truth for task in make_environment("arithmetic", {}).tasks(8)[::2]}
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>'

    def script(prompt, index):
        text = qwen_tokenizer.decode(prompt)
        if "<tool_response>" not in text:
            return say(call)
        return say(f"Answer: {next((truth for question, truth in right.items() if question in text), 7)}")

    return ScriptedEngine(script)


def rollouts(path):
    """What must not change between executors: ids, masks, endings and rewards, by (task, sample)."""
    found = {}
    for result in read_results(path):
        key = (result.task_id, result.sample)
        assert key not in found, f"{key} written twice"
        trajectory = result.trajectory
        found[key] = (trajectory.token_ids, trajectory.loss_mask, result.termination, result.reward)
    return found


def test_two_nodes_give_the_in_process_rollouts_and_an_interrupted_run_resumes(
    cluster, tokenizer_dir, qwen_tokenizer, say, tmp_path
):
    class Interrupted(Exception):
        pass

    def stop_after(count):
        seen = []

        def hear(result):
            seen.append(result)
            if len(seen) == count:
                raise Interrupted

        return hear

    async def main():
        server = await start_server(calculating_engine(qwen_tokenizer, say), context_length=40960)
        spec = RunSpec("arithmetic", model=str(tokenizer_dir), engine="sglang", urls=[server.url])
        spec = dataclasses.replace(spec, tasks=5, samples=2, concurrency=4, temperature=0.0)
        on_ray = dataclasses.replace(spec, workers="ray")
        try:
            await run_rollouts_async(spec, tmp_path / "here.jsonl", progress=False)
            with pytest.raises(Interrupted):
                await run_rollouts_async(
                    on_ray, tmp_path / "ray.jsonl", progress=False, on_result=stop_after(3)
                )
            interrupted = len(list(read_results(tmp_path / "ray.jsonl")))
            summary = await run_rollouts_async(on_ray, tmp_path / "ray.jsonl", progress=False)
            return interrupted, summary
        finally:
            await server.close()

    interrupted, summary = run(main())
    assert interrupted >= 3  # what was written before the interruption stays ...
    assert summary.skipped == interrupted and summary.completed == 10 - interrupted  # ... and is not redone
    here, on_ray = rollouts(tmp_path / "here.jsonl"), rollouts(tmp_path / "ray.jsonl")
    assert len(here) == 10 and on_ray == here
    assert {reward for *_, reward in here.values()} == {0.0, 1.0}  # the rewards compared are not all alike
    header = (tmp_path / "ray.jsonl").read_text().splitlines()[0]
    assert '"workers": "ray"' in header  # the same file format: a header, then one result per line


def test_a_real_models_server_gives_the_same_rollouts_on_ray_as_in_process(
    cluster, tokenizer_dir, random_qwen3, tmp_path
):
    async def main():
        server = await start_server(LocalEngine(random_qwen3), context_length=4096)
        spec = RunSpec("arithmetic", model=str(tokenizer_dir), engine="vllm", urls=[server.url])
        spec = dataclasses.replace(
            spec, tasks=3, samples=1, temperature=0.0, limits={"max_new_tokens": 6, "max_turns": 2}
        )
        try:
            await run_rollouts_async(spec, tmp_path / "here.jsonl", progress=False)
            ray_spec = dataclasses.replace(spec, workers="ray")
            await run_rollouts_async(ray_spec, tmp_path / "ray.jsonl", progress=False)
        finally:
            await server.close()

    run(main())
    here = rollouts(tmp_path / "here.jsonl")
    assert len(here) == 3 and rollouts(tmp_path / "ray.jsonl") == here
    assert all(sum(mask) for _, mask, _, _ in here.values())  # the model generated in every rollout


def test_an_actor_killed_mid_run_has_its_rollouts_rerun_none_lost_or_duplicated(
    cluster, tokenizer_dir, qwen_tokenizer, say, tmp_path
):
    environment = make_environment("arithmetic", {})
    config = RunConfig(samples=2, concurrency=6, retry_backoff_s=0.01, progress=False)
    jobs = plan_jobs(environment, environment.tasks(6), config)
    killed = []

    async def main():
        slow = FaultConfig(probabilities={"slow": 1.0}, slow_delay_s=0.5)
        server = await start_server(
            calculating_engine(qwen_tokenizer, say), context_length=40960, faults=slow
        )
        spec = RunSpec(
            "arithmetic", model=str(tokenizer_dir), engine="sglang", urls=[server.url], concurrency=6
        )
        try:
            async with RayPool(spec, restart_backoff_s=0.01) as pool:
                nodes = {actor.node for actor in pool.actors}

                def kill_a_busy_actor(result):
                    busy = max(pool.actors, key=lambda actor: actor.in_flight)
                    if not killed and busy.in_flight:  # results can come back together: wait for one busy
                        killed.append(busy.in_flight)
                        ray.kill(busy.handle)

                with ResultStore(tmp_path / "r.jsonl") as store:
                    run_summary = await asyncio.wait_for(
                        run_jobs(jobs, pool.execute, store, config, on_result=kill_a_busy_actor), 240
                    )
                return run_summary, pool.started, nodes
        finally:
            await server.close()

    summary, started, nodes = run(main())
    assert len(nodes) == 2  # one actor on each node
    results = list(read_results(tmp_path / "r.jsonl"))
    assert sorted((r.task_id, r.sample) for r in results) == sorted((j.task_id, j.sample) for j in jobs)
    assert all(r.termination is TerminationReason.COMPLETED for r in results)
    assert killed and summary.retried >= 1  # it had rollouts in flight, and they ran again
    assert sum(r.attempts == 2 for r in results) == summary.retried
    assert started == 3  # the lost actor was replaced


def test_a_cluster_that_cannot_reach_the_engine_is_refused_in_one_line(cluster, tokenizer_dir):
    spec = RunSpec(
        "arithmetic",
        model=str(tokenizer_dir),
        engine="sglang",
        urls=["http://127.0.0.1:9"],
        workers="ray",
        server_down_timeout_s=0,  # refused at once, not after waiting for a server that might be starting
    )
    pool = RayPool(spec, setup_timeout_s=120)

    async def main():
        with pytest.raises(ClusterPreflightError) as error:
            async with pool:
                pass
        return str(error.value)

    message = run(main())
    assert message.startswith("Ray node 127.0.0.1 (") and "cannot run rollouts" in message
    assert "127.0.0.1:9" in message and "\n" not in message
    assert pool.actors == []  # nothing left running


def test_a_node_without_the_environments_resources_gets_no_actor(cluster, tokenizer_dir):
    from agentboost.envs.resources import ActorResources

    spec = RunSpec("arithmetic", model=str(tokenizer_dir), engine="sglang", urls=["http://127.0.0.1:9"])
    pool = RayPool(spec, ActorResources(custom={"sandbox_slot": 1}))
    with pytest.raises(ClusterPreflightError, match=r"no node .* offers .*1 CPU, sandbox_slot 1"):
        run(pool.start())
    assert pool.started == 0


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install 'agentboost\[ray\]'"):
        import_ray()


def test_the_trainers_collection_runs_on_ray_with_the_rollouts_of_its_own_process(
    cluster, tokenizer_dir, qwen_tokenizer, say, tmp_path
):
    from agentboost.engines.factory import make_engine
    from agentboost.train.collect import collect_rollouts, training_spec
    from agentboost.train.config import ModelConfig, RolloutConfig

    environment = make_environment("arithmetic", {})
    tasks = environment.tasks(3)
    heard = []

    async def main():
        server = await start_server(calculating_engine(qwen_tokenizer, say), context_length=40960)
        engine = make_engine("vllm", model=str(tokenizer_dir), urls=[server.url])
        loop = asyncio.get_running_loop()
        try:
            specs = {}
            for workers in (0, "ray"):
                rollout = RolloutConfig(group_size=2, vllm_url=server.url, workers=workers, concurrency=4)
                specs[workers] = training_spec(
                    "arithmetic",
                    environment_kwargs={},
                    model=ModelConfig(name_or_path=str(tokenizer_dir)),
                    rollout=rollout,
                    split="train",
                    tasks=len(tasks),
                    samples=2,
                    seed=0,
                )
            collected = {}

            def on_this_loop(coroutine):  # as the trainer runs its collection on its own event loop
                return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

            for workers, spec in specs.items():  # collect_rollouts is synchronous: call it off this loop
                path = tmp_path / f"step_{workers}.jsonl"
                collected[workers] = await loop.run_in_executor(
                    None,
                    lambda spec=spec, path=path: collect_rollouts(
                        environment,
                        engine,
                        qwen_tokenizer,
                        spec,
                        tasks,
                        path,
                        on_result=heard.append,
                        run=on_this_loop,
                    ),
                )
            return specs["ray"], collected
        finally:
            await engine.aclose()
            await server.close()

    spec, collected = run(main())
    assert spec.workers == "ray" and spec.engine == "vllm"
    assert len(heard) == 12
    assert [(r.task_id, r.sample) for r in collected["ray"]] == [(r.task_id, r.sample) for r in collected[0]]
    assert rollouts(tmp_path / "step_ray.jsonl") == rollouts(tmp_path / "step_0.jsonl")


def test_workers_in_the_trainer_need_rollout_servers():
    from agentboost.train.config import RolloutConfig

    assert any("rollout.vllm_url" in problem for problem in RolloutConfig(workers="ray").problems())
    assert not RolloutConfig(workers="ray", vllm_url="http://127.0.0.1:8000").problems()
