"""The coding environment end to end: scripted model output, the real sandbox, real tokenizer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.coding.data import prepare_tasks, write_tasks
from agentboost.envs.coding.environment import TOOL_NAME, CodingEnvironment
from agentboost.envs.coding.shared_pool import shared_pools
from agentboost.envs.registry import make_environment
from agentboost.errors import ConfigError

FIXTURES = Path(__file__).parents[1] / "data" / "coding"
GOOD = "a, b = map(int, input().split())\nprint(a + b)\n"
BAD = "a, b = map(int, input().split())\nprint(a - b)\n"
HIDDEN_ONLY = ("7777777", "7777778", "8888888", "8888883")
"""Inputs and outputs of hidden tests that are not public: the model must never see them."""


def tool_call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": TOOL_NAME, "arguments": {"code": code}}) + "\n</tool_call>"


def answer(code: str) -> str:
    return f"Here is my program.\n```python\n{code}```"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    report = prepare_tasks(
        [str(FIXTURES / "livecodebench_lite.jsonl"), str(FIXTURES / "deepcoder_taco.jsonl")]
    )
    return str(write_tasks(report.tasks, tmp_path_factory.mktemp("coding") / "tasks.jsonl"))


def rollout(environment, task, turns, tokenizer, say, **kwargs):
    engine = ScriptedEngine([say(text) for text in turns])
    engine.record_prompts = True
    result = asyncio.run(environment.run_episode(task, engine, tokenizer, template="qwen3", **kwargs))
    return result, engine


def stdio_task(environment):
    return next(t for t in environment.tasks() if t.id == "lcb-stdin-1")


def test_public_tests_reach_the_tool_and_hidden_tests_never_do(data, qwen_tokenizer, say):
    environment = make_environment("coding", {"data": data})
    task = stdio_task(environment)
    result, engine = rollout(
        environment, task, [tool_call(BAD), tool_call(GOOD), answer(GOOD)], qwen_tokenizer, say
    )
    trajectory = result.trajectory
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert [m["metadata"] for m in tool_messages] == [
        {"status": "wrong_output", "passed": 0, "total": 1},
        {"status": "passed", "passed": 1, "total": 1},
    ]
    first_report = str(tool_messages[0]["content"])
    assert (
        "status: wrong_output" in first_report and "input: 1 2" in first_report and "got: -1" in first_report
    )
    seen = [qwen_tokenizer.decode(prompt) for prompt in engine.prompts]
    seen.append(qwen_tokenizer.decode(trajectory.token_ids))
    seen.append(json.dumps(trajectory.messages))
    for text in seen:
        assert not any(value in text for value in HIDDEN_ONLY)
    assert result.reward == 1.0
    assert result.reward_breakdown == {
        "submitted": 1.0,
        "tested_before_submit": 1.0,
        "tests_passed": 3.0,
        "tests_total": 3.0,
    }
    assert result.reward_info["first_failure_status"] is None


def test_no_fenced_block_is_no_submission(data, qwen_tokenizer, say):
    environment = CodingEnvironment(data=data)
    result, _ = rollout(
        environment, stdio_task(environment), ["print(a + b) is my answer"], qwen_tokenizer, say
    )
    assert result.reward == 0.0
    assert (
        result.reward_breakdown["submitted"] == 0.0 and result.reward_breakdown["tested_before_submit"] == 0.0
    )
    assert result.reward_info["first_failure_status"] == "no_submission"


def test_a_wrong_submission_scores_zero_or_its_fraction(data, qwen_tokenizer, say):
    half_right = "a, b = map(int, input().split())\nprint(a + b if max(a, b) < 100 else 0)\n"
    binary = CodingEnvironment(data=data)
    result, _ = rollout(binary, stdio_task(binary), [answer(half_right)], qwen_tokenizer, say)
    assert result.reward == 0.0 and result.reward_info["first_failure_status"] == "wrong_output"
    assert result.reward_breakdown["tested_before_submit"] == 0.0
    fraction = CodingEnvironment(data=data, reward="fraction")
    result, _ = rollout(fraction, stdio_task(fraction), [answer(half_right)], qwen_tokenizer, say)
    assert result.reward == pytest.approx(1 / 3)
    assert (result.reward_breakdown["tests_passed"], result.reward_breakdown["tests_total"]) == (1.0, 3.0)


@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("while True:\n    pass\n", "timeout"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "runtime_error"),
        ("while True:\n    print('x' * 4096)\n", "output_limit"),
        ("print(open('/proc/1/environ').read() + open('tests.json').read())\n", "runtime_error"),
        ("def broken(:\n", "compile_error"),
    ],
)
def test_hostile_submissions_and_tool_calls_fail_with_the_right_status(
    data, qwen_tokenizer, say, program, status
):
    environment = CodingEnvironment(data=data, time_limit_s=1.5, reward="fraction")
    result, _ = rollout(
        environment, stdio_task(environment), [tool_call(program), answer(program)], qwen_tokenizer, say
    )
    tool_message = next(m for m in result.trajectory.messages if m["role"] == "tool")
    assert tool_message["metadata"]["status"] == status
    assert result.reward == 0.0 and result.reward_info["first_failure_status"] == status


def test_function_call_tasks_run_solution_methods(data, qwen_tokenizer, say):
    environment = CodingEnvironment(data=data)
    task = next(t for t in environment.tasks() if t.id == "lcb-functional-1")
    program = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b\n"
    result, _ = rollout(environment, task, [tool_call(program), answer(program)], qwen_tokenizer, say)
    assert result.reward == 1.0 and result.reward_breakdown["tests_total"] == 3.0


def test_concurrent_rollouts_share_one_pool_per_loop(data, qwen_tokenizer, say):
    environment = CodingEnvironment(data=data, pool_size=2)
    task = stdio_task(environment)

    async def many() -> list:
        results = await asyncio.gather(
            *(
                environment.run_episode(
                    task,
                    ScriptedEngine([say(tool_call(GOOD)), say(answer(GOOD))]),
                    qwen_tokenizer,
                    template="qwen3",
                    sample=sample,
                )
                for sample in range(8)
            )
        )
        pools = [pool for pool in shared_pools() if pool.size == 2]
        return results, pools

    results, pools = asyncio.run(many())
    assert [r.reward for r in results] == [1.0] * 8
    assert len(pools) == 1 and pools[0].workers_started == 2  # 8 rollouts x 2 tool + 3 reward runs, 2 workers
    # a new event loop (the local trainer runs one per step) gets a new pool; the old one is closed
    results, later = asyncio.run(many())
    assert [r.reward for r in results] == [1.0] * 8
    assert len(later) == 1 and later[0] is not pools[0]


def test_task_prompt_shows_starter_code_and_not_hidden_tests(data):
    environment = CodingEnvironment(data=data)
    for task in environment.tasks():
        assert isinstance(task.prompt, str)
        assert not any(value in task.prompt for value in HIDDEN_ONLY)
    functional = next(t for t in environment.tasks() if t.id == "lcb-functional-1")
    assert "class Solution" in functional.prompt and "`add`" in functional.prompt


def test_humaneval_train_and_test_are_disjoint_by_id_and_problem_text():
    from agentboost.envs.coding.data import humaneval_split

    environment = make_environment("coding")
    train, test = environment.tasks(split="train"), environment.tasks(split="test")
    assert (len(train), len(test), len(environment.tasks(split="all"))) == (113, 51, 164)
    assert {t.id for t in train}.isdisjoint(t.id for t in test)
    assert {" ".join(t.prompt.split()) for t in train}.isdisjoint(" ".join(t.prompt.split()) for t in test)
    assert all(humaneval_split(t.id) == "test" for t in test)  # the documented hash, not a draw
    assert [t.id for t in test[:3]] == ["HumanEval/4", "HumanEval/5", "HumanEval/6"]
    with pytest.raises(ConfigError, match="splits train, test and all"):
        environment.tasks(split="validation")


def test_bad_environment_arguments_are_config_errors():
    from agentboost.errors import ConfigError

    with pytest.raises(ConfigError, match="reward"):
        make_environment("coding", {"reward": "partial"})
    with pytest.raises(ConfigError, match="humaneval_mode"):
        make_environment("coding", {"humaneval_mode": "fast"})
    with pytest.raises(ConfigError, match="output_compare"):
        make_environment("coding", {"output_compare": "fuzzy"})


def test_humaneval_by_default_through_the_whole_rollout(qwen_tokenizer, say, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTBOOST_HOME", str(tmp_path))  # prepares HumanEval afresh (sandbox-checked)
    environment = make_environment("coding")
    tasks = environment.tasks(3, split="all")
    assert [t.id for t in tasks] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert (tmp_path / "coding" / "humaneval.jsonl").exists()
    for task in tasks:
        coding = environment.coding_task(task)
        whole = coding.starter_code + coding.metadata["canonical_solution"]
        broken = coding.starter_code + "    return None\n"
        result, _ = rollout(environment, task, [tool_call(whole), answer(whole)], qwen_tokenizer, say)
        assert result.reward == 1.0 and result.trajectory.messages[3]["metadata"]["status"] == "passed"
        result, _ = rollout(environment, task, [answer(broken)], qwen_tokenizer, say)
        assert result.reward == 0.0 and result.reward_info["first_failure_status"] in (
            "wrong_output",
            "runtime_error",
        )
