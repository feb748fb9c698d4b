import re

import pytest

from agentboost.envs.arithmetic import (
    SYSTEM_PROMPT,
    exact_answer_reward,
    extract_answer,
    generate_tasks,
)
from agentboost.envs.calculator import evaluate
from agentboost.errors import ConfigError


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_answers_are_the_exact_integer_value_of_the_question(difficulty):
    for task in generate_tasks(300, seed=7, difficulty=difficulty):
        assert task.prompt == f"What is {task.metadata['expression']}?"
        # recomputed independently: the calculator parses the text the model will see
        value = evaluate(task.metadata["expression"])
        assert type(value) is int
        assert value == task.ground_truth


def test_generation_is_deterministic_and_prefix_stable():
    tasks = generate_tasks(50, seed=3, difficulty=2)
    assert generate_tasks(50, seed=3, difficulty=2) == tasks
    assert generate_tasks(10, seed=3, difficulty=2) == tasks[:10]
    assert generate_tasks(50, seed=4, difficulty=2) != tasks
    assert [task.id for task in tasks[:2]] == ["arith-d2-s3-0", "arith-d2-s3-1"]


def test_ids_are_unique_across_seeds_and_difficulties():
    ids = [
        task.id
        for seed in (0, 1)
        for difficulty in (1, 2, 3)
        for task in generate_tasks(20, seed=seed, difficulty=difficulty)
    ]
    assert len(set(ids)) == len(ids)


def test_difficulty_shapes_the_problems():
    def numbers(task):
        return [int(number) for number in re.findall(r"\d+", task.metadata["expression"])]

    easy = generate_tasks(200, difficulty=1)
    assert all(len(numbers(task)) == 2 and max(numbers(task)) < 100 for task in easy)
    assert not any("/" in task.metadata["expression"] for task in easy)

    medium = generate_tasks(200, difficulty=2)
    assert all(len(numbers(task)) == 4 and max(numbers(task)) < 100 for task in medium)
    assert any("/" in task.metadata["expression"] for task in medium)
    assert any("(" in task.metadata["expression"] for task in medium)

    hard = generate_tasks(200, difficulty=3)
    assert max(max(numbers(task)) for task in hard) >= 1000


def test_unknown_difficulty_is_a_config_error():
    with pytest.raises(ConfigError, match="difficulty"):
        generate_tasks(1, difficulty=4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("37 * 12 = 444, plus 5 is 449.\nAnswer: 449", 449),
        ("answer: -1,234.", -1234),
        ("ANSWER : 7", 7),
        ("**Answer:** 42", 42),
        ("**Answer**: 42", 42),
        ("Answer: **42**", 42),
        ("Answer: **42.**", 42),
        ("Final answer: $42$", 42),
        ("Answer: \\boxed{1,000}.", 1000),
        ("Answer: 1\nLet me check again.\nAnswer: 2", 2),
        ("so the result is \\boxed{12} and then \\boxed{-13}", -13),
        # the last marker decides, even when it holds no integer
        ("Answer: 2\nAnswer: unsure", None),
        ("Answer: 3.5", None),
        ("Answer: 42.0", None),
        ("Answer: 1,23", None),
        ("Answer: 12 + 30 = 42", None),
        ("Answer: 6*7", None),
        ("Answer: forty-two", None),
        ("Answer:\n42", None),
        # no marker and no box: the last number in the text is never taken as the answer
        ("I computed 6 * 7 = 42", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_reward_pays_only_the_exact_answer():
    assert exact_answer_reward("Answer: 449", 449) == 1.0
    assert exact_answer_reward("Answer: 448", 449) == 0.0
    assert exact_answer_reward("The answer is 449", 449) == 0.0


def test_system_prompt_asks_for_the_tool_and_the_answer_format():
    assert "calculator" in SYSTEM_PROMPT
    assert SYSTEM_PROMPT.endswith("Answer: <integer>")


def test_generated_tasks_are_a_sequence_whose_count_method_works():
    """GeneratedTasks kept its length in ``count``, hiding Sequence.count: ``tasks.count(task)`` raised
    TypeError ('int' object is not callable). Found by mypy."""
    from agentboost.envs.arithmetic import ArithmeticEnvironment

    tasks = ArithmeticEnvironment().tasks(5, seed=1)
    assert len(tasks) == 5
    assert tasks.count(tasks[2]) == 1
    assert tasks.index(tasks[3]) == 3
