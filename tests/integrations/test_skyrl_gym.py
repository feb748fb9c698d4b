"""skyrl-gym's own text2sql environment (its SQL tool group, its reward over a real SQLite database) and its
multi-turn GSM8K run through ``--env skyrl-gym:...`` on agentboost's agent loop: token-exact rollouts
(against teacher forcing), every signal mapped, eval, a GRPO step."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest
import torch
from conftest import memorize, train_one_grpo_step
from exactness_support import RecordingEngine, check_exactness

pytest.importorskip("skyrl_gym")

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from agentboost.engines.base import SamplingParams
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.registry import environment_reference, make_environment
from agentboost.errors import ConfigError
from agentboost.eval.evaluate import evaluate
from agentboost.rollout.results import read_results
from agentboost.tokens.trajectory import TerminationReason

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TEXT2SQL = "skyrl-gym:text2sql"
SYSTEM = (
    "Query the database with <sql>...</sql>, then answer with <think>...</think><solution>SQL</solution>."
)
GOLD = "SELECT count(*) FROM items WHERE price > 2"
QUERY_TURN = "<think>count them</think>\n<sql>SELECT name FROM items WHERE price > 2</sql>"
ANSWER_TURN = f"<think>two rows</think>\n<solution>{GOLD}</solution>"


def sql_user(qwen_tokenizer, say):
    """Queries the database first, then answers once the environment's observation is in the prompt."""

    def script(prompt_ids, index):
        seen = "<observation>" in qwen_tokenizer.decode(prompt_ids)
        return say(ANSWER_TURN if seen else QUERY_TURN)

    return script


class AssistantObservation(BaseTextEnv):
    """Written in skyrl-gym's style; answers with an observation agentboost cannot show (role assistant)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()

    def step(self, action):
        return BaseTextEnvStepOutput(
            observations=[{"role": "assistant", "content": "x"}], reward=0.0, done=False, metadata={}
        )


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """A spider-layout SQLite database, where skyrl-gym's text2sql environment looks for it."""
    root = tmp_path_factory.mktemp("sql")
    folder = root / "spider" / "database" / "shop"
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / "shop.sqlite") as connection:
        connection.execute("CREATE TABLE items (name TEXT, price REAL)")
        connection.executemany(
            "INSERT INTO items VALUES (?, ?)", [("pen", 1.5), ("book", 9.0), ("lamp", 20.0)]
        )
    return root


@pytest.fixture(scope="module")
def kwargs(database):
    rows = [
        {
            "id": f"shop-{n}",
            "prompt": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "How many items cost more than 2?"},
            ],
            "env_class": "text2sql",
            "db_id": "shop",
            "data": "spider",
            "max_turns": 3,
            "reward_spec": {"method": "rule", "ground_truth": GOLD},
        }
        for n in range(2)
    ]
    tasks = database / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"tasks": str(tasks), "config": {"db_path": str(database)}, "template": "qwen3"}


@pytest.fixture(scope="module")
def scripted(kwargs, qwen_tokenizer, say):
    """The text2sql conversation on the scripted engine: one query, the database's rows, one answer."""
    env = make_environment(TEXT2SQL, kwargs)
    engine = RecordingEngine(ScriptedEngine(sql_user(qwen_tokenizer, say)))
    return engine, asyncio.run(env.run_episode(env.tasks()[0], engine, qwen_tokenizer))


