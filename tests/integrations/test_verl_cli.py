"""``agentboost data to-verl`` and ``agentboost doctor``, through the parser ``agentboost.cli`` builds."""

from __future__ import annotations

import json

import pytest

from agentboost.cli import build_parser
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.integrations.verl.data import read_row, task_rows


def agentboost(*argv: str) -> int:
    """What `agentboost ARGV` runs (errors raise, as the command's function raises them)."""
    args = build_parser().parse_args(list(argv))
    return args.func(args)


class LocalEnvironment(ArithmeticEnvironment):
    pass


def test_data_to_verl_writes_one_row_per_task_that_rebuilds_the_task(tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "data" / "test.parquet"

    code = agentboost(
        "data", "to-verl", "--env", "arithmetic", "--env-kwargs", '{"difficulty": 2}', "-n", "3",
        "--seed", "5", "--split", "test", "--out", str(out),
    )  # fmt: skip

    assert code == 0
    assert capsys.readouterr().out.strip() == f"3 test tasks of arithmetic -> {out}"
    rows = pq.read_table(out).to_pylist()
    expected = ArithmeticEnvironment(difficulty=2).tasks(3, seed=5, split="test")
    assert [row["extra_info"]["task_id"] for row in rows] == [task.id for task in expected]
    first = rows[0]
    assert first["data_source"] == "arithmetic" and first["agent_name"] == "agentboost"
    assert [message["role"] for message in first["prompt"]] == ["system", "user"]
    assert first["prompt"][1]["content"] == expected[0].prompt
    assert first["reward_model"] == {"style": "rule", "ground_truth": str(expected[0].ground_truth)}
    assert first["extra_info"]["environment"] == "agentboost.envs.arithmetic:ArithmeticEnvironment"
    assert [row["extra_info"]["index"] for row in rows] == [0, 1, 2]

    # what the agent loop does with a row in a veRL worker: the same environment, the same task
    spec = read_row(first)
    environment = make_environment(spec.environment, spec.environment_kwargs)
    assert environment.difficulty == 2
    assert Task.from_dict(spec.task) == expected[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env-kwargs", "{difficulty: 2}"], "--env-kwargs is not valid JSON"),
        (["--env-kwargs", "[2]"], "must be a JSON object"),
        (["--env", "nowhere.at.all:Env"], "cannot import environment"),
        (["--split", "holdout"], "unknown split 'holdout'"),
        (["--out", "tasks.json"], "must end in .parquet"),
    ],
)
def test_data_to_verl_refuses_bad_input_with_a_clear_message(argv, message, tmp_path):
    pytest.importorskip("pyarrow")
    out = [] if "--out" in argv else ["--out", str(tmp_path / "train.parquet")]
    with pytest.raises(ConfigError, match=message):
        agentboost("data", "to-verl", "-n", "2", *out, *argv)


def test_rows_need_an_environment_other_processes_can_import():
    with pytest.raises(ConfigError, match="define it at the top level of an importable module"):

        class Nested(ArithmeticEnvironment):
            pass

        task_rows(Nested(), Nested().tasks(1))


def test_rows_carry_any_task_shape_as_json():
    environment = LocalEnvironment()
    rows = task_rows(
        environment, environment.tasks(2), environment_kwargs={"difficulty": 1}, data_source="math"
    )
    assert rows[0]["data_source"] == "math"
    assert json.loads(rows[1]["extra_info"]["task"])["id"] == environment.tasks(2)[1].id
    assert rows[0]["extra_info"]["environment"].endswith(":LocalEnvironment")


def test_a_row_without_agentboost_fields_is_refused():
    with pytest.raises(ConfigError, match="agentboost data to-verl"):
        read_row({"extra_info": {"index": 3}})
    with pytest.raises(ConfigError, match=r"extra_info\.task is not valid JSON"):
        read_row({"extra_info": {"environment": "arithmetic", "task": "{oops"}})


def test_doctor_reports_versions_and_that_the_agent_loop_imports(capsys):
    pytest.importorskip("verl")
    from importlib import metadata

    code = agentboost("doctor")

    report = capsys.readouterr().out
    assert code == 0, report
    for package in ("verl", "vllm", "sglang", "torch", "transformers", "strands-agents"):
        assert f"  {package} " in report
    assert metadata.version("verl") in report and metadata.version("strands-agents") in report
    assert "agent loop: ok (agentboost.integrations.verl.agent_loop.AgentBoostAgentLoop)" in report
