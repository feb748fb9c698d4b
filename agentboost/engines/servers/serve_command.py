"""The `agentboost serve` command: load a model and serve it over HTTP
(:mod:`agentboost.engines.servers.serve`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agentboost.engines.servers.faults import FAULT_KINDS, FaultConfig
from agentboost.engines.servers.serve import serve_forever
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
        from agentboost.cli_args import claim_port

        claim_port(args.host, args.port)  # before the model loads
        faults = faults_from_args(args)
        from agentboost.engines.embedded.engine import LocalEngine
        from agentboost.models.weights import DEFAULT_MODEL

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


def register_serve_vllm_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve-vllm`` (a real vLLM server with agentboost's settings) to ``subparsers``."""
    from agentboost.cli_args import count, number, port

    parser = subparsers.add_parser(
        "serve-vllm",
        help="start a real vLLM server with every setting agentboost relies on and wait until it is ready",
        description=(
            "Start `python -m vllm.entrypoints.openai.api_server` from the Python that has vLLM installed, "
            "with processed (sampling-distribution) logprobs, fp32, whole-prompt prefill (seeded requests "
            "are safe on CPU) and all cores; print its URL once it answers, stop it on Ctrl-C or SIGTERM. "
            "See docs/vllm.md."
        ),
    )
    parser.add_argument(
        "--model", default=None, help="model directory (default: the default model's converted copy)"
    )
    parser.add_argument(
        "--python",
        default=None,
        help="the Python with vLLM installed (default: $AGENTBOOST_VLLM_PYTHON, else this Python)",
    )
    parser.add_argument("--served-model-name", default=None, help="name in /v1/models (default: model dir)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=port, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument("--dtype", default="float32", help="weights' dtype (default: float32, exact on CPU)")
    parser.add_argument("--max-model-len", type=count(16), default=4096, help="context length (default 4096)")
    parser.add_argument(
        "--kv-cache-gib", type=number(minimum=0, inclusive=False), default=2.0, help="CPU KV cache (GiB)"
    )
    parser.add_argument(
        "--cpus", default=None, help="cores to bind, e.g. 0-1 (default: all this process may use)"
    )
    parser.add_argument(
        "--weight-sync",
        action="store_true",
        help="enable the endpoints training pushes weights through (VLLM_SERVER_DEV_MODE=1) and agentboost's "
        "worker extension, whose reload also refreshes a tied output head",
    )
    parser.add_argument(
        "--ready-timeout", type=number(minimum=0, inclusive=False), default=300.0, help="seconds to wait"
    )
    parser.add_argument("--log", default=None, help="server log file (default: a temporary file)")
    parser.add_argument(
        "extra", nargs=argparse.REMAINDER, help="after --: more vLLM arguments, passed as they are"
    )
    parser.set_defaults(func=run_serve_vllm)
    return parser


def run_serve_vllm(args: argparse.Namespace) -> int:
    """The ``serve-vllm`` command: start vLLM, print its URL, wait for Ctrl-C or SIGTERM, stop it."""
    import signal
    import time

    from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig
    from agentboost.models.weights import DEFAULT_MODEL, resolve_model

    try:
        from agentboost.cli_args import claim_port

        claim_port(args.host, args.port)  # before the model is pulled or vLLM starts
        model = resolve_model(args.model or DEFAULT_MODEL)
        extra = [item for item in args.extra if item != "--"]
        server = VLLMServer(
            VLLMServerConfig(
                model=model,
                python=args.python,
                served_model_name=args.served_model_name,
                host=args.host,
                port=args.port,
                dtype=args.dtype,
                max_model_len=args.max_model_len,
                kv_cache_gib=args.kv_cache_gib,
                cpus=args.cpus,
                weight_sync=args.weight_sync,
                extra_args=extra,
                ready_timeout_s=args.ready_timeout,
                log_path=args.log,
            )
        )
    except AgentBoostError as error:
        print(f"agentboost serve-vllm: {error}", file=sys.stderr)
        return 2

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl-C does, during start-up too

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        print(f"agentboost serve-vllm: starting {server.describe()}", file=sys.stderr)
        print(server.start(), flush=True)
        print(f"agentboost serve-vllm: ready; log {server.log_path}; Ctrl-C stops it", file=sys.stderr)
        while server.process is not None and server.process.poll() is None:
            time.sleep(1.0)
        print(f"agentboost serve-vllm: the server exited: {server.log_tail()}", file=sys.stderr)
        return 1
    except AgentBoostError as error:
        print(f"agentboost serve-vllm: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
    return 0
