"""What the multi-node veRL tests put where veRL would put a GPU: the rollout replicas' inference.

veRL's server manager (``LLMServerClient`` in front of its ``GlobalRequestLoadBalancer`` actor) routes each
turn to a replica actor's ``generate(request_id, *, prompt_ids, sampling_params, ...)``. veRL's own replicas
run vLLM or SGLang on a GPU; :class:`TokenServerReplica` is a replica actor in front of a real token server
(``agentboost serve``'s HTTP server) instead, and records the prompts it served, so a test can see which
replica served which turn. Ray workers import this module by reference (``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from agentboost.engines.base import Engine, Generation, SamplingParams
from agentboost.engines.remote.vllm import VLLMEngine
from agentboost.engines.scripted import ScriptedEngine


@dataclass
class ReplicaOutput:
    """The fields of veRL's ``TokenOutput`` its server manager and the plug-in read (a replica actor that
    imported veRL for the class alone would take ~15 s more to start on a loaded 2-core machine)."""

    token_ids: list[int]
    log_probs: list[float] | None
    stop_reason: str
    num_preempted: int = 0
    extra_fields: dict[str, Any] = field(default_factory=dict)


def sampling_from_verl(sampling_params: dict[str, Any]) -> tuple[SamplingParams, int]:
    """veRL's vLLM sampling dict (what the plug-in's engine sends) as agentboost's, with max_tokens."""
    sampling = SamplingParams(
        temperature=float(sampling_params["temperature"]),
        top_p=float(sampling_params["top_p"]),
        top_k=max(int(sampling_params["top_k"]), 0),
        stop_token_ids=tuple(sampling_params["stop_token_ids"]),
    )
    return sampling, int(sampling_params["max_tokens"])


async def generate_over_http(
    engine: VLLMEngine, prompt_ids: Sequence[int], sampling_params: dict[str, Any]
) -> ReplicaOutput:
    """One turn on a token server, answered the way veRL's replicas answer."""
    sampling, max_tokens = sampling_from_verl(sampling_params)
    generation = await engine.generate(list(prompt_ids), sampling, max_new_tokens=max_tokens)
    return ReplicaOutput(
        token_ids=generation.token_ids,
        log_probs=generation.logprobs,
        stop_reason="completed" if generation.finish_reason == "stop" else "length",
        num_preempted=0,
    )


@ray.remote(num_cpus=0)
class TokenServerReplica:
    """A rollout replica actor (what veRL's load balancer hands out) in front of a token server's URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: VLLMEngine | None = None
        self.prompts: list[list[int]] = []

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> ReplicaOutput:
        if self.engine is None:
            self.engine = VLLMEngine(self.url, check_logprobs=False)
        self.prompts.append(list(prompt_ids))
        return await generate_over_http(self.engine, prompt_ids, sampling_params)

    def served(self) -> list[list[int]]:
        """Every prompt this replica was sent, in order; clears the record."""
        prompts, self.prompts = self.prompts, []
        return prompts


class DirectServerManager:
    """The in-process reference: veRL's ``generate`` signature straight to the same token servers."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.engines: dict[str, VLLMEngine] = {}
        self.routes: dict[str, str] = {}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> ReplicaOutput:
        url = self.routes.setdefault(request_id, self.urls[len(self.routes) % len(self.urls)])
        if url not in self.engines:
            self.engines[url] = VLLMEngine(url, check_logprobs=False)
        return await generate_over_http(self.engines[url], prompt_ids, sampling_params)

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()
        self.engines.clear()


class ServerThread:
    """Token servers (``agentboost serve``'s server over given engines) on a background event loop."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        self._engines = list(engines)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[Any] = []

    def __enter__(self) -> list[str]:
        from agentboost.engines.servers.serve import start_server

        self._thread.start()

        async def start() -> list[Any]:
            return [await start_server(engine) for engine in self._engines]

        self._servers = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        return [server.url for server in self._servers]

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            for server in self._servers:
                await server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


class SlowEngine(ScriptedEngine):
    """A scripted engine that holds every request ``delay_s`` first: rollouts stay in flight a while."""

    def __init__(self, *args: Any, delay_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s = delay_s
        self.started = 0

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        self.started += 1
        await asyncio.sleep(self.delay_s)
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


_TOOL_LINE = re.compile(r'^\{"type": "function".*\}$', re.MULTILINE)
CUSTOMER_OPENING = "Hello, I need help with my account."
"""What the policy says as tau2's simulated customer before the agent has answered it."""
PROGRAM = "print(6 * 7)"
"""The program the policy runs with a code tool, and submits where the system prompt asks for one."""


def tool_using_policy(decode: Callable[[Sequence[int]], str], say: Callable[[str], list[int]]) -> Any:
    """A deterministic policy for any environment: call the first tool the system prompt offers, then
    answer with the last number the tool printed (and, where the system prompt asks for a ```python
    block, submit the program it ran). As tau2's simulated customer (its prompt names ``###STOP###``):
    open with a request, then end the conversation once the agent has replied.
    ``script(prompt_ids, call_index) -> ids``."""

    def respond(prompt_ids: Sequence[int], _index: int) -> list[int]:
        text = decode(prompt_ids)
        system, _, conversation = text.partition("<|im_end|>")  # the system prompt names the tags
        if "###STOP###" in system:  # the customer: its earlier replies are this prompt's assistant turns
            replied = conversation.count("<|im_start|>assistant") > 1  # besides the generation prompt
            return say("###STOP###" if replied else CUSTOMER_OPENING)
        if "<tool_response>" in conversation:
            numbers = re.findall(r"-?\d+(?:\.\d+)?", conversation.rsplit("<tool_response>", 1)[1])
            result = numbers[-1] if numbers else "0"
            submission = f"\n```python\n{PROGRAM}\n```" if "```python" in system else ""
            return say(f"The tool says {result}.\nAnswer: {result}{submission}")
        tools = [json.loads(line)["function"] for line in _TOOL_LINE.findall(text)]
        if not tools:
            return say("Answer: 0")
        function = tools[0]
        parameter = next(iter(function.get("parameters", {}).get("properties", {})), "expression")
        value = PROGRAM if parameter == "code" else "6 * 7"
        call = json.dumps({"name": function["name"], "arguments": {parameter: value}})
        return say(f"<tool_call>\n{call}\n</tool_call>")

    return respond