def test_text2sql_runs_token_exact_with_its_tool_and_reward(scripted, kwargs, qwen_tokenizer):
    engine, result = scripted
    trajectory = result.trajectory
    assert environment_reference(make_environment(TEXT2SQL, kwargs)).endswith(":SkyRLGymEnvironment")
    assert result.termination is TerminationReason.COMPLETED, trajectory.termination_detail
    assert result.reward == 1.0  # skyrl-gym's compute_score_single ran both queries on the database
    assert result.reward_info["step_rewards"] == [0.0, 1.0]
    observation = [m for m in trajectory.messages if m["role"] == "user"][-1]["content"]
    assert "book" in observation and "lamp" in observation and "pen" not in observation  # the SQL tool ran
    # token-exact: every prompt extends the previous one; generated tokens mask 1 with logprobs, the
    # environment's observation mask 0
    assert len(engine.prompts) == 2
    for earlier, later in zip(engine.prompts, [*engine.prompts[1:], trajectory.token_ids], strict=True):
        assert later[: len(earlier)] == earlier
    generated = qwen_tokenizer.decode(
        [t for t, bit in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if bit]
    )
    assert generated == f"{QUERY_TURN}<|im_end|>{ANSWER_TURN}<|im_end|>"
    assert "<observation>" not in generated
    assert all(
        (lp is None) == (bit == 0) for lp, bit in zip(trajectory.logprobs, trajectory.loss_mask, strict=True)
    )


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_text2sql_rollouts_of_a_real_model_match_teacher_forcing(
    temperature, scripted, kwargs, qwen_tokenizer, tmp_path_factory
):
    from transformers import AutoModelForCausalLM

    from agentboost.engines.embedded.engine import LocalEngine

    directory = tmp_path_factory.getbasetemp() / "skyrl-memorized"
    if not directory.exists():
        memorize(scripted[1].trajectory, directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    engine = RecordingEngine(LocalEngine(model))
    env = make_environment(TEXT2SQL, {**kwargs, "limits": {"max_new_tokens": 48}})
    sampling = SamplingParams(temperature=temperature, top_p=0.95, top_k=50, seed=7)
    result = asyncio.run(env.run_episode(env.tasks()[0], engine, qwen_tokenizer, sampling=sampling))
    check_exactness(model, engine, result.trajectory, temperature=temperature)
    if temperature == 0:  # greedy: the model really queried the database and answered right
        assert result.reward == 1.0 and result.trajectory.token_ids == scripted[1].trajectory.token_ids


def test_signals_limits_and_bad_configuration(kwargs, qwen_tokenizer, say, tmp_path):
    rows = tmp_path / "gsm8k.jsonl"
    row = {"prompt": [{"role": "user", "content": "6 * 7?"}], "reward_spec": {"ground_truth": "42"}}
    rows.write_text(
        json.dumps({**row, "extra_info": {"index": 0}}) + "\n" + json.dumps({"id": "bad", "prompt": "?"})
    )
    gsm8k = {"tasks": str(rows), "template": "qwen3"}
    wrong = ScriptedEngine([say("#### 41")], cycle=True)
    right = ScriptedEngine([say("#### 41"), say("#### 42")])
    env = make_environment("skyrl-gym:gsm8k_multi_turn", gsm8k)
    first, bad = env.tasks()
    assert first.id == "0"
    # the environment's own turns: a wrong answer gets its format score and the next instruction; a right
    # one ends it (completed)
    result = asyncio.run(env.run_episode(first, right, qwen_tokenizer))
    assert result.termination is TerminationReason.COMPLETED and result.reward_info["step_rewards"] == [
        0.04,
        1.0,
    ]
    assert "'#### ANSWER'" in [m for m in result.trajectory.messages if m["role"] == "user"][-1]["content"]
    # agentboost's max_turns ends it first: the last turn is still stepped and scored
    limited = make_environment("skyrl-gym:gsm8k_multi_turn", {**gsm8k, "limits": {"max_turns": 2}})
    result = asyncio.run(limited.run_episode(first, wrong, qwen_tokenizer))
    assert result.termination is TerminationReason.MAX_TURNS and result.reward_info["step_rewards"] == [
        0.04,
        0.04,
    ]
    # a row the environment refuses (no reward_spec), and an observation it cannot show: env_error
    result = asyncio.run(env.run_episode(bad, wrong, qwen_tokenizer))
    assert (
        result.termination is TerminationReason.ENV_ERROR
        and "refused task 'bad'" in result.trajectory.termination_detail
    )
    odd = make_environment("skyrl-gym:test_skyrl_gym:AssistantObservation", gsm8k)
    result = asyncio.run(odd.run_episode(first, wrong, qwen_tokenizer))
    assert (
        result.termination is TerminationReason.ENV_ERROR
        and "role 'user'" in result.trajectory.termination_detail
    )
    with pytest.raises(ConfigError, match="no skyrl-gym environment 'nope'; registered: aime"):
        make_environment("skyrl-gym:nope", gsm8k)
    with pytest.raises(ConfigError, match="unknown rollout limit 'turns'"):
        make_environment("skyrl-gym:gsm8k", {**gsm8k, "limits": {"turns": 2}})
    with pytest.raises(ConfigError, match="not a skyrl_gym BaseTextEnv subclass"):
        make_environment("skyrl-gym:json:JSONDecoder", gsm8k)
    with pytest.raises(ConfigError, match="needs an id"):
        rows.write_text(json.dumps(row) + "\n")
        make_environment("skyrl-gym:gsm8k", gsm8k).tasks()


def test_eval_and_a_grpo_step_on_text2sql(kwargs, qwen_tokenizer, say, tmp_path):
    env = make_environment(TEXT2SQL, kwargs)
    engine = ScriptedEngine(sql_user(qwen_tokenizer, say))
    report, summary = asyncio.run(
        evaluate(env, engine, qwen_tokenizer, env.tasks(), out=tmp_path / "eval.jsonl", progress=False)
    )
    assert summary.completed == 2 and report["pass@k"]["1"] == 1.0

    rollouts = train_one_grpo_step(qwen_tokenizer, tmp_path, TEXT2SQL, kwargs, train_tasks=2)
    results = [r for path in rollouts.glob("*.jsonl") for r in read_results(path)]
    assert len(results) == 4 and {r.trajectory.info["environment"] for r in results} == {"skyrl-gym"}
