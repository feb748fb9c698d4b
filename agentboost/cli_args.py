"""argparse types that validate a value where it enters: counts, ranges, ports.

A zero or a negative number where it makes no sense is rejected with a message, never replaced by a
default. Every subcommand uses these, so the same mistake gets the same message everywhere.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

MAX_TASKS = 1_000_000
"""-n: a run's tasks are built and held in memory before it starts (split a bigger run with --seed)."""
MAX_SAMPLES = 10_000
"""--samples: rollouts per task."""
MAX_CONCURRENCY = 4_096
"""--concurrency: rollouts in flight at once, each holding its conversation and a slot of the engine."""


TASKS_WHY = " (a run's tasks are held in memory; split a bigger run into several with --seed)"


def count(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (zeros and negatives are rejected, never replaced)
    and, when given, <= ``maximum`` (``why`` says what the limit protects)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:,}, got {value:,}{why}")
        return value

    return parse


def number(*, minimum: float, inclusive: bool = True, maximum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number in the given range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        low_ok = value >= minimum if inclusive else value > minimum
        if not (low_ok and math.isfinite(value)) or (maximum is not None and value > maximum):
            low = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            high = f" and <= {maximum:g}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"must be {low}{high}, got {text}")
        return value

    return parse


def finite_float(text: str) -> float:
    """An argparse type: any finite number (``nan`` and ``inf`` are refused where a number enters)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def port(text: str) -> int:
    """An argparse type: a TCP port, 1-65535 (0 is not accepted: say which port to use)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {value}")
    return value


def probability(text: str) -> float:
    """An argparse type: a probability in [0, 1]."""
    return number(minimum=0, maximum=1)(text)


def limits_from_args(environment_limits: Any, args: argparse.Namespace) -> Any:
    """The rollout limits of a command with the rollout flags (``--max-turns``, ``--timeout``...): the
    environment's limits with every flag the user gave in its place (see ``resolve_limits``)."""
    from agentboost.agent.limits import resolve_limits

    return resolve_limits(
        environment_limits,
        {
            "max_turns": args.max_turns,
            "max_tool_calls": args.max_tool_calls,
            "max_total_tokens": args.max_total_tokens,
            "max_new_tokens": args.max_new_tokens,
            "timeout_s": args.timeout,
        },
    )


def run_identity(
    args: argparse.Namespace,
    environment: Any,
    environment_kwargs: dict[str, Any],
    sampling: Any,
    limits: Any,
    tasks: int,
) -> dict[str, Any]:
    """The ``run`` header of a results file written by ``rollout`` or ``eval``: what must match for a
    resume to continue the same run (:data:`agentboost.rollout.results.NOT_COMPARED` lists the keys
    that may change)."""
    import dataclasses

    return {
        "environment": args.env,
        "environment_name": environment.name,
        "environment_kwargs": environment_kwargs,
        "split": args.split,
        "seed": args.seed,
        "model": args.model,
        "template": getattr(args, "template", None),
        "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k},
        "limits": dataclasses.asdict(limits),
        "tasks": tasks,
        "samples": args.samples,
        "engine": args.engine,
        "workers": args.workers,
        "concurrency": args.concurrency,
        **server_facts(args),
    }


def server_facts(args: argparse.Namespace) -> dict[str, Any]:
    """The identity's ``server`` entry: what the remote servers said they are (version, model, dtype,
    logprobs), as ``check_engine_args`` found them; nothing for the local engine."""
    facts = getattr(args, "server_facts", None)
    if not facts:
        return {}
    return {"server": facts[0] if len(facts) == 1 else facts}


def add_run_arguments(parser: argparse.ArgumentParser, *, split: str, n: int | None) -> None:
    """The options ``rollout`` and ``eval`` share: which tasks, which model and engine, how to sample,
    how to resume, and the rollout limits (validated here, so both commands refuse the same input)."""
    from agentboost.engines.models import DEFAULT_MODEL

    parser.add_argument(
        "--env", default="arithmetic", help="environment name or module:Class (default: arithmetic)"
    )
    parser.add_argument("--env-kwargs", default=None, help="JSON keyword arguments for the environment")
    parser.add_argument(
        "-n",
        "--n",
        type=count(1, MAX_TASKS, TASKS_WHY),
        default=n,
        help=f"number of tasks (default: {n if n else 'all'})",
    )
    parser.add_argument("--split", default=split, help=f"task split (default: {split})")
    parser.add_argument(
        "--samples", type=count(1, MAX_SAMPLES), default=1, help="rollouts per task (default: 1)"
    )
    parser.add_argument("--seed", type=int, default=0, help="task and sampling seed")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model id or directory (tokenizer too)")
    parser.add_argument("--engine", default="local", choices=["local", "sglang", "vllm"])
    parser.add_argument("--url", action="append", help="server URL for remote engines (repeatable)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start over instead of resuming --out (an agentboost results file)",
    )
    parser.add_argument(
        "--allow-different-settings",
        action="store_true",
        help="resume --out even though it was written with other settings (they are listed)",
    )
    parser.add_argument(
        "--concurrency",
        type=count(1, MAX_CONCURRENCY, " (rollouts in flight at once; more only adds waiting)"),
        default=16,
        help="rollouts in flight at once",
    )
    parser.add_argument(
        "--workers", type=count(0), default=0, help="worker processes (0: run in this process)"
    )
    parser.add_argument(
        "--worker-setup-timeout",
        type=number(minimum=0, inclusive=False),
        default=600.0,
        help="seconds a worker may take to build its environment, tokenizer and engine (default 600)",
    )
    parser.add_argument(
        "--retries", type=count(0), default=2, help="extra attempts after an engine error or crash"
    )
    parser.add_argument("--temperature", type=number(minimum=0), default=0.7, help="0 for greedy")
    parser.add_argument("--top-p", type=number(minimum=0, inclusive=False, maximum=1), default=1.0)
    parser.add_argument("--max-turns", type=count(1), default=None)
    parser.add_argument("--max-tool-calls", type=count(1), default=None)
    parser.add_argument("--max-total-tokens", type=count(1), default=None)
    parser.add_argument("--max-new-tokens", type=count(1), default=None, help="per turn")
    parser.add_argument(
        "--timeout", type=number(minimum=0, inclusive=False), default=None, help="seconds per rollout"
    )
    add_server_arguments(parser)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """How long a remote engine waits for its servers (``--engine sglang`` / ``vllm``)."""
    remote = parser.add_argument_group("remote servers (--engine sglang / vllm)")
    positive = number(minimum=0, inclusive=False)
    remote.add_argument(
        "--read-timeout", type=positive, default=600.0, help="seconds a request may wait for its answer (600)"
    )
    remote.add_argument("--connect-timeout", type=positive, default=10.0, help="seconds to connect (10)")
    remote.add_argument(
        "--server-down-timeout",
        type=number(minimum=0),
        default=120.0,
        help="seconds every server may refuse connections (a restart) before the run gives up (120)",
    )


def engine_options(args: argparse.Namespace) -> dict[str, float]:
    """The remote engine's options from :func:`add_server_arguments`' flags ({} for the local engine)."""
    if args.engine == "local":
        return {}
    return {
        "read_timeout_s": args.read_timeout,
        "connect_timeout_s": args.connect_timeout,
        "down_budget_s": args.server_down_timeout,
    }
