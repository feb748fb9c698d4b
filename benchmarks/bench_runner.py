"""Runner throughput and memory per concurrent rollout, 1,000 rollouts in flight, zero-latency engine.

Each rollout is the arithmetic environment answered by a scripted engine: one calculator call, then
the answer (two model turns, one tool call), so the figures are the runner's, the SDK's and ours,
with no generation cost. Memory per rollout is (peak RSS during the run - RSS before) / rollouts in
flight; results are written to a JSONL file as in a real run.

    python benchmarks/bench_runner.py [--rollouts 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.models.tokenizers import load_qwen3_tokenizer
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class GatedEngine(ScriptedEngine):
    """Zero-latency, but the first turn waits until every rollout has started: all are in flight at once."""

    def __init__(self, responses, rollouts: int) -> None:
        super().__init__(responses)
        self.rollouts = rollouts
        self.waiting = 0
        self.gate = asyncio.Event()

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        if not self.gate.is_set():
            self.waiting += 1
            if self.waiting >= self.rollouts:
                self.gate.set()
            await self.gate.wait()
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


async def main(rollouts: int) -> None:
    tokenizer = load_qwen3_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
    responses = [
        [*tokenizer.encode(call, add_special_tokens=False), end],
        [*tokenizer.encode("Answer: 42", add_special_tokens=False), end],
    ]

    def script(prompt, index):
        return responses[0] if prompt.count(end) < 3 else responses[1]

    environment = ArithmeticEnvironment()
    config = RunConfig(concurrency=rollouts, progress=False)
    jobs = plan_jobs(environment, environment.tasks(rollouts), config)
    engine = GatedEngine(script, rollouts)
    # warm-up (imports, template compile) outside the measurement
    with tempfile.TemporaryDirectory() as scratch, ResultStore(os.path.join(scratch, "warm.jsonl")) as store:
        await run_jobs(jobs[:4], in_process(environment, ScriptedEngine(script), tokenizer), store, config)
    peak = before = rss_bytes()
    stop = asyncio.Event()

    async def sample_memory() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_bytes())
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample_memory())
    with (
        tempfile.TemporaryDirectory() as scratch,
        ResultStore(os.path.join(scratch, "r.jsonl"), fsync=False) as store,
    ):
        started = time.perf_counter()
        summary = await run_jobs(jobs, in_process(environment, engine, tokenizer), store, config)
        elapsed = time.perf_counter() - started
    stop.set()
    await sampler
    assert summary.completed == rollouts and summary.failed == 0, summary.line()
    assert engine.waiting >= rollouts, "not all rollouts were in flight at once"
    print(
        f"{rollouts} concurrent rollouts (2 turns, 1 tool call each): {elapsed:.2f} s, "
        f"{rollouts / elapsed:.0f} rollouts/s, {summary.generated_tokens} tokens"
    )
    print(
        f"memory per concurrent rollout: {(peak - before) / rollouts / 1024:.0f} KiB "
        f"(peak RSS {peak / 2**20:.0f} MiB, before {before / 2**20:.0f} MiB; goal <= 300 KiB)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    asyncio.run(main(parser.parse_args().rollouts))
