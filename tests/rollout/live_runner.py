"""A run for the progress tests, in a pseudo-terminal: one multi-turn arithmetic rollout on a scripted
engine whose turns come back slowly, the last one after a long wait; or (``tau2``) one tau2 airline
rollout whose agent and simulated customer both answer slowly.

python live_runner.py OUT.jsonl TOKENIZER_DIR [tau2]
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
    def __init__(self, *args, delays=DELAYS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.answered = 0
        self.delays = delays

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        await asyncio.sleep(self.delays[min(self.answered, len(self.delays) - 1)])
        self.answered += 1
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


def tau2(say):
    """Airline task 1: the customer opens, the agent and the customer talk for three turns each."""
    from agentboost.envs.tau2.environment import Tau2Environment

    customer = [
        "Hello, my user id is mia_li_3668.",
        "I want to book a flight.",
        "From New York.",
        "###STOP###",
    ]
    agent = ["How can I help?", "Sure, from where?", "Let me look at the flights from New York."]
    environment = Tau2Environment(
        simulator_engine=SlowEngine([say(text) for text in customer], delays=(0.3,)),
        simulator_tokenizer=say.tokenizer,
    )
    return environment, [environment.task("1")], SlowEngine([say(text) for text in agent], delays=(0.3,))


def main() -> None:
    out, tokenizer_dir = sys.argv[1], sys.argv[2]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    def say(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) + end

    say.tokenizer = tokenizer  # type: ignore[attr-defined]
    config = RunConfig(samples=1, concurrency=1, stall_notice_s=1.0)
    if sys.argv[3:] == ["tau2"]:
        environment, tasks, engine = tau2(say)
    else:
        environment = ArithmeticEnvironment()
        tasks = environment.tasks(1)
        engine = SlowEngine([say(CALL), say(CALL), say("Answer: 408")])
    jobs = plan_jobs(environment, tasks, config)
    with ResultStore(out, fsync=False) as store:
        execute = in_process(environment, engine, tokenizer, template="qwen3")
        summary = asyncio.run(run_jobs(jobs, execute, store, config))
    print(summary.line())


if __name__ == "__main__":
    main()
