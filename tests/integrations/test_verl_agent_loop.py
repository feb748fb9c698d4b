"""agentboost's veRL agent loop, run the way veRL's agent-loop worker runs it.

The worker is veRL's real ``AgentLoopWorker`` built from veRL's real trainer config, which loads the shipped
``agent_loop.yaml``; the loop is instantiated from that registry entry exactly as the worker does. Only the
server manager is fake: it has veRL's ``generate(request_id, *, prompt_ids, sampling_params, ...)`` signature
and returns veRL's ``TokenOutput``, backed by the embedded engine (a tiny random Qwen3) or a scripted one.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

import asyncio
import copy
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import hydra
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.rollout.replica import TokenOutput

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment, generate_tasks
from agentboost.errors import EngineError
from agentboost.integrations.verl import AGENT_LOOP_NAME, agent_loop_config_path
from agentboost.integrations.verl.config import compose_trainer_config
from agentboost.integrations.verl.data import task_rows, write_verl_dataset
from agentboost.integrations.verl.engine import PromptTooLongError, VerlServerEngine
from agentboost.tokens.trajectory import Trajectory

PROMPT_LENGTH = 512
RESPONSE_LENGTH = 16
TRAIN_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}
"""What veRL's worker passes to run() for training (rollout.calculate_log_probs=False here)."""
VALIDATION_SAMPLING = {
    "temperature": 0,
    "top_p": 1.0,
    "top_k": -1,
    "repetition_penalty": 1.0,
    "logprobs": True,
}


def run(coroutine):
    return asyncio.run(coroutine)


class EngineServerManager:
    """A stand-in for veRL's server manager, backed by an agentboost engine; records every request."""

    def __init__(self, engine: Any, *, fail: Exception | None = None, stop_reason: str = "completed") -> None:
        self.engine = engine
        self.fail = fail
        self.stop_reason = stop_reason
        self.requests: list[dict[str, Any]] = []

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        self.requests.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "sampling_params": dict(sampling_params),
            }
        )
        if self.fail is not None:
            raise self.fail
        if self.stop_reason == "aborted":
            return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted")
        assert sampling_params["ignore_eos"] is True  # the engine below stops only at the given ids too
        sampling = SamplingParams(
            temperature=sampling_params["temperature"],
            top_p=sampling_params["top_p"],
            top_k=max(sampling_params["top_k"], 0),
            stop_token_ids=tuple(sampling_params["stop_token_ids"]),
            seed=len(self.requests),
        )
        generation = await self.engine.generate(
            prompt_ids, sampling, max_new_tokens=sampling_params["max_tokens"]
        )
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.logprobs if sampling_params.get("logprobs") else None,
            stop_reason=self.stop_reason,
            num_preempted=0,
            extra_fields={"global_steps": 7},
        )


class RewardFailsEnvironment(ArithmeticEnvironment):
    """Arithmetic whose reward function crashes."""

    def reward(self, trajectory: Trajectory, task: Any) -> float:
        raise RuntimeError("the grader is down")


# --- fixtures: veRL's config, worker and dataset ------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, qwen_tokenizer, random_qwen3):
    """What actor_rollout_ref.model.path points at: the tiny model's config and the Qwen3 tokenizer."""
    directory = tmp_path_factory.mktemp("tiny-qwen3")
    config = copy.deepcopy(random_qwen3.config)
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(directory)
    qwen_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def trainer_config(model_dir):
    return compose_trainer_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            f"data.max_prompt_length={PROMPT_LENGTH}",
            f"data.max_response_length={RESPONSE_LENGTH}",
            "actor_rollout_ref.rollout.calculate_log_probs=False",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config_path()}",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
        ]
    )


@pytest.fixture(scope="module")
def worker(trainer_config):
    """veRL's agent-loop worker; building it loads agent_loop.yaml into veRL's registry."""
    return AgentLoopWorker(trainer_config, llm_client=None)


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory, worker, trainer_config):
    """`agentboost data to-verl`'s parquet, read by veRL's own dataset class."""
    path, _ = write_verl_dataset("arithmetic", tmp_path_factory.mktemp("data") / "train.parquet", n=2)
    return RLHFDataset(str(path), worker.tokenizer, trainer_config.data)


def make_loop(worker: AgentLoopWorker, server: Any, config: Any = None) -> Any:
    """Instantiate the registered loop with the arguments AgentLoopWorker._run_agent_loop passes."""
    config = config if config is not None else worker.config
    return hydra.utils.instantiate(
        config=_agent_loop_registry[AGENT_LOOP_NAME],
        trainer_config=DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(worker.tools),
    )


