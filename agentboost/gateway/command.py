"""``agentboost gateway``: serve a model to unmodified agents over the OpenAI and Anthropic APIs.

Every session name an agent uses (in its base URL ``/s/<session>/v1`` or as its API key) opens a
session on first use. On Ctrl-C each session's trajectory is written to ``--out`` (one JSON line per
session, forked rows included); ``GET /sessions/<session>/trajectory`` reads one while serving.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from agentboost.cli_args import count, number, port
from agentboost.errors import AgentBoostError, ConfigError


def register_gateway_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``gateway`` to an argparse ``subparsers`` object; ``args.func(args)`` runs it."""
    parser = subparsers.add_parser(
        "gateway",
        help="serve a model to unmodified agents over the OpenAI and Anthropic APIs, keeping exact tokens",
        description=__doc__,
    )
    parser.add_argument("--model", default=None, help="model name or path (default: the default model)")
    parser.add_argument("--engine", default="local", help="local (embedded), sglang or vllm")
    parser.add_argument("--url", action="append", default=None, help="server URL for --engine sglang/vllm")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=port, default=4000, help="port to listen on (default: 4000)")
    parser.add_argument("--template", default=None, help="chat template: qwen3, chatml or tokenizer")
    parser.add_argument("--parser", default="hermes", help="tool-call format (default: hermes)")
    parser.add_argument(
        "--drift", choices=["fork", "reset", "refuse"], default="fork", help="what a rewritten history does"
    )
    parser.add_argument("--temperature", type=number(minimum=0), default=1.0, help="default temperature")
    parser.add_argument("--max-new-tokens", type=count(1), default=1024, help="tokens per turn at most")
    parser.add_argument("--max-turns", type=count(1), default=10_000, help="model turns per session at most")
    parser.add_argument("--out", default=None, help="write the sessions' trajectories here on exit (JSONL)")
    parser.set_defaults(func=run_gateway)
    return parser


def run_gateway(args: argparse.Namespace) -> int:
    """Load the engine, serve until interrupted, write the sessions. Returns the exit status."""
    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise ConfigError(f"{out} exists; pick a new --out so no earlier sessions are overwritten")
    from agentboost.agent.limits import RolloutLimits
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.factory import make_engine
    from agentboost.gateway.server import Gateway
    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.models.weights import DEFAULT_MODEL
    from agentboost.tokens.tokenizer import tokenizer_of
    from agentboost.tokens.trajectory import TerminationReason, write_jsonl

    model = args.model or DEFAULT_MODEL
    engine = make_engine(args.engine, model=model, urls=args.url or ())
    tokenizer = tokenizer_of(engine) or load_tokenizer(model)
    gateway = Gateway(
        engine,
        tokenizer,
        template=args.template,
        parser=args.parser,
        sampling=SamplingParams(temperature=args.temperature),
        limits=RolloutLimits(max_new_tokens=args.max_new_tokens, max_turns=args.max_turns),
        policy=args.drift,
        open_sessions=True,
        model_name=Path(model).name,
    )

    async def main() -> None:
        try:
            url = await gateway.start(args.host, args.port)
            print(
                f"agentboost gateway: serving {model} at {url}/s/<session>/v1 (OpenAI) and "
                f"{url}/s/<session> (Anthropic); Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            await asyncio.Event().wait()
        finally:
            sessions = list(gateway.sessions.values())
            await gateway.aclose()
            await engine.aclose()
            if out is not None and sessions:
                trajectories = [
                    session.trajectory(
                        session.id,
                        session.termination or TerminationReason.COMPLETED,
                        session.termination_detail,
                    )
                    for session in sessions
                ]
                write_jsonl(out, trajectories)
                print(f"agentboost gateway: wrote {len(trajectories)} sessions to {out}", file=sys.stderr)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except AgentBoostError as error:
        print(f"agentboost gateway: {error}", file=sys.stderr)
        return 2
    return 0
