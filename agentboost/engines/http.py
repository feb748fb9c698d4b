"""One HTTP client core for the remote engines: SGLang, vLLM and `agentboost serve`.

What every remote engine gets from here:

* a connection pool per event loop (an ``aiohttp.ClientSession`` made lazily for each running
  loop, closed by :meth:`RemoteEngine.aclose`), with connect and read timeouts;
* retries only where a retry can help: connection errors, timeouts, HTTP 429, HTTP 5xx, and
  malformed or truncated bodies. Backoff is exponential with jitter and the whole request,
  retries included, never outlives :attr:`RetryPolicy.total_budget_s`. Any other 4xx fails at once;
* typed errors (subclasses of :class:`~agentboost.errors.EngineError`) whose messages say what
  happened and what to do, so a rollout ends with termination ``engine_error`` (or
  ``context_full`` for :class:`~agentboost.errors.ContextLengthError`) instead of crashing;
* cancellation: cancelling the task that awaits ``generate`` closes the in-flight connection, so
  the server sees the disconnect and can stop generating;
* several server URLs with least-loaded routing (fewest requests in flight). A rollout that calls
  :meth:`RemoteEngine.bind` gets a view whose requests all go to the server first chosen for it,
  so the server's prefix cache holds the rollout's growing prompt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import aiohttp

from agentboost.engines.base import Generation, SamplingParams
from agentboost.errors import (
    ConfigError,
    ContextLengthError,
    EngineConnectionError,
    EngineError,
    EngineRateLimitedError,
    EngineRequestError,
    EngineResponseError,
    EngineServerError,
    EngineTimeoutError,
    RemoteEngineError,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

_JSON_HEADERS = {"Content-Type": "application/json"}
_UNREACHABLE_COOLDOWN_S = 2.0
"""After a server refuses a connection, new work avoids it for this long (unless all are down)."""
_MIN_ATTEMPT_S = 0.05
"""No attempt starts with less than this left of the retry budget: it could only time out."""
_CONTEXT_MESSAGE = re.compile(r"context length|context window|maximum context|too long", re.IGNORECASE)


@dataclass(frozen=True)
class RetryPolicy:
    """How a remote engine retries a request that failed for a reason a retry can fix."""

    max_attempts: int = 6
    """Requests sent at most, the first one included. 1 disables retries."""
    initial_backoff_s: float = 0.5
    """Wait before the second attempt; doubles for each later one (before jitter)."""
    max_backoff_s: float = 8.0
    """The wait between two attempts never exceeds this, whatever the attempt number or Retry-After."""
    total_budget_s: float = 900.0
    """Wall-clock bound on one request, every attempt and wait included. Each attempt's own timeout
    is cut to what is left of it, so a request never takes longer than this (plus a little
    scheduling slack)."""
    jitter: float = 0.5
    """Fraction of each wait that is random, so that clients do not retry in lockstep."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("RetryPolicy backoff times must be >= 0")
        if self.total_budget_s <= 0:
            raise ConfigError(f"RetryPolicy.total_budget_s must be > 0, got {self.total_budget_s}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (attempt - 1))
        return base * (1 - self.jitter) + base * self.jitter * rng.random()


class ResponseFormatError(Exception):
    """Raised by a response parser: the JSON arrived but is not what the wire format promises.

    ``retryable`` marks server-side faults worth another attempt (an aborted request); anything
    else means client and server disagree on the format, which a retry will not fix.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class _Server:
    url: str
    index: int
    in_flight: int = 0
    bound_sessions: int = 0
    unreachable_until: float = 0.0


class ServerPool:
    """Least-loaded choice among several servers, with sticky bindings for sessions.

    Load is the number of requests in flight (ties: fewer bound sessions, then round robin). A
    session is bound to the server chosen for its first request and stays there, unless that server
    cannot be reached, in which case it moves to the least-loaded reachable one.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self.servers = [_Server(url=url, index=index) for index, url in enumerate(urls)]
        self._bindings: dict[str, _Server] = {}
        self._turn = 0

    def pick(self, session_id: str | None = None, avoid: set[int] | frozenset[int] = frozenset()) -> _Server:
        """The server for the next request of ``session_id`` (None: unbound), skipping ``avoid``."""
        bound = self._bindings.get(session_id) if session_id is not None else None
        if bound is not None and bound.index not in avoid:
            return bound
        now = time.monotonic()
        candidates = [s for s in self.servers if s.index not in avoid and s.unreachable_until <= now]
        if not candidates:
            candidates = [s for s in self.servers if s.index not in avoid] or self.servers
        count = len(self.servers)
        turn = self._turn
        self._turn += 1
        chosen = min(candidates, key=lambda s: (s.in_flight, s.bound_sessions, (s.index - turn) % count))
        if session_id is not None:
            if bound is not None:
                bound.bound_sessions -= 1
                logger.warning(
                    "session %s moves from %s to %s: server unreachable", session_id, bound.url, chosen.url
                )
            self._bindings[session_id] = chosen
            chosen.bound_sessions += 1
        return chosen

    def server_for(self, session_id: str) -> str | None:
        bound = self._bindings.get(session_id)
        return bound.url if bound is not None else None

    def unbind(self, session_id: str) -> None:
        bound = self._bindings.pop(session_id, None)
        if bound is not None:
            bound.bound_sessions -= 1

    def mark_unreachable(self, server: _Server) -> None:
        server.unreachable_until = time.monotonic() + _UNREACHABLE_COOLDOWN_S

    def in_flight(self) -> dict[str, int]:
        return {s.url: s.in_flight for s in self.servers}


@dataclass
class RequestResult(Generic[T]):
    """A parsed answer and how it was obtained."""

    value: T
    url: str
    attempts: int
    elapsed_s: float
    client_s: float
    """Time spent in client code on the event loop: JSON encoding, decoding and parsing."""


@dataclass
class _Failure:
    """A retryable failure of one attempt."""

    kind: str  # connect | dropped | timeout | server | overloaded | malformed | truncated | aborted
    detail: str
    status: int | None = None
    retry_after_s: float | None = None
    budget_cut: bool = False
    """A timeout that only happened because the retry budget ran out during the attempt."""


@dataclass
class _Reply:
    status: int
    body: bytes
    retry_after_s: float | None = None


def normalize_urls(urls: str | Sequence[str]) -> list[str]:
    """``"http://a:1, http://b:2"`` or a sequence of URLs -> cleaned list; raises ConfigError."""
    items = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else [str(u).strip() for u in urls]
    items = [u.rstrip("/") for u in items if u]
    if not items:
        raise ConfigError("a remote engine needs at least one server URL, e.g. http://127.0.0.1:30000")
    for url in items:
        if not re.match(r"^https?://[^/\s]+", url):
            raise ConfigError(f"server URL {url!r} must start with http:// or https:// and name a host")
    if len(set(items)) != len(items):
        raise ConfigError(f"server URLs are repeated: {items}")
    return items


def error_message(body: bytes, limit: int = 300) -> str:
    """The human-readable message inside an error body (JSON or text), shortened to ``limit``."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        elif isinstance(payload.get("message"), str):
            text = payload["message"]
        elif isinstance(payload.get("detail"), str):
            text = payload["detail"]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class HttpClient:
    """Sends JSON requests to a pool of servers with per-loop sessions, retries and typed errors."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        server_kind: str,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        max_connections_per_server: int = 1024,
    ) -> None:
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ConfigError("connect_timeout_s and read_timeout_s must be > 0")
        if max_connections_per_server < 1:
            raise ConfigError("max_connections_per_server must be >= 1")
        self.pool = ServerPool(normalize_urls(urls))
        self.server_kind = server_kind
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.retry = retry or RetryPolicy()
        self.max_connections_per_server = max_connections_per_server
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._rng = random.Random()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.pool.servers]

    def _session(self) -> aiohttp.ClientSession:
        """The session of the running loop, made on first use (one connection pool per loop)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is not None and not session.closed:
            return session
        for other in [other for other in self._sessions if other.is_closed()]:
            _abandon(self._sessions.pop(other))
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.max_connections_per_server)
        session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        self._sessions[loop] = session
        return session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        parse: Callable[[Any], T],
        session_id: str | None = None,
        url: str | None = None,
    ) -> RequestResult[T]:
        """Send ``body`` as JSON to ``path`` on a server of the pool and return ``parse(json_reply)``.

        ``url`` pins the request to one server of the pool (no routing). Raises a subclass of
        :class:`~agentboost.errors.EngineError` when the request cannot succeed.
        """
        started = time.monotonic()
        clock = time.perf_counter()
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        client_s = time.perf_counter() - clock
        session = self._session()
        policy = self.retry
        deadline = started + policy.total_budget_s
        pinned = next((s for s in self.pool.servers if s.url == url), None) if url is not None else None
        avoid: set[int] = set()
        attempts = 0
        previous: _Failure | None = None
        while True:
            attempts += 1
            server = pinned or self.pool.pick(session_id, avoid)
            remaining = deadline - time.monotonic()
            outcome = await self._attempt(session, server, method, path, data, remaining)
            if isinstance(outcome, _Reply):
                status = outcome.status
                if 200 <= status < 300:
                    clock = time.perf_counter()
                    try:
                        result = self._decode(outcome.body, parse, server, attempts)
                    finally:
                        client_s += time.perf_counter() - clock
                    if not isinstance(result, _Failure):
                        elapsed = time.monotonic() - started
                        return RequestResult(result, server.url, attempts, elapsed, client_s)
                    failure = result
                elif status == 429:
                    failure = _Failure(
                        "overloaded", error_message(outcome.body), status, outcome.retry_after_s
                    )
                elif status >= 500:
                    failure = _Failure("server", error_message(outcome.body), status, outcome.retry_after_s)
                else:
                    raise self._rejected(status, outcome.body, server.url, path, attempts)
            else:
                failure = outcome
                if failure.kind == "connect":
                    avoid.add(server.index)
                    self.pool.mark_unreachable(server)
                if failure.budget_cut and previous is not None:
                    # the budget ran out mid-attempt: the failures before it say more than the cut
                    raise self._exhausted(previous, server.url, attempts, started, "total_budget_s")
            previous = failure
            if attempts >= policy.max_attempts:
                raise self._exhausted(failure, server.url, attempts, started, "max_attempts")
            delay = policy.backoff_s(attempts, self._rng)
            if failure.retry_after_s is not None:
                delay = max(delay, min(failure.retry_after_s, policy.max_backoff_s))
            if time.monotonic() + delay + _MIN_ATTEMPT_S >= deadline:
                raise self._exhausted(failure, server.url, attempts, started, "total_budget_s")
            logger.info(
                "%s %s%s failed (%s: %s); retry %d in %.2f s",
                self.server_kind,
                server.url,
                path,
                failure.kind,
                failure.detail,
                attempts,
                delay,
            )
            await asyncio.sleep(delay)

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        server: _Server,
        method: str,
        path: str,
        data: bytes | None,
        remaining_s: float,
    ) -> _Reply | _Failure:
        """One HTTP exchange. Retryable transport failures come back as a :class:`_Failure`."""
        timeout = aiohttp.ClientTimeout(
            total=remaining_s,
            connect=min(self.connect_timeout_s, remaining_s),
            sock_read=min(self.read_timeout_s, remaining_s),
        )
        server.in_flight += 1
        try:
            async with session.request(
                method, server.url + path, data=data, headers=_JSON_HEADERS if data else None, timeout=timeout
            ) as response:
                body = await response.read()
                return _Reply(response.status, body, _parse_retry_after(response.headers.get("Retry-After")))
        except aiohttp.ConnectionTimeoutError as error:
            return _Failure("connect", f"connection timed out after {self.connect_timeout_s:g} s ({error})")
        except asyncio.TimeoutError:
            if remaining_s < self.read_timeout_s:
                detail = f"no answer in the {remaining_s:.3g} s left of the retry budget"
                return _Failure("timeout", detail, budget_cut=True)
            return _Failure("timeout", f"no answer within read_timeout_s={self.read_timeout_s:g}")
        except aiohttp.ClientConnectorError as error:
            return _Failure("connect", str(error) or type(error).__name__)
        except aiohttp.ClientPayloadError as error:
            return _Failure("truncated", f"{type(error).__name__}: {error}".rstrip(": "))
        except aiohttp.ClientConnectionError as error:
            return _Failure("dropped", f"{type(error).__name__}: {error}".rstrip(": "))
        finally:
            server.in_flight -= 1

    def _decode(self, body: bytes, parse: Callable[[Any], T], server: _Server, attempts: int) -> T | _Failure:
        try:
            payload = json.loads(body)
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
            return _Failure("malformed", f"body is not valid JSON ({error}); {len(body)} bytes received")
        try:
            return parse(payload)
        except ResponseFormatError as error:
            if error.retryable:
                return _Failure("aborted", str(error))
            raise EngineResponseError(
                f"{self.server_kind} server {server.url} answered in an unexpected format: {error}. "
                f"Check that the URL points at a {self.server_kind} server whose version speaks the fields "
                "agentboost asks for (see agentboost/engines/"
                f"{self.server_kind.lower()}.py); not retried.",
                url=server.url,
                status=200,
                attempts=attempts,
            ) from error

    def _rejected(self, status: int, body: bytes, url: str, path: str, attempts: int) -> EngineError:
        message = error_message(body) or "(empty body)"
        if status in (400, 413, 422) and _CONTEXT_MESSAGE.search(message):
            return ContextLengthError(
                f"{self.server_kind} server {url} refused the prompt as too long for its context: {message}. "
                "The rollout's context is full; shorten the prompt or serve a longer context."
            )
        hint = (
            f" Is {url} a {self.server_kind} server? It does not know {path}."
            if status in (404, 405)
            else " Check the model name and sampling options against the server's configuration."
        )
        return EngineRequestError(
            f"{self.server_kind} server {url} rejected the request with HTTP {status}: {message}.{hint} "
            "Not retried: the same request would fail again.",
            url=url,
            status=status,
            attempts=attempts,
        )

    def _exhausted(
        self, failure: _Failure, url: str, attempts: int, started: float, limit: str
    ) -> RemoteEngineError:
        elapsed = time.monotonic() - started
        policy = self.retry
        tail = (
            f" Gave up after {attempts} attempt{'s' if attempts != 1 else ''} in {elapsed:.1f} s "
            f"(RetryPolicy.{limit} reached: max_attempts={policy.max_attempts}, "
            f"total_budget_s={policy.total_budget_s:g})."
        )
        kind = self.server_kind
        error_class: type[RemoteEngineError]
        if failure.kind == "connect":
            error_class = EngineConnectionError
            text = (
                f"could not connect to {kind} server {url}: {failure.detail}. Check that the server is "
                "running and the URL and port are right."
            )
        elif failure.kind == "dropped":
            error_class = EngineConnectionError
            text = (
                f"{kind} server {url} closed the connection before a full answer ({failure.detail}). "
                "It may have crashed or restarted; check its log."
            )
        elif failure.kind == "timeout":
            error_class = EngineTimeoutError
            text = (
                f"{kind} server {url} sent no answer in time ({failure.detail}). Raise read_timeout_s "
                "for long generations, or check whether the server is overloaded or stuck."
            )
        elif failure.kind == "overloaded":
            error_class = EngineRateLimitedError
            text = (
                f"{kind} server {url} is overloaded (HTTP 429: {failure.detail}). Lower the rollout "
                "concurrency, add servers, or raise RetryPolicy.total_budget_s."
            )
        elif failure.kind in ("malformed", "truncated"):
            error_class = EngineResponseError
            text = (
                f"{kind} server {url} sent a {failure.kind} answer ({failure.detail}). Check that the URL "
                "points at the server itself and not at a proxy or another service, and the server's log."
            )
        else:  # server, aborted
            error_class = EngineServerError
            status = f"HTTP {failure.status}: " if failure.status is not None else ""
            text = (
                f"{kind} server {url} failed the request ({status}{failure.detail}). Check the server's log."
            )
        return error_class(text + tail, url=url, status=failure.status, attempts=attempts)

    async def aclose(self) -> None:
        """Close every session: awaited in the running loop, scheduled in other live loops.

        A later request opens a new pool, so a program that runs one event loop after another
        (``asyncio.run`` per batch) calls ``aclose`` at the end of each.
        """
        sessions, self._sessions = self._sessions, {}
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, session in sessions.items():
            if session.closed:
                continue
            if loop is current:
                await session.close()
            elif loop.is_running() and not loop.is_closed():
                asyncio.run_coroutine_threadsafe(session.close(), loop)
            else:
                _abandon(session)


def _abandon(session: aiohttp.ClientSession) -> None:
    """Forget a session whose event loop is gone; its sockets die with the loop's process state."""
    if not session.closed:
        session.detach()


