"""SGLang and vLLM engines: wire formats field by field, documented answers, `agentboost serve`.

Request and response fixtures (tests/fixtures/) are written from the SGLang and vLLM documentation
and protocol definitions; the clients must send exactly those bodies and read those answers. The
last tests run greedy generations and whole agent rollouts through the embedded engine in-process,
through the SGLang client to `agentboost serve`, and through the vLLM client to it: same ids, same
log-probabilities.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
import pytest
from remote_support import GateEngine, StubServer, fast_retry, load_fixture, run

from agentboost.engines.base import SamplingParams
from agentboost.engines.remote.sglang import SGLangEngine
from agentboost.engines.remote.vllm import VLLMEngine
from agentboost.engines.servers.faults import FaultConfig
from agentboost.engines.servers.serve import start_server
from agentboost.engines.servers.serve_command import faults_from_args, register_serve_command, run_serve
from agentboost.errors import ConfigError, EngineResponseError

SGLANG_REQUESTS = load_fixture("sglang_generate_request.json")
SGLANG_ANSWERS = load_fixture("sglang_generate_response.json")
VLLM_REQUESTS = load_fixture("vllm_completions_request.json")
VLLM_ANSWERS = load_fixture("vllm_completions_response.json")

_TYPES: dict[str, Any] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "list[int]": lambda v: (
        isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    ),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def _request(spec: dict[str, Any]) -> tuple[SamplingParams, int]:
    """A fixture case's sampling and its token budget (``Engine.generate``'s ``max_new_tokens``)."""
    sampling = SamplingParams(
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        top_k=spec["top_k"],
        stop_token_ids=tuple(spec["stop_token_ids"]),
        seed=spec["seed"],
    )
    return sampling, spec["max_new_tokens"]


def _assert_documented(body: dict[str, Any], documented: dict[str, str], where: str) -> None:
    for name, value in body.items():
        assert name in documented, f"{where}: {name!r} is not a documented field"
        assert _TYPES[documented[name]](value), f"{where}: {name}={value!r} is not {documented[name]}"


# --- request bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", SGLANG_REQUESTS["cases"], ids=lambda c: c["name"])
def test_sglang_request_body_matches_the_documented_format(case):
    one_token = {
        "text": "",
        "output_ids": [5],
        "meta_info": {
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": len(case["prompt_ids"]),
            "completion_tokens": 1,
            "output_token_logprobs": [[-1.0, 5, None]],
        },
    }

    async def scenario():
        stub = await StubServer(
            {
                "/generate": [(200, one_token)],
                "/model_info": [(200, {"context_length": case["context_length"]})],
            }
        ).start()
        client = SGLangEngine(stub.url, retry=fast_retry(), check_logprobs=False)
        try:
            sampling, budget = _request(case["sampling"])
            await client.generate(case["prompt_ids"], sampling, max_new_tokens=budget)
        finally:
            await client.aclose()
            await stub.close()
        return stub.bodies["/generate"]

    bodies = run(scenario())
    assert bodies == [case["request"]]
    _assert_documented(bodies[0], SGLANG_REQUESTS["documented_fields"], "/generate")
    _assert_documented(
        bodies[0]["sampling_params"], SGLANG_REQUESTS["documented_sampling_fields"], "sampling_params"
    )


@pytest.mark.parametrize("case", VLLM_REQUESTS["cases"], ids=lambda c: c["name"])
def test_vllm_request_body_matches_the_documented_format(case):
    one_token = {
        "choices": [
            {
                "index": 0,
                "text": "",
                "logprobs": {"token_logprobs": [-1.0], "tokens": ["token_id:5"]},
                "finish_reason": "length",
                "token_ids": [5],
            }
        ],
        "usage": {"prompt_tokens": len(case["prompt_ids"]), "completion_tokens": 1},
    }
    models = {"object": "list", "data": [{"id": case["model"], "max_model_len": case["context_length"]}]}

    async def scenario():
        stub = await StubServer(
            {"/v1/completions": [(200, one_token)], "/v1/models": [(200, models)]}
        ).start()
        client = VLLMEngine(
            stub.url, retry=fast_retry(), check_logprobs=False
        )  # learns the model name from /v1/models
        try:
            sampling, budget = _request(case["sampling"])
            await client.generate(case["prompt_ids"], sampling, max_new_tokens=budget)
        finally:
            await client.aclose()
            await stub.close()
        return stub.bodies["/v1/completions"]

    bodies = run(scenario())
    assert bodies == [case["request"]]
    _assert_documented(bodies[0], VLLM_REQUESTS["documented_fields"], "/v1/completions")


# --- documented answers ------------------------------------------------------------------------


def _answer_case(engine_class, path: str, case: dict[str, Any]):
    sampling = SamplingParams(temperature=0.0, stop_token_ids=tuple(case["stop_token_ids"]))

    async def scenario():
        stub = await StubServer({path: [(200, case["response"])]}).start()
        client = engine_class(
            stub.url,
            retry=fast_retry(),
            context_length=100_000,
            check_logprobs=False,
            **_model_for(engine_class),
        )
        try:
            return await client.generate(case["prompt_ids"], sampling, max_new_tokens=case["max_new_tokens"])
        finally:
            await client.aclose()
            await stub.close()

    return run(scenario())


def _model_for(engine_class) -> dict[str, str]:
    return {"model": "Qwen/Qwen3-0.6B"} if engine_class is VLLMEngine else {}


@pytest.mark.parametrize("case", SGLANG_ANSWERS["cases"], ids=lambda c: c["name"])
def test_sglang_reads_the_documented_answers(case):
    generation = _answer_case(SGLangEngine, "/generate", case)
    expected = case["expected"]
    assert generation.token_ids == expected["token_ids"]
    assert generation.logprobs == expected["logprobs"]
    assert generation.finish_reason == expected["finish_reason"]
    assert generation.prompt_tokens == expected["prompt_tokens"]
    assert generation.metrics["server_s"] == case["response"]["meta_info"]["e2e_latency"]


@pytest.mark.parametrize("case", VLLM_ANSWERS["cases"], ids=lambda c: c["name"])
def test_vllm_reads_the_documented_answers(case):
    generation = _answer_case(VLLMEngine, "/v1/completions", case)
    expected = case["expected"]
    assert generation.token_ids == expected["token_ids"]
    assert generation.logprobs == expected["logprobs"]
    assert generation.finish_reason == expected["finish_reason"]
    assert generation.prompt_tokens == expected["prompt_tokens"]


def test_sglang_learns_the_context_length_from_v1_models_when_model_info_lacks_it():
    async def scenario():
        stub = await StubServer(
            {
                "/model_info": [(404, {"detail": "Not Found"})],
                "/get_model_info": [(200, SGLANG_ANSWERS["get_model_info"])],
                "/v1/models": [(200, SGLANG_ANSWERS["v1_models"])],
            }
        ).start()
        client = SGLangEngine(stub.url, retry=fast_retry(), check_logprobs=False)
        try:
            await client.fetch_model_info()
            await client.fetch_model_info()  # asked once only
        finally:
            await client.aclose()
            await stub.close()
        return client.context_length, {path: len(bodies) for path, bodies in stub.bodies.items()}

    context_length, calls = run(scenario())
    assert context_length == 40960 - 1  # SGLang needs prompt + new tokens < its context length
    assert calls == {"/model_info": 1, "/get_model_info": 1, "/v1/models": 1}


def test_vllm_learns_the_model_name_and_context_length_from_v1_models():
    async def scenario():
        stub = await StubServer({"/v1/models": [(200, VLLM_ANSWERS["v1_models"])]}).start()
        client = VLLMEngine(stub.url, retry=fast_retry(), check_logprobs=False)
        try:
            await client.fetch_model_info()
        finally:
            await client.aclose()
            await stub.close()
        return client

    client = run(scenario())
    assert client.model == "Qwen/Qwen3-0.6B" and client.context_length == 40960


def test_an_sglang_abort_is_retried():
    case = SGLANG_ANSWERS["cases"][1]
    answers = [(200, SGLANG_ANSWERS["abort"]), (200, case["response"])]

    async def scenario():
        stub = await StubServer({"/generate": answers}).start()
        client = SGLangEngine(stub.url, retry=fast_retry(), check_logprobs=False, context_length=100)
        sampling = SamplingParams(temperature=0.0, stop_token_ids=(2,))
        try:
            return await client.generate(case["prompt_ids"], sampling, max_new_tokens=3), len(
                stub.bodies["/generate"]
            )
        finally:
            await client.aclose()
            await stub.close()

    generation, requests = run(scenario())
    assert generation.token_ids == case["expected"]["token_ids"]
    assert requests == 2 and generation.metrics["attempts"] == 2


@pytest.mark.parametrize("engine_class", [SGLangEngine, VLLMEngine])
def test_a_stop_on_an_id_that_was_not_requested_is_a_format_error_and_not_retried(engine_class):
    path = engine_class.generate_path
    case = (SGLANG_ANSWERS if engine_class is SGLangEngine else VLLM_ANSWERS)["cases"][0]
    sampling = SamplingParams(temperature=0.0, stop_token_ids=(151643,))  # not 151645

    async def scenario():
        stub = await StubServer({path: [(200, case["response"])]}).start()
        client = engine_class(
            stub.url,
            retry=fast_retry(),
            context_length=100_000,
            check_logprobs=False,
            **_model_for(engine_class),
        )
        try:
            with pytest.raises(EngineResponseError) as caught:
                await client.generate(case["prompt_ids"], sampling, max_new_tokens=64)
        finally:
            await client.aclose()
            await stub.close()
        return caught.value, len(stub.bodies[path])

    error, requests = run(scenario())
    assert requests == 1 and error.attempts == 1
    assert "151645" in str(error) and "not retried" in str(error)


def test_vllm_token_ids_that_disagree_with_the_token_strings_are_a_format_error():
    case = VLLM_ANSWERS["cases"][0]
    response = {
        **case["response"],
        "choices": [{**case["response"]["choices"][0], "token_ids": [1, 2, 3, 151645]}],
    }

    async def scenario():
        stub = await StubServer({"/v1/completions": [(200, response)]}).start()
        client = VLLMEngine(
            stub.url,
            retry=fast_retry(),
            check_logprobs=False,
            context_length=100_000,
            model="Qwen/Qwen3-0.6B",
        )
        sampling = SamplingParams(temperature=0.0, stop_token_ids=(151645,))
        try:
            with pytest.raises(EngineResponseError, match="differ"):
                await client.generate(case["prompt_ids"], sampling, max_new_tokens=64)
        finally:
            await client.aclose()
            await stub.close()

    run(scenario())


# --- agentboost serve -------------------------------------------------------------------------


def test_served_answers_equal_the_engines_own_answer():
    prompts = [[1, 2, 3], [7] * 20, [4, 4]]
    sampling = SamplingParams(temperature=0.0, stop_token_ids=(50, 60))

    async def scenario():
        engine = GateEngine()
        server = await start_server(engine)
        clients = [SGLangEngine(server.url, retry=fast_retry()), VLLMEngine(server.url, retry=fast_retry())]
        try:
            local = [await engine.generate(p, sampling, max_new_tokens=16) for p in prompts]
            remote = [[await c.generate(p, sampling, max_new_tokens=16) for p in prompts] for c in clients]
        finally:
            for client in clients:
                await client.aclose()
            await server.close()
        return local, remote

    local, remote = run(scenario())
    assert any(g.finish_reason == "stop" for g in local) and any(g.finish_reason == "length" for g in local)
    for results in remote:
        for mine, theirs in zip(local, results, strict=True):
            assert (theirs.token_ids, theirs.logprobs) == (mine.token_ids, mine.logprobs)
            assert (theirs.finish_reason, theirs.prompt_tokens) == (mine.finish_reason, mine.prompt_tokens)


REFUSALS = [
    ("/generate", {"text": "hello", "sampling_params": {}}, "tokenizer"),
    ("/generate", {"input_ids": [[1, 2], [3]], "sampling_params": {}}, "batch"),
    ("/generate", {"input_ids": [1, 2], "stream": True}, "streaming"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"regex": "a+"}}, "regex"),
    ("/generate", {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 0}, "logprob_start_len"),
    ("/v1/completions", {"prompt": "hello"}, "tokenizer"),
    ("/v1/completions", {"prompt": [1, 2], "logprobs": 5}, "logprobs=0"),
    ("/v1/completions", {"prompt": [1, 2], "n": 2}, "n=2"),
    ("/v1/completions", {"prompt": [1, 2], "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": [1, 2], "messages": []}, "messages"),
]


@pytest.mark.parametrize(("path", "body", "mentions"), REFUSALS)
def test_serve_refuses_what_its_subset_does_not_cover(path, body, mentions):
    async def scenario():
        server = await start_server(GateEngine())
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(server.url + path, json=body) as response,
            ):
                return response.status, await response.json()
        finally:
            await server.close()

    status, payload = run(scenario())
    assert status == 400
    assert mentions in payload["error"]["message"]


def test_serve_reports_health_and_model_facts():
    async def scenario():
        server = await start_server(GateEngine(context_length=512), model_name="tiny")
        answers = {}
        try:
            async with aiohttp.ClientSession() as session:
                for path in ("/health", "/model_info", "/get_model_info", "/v1/models"):
                    async with session.get(server.url + path) as response:
                        answers[path] = (response.status, await response.json())
        finally:
            await server.close()
        return answers

    answers = run(scenario())
    assert {status for status, _ in answers.values()} == {200}
    assert (
        answers["/model_info"][1]["context_length"] == 512 == answers["/get_model_info"][1]["context_length"]
    )
    assert answers["/v1/models"][1]["data"][0] == {
        **answers["/v1/models"][1]["data"][0],
        "id": "tiny",
        "max_model_len": 512,
    }


def test_the_serve_command_parses_its_options_into_a_fault_config():
    parser = argparse.ArgumentParser(prog="agentboost")
    register_serve_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "serve",
            "--port",
            "30001",
            "--fault-http-500",
            "0.2",
            "--fault-schedule",
            "drop, ok",
            "--fault-slow-delay",
            "0.1",
        ]
    )
    assert args.func is run_serve and args.port == 30001 and args.host == "127.0.0.1"
    faults = faults_from_args(args)
    assert faults == FaultConfig(schedule=("drop", None), probabilities={"http_500": 0.2}, slow_delay_s=0.1)
    assert faults_from_args(parser.parse_args(["serve"])) is None
    bad = parser.parse_args(["serve", "--fault-schedule", "explode"])
    assert run_serve(bad) == 2  # refused before any model is loaded


@pytest.mark.parametrize(
    "kwargs",
    [{"schedule": ["explode"]}, {"probabilities": {"drop": 0.7, "http_500": 0.5}}, {"slow_delay_s": -1}],
)
def test_fault_config_rejects_nonsense(kwargs):
    with pytest.raises(ConfigError):
        FaultConfig(**kwargs)


def test_a_fault_schedule_is_followed_in_order():
    async def scenario():
        server = await start_server(GateEngine(), faults=FaultConfig(schedule=["http_500", "ok", "http_429"]))
        statuses = []
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(4):
                    async with session.post(server.url + "/generate", json={"input_ids": [1]}) as response:
                        statuses.append(response.status)
        finally:
            await server.close()
        return statuses

    assert run(scenario()) == [500, 200, 429, 200]


# --- the same greedy generations whichever way they are served ----------------------------------


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama (vocab 1000, hidden 64, 2 layers), saved the way a user's model would be."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    return str(directory)


async def _three_ways(make_engine, work):
    """``work(engine)`` through the engine in-process, the SGLang client to serve, the vLLM client."""
    from agentboost.engines.servers.serve import start_server as serve

    local = make_engine()
    served = make_engine()
    server = await serve(served, model_name="tiny")
    clients = [
        SGLangEngine(server.url, retry=fast_retry(60.0)),
        VLLMEngine(server.url, retry=fast_retry(60.0)),
    ]
    try:
        return [await work(local), *[await work(client) for client in clients]]
    finally:
        for engine in (*clients, local, served):
            await engine.aclose()
        await server.close()


def test_greedy_generations_are_identical_in_process_and_through_both_clients(tiny_llama_dir):
    from agentboost.engines.embedded.engine import LocalEngine

    prompts = [[1, 2, 3, 4, 5], [17, 230, 999], [42] * 30, [7, 7, 8]]

    async def work(engine):
        probe = await engine.generate(prompts[0], SamplingParams(temperature=0.0), max_new_tokens=8)
        stop = probe.token_ids[3]  # a stop id this model does reach, so 'stop' is exercised too
        sampling = SamplingParams(temperature=0.0, stop_token_ids=(stop,))
        return await asyncio.gather(*(engine.generate(p, sampling, max_new_tokens=24) for p in prompts))

    local, via_sglang, via_vllm = run(
        _three_ways(lambda: LocalEngine.from_pretrained(tiny_llama_dir), work), timeout=120
    )
    assert local[0].finish_reason == "stop"
    for remote in (via_sglang, via_vllm):
        for mine, theirs in zip(local, remote, strict=True):
            assert theirs.token_ids == mine.token_ids
            assert theirs.finish_reason == mine.finish_reason
            assert max(abs(a - b) for a, b in zip(theirs.logprobs, mine.logprobs, strict=True)) <= 1e-4


def _rollout(tokenizer, **limits: int):
    from conftest import QUESTION, SYSTEM, add, multiply

    from agentboost.agent.episode import run_agent
    from agentboost.agent.limits import RolloutLimits

    async def work(engine):
        return await run_agent(
            engine,
            tokenizer,
            QUESTION,
            system_prompt=SYSTEM,
            tools=[add, multiply],
            template="qwen3",
            sampling=SamplingParams(temperature=0.0),
            limits=RolloutLimits(**limits),
        )

    return work


def _assert_same_trajectories(local, remotes) -> None:
    for remote in remotes:
        assert remote.termination == local.termination
        assert remote.token_ids == local.token_ids
        assert remote.loss_mask == local.loss_mask
        assert [lp is None for lp in remote.logprobs] == [lp is None for lp in local.logprobs]
        gaps = [abs(a - b) for a, b in zip(remote.logprobs, local.logprobs, strict=True) if a is not None]
        assert gaps and max(gaps) <= 1e-4


def test_greedy_agent_rollouts_on_a_model_are_identical_in_process_and_through_both_clients(
    random_qwen3, qwen_tokenizer
):
    """A rollout on a (random, tiny) Qwen3 with the real vocabulary: one long turn, same trajectory."""
    from agentboost.engines.embedded.engine import LocalEngine

    work = _rollout(qwen_tokenizer, max_turns=4, max_new_tokens=24)
    local, via_sglang, via_vllm = run(_three_ways(lambda: LocalEngine(random_qwen3), work), timeout=120)
    assert sum(local.loss_mask) == 24  # the random model never says <|im_end|>: one turn, to the limit
    _assert_same_trajectories(local, [via_sglang, via_vllm])


def test_multi_turn_tool_calling_rollouts_are_identical_in_process_and_through_both_clients(
    qwen_tokenizer, say
):
    """The scripted tool-calling conversation: three turns, two tool results, through every path."""
    from conftest import TOOL_SCRIPT

    from agentboost.engines.scripted import ScriptedEngine

    def make_engine():
        return ScriptedEngine([say(text) for text in TOOL_SCRIPT], cycle=True, context_length=4096)

    work = _rollout(qwen_tokenizer, max_turns=8, max_new_tokens=256)
    local, via_sglang, via_vllm = run(_three_ways(make_engine, work), timeout=120)
    assert local.metrics["turns"] == 3 and local.metrics["tool_calls"] == 2
    _assert_same_trajectories(local, [via_sglang, via_vllm])


def test_grpo_siblings_of_one_task_each_keep_their_own_server_through_whole_rollouts(qwen_tokenizer, say):
    """Two samples of one task, run at once over two servers: each rollout's turns all go to one server,
    the siblings are spread over both, and the first to finish does not unbind the other."""
    from conftest import QUESTION, SYSTEM, add

    from agentboost.agent.episode import run_agent
    from agentboost.agent.limits import RolloutLimits
    from agentboost.engines.scripted import ScriptedEngine

    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'

    def script(_prompt, _index):  # not used: the seed picks the answer below
        raise AssertionError

    class SiblingEngine(ScriptedEngine):
        """Sample 0 answers at once; sample 1 calls a tool three times first (its seed says which)."""

        async def generate(self, prompt_ids, sampling, *, max_new_tokens):
            sample, turn = divmod(sampling.seed, 1000)
            self._script = lambda _p, _i: say("Answer: 3" if sample == 0 or turn >= 3 else call)
            return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)

    async def scenario():
        engines = [SiblingEngine(script, context_length=4096) for _ in range(2)]
        servers = [await start_server(engine) for engine in engines]
        for server in servers:
            server.stats.record_bodies = True
        client = SGLangEngine([s.url for s in servers], retry=fast_retry())
        try:
            trajectories = await asyncio.gather(
                *(
                    run_agent(
                        client,
                        qwen_tokenizer,
                        QUESTION,
                        system_prompt=SYSTEM,
                        tools=[add],
                        template="qwen3",
                        sampling=SamplingParams(temperature=0.0, seed=1000 * sample),
                        limits=RolloutLimits(max_turns=8, max_new_tokens=64),
                        task_id="task-1",
                        sample=sample,
                    )
                    for sample in (0, 1)
                )
            )
        finally:
            await client.aclose()
            for server in servers:
                await server.close()
        served = [
            sorted({body["sampling_params"]["sampling_seed"] // 1000 for body in server.stats.bodies})
            for server in servers
        ]
        return trajectories, served, [len(server.stats.bodies) for server in servers]

    trajectories, served, counts = run(scenario())
    assert [t.metrics["turns"] for t in trajectories] == [1, 4]
    assert sorted(served) == [[0], [1]]  # each server saw one sibling only, and both were used
    assert sorted(counts) == [1, 4]
