"""Choose an engine by name: ``local`` (embedded transformers), ``sglang`` or ``vllm`` (remote servers)."""

from __future__ import annotations

import os
from collections.abc import Sequence
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


async def check_servers(kind: str, urls: Sequence[str], *, timeout_s: float = 3.0) -> None:
    """Ask each remote server's ``GET /health`` once, before a run, so a wrong ``--url`` fails in seconds.

    Raises :class:`~agentboost.errors.EngineConnectionError` naming the URL when a server cannot be
    reached, does not answer within ``timeout_s``, or answers with HTTP 5xx. A server without a
    ``/health`` route (HTTP 404) counts as reachable.
    """
    import asyncio

    import aiohttp

    from agentboost.engines.remote.transport import normalize_urls
    from agentboost.errors import EngineConnectionError

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in normalize_urls(list(urls)):
            advice = f"start the {kind} server or fix --url"
            try:
                async with session.get(f"{url}/health") as response:
                    status = response.status
            except asyncio.TimeoutError as error:
                raise EngineConnectionError(
                    f"the {kind} server at {url} did not answer GET /health within {timeout_s:g} s; {advice}",
                    url=url,
                    attempts=1,
                ) from error
            except (aiohttp.ClientError, OSError) as error:
                cause = getattr(error, "os_error", error)
                reason = os.strerror(cause.errno) if getattr(cause, "errno", None) else str(error)
                raise EngineConnectionError(
                    f"cannot reach the {kind} server at {url} ({reason}); {advice}", url=url, attempts=1
                ) from error
            if status >= 500:
                raise EngineConnectionError(
                    f"the {kind} server at {url} is not healthy (GET /health answered HTTP {status}); "
                    "wait until it has loaded its model, or check its log",
                    url=url,
                    status=status,
                    attempts=1,
                )


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
    await check_servers(kind, urls or ())
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
