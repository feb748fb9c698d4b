"""The worker process: ``python -m agentboost.rollout.worker SPEC_JSON CONCURRENCY`` (started by WorkerPool).

Builds its environment, tokenizer and engine from the run's :class:`~agentboost.rollout.spec.RunSpec`
(as :meth:`~agentboost.rollout.spec.RunSpec.to_dict` wrote it), then says ``{"ready": true}`` (or
``{"fatal": message}`` and exits when it cannot: the parent ends the run with that message). Reads
jobs (JSON lines) on stdin, runs up to ``CONCURRENCY`` rollouts at once in one event loop, and writes
one JSON line per finished job on the fd named by ``AGENTBOOST_RESULT_FD``. Anything else it prints
goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentboost.engines.base import Engine
    from agentboost.rollout.runner import Execute
    from agentboost.rollout.spec import RunSpec

SETUP_FAILED = 3
"""Exit status of a worker that could not build its setup."""


def _describe(error: BaseException) -> str:
    """The one line the parent prints: an agentboost error's own message, else its type and text."""
    from agentboost.errors import AgentBoostError

    if isinstance(error, AgentBoostError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def build_execution(spec: RunSpec) -> tuple[Execute, Engine]:
    """What a worker (a process, or a Ray actor) runs rollouts with: the execution function over the
    environment, tokenizer and engine it builds from ``spec``, and that engine (to close)."""
    from agentboost.engines.factory import make_engine
    from agentboost.envs.registry import make_environment
    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.rollout.runner import in_process

    environment = make_environment(spec.environment, spec.environment_kwargs)
    tokenizer = load_tokenizer(spec.model)
    engine = make_engine(
        spec.engine, model=spec.model, urls=spec.urls, retries=spec.retries, **spec.engine_options()
    )
    execute = in_process(
        environment,
        engine,
        tokenizer,
        sampling=spec.sampling(),
        limits=spec.resolve_limits(environment.limits),
        template=spec.template,
    )
    return execute, engine


async def _serve(spec_data: dict[str, Any], concurrency: int, results: Any) -> int:
    from agentboost.rollout.runner import Job
    from agentboost.rollout.spec import RunSpec

    def reply(message: dict[str, Any]) -> None:
        results.write(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")
        results.flush()

    try:
        execute, engine = build_execution(RunSpec.from_dict(spec_data))
    except Exception as error:
        from agentboost.errors import AgentBoostError

        if not isinstance(error, AgentBoostError):
            traceback.print_exc()  # a bug, not a setting: the parent shows its one line, this the rest
        reply({"fatal": _describe(error)})
        return SETUP_FAILED
    reply({"ready": True})
    slots = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    running: set[asyncio.Task[None]] = set()

    async def run(job: dict[str, Any]) -> None:
        async with slots:
            try:
                fields = {name: job[name] for name in ("task_id", "task", "sample", "seed")}
                result = await execute(Job(**fields))
                line = {"id": job["id"], "result": result.to_dict()}
            except Exception as error:  # a bad job must not take the worker down
                line = {"id": job["id"], "error": _describe(error)}
            try:
                reply(line)
            except (TypeError, ValueError) as error:  # a result that is not JSON-serialisable
                reply({"id": job["id"], "error": f"the result could not be sent: {error}"})

    while line := await stdin.readline():
        job_task = asyncio.create_task(run(json.loads(line)))
        running.add(job_task)
        job_task.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)
    await engine.aclose()
    return 0


def main() -> None:
    spec, concurrency = json.loads(sys.argv[1]), int(sys.argv[2])
    results = os.fdopen(int(os.environ["AGENTBOOST_RESULT_FD"]), "wb", buffering=0)
    sys.stdout = sys.stderr  # nothing printed by tools or libraries reaches the protocol pipe
    sys.exit(asyncio.run(_serve(spec, concurrency, results)))


if __name__ == "__main__":
    main()
