"""The logprobs probe and server facts, against servers that compute their answers as vLLM and SGLang do.

Each fake server holds a fixed next-token distribution and answers the probe's top-logprobs requests
by the rule its backend documents: vLLM's ``raw_logprobs`` (untempered), ``processed_logprobs``
(temperature, then top-k/top-p, then log-softmax) and ``processed_logits``; SGLang's default
(temperature-scaled, before truncation) and its "original" (untempered) logprobs. Real HTTP on
loopback, the clients' real wire code.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from aiohttp import web
from remote_support import run

from agentboost.engines.base import SamplingParams
from agentboost.engines.factory import check_engine_args
from agentboost.engines.remote.probe import LogprobsModeError
from agentboost.engines.remote.sglang import SGLangEngine
from agentboost.engines.remote.vllm import VLLMEngine

LOGITS = [9.0, 8.2, 7.5, 6.0, 5.5, 3.0, 2.0, 1.0, 0.5, 0.0]
"""The fake model's next-token logits (ids 0..9)."""


def _log_softmax(values: list[float]) -> list[float]:
    top = max(values)
    total = top + math.log(sum(math.exp(v - top) for v in values if v > -math.inf))
    return [v - total if v > -math.inf else -math.inf for v in values]


def _answer(mode: str, temperature: float, top_k: int) -> list[float]:
    """Per token, what a server in ``mode`` reports for one next token."""
    if mode in ("raw_logprobs", "original"):
        return _log_softmax(LOGITS)
    scaled = [v / (temperature or 1.0) for v in LOGITS]
    if top_k > 0 and mode != "sglang":
        kth = sorted(scaled, reverse=True)[top_k - 1]
        scaled = [v if v >= kth else -math.inf for v in scaled]
    return scaled if mode == "processed_logits" else _log_softmax(scaled)


def _constant(payload: Any) -> Any:
    async def handler(_request: web.Request) -> web.Response:
        return web.json_response(payload)

    return handler


class FakeServer:
    """A vLLM or SGLang server whose top logprobs follow ``mode``; it answers generation requests too."""

    def __init__(self, kind: str, mode: str) -> None:
        self.kind, self.mode = kind, mode
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _vllm(self, request: web.Request) -> web.Response:
        body = await request.json()
        values = _answer(self.mode, body.get("temperature", 1.0), max(0, body.get("top_k", -1)))
        ranked = sorted(range(len(values)), key=lambda t: -values[t])[: body.get("logprobs") or 1]
        top = {f"token_id:{t}": (values[t] if values[t] > -math.inf else -9999.0) for t in ranked}
        token = ranked[0]
        choice = {
            "index": 0,
            "text": "",
            "logprobs": {
                "token_logprobs": [values[token]],
                "tokens": [f"token_id:{token}"],
                "top_logprobs": [top],
            },
            "finish_reason": "length",
            "token_ids": [token],
        }
        return web.json_response({"choices": [choice], "usage": {"prompt_tokens": len(body["prompt"])}})

    async def _sglang(self, request: web.Request) -> web.Response:
        body = await request.json()
        params = body["sampling_params"]
        values = _answer(self.mode, params.get("temperature", 1.0), max(0, params.get("top_k", -1)))
        ranked = sorted(range(len(values)), key=lambda t: -values[t])[: body.get("top_logprobs_num") or 1]
        meta = {
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": len(body["input_ids"]),
            "output_token_logprobs": [[values[ranked[0]], ranked[0], None]],
            "output_top_logprobs": [[[values[t], t, None] for t in ranked]],
        }
        return web.json_response({"text": "", "output_ids": [ranked[0]], "meta_info": meta})

    async def start(self) -> FakeServer:
        app = web.Application()
        if self.kind == "vllm":
            card = {"id": "tiny", "root": "/models/tiny", "owned_by": "vllm", "max_model_len": 64}
            app.router.add_get("/v1/models", _constant({"data": [card]}))
            app.router.add_get("/version", _constant({"version": "0.32.0"}))
            app.router.add_post("/v1/completions", self._vllm)
        else:
            info = {
                "version": "0.5.0",
                "model_path": "/models/tiny",
                "dtype": "bfloat16",
                "context_length": 64,
            }
            app.router.add_get("/model_info", _constant({"context_length": 64}))
            app.router.add_get("/server_info", _constant(info))
            app.router.add_post("/generate", self._sglang)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _probe(kind: str, mode: str, sampling: SamplingParams | None = None) -> tuple[Any, Any]:
    """The engine's facts after a probe and one generation with ``sampling`` (or the error raised)."""

    async def scenario():
        server = await FakeServer(kind, mode).start()
        engine = (VLLMEngine if kind == "vllm" else SGLangEngine)(server.url)
        try:
            await engine.generate([1, 2, 3], sampling or SamplingParams(temperature=0.7), max_new_tokens=1)
            return engine.server_facts[server.url], None
        except LogprobsModeError as error:
            return None, error
        finally:
            await engine.aclose()
            await server.close()

    return run(scenario())


