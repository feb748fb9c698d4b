"""Synchronous vs asynchronous training (``rollout.max_staleness`` 0, 1, 2) on a simulated agent workload.

The trainer is agentboost's own (:class:`~agentboost.train.trainer.Trainer`, its collector, runner and
results files), with two stand-ins: the engine is a :class:`~agentboost.engines.scripted.ScriptedEngine`
whose every call answers after a heavy-tailed delay (Pareto, shape ``--alpha``, minimum ``--min-delay``,
capped at ``--max-delay``: most turns are quick, a few take tens of times longer, as agent turns with
slow tools do), and the update is a fixed ``--update-s`` sleep (no model computation), so the engine and
the trainer never compete for the CPU: the setting of a remote engine (vLLM servers) and a trainer on
its own device. A rollout is one engine call: its whole latency, drawn from the distribution.

Printed per mode: steps per second, rollouts trained per second, the engine's utilisation (share of
the wall time with at least one generation in flight), the trainer's (share spent updating), groups
dropped for staleness and the mean staleness of what was trained.

    python benchmarks/bench_async_throughput.py [--steps 8] [--update-s 1.0] [--seed 0]
        [--latencies benchmarks/data/rollout_latencies_tau2_mock_vllm.json [--latency-scale 0.1]]

``--latencies FILE`` draws each rollout's latency from a histogram recorded from a real run's results
file instead (each row keeps its rollout's wall time, ``trajectory.metrics.latency_s``);
``--record RESULTS --latencies FILE --note TEXT`` makes one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment
from agentboost.envs.task import Task
from agentboost.train.config import config_from_dict
from agentboost.train.logging import read_metrics
from agentboost.train.trainer import Trainer


def tiny_model(directory: Path) -> Path:
    """A 2-layer random Qwen3 with the real vocabulary: the trainer loads a model, the update skips it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agentboost.models.tokenizers import load_qwen3_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=151669,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory)
    load_qwen3_tokenizer().save_pretrained(directory)
    return directory


class Talk(Environment):
    """One model turn per rollout; reward: the sample's parity (every group carries a signal)."""

    name = "talk"
    system_prompt = "Answer."
    template = "qwen3"
    limits = RolloutLimits(max_turns=1, max_new_tokens=8)

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        return [Task(f"{split}-{index}", f"question {index}") for index in range(64 if n is None else n)]

    def reward(self, trajectory: Any, episode: Any) -> float:
        return float(episode.sample % 2)


