"""``agentboost gateway``: serve a model to unmodified agents over the OpenAI and Anthropic APIs.

Every session name an agent uses (in its base URL ``/s/<session>/v1`` or as its API key) opens a
session on first use. A session is written to ``--out`` (one JSON line, forked rows included) as soon
as it finishes: a limit ends it, it has no request for ``--idle-timeout`` seconds, or the agent sends
``DELETE /sessions/<session>``; on Ctrl-C the open ones are written too, and the command exits 130. A
session that never got a turn (every request refused) is not written. ``GET
/sessions/<session>/trajectory`` reads one while serving.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from agentboost.cli_args import claim_port, count, number, port
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
    parser.add_argument(
        "--out", default=None, help="write each session's trajectory here as it finishes (JSONL)"
    )
    parser.add_argument(
        "--max-request-mb",
        type=number(minimum=0.001),
        default=8.0,
        help="largest request body served, in MiB; larger ones get HTTP 413 (default: 8)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=number(minimum=0.001),
        default=600.0,
        help="finish (and write) a session after this many seconds without a request (default: 600)",
    )
    parser.set_defaults(func=run_gateway)
    return parser


def run_gateway(args: argparse.Namespace) -> int:
    """Load the engine, serve until interrupted, write the sessions. Returns the exit status."""
    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise ConfigError(f"{out} exists; pick a new --out so no earlier sessions are overwritten")
    claim_port(args.host, args.port)  # before the model loads
    from agentboost.agent.limits import RolloutLimits
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.factory import make_engine
    from agentboost.gateway.server import Gateway
    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.models.weights import DEFAULT_MODEL
    from agentboost.tokens.tokenizer import tokenizer_of
    from agentboost.tokens.trajectory import TerminationReason

    model = args.model or DEFAULT_MODEL
    engine = make_engine(args.engine, model=model, urls=args.url or ())
    tokenizer = tokenizer_of(engine) or load_tokenizer(model)
    written = {"sessions": 0, "empty": 0}

    def write(session: Any) -> None:
        """One finished session as a line of --out, on disk before the next request is served."""
        if session.served_turns == 0:  # every request was refused: nothing to train on
            written["empty"] += 1
            return
        written["sessions"] += 1
        if out is None:
            return
        reason = session.termination or TerminationReason.COMPLETED
        line = session.trajectory(session.id, reason, session.termination_detail).to_json() + "\n"
        with open(out, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

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
        max_request_bytes=int(args.max_request_mb * 1024 * 1024),
        on_finish=write,
        session_idle_s=args.idle_timeout,
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
            for session_id in list(gateway.sessions):  # the open sessions, as they stand
                gateway.finish_session(session_id)
            await gateway.aclose()
            await engine.aclose()
            where = f" to {out}" if out is not None else " (no --out: not kept)"
            empty = f"; {written['empty']} with no served turn not written" if written["empty"] else ""
            print(f"agentboost gateway: wrote {written['sessions']} sessions{where}{empty}", file=sys.stderr)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print("agentboost: interrupted", file=sys.stderr)
        return 130
    except AgentBoostError as error:
        print(f"agentboost gateway: {error}", file=sys.stderr)
        return 2
    return 0
