"""The math environment: reasoning-gym's own scorer is the reward, the answer is read from the final line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import reasoning_gym

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.math_problems import (
    SUPPORTED_GENERATORS,
    MathEnvironment,
    exact_match,
    extract_answer,
)
from agentboost.envs.registry import make_environment
from agentboost.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "math_model_outputs.jsonl"
END = "<|im_end|>"


def scripted_rollout(environment, task, tokenizer, turns: list[str]):
    engine = ScriptedEngine([tokenizer.encode(turn + END, add_special_tokens=False) for turn in turns])
    return asyncio.run(environment.run_episode(task, engine, tokenizer, template="qwen3"))


@pytest.mark.parametrize("generator", SUPPORTED_GENERATORS)
def test_reward_agrees_with_the_generators_scorer_on_gold_and_wrong_answers(generator, qwen_tokenizer):
    environment = MathEnvironment(generator, tool="none")
    scorer = reasoning_gym.get_score_answer_fn(generator)
    for task in environment.tasks(4, seed=3):
        gold = task.ground_truth
        assert scorer(gold, task.metadata["entry"]) == 1.0  # the generator's own verdict on its gold answer
        right = scripted_rollout(environment, task, qwen_tokenizer, [f"I worked it out.\nAnswer: {gold}"])
        assert right.reward == 1.0, (generator, gold)

        wrong_answer = "12345678" if gold != "12345678" else "7"
        assert scorer(wrong_answer, task.metadata["entry"]) < 1.0
        wrong = scripted_rollout(environment, task, qwen_tokenizer, [f"Answer: {wrong_answer}"])
        assert wrong.reward == 0.0, (generator, gold)


HOSTILE_ANSWERS = [
    "7 or 5",  # made reasoning-gym's prime_factorization scorer raise ValueError (issue 23)
    "I am not sure",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "9" * 5000,  # more digits than int() converts by default
    "-0",
    "∞",
    "１２",  # full-width digits
    "١٢٣",  # Arabic-Indic digits
    "x" * 20000,
    "1/0",
    "0/0",
    "((((",
    "[1, 2]",
    "None",
    "10**10**10",
    "2 × 3 × 5",
    "\\frac{1}{0}",
    "\x00\ud7ff",
]


@pytest.mark.parametrize("generator", SUPPORTED_GENERATORS)
def test_every_hostile_answer_scores_zero_and_is_never_unscored(generator, qwen_tokenizer):
    environment = MathEnvironment(generator, tool="none")
    task = environment.tasks(1, seed=5)[0]
    for answer in HOSTILE_ANSWERS:
        assert environment.answer_reward(answer, task) == 0.0, (generator, answer[:20])
        assert 0.0 <= environment.score_answer(answer, task) < 1.0  # raw: a finite score, maybe partial
    empty = scripted_rollout(environment, task, qwen_tokenizer, ["Answer:"])
    assert (empty.reward, empty.outcome.value) == (0.0, "scored")
    for answer in ("7 or 5", "nan", "9" * 5000):  # whole rollouts: a reward, never a reward_error
        result = scripted_rollout(environment, task, qwen_tokenizer, [f"Answer: {answer}"])
        assert (result.reward, result.reward_error, result.outcome.value) == (0.0, None, "scored")


def test_file_rows_score_hostile_answers_zero():
    assert exact_match("9" * 5000, "9" * 5000) == 1.0  # compared as digits, past int()'s limit
    assert exact_match("-0", "0") == 1.0 and exact_match("007", "7") == 1.0
    for answer in HOSTILE_ANSWERS:
        assert exact_match(answer, "42") == 0.0


def test_partial_credit_is_thresholded_unless_asked_for(qwen_tokenizer):
    environment = MathEnvironment("fraction_simplification", tool="none")
    task = environment.tasks(1, seed=1)[0]
    scorer = reasoning_gym.get_score_answer_fn("fraction_simplification")
    assert (
        0.0 < scorer("1/2", task.metadata["entry"]) < 1.0
    )  # reasoning-gym pays a little for a wrong fraction
    assert scripted_rollout(environment, task, qwen_tokenizer, ["Answer: 1/2"]).reward == 0.0
    raw = MathEnvironment("fraction_simplification", tool="none", threshold=None)
    assert 0.0 < scripted_rollout(raw, task, qwen_tokenizer, ["Answer: 1/2"]).reward < 1.0


def test_an_answer_without_the_format_earns_nothing(qwen_tokenizer):
    environment = MathEnvironment("products", tool="none")
    task = environment.tasks(1)[0]
    bare = scripted_rollout(environment, task, qwen_tokenizer, [f"The product is {task.ground_truth}"])
    assert bare.reward == 0.0  # no "last number" fallback: the policy must give the answer line


def test_answer_extraction_on_real_model_outputs():
    """SmolLM2-135M-Instruct's own replies, kept verbatim, with the answer a person reads in each."""
    rows = [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]
    assert len(rows) >= 8
    for row in rows:
        assert extract_answer(row["output"]) == row["expected"], row["output"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 408", "408"),
        ("**Answer:** 51,465.", "51,465"),
        ("answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("Answer: \\boxed{17}", "17"),
        ("so \\boxed{5 × 7 × 7}", "5 × 7 × 7"),
        ("Answer: 3\nWait, Answer: 4", "4"),
        ("Answer:", None),
        ("The result is 12.", None),
        ("Answer: 1.5e-3.", "1.5e-3"),
    ],
)
def test_extract_answer_rules(text, expected):
    assert extract_answer(text) == expected