class TimedEngine(ScriptedEngine):
    """Counts the wall time with at least one generation in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.active = 0
        self.busy_s = 0.0
        self._since = 0.0

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        if self.active == 0:
            self._since = time.perf_counter()
        self.active += 1
        try:
            return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)
        finally:
            self.active -= 1
            if self.active == 0:
                self.busy_s += time.perf_counter() - self._since


class SimulatedTrainer(Trainer):
    """The real trainer with a scripted engine and an update that takes ``update_s`` seconds."""

    def __init__(
        self, config: Any, *, environment: Environment, engine: TimedEngine, update_s: float
    ) -> None:
        self.timed_engine = engine
        self.update_s = update_s
        self.update_total_s = 0.0
        super().__init__(config, environment=environment)

    def _make_engine(self) -> TimedEngine:
        return self.timed_engine

    def update(self, samples: list[Any], step: int) -> dict[str, float]:
        time.sleep(self.update_s)
        self.update_total_s += self.update_s
        return {"optim/updates": 0.0}


def record_histogram(results: Path, out: Path, note: str, bins: int) -> None:
    """Write the per-rollout wall times (``trajectory.metrics.latency_s``) of a results file as a
    histogram with log-spaced bins, with ``note`` (how the file was made) and its quantiles."""
    from agentboost.rollout.results import read_header, read_results

    latencies = sorted(r.trajectory.metrics["latency_s"] for r in read_results(results) if not r.failed)
    if len(latencies) < 2:
        raise SystemExit(f"{results}: {len(latencies)} finished rollouts; a histogram needs at least two")
    low, high = math.log(latencies[0]), math.log(latencies[-1])
    edges = [math.exp(low + (high - low) * i / bins) for i in range(bins + 1)]
    counts = [0] * bins
    for latency in latencies:
        counts[min(bins - 1, int((math.log(latency) - low) / (high - low or 1.0) * bins))] += 1
    run = (read_header(results) or {}).get("run", {})
    histogram = {
        "what": "per-rollout wall time, s (results rows' trajectory.metrics.latency_s); log-spaced bins",
        "recorded": note,
        "run": {
            key: run.get(key) for key in ("environment", "environment_kwargs", "split", "model", "engine")
        },
        "rollouts": len(latencies),
        "quantiles_s": {
            f"p{q}": round(latencies[min(len(latencies) - 1, len(latencies) * q // 100)], 3)
            for q in (10, 50, 90, 99)
        },
        "edges_s": [round(edge, 4) for edge in edges],
        "counts": counts,
    }
    out.write_text(json.dumps(histogram, indent=1) + "\n")
    print(f"{out}: {len(latencies)} rollouts, quantiles {histogram['quantiles_s']}")


def draw_delays(args: argparse.Namespace, count: int = 100_000) -> list[float]:
    """Rollout latencies: from ``--latencies`` (a bin by its count, then log-uniform inside it, scaled
    by ``--latency-scale``), else Pareto."""
    rng = random.Random(args.seed)
    if args.latencies is None:
        return [min(args.max_delay, args.min_delay * rng.paretovariate(args.alpha)) for _ in range(count)]
    histogram = json.loads(Path(args.latencies).read_text())
    edges, counts = histogram["edges_s"], histogram["counts"]
    bins = rng.choices(range(len(counts)), weights=counts, k=count)
    return [
        args.latency_scale * math.exp(rng.uniform(math.log(edges[b]), math.log(edges[b + 1]))) for b in bins
    ]


def run_mode(model: Path, out: Path, args: argparse.Namespace, staleness: int) -> dict[str, float]:
    delays = draw_delays(args)
    engine = TimedEngine(
        lambda prompt, index: [151645], delay=lambda prompt, index: delays[index % len(delays)]
    )
    config = config_from_dict(
        {
            "model": {"name_or_path": str(model)},
            "environment": {"train_tasks": 64},
            "rollout": {
                "tasks_per_step": args.tasks,
                "group_size": args.group,
                "max_staleness": staleness,
            },
            "eval": {"every": 0},
            "checkpoint": {"every": 0, "save_final_model": False},
            "logging": {"progress": False},
            "steps": args.steps,
            "output_dir": str(out),
        }
    )
    trainer = SimulatedTrainer(config, environment=Talk(), engine=engine, update_s=args.update_s)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    train = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    trained = sum(r.get("async/groups_trained", args.tasks) for r in train) * args.group
    return {
        "steps_per_s": args.steps / wall,
        "rollouts_per_s": trained / wall,
        "engine_util": engine.busy_s / wall,
        "trainer_util": trainer.update_total_s / wall,
        "dropped": sum(r.get("async/dropped_groups", 0.0) for r in train),
        "staleness": sum(r.get("async/staleness_mean", 0.0) for r in train) / len(train),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--update-s", type=float, default=1.0, help="the simulated update's seconds")
    parser.add_argument("--min-delay", type=float, default=0.05, help="the shortest engine call (s)")
    parser.add_argument("--alpha", type=float, default=1.2, help="Pareto shape of the call latency")
    parser.add_argument("--max-delay", type=float, default=5.0, help="the longest engine call (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--latencies", type=Path, help="draw rollout latencies from this recorded histogram (JSON) instead"
    )
    parser.add_argument("--latency-scale", type=float, default=1.0, help="multiply the recorded latencies")
    parser.add_argument(
        "--record", type=Path, help="make a histogram (--latencies' format) of a results file"
    )
    parser.add_argument("--note", default="", help="with --record: how the results file was made")
    parser.add_argument("--bins", type=int, default=24, help="with --record: the histogram's bins")
    args = parser.parse_args()
    if args.record is not None:
        if args.latencies is None:
            parser.error("--record RESULTS needs --latencies OUT.json (the histogram to write)")
        record_histogram(args.record, args.latencies, args.note, args.bins)
        return
    if args.latencies is not None:
        histogram = json.loads(args.latencies.read_text())
        quantiles = histogram["quantiles_s"]
        latency = (
            f"recorded latencies ({args.latencies.name}: {histogram['rollouts']} rollouts, median "
            f"{quantiles['p50']}s, p90 {quantiles['p90']}s) x {args.latency_scale}"
        )
    else:
        latency = f"Pareto(alpha={args.alpha}) x {args.min_delay}s, cap {args.max_delay}s"
    with tempfile.TemporaryDirectory() as scratch:
        model = tiny_model(Path(scratch) / "model")
        print(
            f"{args.steps} steps x {args.tasks} tasks x {args.group} rollouts; rollout latency {latency}; "
            f"update {args.update_s}s"
        )
        print(
            f"{'mode':<12}{'steps/s':>9}{'rollouts/s':>12}{'engine util':>13}{'trainer util':>14}"
            f"{'dropped':>9}{'staleness':>11}{'wall s':>8}"
        )
        for staleness in (0, 1, 2):
            found = run_mode(model, Path(scratch) / f"run-{staleness}", args, staleness)
            mode = "sync" if staleness == 0 else f"async k={staleness}"
            print(
                f"{mode:<12}{found['steps_per_s']:>9.3f}{found['rollouts_per_s']:>12.2f}"
                f"{found['engine_util']:>13.0%}{found['trainer_util']:>14.0%}{found['dropped']:>9.0f}"
                f"{found['staleness']:>11.2f}{found['wall_s']:>8.1f}"
            )


if __name__ == "__main__":
    main()
