"""The worker process: ``python -m agentboost.rollout.worker SPEC_JSON`` (started by WorkerPool).

Reads jobs (JSON lines) on stdin, runs up to ``spec.concurrency`` rollouts at once in one event loop,
and writes one JSON line per finished job on the fd named by ``AGENTBOOST_RESULT_FD``. Anything else
the process prints goes to stderr.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from typing import Any


async def _serve(spec: dict[str, Any], results: Any) -> None:
    from agentboost.agent.limits import RolloutLimits
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.factory import load_tokenizer, make_engine
    from agentboost.envs.registry import make_environment
    from agentboost.envs.task import Task

    environment = make_environment(spec["environment"], spec["environment_kwargs"])
    tokenizer = load_tokenizer(spec["model"])
    engine = make_engine(spec["engine"], model=spec["model"], urls=spec["urls"])
    sampling = SamplingParams(**spec["sampling"])
    limits = RolloutLimits(**spec["limits"]) if spec.get("limits") else None
    slots = asyncio.Semaphore(spec["concurrency"])
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    running: set[asyncio.Task[None]] = set()

    def reply(message: dict[str, Any]) -> None:
        results.write(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")
        results.flush()

    async def run(job: dict[str, Any]) -> None:
        async with slots:
            try:
                task = Task.from_dict(job["task"])
                result = await environment.rollout(
                    task,
                    engine,
                    tokenizer,
                    sampling=dataclasses.replace(sampling, seed=job["seed"]),
                    limits=limits,
                    sample=job["sample"],
                )
                reply({"id": job["id"], "result": result.to_dict()})
            except Exception as error:  # a bad job must not take the worker down
                reply({"id": job["id"], "error": f"{type(error).__name__}: {error}"})

    while line := await stdin.readline():
        job_task = asyncio.create_task(run(json.loads(line)))
        running.add(job_task)
        job_task.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)
    await engine.aclose()


def main() -> None:
    spec = json.loads(sys.argv[1])
    results = os.fdopen(int(os.environ["AGENTBOOST_RESULT_FD"]), "wb", buffering=0)
    sys.stdout = sys.stderr  # nothing printed by tools or libraries reaches the protocol pipe
    asyncio.run(_serve(spec, results))


if __name__ == "__main__":
    main()
