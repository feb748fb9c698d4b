"""Per model call CPU time spent outside generation: the Strands SDK's share and agentboost's own.

Times are CPU time of the event-loop thread (``time.thread_time``), so other processes on a shared
machine barely move them; everything runs in that one thread (the tool is async).

A zero-latency scripted engine always answers with one tool call, so a rollout of N turns is N model
calls and N tool calls with no generation cost. Our share is the time inside TokenModel.stream
(reading new messages, rendering and tokenizing the delta, decoding and parsing the turn, building
events) minus the engine's own time, plus the time in RolloutGuard's hooks (limits and termination,
and taking each turn's tool results into the token buffer); the SDK's share is everything else per
call (its history copies and normalisation, tool execution machinery, hook dispatch, event loop).

    python benchmarks/bench_provider_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from strands import tool

from agentboost.agent import provider as provider_module
from agentboost.agent import termination as termination_module
from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.models.tokenizers import load_qwen3_tokenizer


@tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


_ours = 0.0
_original_stream = provider_module.TokenModel.stream


async def _timed_stream(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Time our own code: every resumption of TokenModel.stream, minus the engine's time inside it."""
    global _ours
    stream = _original_stream(self, *args, **kwargs)
    while True:
        started = time.thread_time()
        try:
            event = await stream.__anext__()
        except StopAsyncIteration:
            _ours += time.thread_time() - started
            break
        _ours += time.thread_time() - started
        yield event


def _timed_hook(method):  # type: ignore[no-untyped-def]
    """Time a RolloutGuard hook callback as ours."""

    def timed(self, event):  # type: ignore[no-untyped-def]
        global _ours
        started = time.thread_time()
        try:
            return method(self, event)
        finally:
            _ours += time.thread_time() - started

    return timed


def measure(tokenizer, turns: int) -> tuple[float, float]:
    global _ours
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    ids = [*tokenizer.encode(call, add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    engine = ScriptedEngine([ids], cycle=True)
    _ours = 0.0
    started = time.thread_time()
    trajectory = asyncio.run(
        run_agent(
            engine,
            tokenizer,
            "What is 1 + 2?",
            system_prompt="Use the tool.",
            tools=[add],
            template="qwen3",
            limits=RolloutLimits(max_turns=turns),
        )
    )
    total = time.thread_time() - started
    assert trajectory.metrics["turns"] == turns, trajectory.termination
    ours = _ours
    sdk = total - ours  # the scripted engine's own time is negligible and counted as the SDK's
    return ours / turns * 1e3, sdk / turns * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    provider_module.TokenModel.stream = _timed_stream  # type: ignore[method-assign]
    guard = termination_module.RolloutGuard
    for name in ("_after_model_call", "_before_tools", "_after_tools"):
        setattr(guard, name, _timed_hook(getattr(guard, name)))
    tokenizer = load_qwen3_tokenizer()
    measure(tokenizer, 5)  # warm-up: imports, template compilation
    rows = {}
    print(f"{'turns':>6} {'ours ms/call':>13} {'strands ms/call':>16}")
    for turns in (10, 50, 150):
        samples = [measure(tokenizer, turns) for _ in range(args.repeats)]
        ours = statistics.median(s[0] for s in samples)
        sdk = statistics.median(s[1] for s in samples)
        rows[turns] = ours
        print(f"{turns:>6} {ours:>13.3f} {sdk:>16.3f}")
    print(
        f"ours, 150-turn / 10-turn: {rows[150] / rows[10]:.2f} (goal <= 1.5); "
        f"ours at 150 turns: {rows[150]:.3f} ms (goal <= 0.3)"
    )


if __name__ == "__main__":
    main()
