"""A verifiers environment written in verifiers' own style (run by the verifiers virtual environment
through agentboost's bridge, never imported by agentboost's tests): a dataset, a rubric and, for
``kind="tools"``, a ``vf.ToolEnv`` whose Python tool the model calls through the gateway."""

import verifiers as vf
from datasets import Dataset

ROWS = [{"question": "What is 12 + 30?", "answer": "42"}, {"question": "What is 6 + 7?", "answer": "13"}]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def load_environment(kind: str = "single", **kwargs):
    def exact(completion, answer, **_):
        return 1.0 if answer in str(completion[-1]["content"]) else 0.0

    rubric = vf.Rubric(funcs=[exact])
    dataset, eval_dataset = Dataset.from_list(ROWS), Dataset.from_list(ROWS[:1])
    system = "Answer with the number."
    if kind == "tools":
        return vf.ToolEnv(
            dataset=dataset,
            eval_dataset=eval_dataset,
            tools=[add],
            system_prompt=system,
            rubric=rubric,
            max_turns=3,
        )
    return vf.SingleTurnEnv(dataset=dataset, eval_dataset=eval_dataset, system_prompt=system, rubric=rubric)