def run_loop(worker, server, row, *, sampling=VALIDATION_SAMPLING, config=None) -> AgentLoopOutput:
    async def go():
        loop = make_loop(worker, server, config)
        return await loop.run(dict(sampling), **row)

    return run(go())


def row_of(environment, task, **extra_info: Any) -> dict[str, Any]:
    """One row's fields as the worker passes them to run() (agent_name is consumed by the worker)."""
    row = task_rows(environment, [task])[0]
    row.pop("agent_name")
    row["extra_info"].update(extra_info)
    return {**row, "raw_prompt": row["prompt"], "index": 0, "tools_kwargs": {}, "interaction_kwargs": {}}


def with_rollout(config, **settings: Any):
    config = copy.deepcopy(config)
    for key, value in settings.items():
        config.actor_rollout_ref.rollout[key] = value
    return config


def tool_call(expression: str) -> str:
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{payload}\n</tool_call>"


def scripted_server(say, texts: Sequence[str]) -> EngineServerManager:
    return EngineServerManager(ScriptedEngine([say(text) for text in texts]))


# --- the loop under veRL's worker -----------------------------------------------------------------


def test_worker_runs_parquet_rows_into_a_padded_batch_with_exact_logprobs(
    worker, train_dataset, random_qwen3
):
    engine = LocalEngine(random_qwen3)
    server = EngineServerManager(engine)
    worker.llm_client = server
    batch = DataProto.from_single_dict(
        collate_fn([train_dataset[index] for index in range(len(train_dataset))])
    )
    try:
        output = run(worker.generate_sequences(batch))
    finally:
        engine.close()

    tensors = output.batch
    assert tensors["prompts"].shape == (2, PROMPT_LENGTH)
    assert tensors["responses"].shape == tensors["response_mask"].shape == (2, RESPONSE_LENGTH)
    assert tensors["rollout_log_probs"].shape == (2, RESPONSE_LENGTH)
    for row in range(2):
        prompt_mask = tensors["attention_mask"][row, :PROMPT_LENGTH]
        prompt_tokens = int(prompt_mask.sum())
        left_padded = [0] * (PROMPT_LENGTH - prompt_tokens) + [1] * prompt_tokens
        assert prompt_mask.tolist() == left_padded
        # the random model never says <|im_end|>: its turn runs into the response budget and stops there
        assert tensors["response_mask"][row].tolist() == [1] * RESPONSE_LENGTH
        assert output.non_tensor_batch["agentboost"][row]["termination"] == "context_full"
        assert output.non_tensor_batch["agentboost"][row]["error"] is None

        # the log-probabilities are the policy's own, at the right positions: recompute them with the model
        ids = tensors["input_ids"][row][tensors["attention_mask"][row].bool()]
        with torch.no_grad():
            logprobs = torch.log_softmax(random_qwen3(ids[None]).logits[0].float(), dim=-1)
        expected = logprobs[prompt_tokens - 1 : -1].gather(1, ids[prompt_tokens:, None])[:, 0]
        torch.testing.assert_close(tensors["rollout_log_probs"][row], expected, atol=2e-4, rtol=0)

    # every turn of a rollout went out under the rollout's own request id; rollouts never share one
    request_ids = [request["request_id"] for request in server.requests]
    assert len(set(request_ids)) == 2
    for request in server.requests:
        assert request["sampling_params"]["max_tokens"] == RESPONSE_LENGTH
        assert request["sampling_params"]["logprobs"] is True  # asked for although calculate_log_probs=False
        assert request["sampling_params"]["stop_token_ids"] == [
            worker.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
    assert tensors["rm_scores"].sum().item() == 0.0  # the reward the environment gave: nothing right
    assert output.non_tensor_batch["__num_turns__"].tolist() == [2, 2]
    assert output.meta_info["reward_extra_keys"] == [
        "failed",
        "policy_failure",
        "turns",
        "tool_calls",
        "parse_errors",
        "forked_rows",
    ]
    assert all(metric["generate_sequences"] > 0 for metric in output.meta_info["metrics"])


def call_then_answer(worker, say, make_row):
    """A task whose policy calls the calculator, then answers right, run by the loop at validation
    sampling: (task, row, the two turns' ids, server, output)."""
    task = generate_tasks(1, seed=3)[0]
    turns = [
        tool_call(task.metadata["expression"]),
        f"The calculator says {task.ground_truth}.\nAnswer: {task.ground_truth}",
    ]
    server = scripted_server(say, turns)
    config = with_rollout(worker.config, response_length=256)
    row = make_row(task)
    output = run_loop(worker, server, row, sampling=VALIDATION_SAMPLING, config=config)
    return task, row, say(turns[0]), say(turns[1]), server, output


def test_tool_turns_are_masked_out_and_the_reward_lands_on_the_last_token(worker, say):
    task, row, first, last, server, output = call_then_answer(
        worker, say, lambda task: row_of(ArithmeticEnvironment(), task)
    )

    response, mask = output.response_ids, output.response_mask
    assert response[: len(first)] == first and response[-len(last) :] == last
    assert mask == [1] * len(first) + [0] * (len(response) - len(first) - len(last)) + [1] * len(last)
    tool_text = worker.tokenizer.decode(response[len(first) : -len(last)])
    assert "<tool_response>" in tool_text and str(task.ground_truth) in tool_text
    assert output.response_logprobs == [-0.5 if bit else 0.0 for bit in mask]  # ScriptedEngine's constant
    prompt_text = worker.tokenizer.decode(output.prompt_ids)
    assert task.prompt in prompt_text and '"calculator"' in prompt_text  # rendered with the tool schema
    assert output.reward_score == 1.0
    assert output.num_turns == 4  # user, assistant, tool, assistant
    assert output.extra_fields["agentboost"]["termination"] == "completed"
    assert output.extra_fields["reward_extra_info"] == {
        "failed": 0.0,
        "policy_failure": 0.0,
        "turns": 2.0,
        "tool_calls": 1.0,
        "parse_errors": 0.0,
        "forked_rows": 0.0,
    }
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 7
    assert [request["sampling_params"]["temperature"] for request in server.requests] == [0, 0]  # validation
    assert len({request["request_id"] for request in server.requests}) == 1

    # veRL's trainer (v1) stores the output unpadded: the reward sits on the policy's last token
    stored = output.as_dict()
    assert stored["rm_scores"].tolist() == [0.0] * (len(response) - 1) + [1.0]
    assert stored["rollout_log_probs"].shape == stored["response_mask"].shape == (len(response),)
    stored.update(row)  # as AgentLoopWorkerTQ does before putting it into TransferQueue
    assert list_of_dict_to_tensordict([stored, stored]).batch_size == torch.Size([2])


def test_the_legacy_trainer_pads_the_output_and_rewards_the_last_token(worker, say):
    task = generate_tasks(1, seed=3)[0]
    answer = say(f"Answer: {task.ground_truth}")
    row = row_of(ArithmeticEnvironment(), task)

    output = run_loop(worker, scripted_server(say, [f"Answer: {task.ground_truth}"]), row)
    batch = worker._postprocess([run(worker._agent_loop_postprocess(output, False, **row))]).batch

    padding = RESPONSE_LENGTH - len(answer)
    assert batch["prompts"][0, -len(output.prompt_ids) :].tolist() == output.prompt_ids  # left-padded
    assert batch["responses"][0, : len(answer)].tolist() == answer  # right-padded
    assert batch["response_mask"][0].tolist() == [1] * len(answer) + [0] * padding
    assert batch["rollout_log_probs"][0].tolist() == [-0.5] * len(answer) + [0.0] * padding
    assert batch["rm_scores"][0].tolist() == [0.0] * (len(answer) - 1) + [1.0] + [0.0] * padding


def test_the_response_budget_ends_the_rollout_between_messages(worker, say):
    environment = ArithmeticEnvironment()
    task = generate_tasks(1, seed=3)[0]
    turns = [tool_call(task.metadata["expression"]), f"Answer: {task.ground_truth}"]
    budget = len(say(turns[0])) + 3  # room for the first turn, not for the tool result after it
    server = scripted_server(say, turns)

    output = run_loop(
        worker, server, row_of(environment, task), config=with_rollout(worker.config, response_length=budget)
    )

    assert output.response_ids == say(turns[0])  # the whole first turn; the tool result after it is left out
    assert output.response_mask == [1] * len(output.response_ids)
    assert len(output.response_ids) <= budget
    assert output.extra_fields["agentboost"]["termination"] == "context_full"
    assert output.extra_fields["agentboost"]["error"] is None
    assert len(server.requests) == 1  # no second turn was asked for
    assert output.reward_score == 0.0


def test_verls_assistant_turn_limit_caps_the_environments(worker, say):
    environment = ArithmeticEnvironment()
    task = generate_tasks(1, seed=3)[0]
    server = scripted_server(say, [tool_call(task.metadata["expression"]), f"Answer: {task.ground_truth}"])
    config = with_rollout(worker.config, response_length=256)
    config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns = 1

    output = run_loop(worker, server, row_of(environment, task), config=config)

    assert output.extra_fields["agentboost"]["termination"] == "max_turns"
    assert len(server.requests) == 1


FAILURES = {
    "server_error": "engine_error: EngineError: veRL's server manager failed: RuntimeError: out of memory",
    "aborted": "engine_error: EngineError: veRL's server aborted the request",
    "prompt_too_long": "the first prompt has",
    "row_without_environment": "agentboost data to-verl",
    "unknown_environment": "cannot import environment",
    "reward_fails": "reward failed: RuntimeError: the grader is down",
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_failed_rollout_is_a_valid_output_that_trains_nothing(worker, say, case):
    expected_error = FAILURES[case]
    environment = RewardFailsEnvironment() if case == "reward_fails" else ArithmeticEnvironment()
    task = generate_tasks(1, seed=3)[0]
    row = row_of(environment, task)
    server = scripted_server(say, [f"Answer: {task.ground_truth}"])
    config = worker.config
    if case == "server_error":
        server.fail = RuntimeError("out of memory")
    elif case == "aborted":
        server.stop_reason = "aborted"
    elif case == "prompt_too_long":
        config = with_rollout(config, prompt_length=64)
    elif case == "row_without_environment":
        row["extra_info"] = {"index": 0}
    elif case == "unknown_environment":
        row["extra_info"]["environment"] = "nowhere.to.be.found:Environment"

    output = run_loop(worker, server, row, config=config)  # never raises

    prompt_length = config.actor_rollout_ref.rollout.prompt_length
    assert 1 <= len(output.prompt_ids) <= prompt_length
    assert 1 <= len(output.response_ids) <= RESPONSE_LENGTH
    assert output.response_mask == [0] * len(output.response_ids)
    assert output.response_logprobs == [0.0] * len(output.response_ids)
    assert output.reward_score == 0.0
    assert expected_error in output.extra_fields["agentboost"]["error"]
    assert output.extra_fields["reward_extra_info"]["failed"] == 1.0
    if case == "prompt_too_long":
        assert server.requests == []  # refused before anything was sent
    if case == "reward_fails":
        assert output.response_ids == say(f"Answer: {task.ground_truth}")  # kept for inspection, masked out
    # and veRL takes it like any other output
    padded = run(worker._agent_loop_postprocess(output, False, **row))
    assert padded.response_mask.sum().item() == 0
    assert output.as_dict()["rm_scores"].sum().item() == 0.0


# --- the engine adapter on its own ----------------------------------------------------------------


class CannedServer:
    def __init__(self, *outputs: TokenOutput) -> None:
        self.outputs = list(outputs)
        self.requests: list[tuple[str, list[int], dict[str, Any]]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append((request_id, prompt_ids, sampling_params))
        return self.outputs.pop(0)


SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, stop_token_ids=(9,))
BUDGET = 4


def test_engine_maps_stop_and_length_and_keeps_one_request_id():
    server = CannedServer(
        TokenOutput(
            token_ids=[5, 9],
            log_probs=[-0.1, -0.2],
            stop_reason="completed",
            num_preempted=1,
            extra_fields={"global_steps": 3},
        ),
        TokenOutput(
            token_ids=[5, 6, 7, 8],
            log_probs=[-1.0] * 4,
            stop_reason="length",
            num_preempted=0,
            extra_fields={"global_steps": 4},
        ),
    )
    engine = VerlServerEngine(
        server, request_id="rollout-1", backend="sglang", extra_sampling={"repetition_penalty": 1.1}
    )

    first = run(engine.generate([1, 2, 3], SAMPLING, max_new_tokens=BUDGET))
    second = run(engine.generate([1, 2, 3, 5, 9, 4], SAMPLING, max_new_tokens=BUDGET))

    assert (first.token_ids, first.logprobs, first.finish_reason) == ([5, 9], [-0.1, -0.2], "stop")
    assert (second.finish_reason, second.prompt_tokens) == ("length", 6)
    assert [request[0] for request in server.requests] == ["rollout-1", "rollout-1"]
    assert server.requests[0][2] == {  # SGLang's own sampling fields (wire.sglang), plus veRL's logprobs
        "repetition_penalty": 1.1,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_new_tokens": 4,
        "stop_token_ids": [9],
        "ignore_eos": True,
        "no_stop_trim": True,  # SGLang only: keep the stop id in output_ids
        "skip_special_tokens": False,
        "logprobs": True,
    }
    assert (engine.num_preempted, engine.min_global_steps, engine.max_global_steps) == (1, 3, 4)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_engine_sends_only_the_backends_documented_sampling_fields(backend):
    """veRL forwards sampling_params to the backend's own sampling parameters: the fixtures list them."""
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    if backend == "vllm":
        documented = json.loads((fixtures / "vllm_completions_request.json").read_text())["documented_fields"]
    else:
        documented = json.loads((fixtures / "sglang_generate_request.json").read_text())[
            "documented_sampling_fields"
        ]
    server = CannedServer(TokenOutput(token_ids=[9], log_probs=[-0.1], stop_reason="completed"))
    engine = VerlServerEngine(server, request_id="r", backend=backend)
    run(engine.generate([1, 2, 3], replace(SAMPLING, seed=7), max_new_tokens=BUDGET))
    params = dict(server.requests[0][2])
    assert params.pop("logprobs") is True  # veRL's own switch, popped before the backend sees the rest
    assert set(params) <= set(documented), set(params) - set(documented)
    assert params["stop_token_ids"] == [9] and params["ignore_eos"] is True
    assert params["seed" if backend == "vllm" else "sampling_seed"] == 7


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            TokenOutput(token_ids=[5, 6], log_probs=[-1.0, -1.0], stop_reason="completed"),
            "stopped after 2 of 4",
        ),
        (TokenOutput(token_ids=[5, 9], log_probs=None, stop_reason="completed"), "no log-probabilities"),
        (TokenOutput(token_ids=[5, 9], log_probs=[-1.0], stop_reason="completed"), "2 token ids but 1"),
        (TokenOutput(token_ids=[], log_probs=[], stop_reason="completed"), "no tokens"),
        (TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted"), "aborted"),
    ],
)
def test_engine_turns_bad_server_answers_into_engine_errors(output, message):
    engine = VerlServerEngine(CannedServer(output), request_id="r")
    with pytest.raises(EngineError, match=message):
        run(engine.generate([1, 2, 3], SAMPLING, max_new_tokens=BUDGET))


