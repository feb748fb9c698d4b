"""The runner's executors side by side: in this process, worker processes, and Ray actors (``--workers ray``).

Every executor runs the same rollouts (the arithmetic environment) against one ``agentboost serve``
server on loopback, in a process of its own. ``--engine scripted`` (default): a scripted policy (one
calculator call, then the answer), so the figures are the executors' own cost, not generation;
``--engine tiny``: the embedded engine over a tiny random Qwen3 (the tests' model: it never stops, so
every rollout is one full-budget turn), the same executors with a real forward pass behind them. Printed:

- start-up: from nothing to an executor ready to run rollouts (worker processes and actors build
  their environment, tokenizer and engine client; Ray's cluster start is reported apart),
- per-rollout overhead: the mean latency of rollouts run one at a time, minus in-process's,
- rollouts/s with ``--concurrency`` in flight, on 1, 2 and 4 simulated nodes (one local Ray cluster
  of 4 one-CPU nodes; a custom resource per node count picks which nodes get an actor).

    python benchmarks/ray_runner.py [--engine scripted|tiny] [--rollouts 64] [--serial 16]
        [--concurrency 8] [--nodes 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.envs.resources import ActorResources
from agentboost.models.tokenizers import load_qwen3_tokenizer
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, plan_jobs, run_jobs
from agentboost.rollout.spec import RunSpec
from agentboost.rollout.worker import build_execution

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("scripted", "tiny")


def scripted_engine(tokenizer: Any) -> ScriptedEngine:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
    responses = [
        [*tokenizer.encode(call, add_special_tokens=False), end],
        [*tokenizer.encode("Answer: 42", add_special_tokens=False), end],
    ]
    return ScriptedEngine(lambda prompt, index: responses[0] if prompt.count(end) < 3 else responses[1])


@asynccontextmanager
async def in_process(spec: RunSpec) -> Any:
    execute, engine = build_execution(spec)
    try:
        yield execute
    finally:
        await engine.aclose()


@asynccontextmanager
async def worker_processes(spec: RunSpec, workers: int) -> Any:
    from agentboost.rollout.workers import WorkerPool

    async with WorkerPool(spec, workers) as pool:
        yield pool.execute


@asynccontextmanager
async def ray_actors(spec: RunSpec, nodes: int) -> Any:
    from agentboost.rollout.ray_pool import RayPool

    async with RayPool(spec, ActorResources(custom={f"up_to_{nodes}": 1})) as pool:
        yield pool.execute


async def measure(
    make: Callable[[], AbstractAsyncContextManager[Any]], jobs: list[Any], serial: int, concurrency: int
) -> dict[str, float]:
    """Start-up, mean latency of ``serial`` rollouts one at a time, and rollouts/s at ``concurrency``."""
    out = Path(tempfile.mkdtemp(prefix="ab-bench-"))
    try:
        started = time.perf_counter()
        async with make() as execute:
            ready = time.perf_counter() - started
            one = RunConfig(concurrency=1, progress=False, stall_notice_s=None)
            with ResultStore(out / "serial.jsonl") as store:
                began = time.perf_counter()
                await run_jobs(jobs[:serial], execute, store, one)
                latency = (time.perf_counter() - began) / serial
            many = RunConfig(concurrency=concurrency, progress=False, stall_notice_s=None)
            with ResultStore(out / "many.jsonl") as store:
                began = time.perf_counter()
                summary = await run_jobs(jobs, execute, store, many)
                rate = summary.completed / (time.perf_counter() - began)
        return {"startup_s": ready, "latency_ms": latency * 1e3, "rate": rate}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def start_cluster(nodes: list[int], temp_dir: str) -> Any:
    """A local Ray cluster of one-CPU nodes on loopback; node i offers ``up_to_k`` for each k >= i+1."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_TMPDIR"] = temp_dir
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback addresses stay loopback
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = Cluster(shutdown_at_exit=True)
    for index in range(max(nodes)):
        resources = {f"up_to_{k}": 1 for k in nodes if index < k}
        head = {"gcs_server_port": port, "include_dashboard": False} if index == 0 else {}
        cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1, resources=resources, **head)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def tiny_engine() -> Any:
    """The embedded engine over the tests' tiny random Qwen3 (tests/conftest.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import tiny_qwen3

    from agentboost.engines.embedded.engine import LocalEngine

    return LocalEngine(tiny_qwen3())


async def main(
    engine: str, rollouts: int, serial: int, concurrency: int, nodes: list[int], workers: int
) -> None:
    tokenizer = load_qwen3_tokenizer()
    tokenizer_dir = tempfile.mkdtemp(prefix="ab-bench-tokenizer-")
    tokenizer.save_pretrained(tokenizer_dir)
    environment = ArithmeticEnvironment()
    jobs = plan_jobs(environment, environment.tasks(rollouts), RunConfig())
    server = await start_server_process(engine)
    spec = RunSpec(
        "arithmetic", model=tokenizer_dir, engine="sglang", urls=[server.url], concurrency=concurrency
    )
    rows: list[tuple[str, dict[str, float]]] = []
    temp_dir = tempfile.mkdtemp(prefix="ab-bench-ray-", dir="/tmp")
    cluster = None
    try:
        rows.append(("in-process", await measure(lambda: in_process(spec), jobs, serial, concurrency)))
        label = f"{workers} worker processes"
        rows.append(
            (label, await measure(lambda: worker_processes(spec, workers), jobs, serial, concurrency))
        )
        began = time.perf_counter()
        cluster = start_cluster(nodes, temp_dir)
        cluster_s = time.perf_counter() - began
        for count in nodes:
            measured = await measure(lambda count=count: ray_actors(spec, count), jobs, serial, concurrency)
            rows.append((f"ray, {count} node{'s' * (count > 1)}", measured))
    finally:
        server.kill()
        await server.wait()
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
    base = rows[0][1]["latency_ms"]
    print(f"{rollouts} rollouts (arithmetic, {engine} server on loopback), {concurrency} in flight")
    print(f"load average {load()}")
    if cluster is not None:
        print(f"Ray cluster of {max(nodes)} one-CPU nodes started in {cluster_s:.1f} s (not in start-up)")
    print("| executor | start-up (s) | one at a time (ms) | overhead per rollout (ms) | rollouts/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, row in rows:
        startup, latency, rate = row["startup_s"], row["latency_ms"], row["rate"]
        print(f"| {label} | {startup:.2f} | {latency:.1f} | {latency - base:+.1f} | {rate:.1f} |")


class ServerProcess:
    """The scripted server in a process of its own (as `agentboost serve` would be), so no executor
    shares its event loop with the server."""

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process, self.url = process, url

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    async def wait(self) -> None:
        await self.process.wait()


async def start_server_process(engine: str) -> ServerProcess:
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", "--engine", engine, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    url = (await process.stdout.readline()).decode().strip()
    if not url.startswith("http"):
        raise RuntimeError(f"the {engine} server did not start (it said {url!r})")
    return ServerProcess(process, url)


async def serve(engine: str) -> None:
    served = tiny_engine() if engine == "tiny" else scripted_engine(load_qwen3_tokenizer())
    server = await start_server(served, context_length=40960)
    print(server.url, flush=True)
    await asyncio.Event().wait()


def load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=ENGINES, default="scripted", help="what the server runs")
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--serial", type=int, default=16, help="rollouts run one at a time for the latency")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="worker processes to compare with")
    parser.add_argument("--nodes", default="1,2,4", help="simulated node counts (comma-separated)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server's own process
    args = parser.parse_args()
    node_counts = sorted({int(part) for part in args.nodes.split(",")})
    if args.serve:
        asyncio.run(serve(args.engine))
    else:
        arguments = (args.rollouts, args.serial, args.concurrency, node_counts, args.workers)
        asyncio.run(main(args.engine, *arguments))
