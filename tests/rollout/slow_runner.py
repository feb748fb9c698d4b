"""A runner process for the kill-and-resume test: arithmetic tasks on a slow scripted engine.

python slow_runner.py OUT.jsonl TOKENIZER_DIR N_TASKS SAMPLES
"""

from __future__ import annotations

import asyncio
import sys

from transformers import AutoTokenizer

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs


class SlowEngine(ScriptedEngine):
    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        await asyncio.sleep(0.05)
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


def main() -> None:
    out, tokenizer_dir, tasks, samples = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    answer = [
        *tokenizer.encode("Answer: 7", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=samples, concurrency=4, progress=False)
    jobs = plan_jobs(environment, environment.tasks(tasks), config)
    with ResultStore(out, fsync=False) as store:
        execute = in_process(environment, SlowEngine([answer], cycle=True), tokenizer)
        summary = asyncio.run(run_jobs(jobs, execute, store, config))
    print(summary.line())


if __name__ == "__main__":
    main()
