"""Remote clients under load: N concurrent requests against a zero-latency `agentboost serve`.

The server runs in a child process over a ScriptedEngine (no model, no latency), so what is
measured is the client side: the SGLang and vLLM engines' request building, JSON encoding and
decoding, routing and retry bookkeeping, plus aiohttp and the event loop.

Prints, per client: errors (must be 0), client overhead per request (time spent in agentboost's
client code on the event loop: building and encoding the request, decoding and checking the
answer) at p50/p99, end-to-end latency p50/p99 with all N requests in flight, throughput, client
CPU time per request, and peak RSS of the client and server processes.

    python benchmarks/bench_remote_clients.py --requests 1000 --prompt-tokens 1024 --new-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.remote.engine import RemoteEngine
from agentboost.engines.remote.sglang import SGLangEngine
from agentboost.engines.remote.transport import RetryPolicy
from agentboost.engines.remote.vllm import VLLMEngine

STOP_ID = 2

_SERVER = """
import asyncio, sys
from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import serve_forever
new_tokens = int(sys.argv[1])
reply = [3 + (i % 90) for i in range(new_tokens - 1)] + [2]
engine = ScriptedEngine(lambda prompt, index: reply, context_length=1 << 20)
asyncio.run(serve_forever(engine, model_name="bench", port=0))
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _peak_rss_mb(pid: int | None = None) -> float:
    """Peak resident memory (VmHWM) of a process, in MiB."""
    if pid is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _round(
    engine: RemoteEngine, prompts: list[list[int]], sampling: SamplingParams, max_new_tokens: int
) -> dict[str, float]:
    """All prompts at once; returns the round's figures."""

    async def one(prompt: list[int]) -> tuple[Generation | BaseException, float]:
        started = time.perf_counter()
        try:
            result: Generation | BaseException = await engine.generate(
                prompt, sampling, max_new_tokens=max_new_tokens
            )
        except Exception as error:  # counted, not raised: the benchmark reports errors
            result = error
        return result, time.perf_counter() - started

    cpu = time.process_time()
    wall = time.perf_counter()
    outcomes = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    generations = [g for g, _ in outcomes if isinstance(g, Generation)]
    errors = [g for g, _ in outcomes if not isinstance(g, Generation)]
    for error in errors[:3]:
        print(f"    error: {type(error).__name__}: {error}")
    overhead = [g.metrics["client_overhead_s"] * 1e3 for g in generations]
    latency = [seconds * 1e3 for _, seconds in outcomes]
    return {
        "errors": len(errors),
        "overhead_p50_ms": _percentile(overhead, 0.5) if overhead else float("nan"),
        "overhead_p99_ms": _percentile(overhead, 0.99) if overhead else float("nan"),
        "latency_p50_ms": _percentile(latency, 0.5),
        "latency_p99_ms": _percentile(latency, 0.99),
        "throughput_rps": len(prompts) / wall,
        "cpu_ms_per_request": cpu * 1e3 / len(prompts),
        "wall_s": wall,
        "retries": sum(g.metrics["attempts"] - 1 for g in generations),
    }


async def _bench(url: str, kind: str, args: argparse.Namespace) -> list[dict[str, float]]:
    retry = RetryPolicy(total_budget_s=120.0)
    engine: RemoteEngine = (
        SGLangEngine(url, retry=retry) if kind == "sglang" else VLLMEngine(url, retry=retry, model="bench")
    )
    prompts = [[3 + (n + i) % 1000 for i in range(args.prompt_tokens)] for n in range(args.requests)]
    sampling = SamplingParams(temperature=0.0, stop_token_ids=(STOP_ID,))
    try:
        rounds = [await _round(engine, prompts, sampling, args.new_tokens) for _ in range(args.rounds)]
    finally:
        await engine.aclose()
    return rounds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000, help="concurrent requests per round")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per client (the first opens connections)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--engine", choices=["sglang", "vllm", "both"], default="both")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.requests + 256)), hard))
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(args.new_tokens)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if "listening on" not in line:
            print(f"the server did not start: {line!r}", file=sys.stderr)
            return 1
        url = line.split("listening on ")[1].split()[0]
        print(
            f"{args.requests} concurrent requests x {args.rounds} rounds, prompt {args.prompt_tokens} "
            f"tokens, {args.new_tokens} new tokens; zero-latency server at {url} (separate process)"
        )
        kinds = ["sglang", "vllm"] if args.engine == "both" else [args.engine]
        total_errors = 0
        for kind in kinds:
            rounds = asyncio.run(_bench(url, kind, args))
            for index, figures in enumerate(rounds):
                total_errors += int(figures["errors"])
                label = "cold (opens connections)" if index == 0 else "warm pool"
                print(
                    f"  {kind:6s} round {index + 1} [{label}]: errors {figures['errors']:.0f}, retries "
                    f"{figures['retries']:.0f}; client overhead p50 {figures['overhead_p50_ms']:.3f} ms, "
                    f"p99 {figures['overhead_p99_ms']:.3f} ms; latency p50 "
                    f"{figures['latency_p50_ms']:.0f} ms, p99 {figures['latency_p99_ms']:.0f} ms; "
                    f"{figures['throughput_rps']:.0f} req/s; "
                    f"client CPU {figures['cpu_ms_per_request']:.2f} ms/request"
                )
            warm = rounds[1:] or rounds
            print(
                f"  {kind:6s} warm rounds: client overhead p50 "
                f"{statistics.median(r['overhead_p50_ms'] for r in warm):.3f} ms, p99 "
                f"{statistics.median(r['overhead_p99_ms'] for r in warm):.3f} ms"
            )
        print(f"peak RSS: client {_peak_rss_mb():.0f} MiB, server {_peak_rss_mb(server.pid):.0f} MiB")
        print(f"errors in total: {total_errors}")
        return 0 if total_errors == 0 else 1
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
