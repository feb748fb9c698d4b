"""The base of the SGLang and vLLM engines: model facts, context clamping, and one server per rollout.

A :class:`RemoteEngine` is safe to share between many concurrent rollouts in one event loop. Each rollout
generates through :meth:`RemoteEngine.bind` (keyed by its :class:`~agentboost.engines.base.RolloutKey`),
whose view keeps every turn on the server first chosen for it, so that server's prefix cache holds the
rollout's growing prompt. The transport (:mod:`agentboost.engines.remote.transport`) retries and types errors;
the wire format (:mod:`agentboost.engines.remote.wire`) is each subclass's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentboost.engines.base import Generation, RolloutKey, SamplingParams, check_max_new_tokens
from agentboost.engines.remote.probe import AGENTBOOST_SERVE, LogprobsFacts, probe_logprobs
from agentboost.engines.remote.transport import HttpClient, RetryPolicy
from agentboost.errors import (
    ConfigError,
    ContextLengthError,
    EngineConnectionError,
    EngineError,
    EngineRequestError,
    ServersDownError,
)

logger = logging.getLogger(__name__)


class RemoteEngine:
    """Base of the SGLang and vLLM engines: model facts, context clamping, rollout binding.

    Subclasses say how to build the request body, where to send it, how to read the answer and how
    to learn the server's context length (with the functions of their :mod:`agentboost.engines.remote.wire`
    module). An engine is safe to share between many concurrent rollouts in one event loop; each
    rollout generates through :meth:`bind` to keep its requests on one server. Several loops (threads)
    may share it too, each with its own connection pool; the load counts used for routing are then
    approximate.
    """

    server_kind: ClassVar[str] = "remote"
    generate_path: ClassVar[str] = "/generate"
    context_slack: ClassVar[int] = 0
    """Tokens the server keeps free: it needs ``prompt + max_new_tokens <= server context - slack``."""
    logprobs_fix: ClassVar[str] = ""
    """How to fix a server whose logprobs fail :mod:`agentboost.engines.remote.probe` (the end of the
    error)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        context_length: int | None = None,
        max_connections_per_server: int = 1024,
        check_logprobs: bool = True,
        down_budget_s: float | None = None,
    ) -> None:
        """``down_budget_s`` overrides ``retry``'s (how long every server may stay unreachable);
        ``check_logprobs``: probe each server's logprobs before the first generation."""
        if down_budget_s is not None:
            retry = dataclasses.replace(retry or RetryPolicy(), down_budget_s=down_budget_s)
        self._client = HttpClient(
            urls,
            server_kind=self.server_kind,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            retry=retry,
            max_connections_per_server=max_connections_per_server,
        )
        if context_length is not None and context_length <= self.context_slack:
            raise ConfigError(f"context_length must be > {self.context_slack}, got {context_length}")
        self._server_context = context_length
        self._context_override = context_length
        self._check_logprobs = check_logprobs
        self._info_known = context_length is not None and not check_logprobs
        self.server_facts: dict[str, dict[str, Any]] = {}
        """Per server URL: what produced the rollouts (version, model, dtype, logprobs); filled by
        :meth:`fetch_model_info`, recorded in a run's identity."""
        self._logprobs: dict[str, LogprobsFacts] = {}
        self._info_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    # -- Engine protocol -------------------------------------------------------------------

    @property
    def context_length(self) -> int | None:
        """The most tokens (prompt + generated) one request may hold on the server.

        That is the server's context length less ``context_slack``. None until the first request
        or :meth:`fetch_model_info` has asked the server.
        """
        if self._server_context is None:
            return None
        return self._server_context - self.context_slack

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        """Generate on the least-loaded server. Rollouts generate through :meth:`bind` instead."""
        return await self._generate(prompt_ids, sampling, max_new_tokens, None)

    async def aclose(self) -> None:
        """Close the connection pools (idempotent). A later request opens a new pool.

        Call it before the event loop that used the engine ends; a pool left behind by a finished
        loop is dropped and its sockets are only reclaimed by the garbage collector.
        """
        await self._client.aclose()

    # -- routing -----------------------------------------------------------------------------

    def bind(self, rollout: RolloutKey | Hashable) -> BoundEngine:
        """A view of this engine whose requests all go to one server, chosen at its first request.

        ``rollout`` names one rollout: a :class:`~agentboost.engines.base.RolloutKey` (task id and
        sample), or any hashable id. Generate through the view: the server then sees one growing prompt
        and reuses its prefix cache from turn to turn. The server is the least-loaded one at the view's
        first request; it only changes if that server becomes unreachable. :meth:`unbind` (or closing
        the view) forgets the binding; views of the same key are counted, so one finishing never
        unbinds another. Neither closes the engine.
        """
        self._client.pool.hold(rollout)
        return BoundEngine(self, rollout)

    def unbind(self, rollout: RolloutKey | Hashable) -> None:
        """One holder of ``rollout``'s binding is done; the last one forgets the server chosen for it."""
        self._client.pool.release(rollout)

    def server_for(self, rollout: RolloutKey | Hashable) -> str | None:
        """The URL ``rollout`` is bound to, or None before its first request (or after unbind)."""
        return self._client.pool.server_for(rollout)

    @property
    def urls(self) -> list[str]:
        return self._client.urls

    def outage(self) -> ServersDownError | None:
        """The error a run stops with once every server has refused connections for the whole
        server-down budget; None while one answers or the budget lasts."""
        return self._client.outage()

    def in_flight(self) -> dict[str, int]:
        """Requests in flight per server URL (what least-loaded routing compares)."""
        return self._client.pool.in_flight()

    # -- model facts -------------------------------------------------------------------------

    async def fetch_model_info(self) -> None:
        """Ask the servers for the model facts (context length) now; done once, on first use.

        Await it before the first rollout when code reads :attr:`context_length` before generating.
        """
        if self._info_known:
            return
        loop = asyncio.get_running_loop()
        task = self._info_tasks.get(loop)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = loop.create_task(self._load_model_info())
            self._info_tasks[loop] = task
        # shield: one caller being cancelled must not cancel the fetch the others wait on
        await asyncio.shield(task)

    async def _load_model_info(self) -> None:
        length = await self._fetch_context_length()
        if self._context_override is None:
            self._server_context = length
        if self._check_logprobs:
            for url in self.urls:
                try:
                    facts = await self._fetch_facts(url)
                except EngineConnectionError:
                    # a run's command checks every server first; here a dead one just goes unprobed
                    logger.warning(
                        "%s server %s is unreachable; its logprobs are not probed", self.server_kind, url
                    )
                    continue
                if facts.get("server") != AGENTBOOST_SERVE:  # agentboost's own server keeps the convention
                    logprobs = await probe_logprobs(
                        lambda temperature, top_k, url=url: self._top_logprobs(url, temperature, top_k),
                        server=f"{self.server_kind} server {url}",
                        fix=self.logprobs_fix,
                    )
                    self._logprobs[url] = logprobs
                    facts["logprobs"] = logprobs.describe()
                self.server_facts[url] = facts
        self._info_known = True
        self._info_tasks.clear()

    async def _fetch_context_length(self) -> int | None:
        raise NotImplementedError

    async def _fetch_facts(self, url: str) -> dict[str, Any]:
        """What the server at ``url`` says about itself (kind, version, model, dtype where exposed)."""
        raise NotImplementedError

    async def _top_logprobs(self, url: str, temperature: float, top_k: int) -> dict[int, float]:
        """The top logprobs of the probe prompt's next token (:mod:`agentboost.engines.remote.probe`)."""
        raise NotImplementedError

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Refuse sampling settings whose logprobs a probed server would report off the convention."""
        for url, facts in self._logprobs.items():
            facts.check(sampling, server=f"{self.server_kind} server {url}")

    # -- generation --------------------------------------------------------------------------

    def _room(self, prompt_len: int, requested: int) -> int:
        """``max_new_tokens`` clamped to what the context leaves; ContextLengthError if nothing."""
        usable = self.context_length
        if usable is None:
            return requested
        room = usable - prompt_len
        if room < 1:
            raise ContextLengthError(
                f"the prompt has {prompt_len} tokens and the {self.server_kind} server takes at most "
                f"{usable} (prompt + new tokens; its context length is {self._server_context}), so no "
                "token can be generated; the request was not sent. Shorten the conversation or serve the "
                "model with a longer context."
            )
        return min(requested, room)

    async def _generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, requested: int, rollout: Hashable | None
    ) -> Generation:
        requested = check_max_new_tokens(requested)
        if not self._info_known:
            await self.fetch_model_info()
        clock = time.perf_counter()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineRequestError(f"cannot send an empty prompt to the {self.server_kind} server")
        self.check_sampling(sampling)
        max_new_tokens = self._room(len(prompt), requested)
        body = self.build_request(prompt, sampling, max_new_tokens)
        build_s = time.perf_counter() - clock
        result = await self._client.request(
            "POST",
            self.generate_path,
            body=body,
            parse=lambda payload: self.parse_response(payload, prompt, sampling, max_new_tokens),
            session_id=rollout,
        )
        generation: Generation = result.value
        generation.metrics.update(
            {
                "request_s": result.elapsed_s,
                "attempts": float(result.attempts),
                "client_overhead_s": result.client_s + build_s,
            }
        )
        return generation

    def build_request(
        self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> dict[str, Any]:
        """The JSON body of one generation request."""
        raise NotImplementedError

    def parse_response(
        self, payload: Any, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        """Turn the server's JSON answer into a Generation; raise ResponseFormatError if it cannot."""
        raise NotImplementedError


@dataclass
class BoundEngine:
    """An :class:`~agentboost.engines.base.Engine` view that keeps one rollout on one server.

    Made by :meth:`RemoteEngine.bind`. ``aclose`` (like ``RemoteEngine.unbind``) releases the binding
    only; the engine it views stays open for other rollouts.
    """

    engine: RemoteEngine
    rollout: Hashable
    _closed: bool = field(default=False, repr=False)

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    @property
    def server_url(self) -> str | None:
        """The server this rollout uses; None before its first request."""
        return self.engine.server_for(self.rollout)

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        if self._closed:
            raise EngineError(
                f"the engine view for rollout {self.rollout} is closed; "
                "bind the engine again for a new rollout"
            )
        return await self.engine._generate(prompt_ids, sampling, max_new_tokens, self.rollout)

    def bind(self, rollout: RolloutKey | Hashable) -> BoundEngine:
        """Bind the underlying engine for another rollout (a view is one rollout's)."""
        return self.engine.bind(rollout)

    def unbind(self, rollout: RolloutKey | Hashable) -> None:
        self.engine.unbind(rollout)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.unbind(self.rollout)
