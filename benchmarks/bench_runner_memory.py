"""Peak memory of `agentboost rollout -n N --samples 8` for its first results, for one or more checkouts.

The real command in a subprocess, against a zero-latency engine (agentboost's server on a
ScriptedEngine: every turn answers "Answer: 7" at once, over loopback HTTP), so the figure is the
command's own: environment, tasks, plan, results file, runner. Once ``--results`` rollouts are in the
results file the command is stopped (SIGINT) and its peak resident memory (VmHWM) is printed, with
the seconds it took to get there. ``--checkout`` puts another source tree first on the command's
PYTHONPATH (e.g. main's), so two trees are measured side by side in one run.

    python benchmarks/bench_runner_memory.py -n 10000 1000000 --samples 8 --results 2000 \\
        --checkout /work/main --checkout .
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.memory import peak_resident_bytes
from agentboost.models.tokenizers import load_qwen3_tokenizer


def peak_rss_mb(pid: int) -> float:
    return peak_resident_bytes(pid) / 2**20


def lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle) - 1  # the header
    except FileNotFoundError:
        return 0


def measure(
    checkout: Path, n: int, args: argparse.Namespace, url: str, model: Path
) -> tuple[float, float, int]:
    """(peak RSS in MB, seconds to the results, results seen) of one run of the command."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "r.jsonl"
        command = [sys.executable, "-m", "agentboost.cli", "rollout", "-n", str(n), "--samples"]
        command += [str(args.samples), "--engine", "sglang", "--url", url, "--model", str(model)]
        command += ["--concurrency", str(args.concurrency), "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(checkout.resolve()), "HF_HUB_OFFLINE": "1"}
        started = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            peak = 0.0
            while process.poll() is None and lines(out) < args.results:
                peak = max(peak, peak_rss_mb(process.pid))
                if time.perf_counter() - started > args.give_up:
                    break
                time.sleep(0.2)
            elapsed = time.perf_counter() - started
            if process.poll() is None:
                peak = max(peak, peak_rss_mb(process.pid))
            else:
                raise RuntimeError(f"the command ended early: {process.stderr.read().decode()[-2000:]}")
            return peak, elapsed, lines(out)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--results", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--checkout", type=Path, action="append", help="source tree(s) to measure (default: .)"
    )
    parser.add_argument("--give-up", type=float, default=600.0, help="seconds to wait for the results")
    args = parser.parse_args()
    tokenizer = load_qwen3_tokenizer()
    answer = [
        *tokenizer.encode("Answer: 7", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = ScriptedEngine([answer], cycle=True)
    server = asyncio.run_coroutine_threadsafe(start_server(engine, context_length=40960), loop).result(60)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    try:
        with tempfile.TemporaryDirectory() as model:
            tokenizer.save_pretrained(model)
            for checkout in args.checkout or [Path(".")]:
                for n in args.n:
                    peak, elapsed, seen = measure(checkout, n, args, server.url, Path(model))
                    print(
                        f"{checkout}: -n {n:,} --samples {args.samples}: peak RSS {peak:.0f} MB "
                        f"after {seen} results ({elapsed:.1f} s)",
                        flush=True,
                    )
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