def test_engine_refuses_only_an_overlong_first_prompt():
    server = CannedServer(TokenOutput(token_ids=[9], log_probs=[-0.1], stop_reason="completed"))
    engine = VerlServerEngine(server, request_id="r", max_prompt_tokens=3)
    with pytest.raises(PromptTooLongError, match="prompt_length"):
        run(engine.generate([1, 2, 3, 4], SAMPLING, max_new_tokens=BUDGET))
    assert server.requests == []
    assert run(engine.generate([1, 2, 3], SAMPLING, max_new_tokens=BUDGET)).finish_reason == "stop"


def test_importing_agentboost_does_not_import_verl():
    code = (
        "import sys, agentboost, agentboost.integrations.verl, agentboost.integrations.verl.data, "
        "agentboost.integrations.verl.engine, agentboost.integrations.verl.cli; "
        "print('verl' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# --- gateway rollouts: an unmodified agent behind the loop's in-process gateway ---------------------

EXAMPLE_AGENT = Path(__file__).parents[2] / "examples" / "gateway" / "openai_agent.py"
FORKING_AGENT = Path(__file__).parent / "gateway_forking_agent.py"


def gateway_row(task, command: Sequence[str]) -> dict[str, Any]:
    """A veRL row whose environment is a gateway environment running ``command`` on arithmetic tasks."""
    from agentboost.gateway.environment import GatewayEnvironment

    kwargs = {"command": list(command), "tasks_from": "arithmetic"}
    environment = GatewayEnvironment(**kwargs)
    row = task_rows(environment, [task], environment_kwargs=kwargs)[0]
    row.pop("agent_name")
    assert row["extra_info"]["environment"].endswith(":GatewayEnvironment")
    return {**row, "raw_prompt": row["prompt"], "index": 0, "tools_kwargs": {}, "interaction_kwargs": {}}


def test_a_gateway_agent_runs_in_the_loop_as_one_exact_row(worker, say):
    command = [sys.executable, str(EXAMPLE_AGENT)]
    task, _, first, last, server, output = call_then_answer(
        worker, say, lambda task: gateway_row(task, command)
    )

    response, mask = output.response_ids, output.response_mask
    assert response[: len(first)] == first and response[-len(last) :] == last
    assert mask == [1] * len(first) + [0] * (len(response) - len(first) - len(last)) + [1] * len(last)
    assert str(task.ground_truth) in worker.tokenizer.decode(
        response[len(first) : -len(last)]
    )  # the tool ran
    assert output.response_logprobs == [-0.5 if bit else 0.0 for bit in mask]
    prompt_text = worker.tokenizer.decode(output.prompt_ids)
    assert task.prompt in prompt_text and '"calculator"' in prompt_text  # the tools the agent declared
    assert output.reward_score == 1.0 and output.extra_fields["agentboost"]["error"] is None
    assert output.extra_fields["reward_extra_info"]["forked_rows"] == 0.0
    # every turn went to the loop's engine under one request id, at veRL's validation sampling
    assert len(server.requests) == 2 and len({request["request_id"] for request in server.requests}) == 1
    assert [request["sampling_params"]["temperature"] for request in server.requests] == [0, 0]


def test_a_forked_gateway_session_trains_its_last_row_and_reports_the_others(worker, say, monkeypatch):
    task = generate_tasks(1, seed=3)[0]
    monkeypatch.setenv("AGENT_TOOL_RESULT", str(task.ground_truth))
    turns = [tool_call(task.metadata["expression"]), f"Answer: {task.ground_truth}"]
    server = scripted_server(say, turns)
    config = with_rollout(worker.config, response_length=256)

    output = run_loop(worker, server, gateway_row(task, [sys.executable, str(FORKING_AGENT)]), config=config)

    # the last row: the edited history is prompt (never trained), then the one turn generated after it
    answer = say(turns[1])
    assert output.response_ids == answer and output.response_mask == [1] * len(answer)
    prompt_text = worker.tokenizer.decode(output.prompt_ids)
    assert "Let me calculate." in prompt_text and "<tool_response>" in prompt_text
    assert output.reward_score == 1.0
    extra = output.extra_fields
    assert extra["agentboost"]["error"] is None
    assert extra["agentboost"]["drift"] == [
        {"reason": "assistant_edited", "position": 1, "row": 0, "turn": 1, "policy": "fork"}
    ]
    assert extra["reward_extra_info"]["forked_rows"] == 1.0  # veRL logs it; that row is not trained here


CRASHING_AGENT = """
import openai
client = openai.OpenAI(max_retries=0)
if {ask}:
    client.chat.completions.create(model="policy", messages=[{{"role": "user", "content": "hi"}}])
raise SystemExit("the agent crashed")
"""


def test_a_failure_the_policy_caused_trains_with_its_real_mask_and_the_failure_reward(worker, say):
    """The local trainer's rule: an agent that crashed after a model turn is scored, not masked."""
    task = generate_tasks(1, seed=3)[0]
    server = scripted_server(say, [f"Answer: {task.ground_truth}"])
    command = [sys.executable, "-c", CRASHING_AGENT.format(ask=True)]

    output = run_loop(worker, server, gateway_row(task, command))

    answer = say(f"Answer: {task.ground_truth}")
    assert output.response_ids == answer and output.response_mask == [1] * len(answer)
    assert output.response_logprobs == [-0.5] * len(answer)
    assert output.reward_score == 0.0  # the environment's failure reward (its FailureRule)
    extra = output.extra_fields
    assert extra["agentboost"]["termination"] == "agent_error" and extra["agentboost"]["error"] is None
    assert extra["reward_extra_info"]["failed"] == 0.0 and extra["reward_extra_info"]["policy_failure"] == 1.0


def test_an_agent_that_crashed_before_the_model_acted_is_an_infrastructure_failure(worker, say):
    """Masked as the local trainer masks it; veRL keeps it in its GRPO group with reward 0 (docs/verl.md)."""
    task = generate_tasks(1, seed=3)[0]
    server = scripted_server(say, [f"Answer: {task.ground_truth}"])
    command = [sys.executable, "-c", CRASHING_AGENT.format(ask=False)]

    output = run_loop(worker, server, gateway_row(task, command))

    assert output.response_mask == [0] * len(output.response_ids) and output.reward_score == 0.0
    assert output.extra_fields["agentboost"]["error"].startswith("agent_error: ")
    assert output.extra_fields["reward_extra_info"]["failed"] == 1.0
    assert output.extra_fields["reward_extra_info"]["policy_failure"] == 0.0
    assert server.requests == []
