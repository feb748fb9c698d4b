"""Choose an engine by name: ``local`` (embedded transformers), ``sglang`` or ``vllm`` (remote servers)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentboost.engines.base import Engine, check_engine
from agentboost.errors import ConfigError

ENGINE_KINDS = ("local", "sglang", "vllm")


def make_engine(
    kind: str, *, model: str, urls: Sequence[str] = (), retries: int | None = None, **options: Any
) -> Engine:
    """Build an engine, checked against the :class:`Engine` protocol (:func:`check_engine`). Remote kinds
    need ``urls``; ``local`` loads ``model`` in this process.

    ``retries=0`` (``--retries 0``) also turns off the remote client's own HTTP retries: no request is
    sent twice. Other values leave the client's retry policy as it is.
    """
    if kind == "local":
        if urls:
            raise ConfigError("--url is for remote engines; drop it or pass --engine sglang / vllm")
        from agentboost.engines.embedded.engine import LocalEngine

        return check_engine(LocalEngine.from_pretrained(model, **options))
    if kind not in ENGINE_KINDS:
        raise ConfigError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
    if not urls:
        raise ConfigError(f"the {kind} engine needs the server's address: --url http://HOST:PORT")
    if retries == 0 and "retry" not in options:
        from agentboost.engines.remote.transport import RetryPolicy

        options["retry"] = RetryPolicy(max_attempts=1)
    if kind == "sglang":
        from agentboost.engines.remote.sglang import SGLangEngine

        return check_engine(SGLangEngine(list(urls), **options))
    from agentboost.engines.remote.vllm import VLLMEngine

    return check_engine(VLLMEngine(list(urls), **options))


async def check_servers(
    kind: str,
    urls: Sequence[str],
    *,
    timeout_s: float = 3.0,
    wait_s: float = 0.0,
    say: Callable[[str], None] | None = None,
) -> None:
    """Ask each remote server's ``GET /health`` before a run, so a wrong ``--url`` fails in one line.

    A server that is still starting (connection refused, no answer within ``timeout_s``, or HTTP 5xx
    while it loads its model) is asked again every second for up to ``wait_s`` seconds, and ``say``
    (default: standard error) hears "waiting for the engine at URL ..." every 10 s meanwhile. Then
    :class:`~agentboost.errors.ServersDownError` names the URL, what it answered last and the fix. A
    server without a ``/health`` route (HTTP 404) counts as reachable.
    """
    import asyncio
    import time

    import aiohttp

    from agentboost.engines.remote.transport import normalize_urls
    from agentboost.errors import ServersDownError

    tell = say or (lambda line: print(f"agentboost: {line}", file=sys.stderr, flush=True))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in normalize_urls(list(urls)):
            started = time.monotonic()
            told = -_WAIT_NOTICE_S
            while (problem := await _health(session, url, timeout_s)) is not None:
                waited = time.monotonic() - started
                if waited >= wait_s:
                    start = " (agentboost serve-vllm --port PORT)" if kind == "vllm" else ""
                    longer = f" after waiting {waited:.0f} s" if wait_s else ""
                    raise ServersDownError(
                        f"the {kind} server at {url} {problem}{longer}; start it{start} or fix --url, "
                        "and give a server that takes minutes to load more time with --server-down-timeout "
                        "SECONDS",
                        url=url,
                        attempts=1,
                    )
                if waited - told >= _WAIT_NOTICE_S:
                    told = waited
                    tell(f"waiting for the engine at {url} ({problem}; {waited:.0f} s of {wait_s:g} s)")
                await asyncio.sleep(min(1.0, max(0.0, wait_s - waited)))


_WAIT_NOTICE_S = 10.0
"""Seconds between two "waiting for the engine" lines while a server starts."""


async def _health(session: Any, url: str, timeout_s: float) -> str | None:
    """Why the server at ``url`` is not ready (in words), or None when ``GET /health`` says it is."""
    import asyncio

    import aiohttp

    try:
        async with session.get(f"{url}/health") as response:
            status = response.status
    except asyncio.TimeoutError:
        return f"did not answer GET /health within {timeout_s:g} s"
    except (aiohttp.ClientError, OSError) as error:
        cause = getattr(error, "os_error", error)
        reason = os.strerror(cause.errno) if getattr(cause, "errno", None) else str(error)
        return f"cannot be reached ({reason})"
    if status >= 500:
        return f"is not ready (GET /health answered HTTP {status}: still loading its model, or failing)"
    return None


async def check_engine_args(
    kind: str,
    *,
    model: str,
    urls: Sequence[str] | None,
    sampling: Any = None,
    options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """What ``rollout`` and ``eval`` check before anything heavy is imported: ``--engine`` and ``--url``
    agree, every remote server answers (:func:`check_servers`), and its logprobs are those of the
    sampling distribution for ``sampling`` (:mod:`agentboost.engines.remote.probe`).

    Returns the servers' facts (what produced the rollouts: version, model, dtype, logprobs; one entry
    per distinct set), [] for the local engine.
    """
    from agentboost.errors import ConfigError

    if kind == "local":
        if urls:
            raise ConfigError("--url is for remote engines; drop it or pass --engine sglang / vllm")
        return []
    engine = make_engine(kind, model=model, urls=urls or (), **(options or {}))  # validates --engine / --url
    # a server still starting is waited for as long as a run lets its servers stay down
    from agentboost.engines.remote.transport import RetryPolicy

    wait_s = (options or {}).get("down_budget_s")
    await check_servers(kind, urls or (), wait_s=RetryPolicy().down_budget_s if wait_s is None else wait_s)
    try:
        await engine.fetch_model_info()  # type: ignore[attr-defined]
        if sampling is not None:
            engine.check_sampling(sampling)  # type: ignore[attr-defined]
        facts: list[dict[str, Any]] = []
        for found in engine.server_facts.values():  # type: ignore[attr-defined]
            if found not in facts:
                facts.append(found)
        return facts
    finally:
        await engine.aclose()