def test_a_vllm_server_reporting_the_sampling_distribution_passes_and_its_facts_are_recorded():
    facts, error = _probe("vllm", "processed_logprobs")
    assert error is None
    assert facts == {
        "server": "vLLM",
        "model": "tiny",
        "root": "/models/tiny",
        "version": "0.32.0",
        "dtype": None,  # /server_info exists only in vLLM's development mode
        "logprobs": "sampling distribution, after top-k/top-p",
    }


def test_a_vllm_server_with_the_default_raw_logprobs_is_refused_with_the_fix():
    facts, error = _probe("vllm", "raw_logprobs")
    assert facts is None
    message = str(error)
    assert "untempered" in message and "--logprobs-mode processed_logprobs" in message
    assert "\n" not in message


def test_a_vllm_server_reporting_logits_is_refused():
    _, error = _probe("vllm", "processed_logits")
    assert error is not None and "not log-probabilities" in str(error)


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0, top_k=5)],
    ids=["top-p", "top-k"],
)
def test_truncated_sampling_is_refused_on_vllm_which_reports_logprobs_after_the_cut(sampling):
    _, error = _probe("vllm", "processed_logprobs", sampling)
    assert error is not None and "after top-k/top-p" in str(error) and "--top-p 1" in str(error)


def test_greedy_decoding_with_top_p_set_is_allowed_on_vllm():
    facts, error = _probe("vllm", "processed_logprobs", SamplingParams(temperature=0, top_p=0.5))
    assert error is None and facts["logprobs"].startswith("sampling distribution")


def test_an_sglang_server_with_its_default_logprobs_passes_even_with_top_p():
    facts, error = _probe("sglang", "sglang", SamplingParams(temperature=0.7, top_p=0.9))
    assert error is None
    assert facts == {
        "server": "SGLang",
        "version": "0.5.0",
        "model": "/models/tiny",
        "dtype": "bfloat16",
        "logprobs": "sampling distribution, before top-k/top-p",
    }


def test_an_sglang_server_returning_original_logprobs_is_refused():
    _, error = _probe("sglang", "original")
    assert error is not None and "untempered" in str(error)


def test_the_run_identity_records_the_servers_facts():
    from agentboost.agent.limits import RolloutLimits
    from agentboost.rollout.spec import RunSpec

    async def scenario():
        server = await FakeServer("vllm", "processed_logprobs").start()
        try:
            return await check_engine_args(
                "vllm", model="tiny", urls=[server.url], sampling=SamplingParams(temperature=0.7)
            )
        finally:
            await server.close()

    facts = run(scenario())
    spec = RunSpec(engine="vllm", urls=("http://127.0.0.1:1",))
    identity = spec.identity(environment_name="arithmetic", limits=RolloutLimits(), tasks=1, servers=facts)
    assert identity["server"] == facts[0]
    assert facts[0]["version"] == "0.32.0" and facts[0]["logprobs"].startswith("sampling distribution")
    assert "server" not in spec.identity(environment_name="arithmetic", limits=RolloutLimits(), tasks=1)


def test_check_engine_args_refuses_top_p_on_vllm_before_the_run():
    async def scenario():
        server = await FakeServer("vllm", "processed_logprobs").start()
        try:
            with pytest.raises(LogprobsModeError) as caught:
                await check_engine_args(
                    "vllm",
                    model="tiny",
                    urls=[server.url],
                    sampling=SamplingParams(temperature=0.7, top_p=0.95),
                )
            return caught.value
        finally:
            await server.close()

    assert "top_p=0.95" in str(run(scenario()))
