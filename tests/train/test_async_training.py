"""Asynchronous training (agentboost/train/async_collect.py): equivalence, the staleness bound, whole
groups, partial rollouts, resume."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from strands import tool
from test_trainer import toy_config
from train_toy_env import FirstToken, SimulatedKill, save_toy_model

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment, Episode
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.rollout.results import read_results
from agentboost.tokens.trajectory import Trajectory
from agentboost.train.async_collect import staleness
from agentboost.train.config import config_from_dict
from agentboost.train.logging import read_metrics
from agentboost.train.trainer import Trainer


@pytest.fixture(scope="module")
def toy_model(qwen_tokenizer, tmp_path_factory):
    return save_toy_model(tmp_path_factory.mktemp("tiny-qwen3"), qwen_tokenizer)


@pytest.fixture(scope="module")
def target(qwen_tokenizer) -> int:
    """The toy task's target: the line-break token."""
    (token,) = qwen_tokenizer.encode("\n", add_special_tokens=False)
    return token


def rollouts(run_dir, step):
    return sorted(
        (r.task_id, r.sample, r.trajectory.token_ids, r.trajectory.weight_versions, r.reward)
        for r in read_results(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
    )


def logprobs(run_dir, step):
    found = sorted(
        (r.task_id, r.sample, [p for p in r.trajectory.logprobs if p is not None])
        for r in read_results(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
    )
    return [value for *_, values in found for value in values]


def test_max_staleness_0_through_the_async_path_is_the_synchronous_trainer_bit_for_bit(
    toy_model, target, tmp_path
):
    sections = {"rollout": {"tasks_per_step": 4, "group_size": 4}, "optimizer": {"lr": 1e-2}, "steps": 2}
    synchronous = Trainer(
        toy_config(toy_model, tmp_path / "sync", **sections), environment=FirstToken(target)
    )
    synchronous.train()
    sections["rollout"] = {**sections["rollout"], "asynchronous": True, "max_staleness": 0}
    asynchronous = Trainer(
        toy_config(toy_model, tmp_path / "async", **sections), environment=FirstToken(target)
    )
    asynchronous.train()

    for (name, expected), (_, actual) in zip(
        synchronous.model.named_parameters(), asynchronous.model.named_parameters(), strict=True
    ):
        assert torch.equal(expected, actual), name
    for step in range(2):
        assert rollouts(tmp_path / "sync", step) == rollouts(tmp_path / "async", step)
        # the engine's own logprobs depend on which requests it batched together (timing): equal to
        # float32 rounding; the update reads the trainer's, so the weights above are bit for bit
        assert logprobs(tmp_path / "async", step) == pytest.approx(
            logprobs(tmp_path / "sync", step), abs=1e-5
        )
        # every generated token carries the version that made it: step s's rollouts ran on version s
        for run in ("sync", "async"):
            for result in read_results(tmp_path / run / "rollouts" / f"step_{step:06d}.jsonl"):
                assert result.trajectory.weight_versions == [step]
    train = [r for r in read_metrics(tmp_path / "async" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["async/staleness_0"] for r in train] == [16.0, 16.0]
    assert [r["async/dropped_groups"] for r in train] == [0.0, 0.0]

    def comparable(run):  # what the update did; timing, memory and the engine's logprobs aside
        return [
            {
                k: v
                for k, v in r.items()
                if k.startswith(("policy/", "optim/", "reward/", "batch/", "groups/"))
            }
            for r in read_metrics(tmp_path / run / "metrics.jsonl")
            if r["kind"] == "train"
        ]

    assert comparable("sync") == comparable("async")
    assert sum(r["optim/updates"] for r in train) >= 1  # the weights really moved


# --- a scripted engine: every rollout calls a tool, then answers; the tool waits as the test says ------


class Waits(Environment):
    """Each rollout: a tool call, the tool (which waits until ``until(episode)`` holds, when it names a
    condition), an answer. Rewards differ within a group (sample parity), so groups carry a signal."""

    name = "waits"
    system_prompt = "Call the tool, then answer."
    template = "qwen3"
    limits = RolloutLimits(max_turns=4)

    def __init__(self) -> None:
        self.until: Callable[[Episode], Callable[[], bool] | None] = lambda episode: None

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task(f"{split}-{index}", f"task {index}") for index in range(8 if n is None else n)]

    def tools(self, episode):
        condition = self.until(episode)

        @tool
        async def wait() -> str:
            """Wait for the world."""
            deadline = time.monotonic() + 30
            while condition is not None and not condition():
                assert time.monotonic() < deadline, "the condition never held"
                await asyncio.sleep(0.005)
            return "ok"

        return [wait]

    def reward(self, trajectory, episode):
        return float(episode.sample % 2)


class ScriptedTrainer(Trainer):
    """The trainer (a tiny real model updates) with a scripted engine; records what each step trained on."""

    def __init__(self, config, *, environment, engine) -> None:
        self.scripted = engine
        super().__init__(config, environment=environment)
        self.trained: list[tuple[int, list, list]] = []

    def _make_engine(self):
        return self.scripted

    def make_samples(self, results, *, groups=None):
        self.trained.append((self.step, list(groups), list(results)))
        return super().make_samples(results, groups=groups)


TOOL_CALL = '<tool_call>\n{"name": "wait", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def scripted_engine(qwen_tokenizer, say):
    """Calls the tool on the first turn, answers once the tool responded (the system prompt names
    ``<tool_response>`` once: a second one is the tool's)."""
    response_id = qwen_tokenizer.convert_tokens_to_ids("<tool_response>")
    call, answer = say(TOOL_CALL), say("done")

    def make():
        return ScriptedEngine(
            lambda prompt, _: answer if prompt.count(response_id) > 1 else call, logprob=-0.25
        )

    return make, call


def scripted_run(toy_model, tmp_path, engine, *, steps=3, checkpoint=None, **rollout):
    environment = Waits()
    config = toy_config(
        toy_model,
        tmp_path,
        environment={"train_tasks": 8},
        rollout={"tasks_per_step": 2, "group_size": 2, "max_staleness": 1, **rollout},
        steps=steps,
        checkpoint={"every": 0, "save_final_model": False, **(checkpoint or {})},
    )
    return ScriptedTrainer(config, environment=environment, engine=engine), environment


def check_bound_and_whole_groups(trainer, bound=1):
    for step, keys, results in trainer.trained:
        assert all(staleness(result, step) <= bound for result in results), step
        assert set(Counter(keys).values()) <= {trainer.config.rollout.group_size}, keys


def test_partial_rollouts_continue_on_new_weights_keeping_their_prefix_and_every_tokens_version(
    toy_model, scripted_engine, tmp_path
):
    make, call = scripted_engine
    trainer, environment = scripted_run(toy_model, tmp_path / "run", make())
    origin = {task.id: step for step in range(3) for task in trainer.tasks_for_step(step)}
    collector, engine = trainer._async, trainer.scripted

    def until(episode):
        if origin[episode.task.id] == 0:  # step 0's tools wait for the first turns of steps 0 and 1
            return lambda: engine.calls >= 8
        # a rollout of step t >= 1 waits in its tool for version t: collected one step ahead, its first
        # turn ran on version t-1 (step 2's: on 1, or on 2 when it started after update 1), its answer
        # on t, after the update
        return lambda: collector.version >= origin[episode.task.id]

    environment.until = until
    trainer.train()

    check_bound_and_whole_groups(trainer)
    spanned = 0
    for step, _, results in trainer.trained:
        for result in results:
            trajectory = result.trajectory
            assert origin[result.task_id] == step
            first, second = (s for s in trajectory.segments if s.role == "assistant")
            assert trajectory.token_ids[first.start : first.end] == call  # the prefix kept, as generated
            assert trajectory.logprobs[first.start : first.end] == [-0.25] * len(call)
            versions = trajectory.token_versions()
            assert all(versions[i] is None for i, kept in enumerate(trajectory.loss_mask) if not kept)
            assert all(versions[i] == first.weight_version for i in range(first.start, first.end))
            assert all(versions[i] == second.weight_version for i in range(second.start, second.end))
            expected = {0: [[0]], 1: [[0, 1]], 2: [[1, 2], [2]]}[step]
            assert trajectory.weight_versions in expected
            spanned += len(trajectory.weight_versions) == 2
    assert spanned >= 4  # every rollout of step 1 spanned an update (step 2's, when they started before it)
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["async/versions_spanned_max"] for r in train][:2] == [1.0, 2.0]
    assert [r["async/staleness_1"] for r in train][:2] == [0.0, 4.0]
    assert [r["async/dropped_groups"] for r in train] == [0.0] * 3
    assert train[-1]["async/groups_left_over"] == 0.0
    assert all(r["time/trainer_idle_s"] >= 0 and r["time/engine_idle_s"] >= 0 for r in train)


def test_a_group_over_the_bound_is_dropped_whole_and_counted_never_trained(
    toy_model, scripted_engine, tmp_path
):
    make, _ = scripted_engine
    trainer, environment = scripted_run(toy_model, tmp_path / "run", make())
    straggler = trainer.tasks_for_step(0)[0].id
    # one member of one of step 0's groups waits until version 2: its group is then 2 versions old
    collector = trainer._async
    environment.until = lambda episode: (
        (lambda: collector.version >= 2) if (episode.task.id, episode.sample) == (straggler, 0) else None
    )
    trainer.train()

    check_bound_and_whole_groups(trainer)
    trained = [(result.task_id, result.sample) for _, _, results in trainer.trained for result in results]
    assert (straggler, 1) not in trained and (straggler, 0) not in trained  # neither member: whole
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert sum(r["async/dropped_groups"] for r in train) == 1.0
    assert sum(r["async/groups_trained"] for r in train) == 5.0
    assert train[-1]["async/groups_left_over"] == 0.0


class KilledAtStep(ScriptedTrainer):
    """Dies once step ``kill_at``'s metrics are logged, before its checkpoint (as SIGKILL would), when
    the next step's collection, started ahead, has ended."""

    kill_at = 1

    def update(self, samples, step):
        if step == self.kill_at:  # a group of the next step, started ahead, has ended on this step's weights
            deadline = time.monotonic() + 60
            while not self._async._collections[step + 1].announced:
                assert time.monotonic() < deadline, "no group of the next step ended"
                time.sleep(0.01)
        return super().update(samples, step)

    def finished_step(self, step, metrics):
        if step == self.kill_at:
            self._async._collections[step + 1].future.result(timeout=60)
            raise SimulatedKill()


def collected(run_dir, steps):
    """``(step, task, sample) -> (token ids, logprobs, versions)`` of the run's rollout files."""
    return {
        (step, r.task_id, r.sample): (
            r.trajectory.token_ids,
            r.trajectory.logprobs,
            r.trajectory.weight_versions,
        )
        for step in steps
        for r in read_results(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
    }


def test_an_interrupted_async_run_resumes_keeping_what_it_collected_ahead_on_weights_it_still_has(
    toy_model, scripted_engine, tmp_path
):
    make, _ = scripted_engine
    killed, environment = scripted_run(toy_model, tmp_path / "run", make(), checkpoint={"every": 1})
    killed.__class__ = KilledAtStep
    # one group of step 2 (collected ahead from step 1 on) answers after update 1, on weights the
    # checkpoint of step 1 will not have; the other group ends on version 1, the checkpoint's
    late = killed.tasks_for_step(2)[0].id
    collector = killed._async
    environment.until = lambda episode: (lambda: collector.version >= 2) if episode.task.id == late else None
    with pytest.raises(SimulatedKill):
        killed.train()
    assert [path.name for path in killed.checkpoints()] == ["step_000001"]
    before = collected(tmp_path / "run", (1, 2))
    assert len(before) == 8
    lost = {key for key, (_, _, versions) in before.items() if max(versions) > 1}
    assert {key[1] for key in lost} == {late} and len(lost) == 2

    engine = make()
    resumed, _ = scripted_run(toy_model, tmp_path / "run", engine, checkpoint={"every": 1})
    summary = resumed.train()
    assert summary.steps == 3 and summary.resumed_from == 1
    assert [step for step, _, _ in resumed.trained] == [1, 2]
    check_bound_and_whole_groups(resumed)
    after = collected(tmp_path / "run", (1, 2))
    # what was collected ahead on the checkpoint's weights or older is reused as it was, not collected
    # again; the rollouts with a token of the lost version 2 were collected again (two turns each)
    for key, rollout in before.items():
        if key not in lost:
            assert after[key] == rollout, key
    assert engine.calls == 2 * len(lost)
    assert all(max(after[key][2]) <= 2 and after[key][2][0] >= 1 for key in lost)
    trained = {
        (origin, r.task_id, r.sample)
        for _, keys, results in resumed.trained
        for (origin, _), r in zip(keys, results, strict=True)
    }
    assert trained == set(after)  # every rollout of steps 1 and 2 trained, the reused ones included


def test_the_settings_say_what_is_wrong_and_stale_data_gets_a_clipped_correction(tmp_path):
    def config(**rollout):
        return config_from_dict({"rollout": rollout, "output_dir": str(tmp_path)})

    with pytest.raises(ConfigError, match="max_staleness must be >= 0"):
        config(max_staleness=-1)
    with pytest.raises(ConfigError, match="needs the asynchronous collector"):
        config(max_staleness=2, asynchronous=False)
    with pytest.raises(ConfigError, match="workers with asynchronous training is not supported"):
        config(max_staleness=1, workers="ray", vllm_url="http://127.0.0.1:8000")
    assert not config().rollout.is_async and config(max_staleness=1).rollout.is_async
    assert config(asynchronous=True).rollout.is_async  # max_staleness 0 through the async path
    algorithm = config().algorithm
    assert algorithm.correction(exact=True).correction == "none"
    assert algorithm.correction(exact=True, stale=True).correction == "icepop"  # masked outside the band


def test_a_segment_without_a_version_is_stored_as_before(scripted_trajectory):
    data = scripted_trajectory.to_dict()
    assert all("weight_version" not in segment for segment in data["segments"])
    tagged = Trajectory.from_dict(data)
    tagged.segments[1].weight_version = 3
    again = Trajectory.from_dict(tagged.to_dict())
    assert again.segments[1].weight_version == 3 and again.weight_versions == [3]
    assert again.token_versions()[again.segments[1].start] == 3
