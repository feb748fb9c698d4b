"""The gateway: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages in front of any
engine, owning the tokens.

Endpoints (a session is named in the path, or carried in the API-key slot for clients whose base
URL is fixed):

* ``POST /s/<session>/v1/chat/completions`` and ``POST /v1/chat/completions`` (key:
  ``Authorization: Bearer <session>``);
* ``POST /s/<session>/v1/responses`` and ``POST /v1/responses`` (the same key);
* ``POST /s/<session>/v1/messages`` and ``POST /v1/messages`` (key: ``x-api-key: <session>`` or the
  bearer token); ``POST .../v1/messages/count_tokens`` (no session needed);
* ``GET /s/<session>/v1/models``, ``GET /v1/models``, ``GET /health``;
* ``GET /sessions/<session>/trajectory``: the session so far, as an agentboost trajectory.

An unknown session is answered in the API's error shape: 404 when it was named in the path, 401
when it came as a key. With ``open_sessions`` (the ``agentboost gateway`` command), any new name
opens a session instead; ``DELETE /sessions/<session>`` finishes one (as a limit, or
``session_idle_s`` without a request, does) and hands it to ``on_finish``. Any other route gets a
404 in the OpenAI error shape (the Anthropic one under ``.../messages``) naming the routes served.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentboost.agent.episode import stop_token_ids
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Engine, RolloutKey, SamplingParams
from agentboost.errors import ConfigError
from agentboost.gateway import anthropic_api, openai_api, responses_api
from agentboost.gateway.session import (
    DriftPolicy,
    GatewayError,
    GatewaySession,
    check_policy,
    prompt_token_count,
)
from agentboost.tokens.parsers import get_parser
from agentboost.tokens.templates import ChatTemplate, template_for
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.tokens.trajectory import TerminationReason


@dataclass
class GatewayStats:
    """What the server saw (for tests and benchmarks)."""

    requests: int = 0
    errors: int = 0
    disconnects: int = 0
    """Requests whose client went away before it received the answer (the turn is withdrawn)."""


DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""The largest request body served (``413`` above it); ``agentboost gateway --max-request-mb``."""
OFF_LOOP_BYTES = 64 * 1024
"""Request bodies larger than this are decoded and translated in a worker thread."""
_SESSION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class Gateway:
    """Owns the sessions and serves them over HTTP. Use :meth:`start` / :meth:`aclose` (or ``async with``)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        *,
        template: ChatTemplate | str | None = None,
        parser: str = "hermes",
        sampling: SamplingParams | None = None,
        limits: RolloutLimits | None = None,
        policy: DriftPolicy | str = DriftPolicy.FORK,
        client_sampling: bool = True,
        open_sessions: bool = False,
        model_name: str = "agentboost",
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        on_finish: Callable[[GatewaySession], None] | None = None,
        session_idle_s: float | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template if isinstance(template, ChatTemplate) else template_for(tokenizer, template)
        self.parser_name = parser
        get_parser(parser)  # an unknown parser fails here, not on the first request
        self.sampling = sampling or SamplingParams()
        self.limits = limits or RolloutLimits()
        self.policy = check_policy(policy.value if isinstance(policy, DriftPolicy) else policy)
        self.client_sampling = client_sampling
        self.open_sessions = open_sessions
        self.model_name = model_name
        if max_request_bytes < 1:
            raise ConfigError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
        self.max_request_bytes = max_request_bytes
        self.on_finish = on_finish
        """Called with each session as it finishes (a limit ended it, it idled, or it was deleted)."""
        self.session_idle_s = session_idle_s
        """Finish a session after this long without a request (None: never)."""
        self.finished: set[str] = set()
        """Names of finished sessions: never opened again (their trajectory was handed on)."""
        self._reaper: asyncio.Task[None] | None = None
        self.sessions: dict[str, GatewaySession] = {}
        self.stats = GatewayStats()
        self._stop_ids = stop_token_ids(tokenizer)
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        """``http://host:port`` once started."""

    # --- sessions -------------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str | None = None,
        *,
        limits: RolloutLimits | None = None,
        sampling: SamplingParams | None = None,
        policy: DriftPolicy | str | None = None,
        client_sampling: bool | None = None,
        rollout: RolloutKey | None = None,
    ) -> GatewaySession:
        """A new session (a random name unless given); its URLs: :meth:`base_url`, :meth:`anthropic_url`."""
        session_id = session_id or f"s-{uuid.uuid4().hex}"
        if not _SESSION_NAME.fullmatch(session_id) or set(session_id) == {"."}:
            raise ConfigError(
                f"session name {session_id[:80]!r} may hold only letters, digits, '-', '_' and '.' "
                "(1 to 200 of them)"
            )
        if session_id in self.sessions or session_id in self.finished:
            raise ConfigError(f"session {session_id!r} is already open; pick another name")
        session = GatewaySession(
            session_id,
            engine=self.engine,
            tokenizer=self.tokenizer,
            template=self.template,
            parser=get_parser(self.parser_name),
            stop_token_ids=self._stop_ids,
            sampling=sampling or self.sampling,
            limits=limits or self.limits,
            policy=check_policy(
                policy.value if isinstance(policy, DriftPolicy) else policy or self.policy.value
            ),
            client_sampling=self.client_sampling if client_sampling is None else client_sampling,
            rollout=rollout,
        )
        self.sessions[session_id] = session
        return session

    def close_session(self, session_id: str) -> GatewaySession:
        """Stop serving a session and return it (its rows stay readable)."""
        session = self.sessions.pop(session_id)
        session.close()
        return session

    def finish_session(self, session_id: str) -> GatewaySession:
        """Close a session for good and hand it to ``on_finish``; its name is not opened again."""
        session = self.close_session(session_id)
        self.finished.add(session_id)
        if self.on_finish is not None:
            self.on_finish(session)
        return session

    async def _reap_idle(self) -> None:
        """Finish sessions that had no request for ``session_idle_s`` (and none in flight)."""
        assert self.session_idle_s is not None
        while True:
            await asyncio.sleep(min(self.session_idle_s / 4, 5.0))
            now = time.monotonic()
            for session_id, session in list(self.sessions.items()):
                if not session.busy and now - session.last_active >= self.session_idle_s:
                    self.finish_session(session_id)

    def base_url(self, session_id: str) -> str:
        """The OpenAI-style base URL of a session (``.../s/<session>/v1``)."""
        return f"{self._require_url()}/s/{session_id}/v1"

    def anthropic_url(self, session_id: str) -> str:
        """The Anthropic SDK's base URL of a session (it appends ``/v1/messages`` itself)."""
        return f"{self._require_url()}/s/{session_id}"

    def _require_url(self) -> str:
        if self.url is None:
            raise ConfigError("the gateway is not serving yet; await gateway.start() first")
        return self.url

    # --- serving --------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_request_bytes)
        openai_handler = self._handler(self._openai)
        anthropic_handler = self._handler(self._anthropic)
        responses_handler = self._handler(self._responses)
        app.router.add_post("/s/{session}/v1/chat/completions", openai_handler)
        app.router.add_post("/v1/chat/completions", openai_handler)
        app.router.add_post("/s/{session}/v1/responses", responses_handler)
        app.router.add_post("/v1/responses", responses_handler)
        app.router.add_post("/s/{session}/v1/messages", anthropic_handler)
        app.router.add_post("/v1/messages", anthropic_handler)
        app.router.add_post("/s/{session}/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/s/{session}/v1/models", self._models)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/sessions/{session}/trajectory", self._trajectory)
        app.router.add_delete("/sessions/{session}", self._delete)
        app.router.add_route("*", "/{path:.*}", self._unknown)  # last: every other route and method
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0: a free port); returns :attr:`url`."""
        runner = web.AppRunner(self.build_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            raise ConfigError(
                f"cannot listen on {host}:{port}: {error.strerror}; pick another port"
            ) from None
        self._runner = runner
        if self.session_idle_s is not None:
            self._reaper = asyncio.create_task(self._reap_idle())
        bound_port = runner.addresses[0][1]
        self.url = f"http://{host}:{bound_port}"
        return self.url

    async def aclose(self) -> None:
        """Stop listening and unbind every open session. Idempotent; never closes the engine."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for session_id in list(self.sessions):
            self.close_session(session_id)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    # --- handlers -------------------------------------------------------------------------------

    def _session(self, request: web.Request) -> GatewaySession:
        named = request.match_info.get("session")
        if named is not None:
            session = self.sessions.get(named)
            if session is None and self.open_sessions:
                session = self._open_named(named)
            if session is None:
                raise GatewayError(
                    404, "not_found", f"there is no session {named!r} on this gateway", "session_not_found"
                )
            return session
        key = request.headers.get("x-api-key")
        authorization = request.headers.get("Authorization", "")
        if key is None and authorization.lower().startswith("bearer "):
            key = authorization[len("bearer ") :].strip()
        if not key:
            raise GatewayError(
                401,
                "authentication",
                "name the session: use the base URL .../s/<session>/v1 or send the session as the API key",
                "session_missing",
            )
        session = self.sessions.get(key)
        if session is None and self.open_sessions:
            session = self._open_named(key)
        if session is None:
            raise GatewayError(
                401, "authentication", "the API key names no session on this gateway", "invalid_api_key"
            )
        return session

    def _open_named(self, name: str) -> GatewaySession:
        """Open the session a request names (``open_sessions``); a bad or finished name is a 400."""
        if name in self.finished:
            raise GatewayError(
                400,
                "session_ended",
                f"session {name!r} has finished and was written; use a new session name",
                "session_ended",
            )
        try:
            return self.open_session(name)
        except ConfigError as error:
            raise GatewayError(400, "invalid_request", str(error), "invalid_session_name") from None

    def _handler(self, serve: Callable[[web.Request, GatewaySession, Any], Any]) -> Any:
        errors = anthropic_api.error_body if serve == self._anthropic else openai_api.error_body

        async def handle(request: web.Request) -> web.StreamResponse:
            self.stats.requests += 1
            session = None
            try:
                session = self._session(request)
                raw = await self._read_body(request)
                return await serve(request, session, raw)
            except GatewayError as error:
                self.stats.errors += 1
                return web.json_response(errors(error), status=error.status)
            finally:
                if session is not None and session.termination is not None and self.on_finish is not None:
                    self._finish_ended(session)

        return handle

    def _finish_ended(self, session: GatewaySession) -> None:
        """Finish a session a limit or an error ended, once no request of it is in flight."""
        if not session.busy and self.sessions.get(session.id) is session:
            self.finish_session(session.id)

    async def _read_body(self, request: web.Request) -> bytes:
        if (request.content_length or 0) > self.max_request_bytes:
            raise _too_large(self.max_request_bytes)
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _too_large(self.max_request_bytes) from None

    async def _parse(self, parse: Callable[..., Any], raw: bytes, session: GatewaySession) -> Any:
        """Decode the JSON body and translate it into a ChatRequest: off the event loop when it is big."""
        return await self._parse_body(parse, raw, session.wire_memo)

    async def _parse_body(self, parse: Callable[..., Any], raw: bytes, memo: Any) -> Any:

        def work() -> Any:
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise GatewayError(
                    400, "invalid_request", f"the request body is not valid JSON: {error}"
                ) from error
            return parse(body, self.tokenizer, memo)

        return await asyncio.to_thread(work) if len(raw) > OFF_LOOP_BYTES else work()

    async def _openai(self, request: web.Request, session: GatewaySession, raw: bytes) -> web.StreamResponse:
        chat, stream, include_usage = await self._parse(openai_api.parse_request, raw, session)
        served = await self._complete(request, session, chat)
        tokenizer = self.tokenizer if chat.logprobs else None
        if not stream:
            return web.json_response(openai_api.response(served, self.model_name, tokenizer))
        chunks = openai_api.stream_chunks(served, self.model_name, include_usage, tokenizer)
        events = (("", chunk) for chunk in chunks)
        return await self._stream(request, session, served, events, done="data: [DONE]\n\n")

    async def _responses(
        self, request: web.Request, session: GatewaySession, raw: bytes
    ) -> web.StreamResponse:
        parse = functools.partial(
            responses_api.parse_request, stored=session.responses, items=session.response_items
        )
        chat, call = await self._parse(parse, raw, session)
        served = await self._complete(request, session, chat)
        answer = responses_api.response(served, call, self.model_name, self.tokenizer, logprobs=chat.logprobs)
        if call.store and not served.undelivered:
            session.responses[answer["id"]] = [*call.items, *answer["output"]]
            session.response_items.update((item["id"], item) for item in answer["output"])
        if not call.stream:
            return web.json_response(answer)
        return await self._stream(request, session, served, responses_api.stream_events(answer), done=None)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """``POST .../v1/messages/count_tokens``: the prompt's tokens under the gateway's tokenizer and
        template (every session shares them, so no session is opened)."""
        self.stats.requests += 1
        try:
            raw = await self._read_body(request)
            chat, _stream, _thinking = await self._parse_body(anthropic_api.parse_request, raw, None)
            count = await asyncio.to_thread(prompt_token_count, self.tokenizer, self.template, chat)
        except GatewayError as error:
            self.stats.errors += 1
            return web.json_response(anthropic_api.error_body(error), status=error.status)
        return web.json_response({"input_tokens": count})

    async def _unknown(self, request: web.Request) -> web.Response:
        """Every route not served: a 404 in the API's error shape that names the ones served."""
        self.stats.requests += 1
        self.stats.errors += 1
        path = request.path
        served = (
            "POST .../v1/chat/completions, .../v1/responses, .../v1/messages, .../v1/messages/count_tokens; "
            "GET .../v1/models (with .../ = /s/<session>/ or the session as the API key)"
        )
        if path.rstrip("/").endswith("/completions") and "/chat/" not in path:
            hint = "the legacy Completions API is not served: send Chat Completions or Responses"
        else:
            hint = f"{request.method} {path[:200]} is not a route of this gateway"
        error = GatewayError(404, "not_found", f"{hint}; it serves {served}", "unknown_route")
        anthropic = "/messages" in path
        body = anthropic_api.error_body(error) if anthropic else openai_api.error_body(error)
        return web.json_response(body, status=404)

    async def _anthropic(
        self, request: web.Request, session: GatewaySession, raw: bytes
    ) -> web.StreamResponse:
        chat, stream, thinking = await self._parse(anthropic_api.parse_request, raw, session)
        served = await self._complete(request, session, chat)
        if not stream:
            return web.json_response(anthropic_api.response(served, self.model_name, thinking))
        events = anthropic_api.stream_events(served, self.model_name, thinking)
        return await self._stream(request, session, served, events, done=None)

    async def _complete(self, request: web.Request, session: GatewaySession, chat: Any) -> Any:
        """The session's next turn, run to the end even if the client goes away; a turn whose client is
        gone by then is withdrawn (never delivered, so never trained on)."""
        task = asyncio.ensure_future(session.complete(chat))
        try:
            served = await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                self._undelivered(session, await task)
            raise
        transport = request.transport
        if transport is None or transport.is_closing():
            self._undelivered(session, served)
        return served

    def _undelivered(self, session: GatewaySession, served: Any) -> None:
        if not served.undelivered:  # counted once, whether noticed before or while streaming
            self.stats.disconnects += 1
            session.withdraw(served)

    async def _stream(
        self, request: web.Request, session: GatewaySession, served: Any, events: Any, *, done: str | None
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(request)
            for name, data in events:
                prefix = f"event: {name}\n" if name else ""
                await response.write(f"{prefix}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode())
            if done is not None:
                await response.write(done.encode())
            await response.write_eof()
        except ConnectionResetError:  # the client went away mid-stream: it never got the whole turn
            self._undelivered(session, served)
        except asyncio.CancelledError:
            self._undelivered(session, served)
            raise
        return response

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "agentboost"}]}
        )

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sessions": len(self.sessions)})

    async def _trajectory(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.match_info["session"])
        if session is None:
            error = GatewayError(
                404, "not_found", "there is no such session on this gateway", "session_not_found"
            )
            return web.json_response(openai_api.error_body(error), status=404)
        reason = session.termination or TerminationReason.COMPLETED
        trajectory = session.trajectory(session.id, reason, session.termination_detail)
        return web.json_response(trajectory.to_dict())

    async def _delete(self, request: web.Request) -> web.Response:
        """Finish a session now (``DELETE /sessions/<session>``): 204, or 404 if there is none open."""
        session_id = request.match_info["session"]
        if session_id not in self.sessions:
            error = GatewayError(
                404, "not_found", "there is no such open session on this gateway", "session_not_found"
            )
            return web.json_response(openai_api.error_body(error), status=404)
        self.finish_session(session_id)
        return web.Response(status=204)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        "request_too_large",
        f"the request body is larger than this gateway's limit of {limit} bytes "
        "(agentboost gateway --max-request-mb; Gateway(max_request_bytes=...))",
        "request_too_large",
    )


def sessions_summary(sessions: Mapping[str, GatewaySession]) -> dict[str, Any]:
    """Counts over sessions: turns, rows and drift events (for ``agentboost gateway``'s exit line)."""
    return {
        "sessions": len(sessions),
        "turns": sum(session.turns for session in sessions.values()),
        "drift_events": sum(len(session.drift) for session in sessions.values()),
    }
