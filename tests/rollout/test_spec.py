"""RunSpec: one run specification that is the CLI options, the results header, the worker's setup and
the eval report's ``run``; a resume compares exactly the fields declared compared."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import run

from agentboost.cli import build_parser
from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.errors import ConfigError
from agentboost.rollout.results import ResultStore, read_header, read_results
from agentboost.rollout.runner import job_seed
from agentboost.rollout.spec import NOT_COMPARED, RunSpec

SPEC = RunSpec(
    environment="arithmetic",
    environment_kwargs={"difficulty": 2},
    split="test",
    seed=3,
    model="some/model",
    template="chatml",
    temperature=0.25,
    top_p=0.9,
    top_k=5,
    limits={"max_turns": 3, "max_new_tokens": 64, "timeout_s": 12.5},
    tasks=7,
    samples=2,
    engine="sglang",
    urls=("http://127.0.0.1:1", "http://127.0.0.1:2"),
    workers=2,
    concurrency=6,
    retries=1,
    worker_setup_timeout_s=30.0,
)

CHANGES = {
    "environment": "calculator",
    "environment_kwargs": {"difficulty": 3},
    "split": "train",
    "seed": 4,
    "model": "other/model",
    "template": "qwen3",
    "temperature": 1.0,
    "top_p": 0.5,
    "top_k": 0,
    "limits": {"max_turns": 4},
    "tasks": 9,
    "samples": 3,
    "engine": "vllm",
    "urls": ("http://127.0.0.1:3",),
    "workers": "ray",
    "ray_address": "127.0.0.1:6379",
    "concurrency": 1,
    "retries": 0,
    "worker_setup_timeout_s": 5.0,
    "read_timeout_s": 30.0,
    "connect_timeout_s": 2.0,
    "server_down_timeout_s": 0.0,
    "engine_memory_gib": 1.5,
}
"""One other value per field: a new field must be listed here, deciding whether a resume compares it."""

COMPARED = {"environment", "environment_kwargs", "split", "seed", "model", "template"}
COMPARED |= {"temperature", "top_p", "top_k", "limits"}


@pytest.mark.parametrize("command", ["rollout", "eval"])
@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        RunSpec(),
        RunSpec(tasks=None, environment_kwargs={}),
        RunSpec(workers="ray", ray_address="10.0.0.1:6379"),
    ],
    ids=["full", "defaults", "all-tasks", "ray"],
)
def test_a_spec_round_trips_through_the_command_line_options(command, spec):
    args = build_parser().parse_args([command, *spec.to_argv()])
    assert RunSpec.from_args(args) == spec


def test_each_command_has_its_own_defaults_and_no_options_means_them():
    rollout = RunSpec.from_args(build_parser().parse_args(["rollout"]))
    evaluation = RunSpec.from_args(build_parser().parse_args(["eval"]))
    assert rollout == RunSpec(split="train", tasks=4)
    assert evaluation == RunSpec(split="test", tasks=None)


def test_a_spec_round_trips_through_json_as_workers_receive_it():
    assert RunSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    with pytest.raises(ConfigError, match=r"unknown run settings \['colour'\]"):
        RunSpec.from_dict({**SPEC.to_dict(), "colour": "red"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"samples": 0}, "RunSpec.samples must be an integer >= 1"),
        ({"engine": "tgi"}, "unknown engine 'tgi'"),
        ({"limits": {"max_turn": 3}}, "unknown rollout limit 'max_turn'"),
        ({"limits": {"max_turns": 0}}, "max_turns must be an integer >= 1"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"environment_kwargs": {"f": object()}}, "environment_kwargs must be JSON"),
        ({"urls": "http://h:1"}, "RunSpec.urls must be a list of server URLs"),
        ({"tasks": 10**9}, "RunSpec.tasks must be at most 1,000,000"),
        ({"concurrency": 10**8}, "RunSpec.concurrency must be at most 4,096"),
        ({"read_timeout_s": float("nan")}, "RunSpec.read_timeout_s must be a finite number"),
        ({"engine_memory_gib": float("nan")}, "RunSpec.engine_memory_gib must be a finite number of GiB > 0"),
        ({"engine_memory_gib": float("inf")}, "RunSpec.engine_memory_gib must be a finite number of GiB > 0"),
        ({"engine_memory_gib": -1.0}, "RunSpec.engine_memory_gib must be a finite number of GiB > 0"),
    ],
)
def test_a_bad_setting_is_refused_when_the_spec_is_built(changes, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(SPEC, **changes)


def _identity(spec: RunSpec) -> dict:
    return spec.identity(environment_name="arithmetic", limits=spec.resolve_limits(), tasks=spec.tasks or 1)


def test_the_change_table_covers_every_field_and_not_compared_is_derived_from_it():
    assert set(CHANGES) == {field.name for field in dataclasses.fields(RunSpec)}
    recorded_not_compared = {"tasks", "samples", "engine", "urls", "workers", "concurrency", "retries"}
    recorded_not_compared |= {"ray_address"}
    server_timeouts = {"read_timeout_s", "connect_timeout_s", "server_down_timeout_s"}
    engine_sizes = {"engine_memory_gib"}
    facts = {"precision"}  # the embedded engine's resolved precision: recorded, never a reason to refuse
    assert (
        recorded_not_compared | {"worker_setup_timeout_s"} | server_timeouts | engine_sizes | facts
        == NOT_COMPARED
    )


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_resume_compares_exactly_the_compared_fields(name, tmp_path):
    out = tmp_path / "r.jsonl"
    ResultStore(out, identity=_identity(SPEC)).close()
    before = out.read_bytes()
    changed = dataclasses.replace(SPEC, **{name: CHANGES[name]})
    if name in COMPARED:
        with pytest.raises(ConfigError, match="written by a run with other settings"):
            ResultStore(out, identity=_identity(changed))
        assert out.read_bytes() == before
    else:
        ResultStore(out, identity=_identity(changed)).close()


def test_the_results_header_workers_and_eval_report_carry_the_same_spec(qwen_tokenizer, say, tmp_path):
    """One spec runs in this process and in a worker process (same rollouts), then as an evaluation
    whose report's ``run`` is the results header's."""
    from agentboost.eval.evaluate import evaluate_run
    from agentboost.rollout.run import prepare_run, run_rollouts_async

    tokenizer_dir = tmp_path / "tokenizer"
    qwen_tokenizer.save_pretrained(tokenizer_dir)

    async def main():
        server = await start_server(ScriptedEngine([say("Answer: 7")], cycle=True), context_length=40960)
        try:
            spec = RunSpec(
                model=str(tokenizer_dir),
                engine="sglang",
                urls=(server.url,),
                tasks=3,
                samples=2,
                limits={"max_turns": 2},
            )
            here = await run_rollouts_async(spec, tmp_path / "here.jsonl", progress=False)
            in_worker = dataclasses.replace(spec, workers=1)
            there = await run_rollouts_async(in_worker, tmp_path / "there.jsonl", progress=False)
            # workers are not compared: the worker's file resumes in this process, with nothing to do
            resumed = await run_rollouts_async(spec, tmp_path / "there.jsonl", progress=False)
            prepared = await prepare_run(spec)
            report, _ = await evaluate_run(prepared, tmp_path / "eval.jsonl", progress=False)
            return spec, prepared, here, there, resumed, report
        finally:
            await server.close()

    spec, prepared, here, there, resumed, report = run(main())
    assert here.completed == there.completed == 6 and resumed.completed == 0 and resumed.skipped == 6
    # the line names the environment and where the results went, as `agentboost rollout` prints it
    assert here.line().startswith("arithmetic: 6 rollouts (0 already done")
    assert here.line().endswith(f"-> {tmp_path / 'here.jsonl'}")
    header = read_header(tmp_path / "here.jsonl")["run"]
    assert header == prepared.identity == report["run"] == read_header(tmp_path / "eval.jsonl")["run"]
    assert header["limits"]["max_turns"] == 2 and header["sampling"]["temperature"] == spec.temperature
    assert read_header(tmp_path / "there.jsonl")["run"] == {**header, "workers": 1}

    def rollouts(name):
        return [(r.task_id, r.sample, r.trajectory.token_ids) for r in read_results(tmp_path / name)]

    assert sorted(rollouts("here.jsonl")) == sorted(rollouts("there.jsonl"))
    # each trajectory records the sampling it was made with: the spec's, with its own seed
    for result in read_results(tmp_path / "there.jsonl"):
        assert result.trajectory.info["sampling"] == {
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k,
            "seed": job_seed(spec.seed, result.task_id, result.sample),
        }


def test_the_embedded_engine_records_the_precision_it_serves_in_and_a_resume_does_not_compare_it(tmp_path):
    from types import SimpleNamespace

    from agentboost.rollout.run import PreparedRun

    def identity(engine: str) -> dict:
        spec = dataclasses.replace(SPEC, engine=engine, urls=() if engine == "local" else ("http://x:1",))
        environment, tasks = SimpleNamespace(name="arithmetic"), SimpleNamespace(count=3)
        return PreparedRun(spec, environment, tasks, spec.resolve_limits()).identity

    local = identity("local")
    assert local["precision"] == {"weights": "float32", "compute": "float32", "device": "cpu"}  # this CPU
    assert "precision" not in identity("vllm")  # a server says its own dtype (``server``)
    path = tmp_path / "results.jsonl"
    ResultStore(path, resume=True, identity={k: v for k, v in local.items() if k != "precision"}).close()
    ResultStore(path, resume=True, identity=local).close()  # a file from before the record resumes
