"""The `agentboost serve` command: load a model and serve it over HTTP (:mod:`agentboost.engines.server`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agentboost.engines.faults import FAULT_KINDS, FaultConfig
from agentboost.engines.server import serve_forever
from agentboost.errors import AgentBoostError, ConfigError


def register_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an argparse ``subparsers`` object; ``args.func(args)`` runs it."""
    from agentboost.cli_args import count, number, port, probability

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over HTTP in the SGLang /generate and vLLM /v1/completions wire formats",
        description=(
            "Serve a model with the embedded transformers engine, speaking the subset of the SGLang "
            "and vLLM wire formats that agentboost's remote engines use (token ids in, ids and "
            "log-probabilities out), plus GET /health."
        ),
    )
    parser.add_argument(
        "--model", default=None, help="model directory or hub id (default: the embedded default model)"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="name reported by /v1/models (default: --model)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=port, default=30000, help="port to listen on (default: 30000)")
    parser.add_argument(
        "--context-length",
        type=count(1),
        default=None,
        help="context length to report (default: the model's)",
    )
    faults = parser.add_argument_group("fault injection (for testing clients)")
    for kind in FAULT_KINDS:
        faults.add_argument(
            f"--fault-{kind.replace('_', '-')}",
            type=probability,
            default=0.0,
            metavar="P",
            dest=f"fault_{kind}",
            help=f"probability that a generation request gets fault {kind!r}",
        )
    faults.add_argument(
        "--fault-schedule",
        default="",
        metavar="LIST",
        help="comma-separated faults for the first generation requests, e.g. 'http_500,ok,drop' "
        f"(kinds: {', '.join(FAULT_KINDS)})",
    )
    faults.add_argument(
        "--fault-slow-delay", type=number(minimum=0), default=5.0, metavar="S", help="delay of 'slow' (s)"
    )
    faults.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws")
    parser.set_defaults(func=run_serve)
    return parser


def faults_from_args(args: argparse.Namespace) -> FaultConfig | None:
    """The FaultConfig the ``--fault-*`` options describe, or None when they describe none."""
    probabilities = {
        kind: getattr(args, f"fault_{kind}") for kind in FAULT_KINDS if getattr(args, f"fault_{kind}")
    }
    schedule = [item.strip() for item in args.fault_schedule.split(",") if item.strip()]
    if not probabilities and not schedule:
        return None
    return FaultConfig(
        schedule=schedule,
        probabilities=probabilities,
        slow_delay_s=args.fault_slow_delay,
        seed=args.fault_seed,
    )


def run_serve(args: argparse.Namespace) -> int:
    """The ``serve`` command: load the model, serve until interrupted. Returns the exit status."""
    try:
        faults = faults_from_args(args)
        from agentboost.engines.local import LocalEngine
        from agentboost.engines.models import DEFAULT_MODEL

        model = args.model or DEFAULT_MODEL
        engine = LocalEngine.from_pretrained(model)
    except AgentBoostError as error:
        print(f"agentboost serve: {error}", file=sys.stderr)
        return 2
    name = args.served_model_name or model

    async def main() -> None:
        try:
            await serve_forever(
                engine,
                model_name=name,
                context_length=args.context_length,
                faults=faults,
                host=args.host,
                port=args.port,
            )
        finally:
            await engine.aclose()

    try:
        asyncio.run(main())
    except ConfigError as error:
        print(f"agentboost serve: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
