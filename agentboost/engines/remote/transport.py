"""HTTP transport for the remote engines: connection pools, timeouts, retries and typed errors.

What every remote engine gets from :class:`HttpClient`:

* a connection pool per event loop (an ``aiohttp.ClientSession`` made lazily for each running
  loop, closed by :meth:`HttpClient.aclose`), with connect and read timeouts;
* retries only where a retry can help: connection errors, timeouts, HTTP 429, HTTP 5xx, and
  malformed or truncated bodies. Backoff is exponential with jitter and the whole request,
  retries included, never outlives :attr:`RetryPolicy.total_budget_s`. Any other 4xx fails at once;
* typed errors (subclasses of :class:`~agentboost.errors.EngineError`) whose messages say what
  happened and what to do, so a rollout ends with termination ``engine_error`` (or
  ``context_full`` for :class:`~agentboost.errors.ContextLengthError`) instead of crashing;
* cancellation: cancelling the task that awaits a request closes the in-flight connection, so
  the server sees the disconnect and can stop generating.

Which server a request goes to is :mod:`agentboost.engines.remote.routing`'s decision; what the bodies mean is
:mod:`agentboost.engines.remote.wire`'s.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import random
import re
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import aiohttp

from agentboost.engines.remote.routing import Server, ServerPool
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
    ResponseFormatError,
    ServersDownError,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

_JSON_HEADERS = {"Content-Type": "application/json"}
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
    down_budget_s: float = 120.0
    """How long every server may stay unreachable before requests give up at once. The outage clock is
    shared by all requests of a client: a server restarted within it is ridden out (connection
    failures do not count against ``max_attempts``), and once it has run out each request fails
    after a single refused connection, so a run whose servers are gone ends promptly."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("RetryPolicy backoff times must be >= 0")
        if self.total_budget_s <= 0:
            raise ConfigError(f"RetryPolicy.total_budget_s must be > 0, got {self.total_budget_s}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")
        if self.down_budget_s < 0:
            raise ConfigError(f"RetryPolicy.down_budget_s must be >= 0, got {self.down_budget_s}")

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (attempt - 1))
        return base * (1 - self.jitter) + base * self.jitter * rng.random()


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
        liveness_interval_s: float = 5.0,
    ) -> None:
        if connect_timeout_s <= 0 or read_timeout_s <= 0 or liveness_interval_s <= 0:
            raise ConfigError("connect_timeout_s, read_timeout_s and liveness_interval_s must be > 0")
        if max_connections_per_server < 1:
            raise ConfigError("max_connections_per_server must be >= 1")
        self.pool = ServerPool(normalize_urls(urls))
        self.server_kind = server_kind
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.retry = retry or RetryPolicy()
        self.max_connections_per_server = max_connections_per_server
        self.liveness_interval_s = liveness_interval_s
        """A request unanswered this long checks that its server still listens; if it does not (a
        server shutting down keeps open connections but never answers them), it is retried."""
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
        session_id: Hashable | None = None,
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
                self.pool.mark_reachable(server)
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
                    if self.pool.down_past(policy.down_budget_s):
                        raise self._servers_down(failure.detail, server.url, attempts)
                    if len(avoid) == len(self.pool.servers):
                        avoid.clear()  # every server refused: wait for one to come back
                if failure.budget_cut and previous is not None:
                    # the budget ran out mid-attempt: the failures before it say more than the cut
                    raise self._exhausted(previous, server.url, attempts, started, "total_budget_s")
            previous = failure
            outage = self.pool.all_down_since is not None and failure.kind == "connect"
            if attempts >= policy.max_attempts and not outage:
                raise self._exhausted(failure, server.url, attempts, started, "max_attempts")
            delay = policy.backoff_s(attempts, self._rng)
            if failure.retry_after_s is not None:
                delay = max(delay, min(failure.retry_after_s, policy.max_backoff_s))
            if outage:  # wake up no later than the outage budget, to fail with it
                delay = max(0.0, min(delay, policy.down_budget_s - self.pool.down_for()))
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
        server: Server,
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
        exchange = asyncio.ensure_future(
            self._exchange(session, server, method, path, data, timeout, remaining_s)
        )
        try:
            while True:
                done, _ = await asyncio.wait({exchange}, timeout=self.liveness_interval_s)
                if done:
                    return exchange.result()
                if not await self._listening(server):
                    self.pool.mark_unreachable(server)
                    return _Failure(
                        "dropped",
                        "the server stopped accepting connections while this request was in flight "
                        "(shutting down?)",
                    )
        finally:
            exchange.cancel()
            server.in_flight -= 1

    async def _listening(self, server: Server) -> bool:
        """Whether ``server`` still accepts connections (checked at most once per liveness interval)."""
        now = time.monotonic()
        if now - server.listening_checked < self.liveness_interval_s:
            return True
        parts = urlsplit(server.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname, port), self.connect_timeout_s
            )
        except OSError as error:
            # refused: nothing listens; anything else (a routing hiccup) is left to the read timeout
            return not (isinstance(error, ConnectionRefusedError) or error.errno == errno.ECONNREFUSED)
        except asyncio.TimeoutError:
            return True
        writer.close()
        server.listening_checked = time.monotonic()
        return True

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        server: Server,
        method: str,
        path: str,
        data: bytes | None,
        timeout: aiohttp.ClientTimeout,
        remaining_s: float,
    ) -> _Reply | _Failure:
        """The HTTP exchange itself; retryable transport failures come back as a :class:`_Failure`."""
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

    def _decode(self, body: bytes, parse: Callable[[Any], T], server: Server, attempts: int) -> T | _Failure:
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

    def outage(self) -> ServersDownError | None:
        """The error requests fail with now if every server has refused connections for the whole
        server-down budget (a run stops on it); None while one answers or the budget lasts."""
        return (
            self._servers_down(None, self.pool.servers[0].url, 0)
            if self.pool.down_past(self.retry.down_budget_s)
            else None
        )

    def _servers_down(self, detail: str | None, url: str, attempts: int) -> ServersDownError:
        urls = [server.url for server in self.pool.servers]
        kind = self.server_kind
        who = f"every one of the {len(urls)} {kind} servers" if len(urls) > 1 else f"{kind} server {url}"
        why = "; ".join(([", ".join(urls)] if len(urls) > 1 else []) + ([detail] if detail else []))
        return ServersDownError(
            f"{who} has refused connections for {self.pool.down_for():.0f} s{f' ({why})' if why else ''}; "
            f"giving up (the server-down budget, --server-down-timeout, is {self.retry.down_budget_s:g} s). "
            "Restart the server and resume the run: the results so far are kept.",
            url=url,
            status=None,
            attempts=attempts,
        )

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
