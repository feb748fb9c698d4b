"""Gateway overhead per model call, and many concurrent sessions, against a zero-latency engine.

1. Per-call cycle time (from one engine call to the next: tokenizing the new messages, the
   request/response and the tool loop) at turns 10, 50 and 150 of one long tool-calling session,
   through the Strands provider (``run_agent``) and through the gateway (a minimal aiohttp OpenAI
   client on loopback). Rounds alternate between paths; the median round's p50 over the five turns
   before each mark is printed, with the difference (the gateway's added cost per call) and the
   part of the gateway's cycle the client spends encoding the history it resends (JSON). The same
   session on the Responses API: the whole input resent each call (as the OpenAI Agents SDK does),
   and chained by ``previous_response_id`` (only the new ``function_call_output`` sent).
2. ``--sessions`` concurrent sessions (3 turns each) through one gateway: errors, wall time, and the
   resident memory the open sessions hold, per session.

    python benchmarks/bench_gateway.py [--turns 150] [--rounds 3] [--sessions 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import statistics
import time

import aiohttp
from strands import tool

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.engines.scripted import ScriptedEngine
from agentboost.gateway.server import Gateway
from agentboost.models.tokenizers import load_qwen3_tokenizer
from agentboost.tokens.templates import tool_specs_to_openai

MARKS = (10, 50, 150)
JSON = {"Content-Type": "application/json"}


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


class Clock:
    """A zero-latency scripted engine that timestamps every call."""

    def __init__(self, tokenizer, turns: int) -> None:
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        self.call_ids = [*tokenizer.encode(call, add_special_tokens=False), im_end]
        self.answer_ids = [*tokenizer.encode("Answer: 3", add_special_tokens=False), im_end]
        self.turns = turns
        self.stamps: list[float] = []
        self.engine = ScriptedEngine(self.script)

    def script(self, _prompt, index):
        self.stamps.append(time.perf_counter())
        return self.call_ids if index < self.turns - 1 else self.answer_ids


def p50_at_marks(stamps: list[float]) -> dict[int, float]:
    cycles = [b - a for a, b in itertools.pairwise(stamps)]  # cycles[i]: call i -> call i+1
    return {mark: statistics.median(cycles[mark - 6 : mark - 1]) for mark in MARKS if mark <= len(cycles) + 1}


async def provider_round(tokenizer, turns: int) -> dict[int, float]:
    clock = Clock(tokenizer, turns)
    await run_agent(
        clock.engine,
        tokenizer,
        "Add 1 and 2, again and again.",
        tools=[add],
        template="qwen3",
        sampling=SamplingParams(temperature=0),
        limits=RolloutLimits(max_turns=turns + 1, max_new_tokens=64),
    )
    return p50_at_marks(clock.stamps)


async def gateway_round(tokenizer, turns: int) -> tuple[dict[int, float], dict[int, float]]:
    """The gateway's cycle times at the marks, and the client's own JSON encoding of the request."""
    clock = Clock(tokenizer, turns)
    encoding: list[float] = []
    tools = tool_specs_to_openai([add.tool_spec])
    async with Gateway(
        clock.engine, tokenizer, template="qwen3", limits=RolloutLimits(max_turns=turns + 1)
    ) as gateway:
        gateway.open_session("bench")
        url = f"{gateway.base_url('bench')}/chat/completions"
        messages = [{"role": "user", "content": "Add 1 and 2, again and again."}]
        async with aiohttp.ClientSession() as http:
            for _ in range(turns):
                started = time.perf_counter()
                body = json.dumps({"messages": messages, "tools": tools}).encode()
                encoding.append(time.perf_counter() - started)
                async with http.post(url, data=body, headers=JSON) as response:
                    message = (await response.json())["choices"][0]["message"]
                messages.append(message)
                for call in message.get("tool_calls") or ():
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "3"})
                if not message.get("tool_calls"):
                    break
    encoded = {mark: statistics.median(encoding[mark - 5 : mark]) for mark in MARKS if mark <= len(encoding)}
    return p50_at_marks(clock.stamps), encoded


async def responses_round(tokenizer, turns: int, chained: bool) -> dict[int, float]:
    """The gateway's cycle times at the marks on the Responses API (whole input, or chained)."""
    clock = Clock(tokenizer, turns)
    tools = [{"type": "function", **tool["function"]} for tool in tool_specs_to_openai([add.tool_spec])]
    async with Gateway(
        clock.engine, tokenizer, template="qwen3", limits=RolloutLimits(max_turns=turns + 1)
    ) as gateway:
        gateway.open_session("bench")
        url = f"{gateway.base_url('bench')}/responses"
        items: list = [{"role": "user", "content": "Add 1 and 2, again and again."}]
        new, previous = list(items), None
        async with aiohttp.ClientSession() as http:
            for _ in range(turns):
                request = {"input": new if chained else items, "tools": tools}
                if chained and previous:
                    request["previous_response_id"] = previous
                async with http.post(url, data=json.dumps(request).encode(), headers=JSON) as response:
                    answer = await response.json()
                previous = answer["id"]
                items += answer["output"]
                calls = [item for item in answer["output"] if item["type"] == "function_call"]
                if not calls:
                    break
                new = [
                    {"type": "function_call_output", "call_id": c["call_id"], "output": "3"} for c in calls
                ]
                items += new
    return p50_at_marks(clock.stamps)


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def many_sessions(tokenizer, count: int) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([[*tokenizer.encode("ok", add_special_tokens=False), im_end]], cycle=True)
    async with Gateway(engine, tokenizer, template="qwen3") as gateway:
        for index in range(count):
            gateway.open_session(f"s{index}")
        gc.collect()
        before = rss_bytes()
        errors = 0

        async def chat(http: aiohttp.ClientSession, name: str) -> None:
            nonlocal errors
            messages = []
            for turn in range(3):
                messages.append({"role": "user", "content": f"Turn {turn} of session {name}."})
                async with http.post(
                    f"{gateway.base_url(name)}/chat/completions", json={"messages": messages}
                ) as response:
                    if response.status != 200:
                        errors += 1
                        return
                    messages.append((await response.json())["choices"][0]["message"])

        started = time.perf_counter()
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector) as http:
            await asyncio.gather(*(chat(http, f"s{index}") for index in range(count)))
        wall = time.perf_counter() - started
        gc.collect()
        held = rss_bytes() - before
        turns = sum(session.turns for session in gateway.sessions.values())
        tokens = sum(
            len(session.row.buffer.token_ids) for session in gateway.sessions.values() if session.row
        )
    print(
        f"{count} concurrent sessions x 3 turns: {turns} turns, {errors} errors, {wall:.1f} s wall, "
        f"{held / count / 1024:.1f} KiB resident per open session ({tokens / count:.0f} tokens each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args()
    tokenizer = load_qwen3_tokenizer()
    provider, gateway, encoding, responses, chained = [], [], [], [], []
    for _ in range(args.rounds):
        provider.append(asyncio.run(provider_round(tokenizer, args.turns)))
        cycles, encoded = asyncio.run(gateway_round(tokenizer, args.turns))
        gateway.append(cycles)
        encoding.append(encoded)
        responses.append(asyncio.run(responses_round(tokenizer, args.turns, chained=False)))
        chained.append(asyncio.run(responses_round(tokenizer, args.turns, chained=True)))
    print("cycle time per model call, ms (median of rounds of the p50 over the 5 calls before the mark);")
    print("'client JSON': of the chat gateway's cycle, the client encoding the history it resends;")
    print("'responses': the Responses API, whole input each call; 'chained': by previous_response_id")
    header = ("turn", "provider", "chat", "added", "client JSON", "responses", "chained")
    print(f"{header[0]:>6}" + "".join(f"{name:>12}" for name in header[1:]))
    for mark in MARKS:
        if mark > args.turns:
            continue
        figures = [statistics.median(r[mark] for r in runs) * 1e3 for runs in (provider, gateway, encoding)]
        direct, served, encode = figures
        wire = [statistics.median(r[mark] for r in runs) * 1e3 for runs in (responses, chained)]
        print(
            f"{mark:>6} {direct:>11.2f} {served:>11.2f} {served - direct:>+11.2f} {encode:>11.2f} "
            f"{wire[0]:>11.2f} {wire[1]:>11.2f}"
        )
    if args.sessions:
        asyncio.run(many_sessions(tokenizer, args.sessions))


if __name__ == "__main__":
    main()