def test_splits_are_disjoint_and_deterministic():
    environment = MathEnvironment("products", {"min_digits": 3, "max_digits": 3}, tool="none")
    train = environment.tasks(512)
    test = environment.tasks(64, split="test")
    assert len(test) == 64
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert [t.prompt for t in environment.tasks(8)] == [t.prompt for t in train[:8]]
    assert all("*" in t.prompt and t.metadata["entry"]["metadata"]["num_digits"] == 3 for t in train[:16])


def test_a_weighted_mix_draws_from_each_generator_with_its_settings():
    environment = MathEnvironment(
        {"products": 3, "gcd": 1}, {"products": {"min_digits": 2, "max_digits": 2}, "gcd": {}}, tool="none"
    )
    tasks = environment.tasks(200)
    kinds = [t.metadata["generator"] for t in tasks]
    assert 120 < kinds.count("products") < 180 and kinds.count("gcd") > 20
    assert len({t.id for t in tasks}) == 200


def test_aime_rows_load_from_a_file_and_score_by_exact_match(tmp_path, qwen_tokenizer):
    path = tmp_path / "aime.jsonl"
    path.write_text('{"problem": "Find 6 * 7.", "answer": "042"}\n{"problem": "Find 2 + 2.", "answer": 4}\n')
    environment = make_environment("math", {"data_file": str(path), "tool": "none"})
    tasks = {t.prompt: t for t in environment.tasks(2)}
    assert scripted_rollout(environment, tasks["Find 6 * 7."], qwen_tokenizer, ["Answer: 42"]).reward == 1.0
    assert scripted_rollout(environment, tasks["Find 2 + 2."], qwen_tokenizer, ["Answer: 5"]).reward == 0.0
    assert exact_match("1,000", "1000") == 1.0
    path.write_text('{"question": "no problem key"}\n')
    with pytest.raises(ConfigError, match="problem"):
        make_environment("math", {"data_file": str(path)}).tasks(1)


def test_bad_settings_are_typed_errors():
    with pytest.raises(ConfigError, match="no_such_generator"):
        MathEnvironment("no_such_generator")
    with pytest.raises(ConfigError, match="tool must be one of"):
        MathEnvironment("products", tool="shell")
    with pytest.raises(ConfigError, match="map generator names"):
        MathEnvironment("products,gcd", {"min_digits": 2})


def test_the_calculator_tool_gives_the_answer_a_model_copies(qwen_tokenizer):
    environment = MathEnvironment("products", {"min_digits": 3, "max_digits": 3}, tool="calculator")
    task = environment.tasks(1)[0]
    expression = task.metadata["entry"]["metadata"]["expression"]
    arguments = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    call = f"<tool_call>\n{arguments}\n</tool_call>"
    result = scripted_rollout(environment, task, qwen_tokenizer, [call, f"Answer: {task.ground_truth}"])
    tool_message = next(m for m in result.trajectory.messages if m["role"] == "tool")
    assert tool_message["content"] == task.ground_truth
    assert result.reward == 1.0


def test_the_python_tool_runs_in_the_sandbox(qwen_tokenizer):
    environment = MathEnvironment("products", {"min_digits": 3, "max_digits": 3}, tool="python")
    tasks = environment.tasks(3)

    async def run_all():
        rollouts = []
        for task in tasks:
            expression = task.metadata["entry"]["metadata"]["expression"]
            code = json.dumps({"name": "python", "arguments": {"code": f"print({expression})"}})
            engine = ScriptedEngine(
                [
                    qwen_tokenizer.encode(
                        f"<tool_call>\n{code}\n</tool_call>{END}", add_special_tokens=False
                    ),
                    qwen_tokenizer.encode(f"Answer: {task.ground_truth}{END}", add_special_tokens=False),
                ]
            )
            rollouts.append(environment.run_episode(task, engine, qwen_tokenizer, template="qwen3"))
        return await asyncio.gather(*rollouts)  # concurrent rollouts share one pool

    results = asyncio.run(run_all())
    for task, result in zip(tasks, results, strict=True):
        tool_message = next(m for m in result.trajectory.messages if m["role"] == "tool")
        assert task.ground_truth in tool_message["content"]
        assert result.reward == 1.0
    assert not environment._pools._pools  # the loop's pool was closed with its loop
