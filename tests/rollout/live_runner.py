"""A run for the progress tests, in a pseudo-terminal: one multi-turn arithmetic rollout on a scripted
engine whose turns come back slowly, the last one after a long wait.

python live_runner.py OUT.jsonl TOKENIZER_DIR
"""

from __future__ import annotations

import asyncio
import sys

from transformers import AutoTokenizer

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
DELAYS = (0.2, 0.2, 3.0)
"""Seconds before each turn comes back: two calculator calls, then (after a stall) the answer."""


class SlowEngine(ScriptedEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.answered = 0

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        await asyncio.sleep(DELAYS[min(self.answered, len(DELAYS) - 1)])
        self.answered += 1
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


def main() -> None:
    out, tokenizer_dir = sys.argv[1], sys.argv[2]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    call = tokenizer.encode(CALL, add_special_tokens=False) + end
    answer = tokenizer.encode("Answer: 408", add_special_tokens=False) + end
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=1, concurrency=1, stall_notice_s=1.0)
    jobs = plan_jobs(environment, environment.tasks(1), config)
    engine = SlowEngine([call, call, answer])
    with ResultStore(out, fsync=False) as store:
        execute = in_process(environment, engine, tokenizer, template="qwen3")
        summary = asyncio.run(run_jobs(jobs, execute, store, config))
    print(summary.line())


if __name__ == "__main__":
    main()