class RemoteEngine:
    """Base of the SGLang and vLLM engines: routing, retries, context clamping, session binding.

    Subclasses say how to build the request body, where to send it, how to read the answer and how
    to learn the server's context length. An engine is safe to share between many concurrent
    rollouts in one event loop; each rollout should call :meth:`bind` to keep its requests on one
    server. Several loops (threads) may share it too, each with its own connection pool; the load
    counts used for routing are then approximate.
    """

    server_kind: ClassVar[str] = "remote"
    generate_path: ClassVar[str] = "/generate"
    context_slack: ClassVar[int] = 0
    """Tokens the server keeps free: it needs ``prompt + max_new_tokens <= server context - slack``."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        context_length: int | None = None,
        max_connections_per_server: int = 1024,
    ) -> None:
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
        self._info_known = context_length is not None
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

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """Generate on the least-loaded server. Use :meth:`bind` to keep a rollout on one server."""
        return await self._generate(prompt_ids, sampling, None)

    async def aclose(self) -> None:
        """Close the connection pools (idempotent). A later request opens a new pool.

        Call it before the event loop that used the engine ends; a pool left behind by a finished
        loop is dropped and its sockets are only reclaimed by the garbage collector.
        """
        await self._client.aclose()

    # -- routing -----------------------------------------------------------------------------

    def bind(self, session_id: str) -> BoundEngine:
        """A view of this engine whose requests all go to one server, chosen at its first request.

        Give each rollout its own ``session_id`` (any unique string) and generate through the view:
        the server then sees one growing prompt and reuses its prefix cache from turn to turn. The
        server is the least-loaded one at the view's first request; it only changes if that server
        becomes unreachable. Closing the view forgets the binding; it does not close the engine.
        """
        return BoundEngine(self, session_id)

    def unbind(self, session_id: str) -> None:
        """Forget the server chosen for ``session_id``."""
        self._client.pool.unbind(session_id)

    def server_for(self, session_id: str) -> str | None:
        """The URL ``session_id`` is bound to, or None before its first request."""
        return self._client.pool.server_for(session_id)

    @property
    def urls(self) -> list[str]:
        return self._client.urls

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
        self._info_known = True
        self._info_tasks.clear()

    async def _fetch_context_length(self) -> int | None:
        raise NotImplementedError

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
        self, prompt_ids: Sequence[int], sampling: SamplingParams, session_id: str | None
    ) -> Generation:
        if not self._info_known:
            await self.fetch_model_info()
        clock = time.perf_counter()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineRequestError(f"cannot send an empty prompt to the {self.server_kind} server")
        max_new_tokens = self._room(len(prompt), sampling.max_new_tokens)
        body = self.build_request(prompt, sampling, max_new_tokens)
        build_s = time.perf_counter() - clock
        result = await self._client.request(
            "POST",
            self.generate_path,
            body=body,
            parse=lambda payload: self.parse_response(payload, prompt, sampling, max_new_tokens),
            session_id=session_id,
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


def finish_reason_for(
    token_ids: list[int], server_reason: str, sampling: SamplingParams, max_new_tokens: int
) -> str:
    """Map a server's finish reason onto the Engine protocol's ``stop`` / ``length``.

    ``stop`` requires the last id to be one of the requested stop ids (the protocol's promise);
    a server that stopped anywhere else is reported as a format error rather than passed on.
    """
    if len(token_ids) > max_new_tokens:
        raise ResponseFormatError(
            f"{len(token_ids)} tokens came back but at most {max_new_tokens} were asked for"
        )
    if server_reason == "length":
        return "length"
    if server_reason == "stop":
        if token_ids and token_ids[-1] in sampling.stop_token_ids:
            return "stop"
        last = token_ids[-1] if token_ids else None
        raise ResponseFormatError(
            f"the server reports finish reason 'stop' but the last generated id is {last}, not one of the "
            f"requested stop ids {list(sampling.stop_token_ids)} (did the server stop on its own EOS or a "
            "stop string, or trim the stop token?)"
        )
    if server_reason == "abort":
        raise ResponseFormatError("the server aborted the request", retryable=True)
    raise ResponseFormatError(f"unknown finish reason {server_reason!r}")


def float_list(values: Any, what: str) -> list[float]:
    """``values`` as a list of floats, or ResponseFormatError naming ``what``."""
    if not isinstance(values, list):
        raise ResponseFormatError(f"{what} is {type(values).__name__}, expected a list")
    out: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResponseFormatError(f"{what} holds {value!r}, expected numbers")
        out.append(float(value))
    return out


def int_list(values: Any, what: str) -> list[int]:
    """``values`` as a list of ints, or ResponseFormatError naming ``what``."""
    if not isinstance(values, list):
        raise ResponseFormatError(f"{what} is {type(values).__name__}, expected a list")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ResponseFormatError(f"{what} holds non-integer values")
    return list(values)


@dataclass
class BoundEngine:
    """An :class:`~agentboost.engines.base.Engine` view that keeps one session on one server.

    Made by :meth:`RemoteEngine.bind`. ``aclose`` releases the binding only; the engine it views
    stays open for other rollouts.
    """

    engine: RemoteEngine
    session_id: str
    _closed: bool = field(default=False, repr=False)

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    @property
    def server_url(self) -> str | None:
        """The server this session uses; None before its first request."""
        return self.engine.server_for(self.session_id)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if self._closed:
            raise EngineError(f"the engine view for session {self.session_id!r} is closed")
        return await self.engine._generate(prompt_ids, sampling, self.session_id)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.unbind(self.session_id)
