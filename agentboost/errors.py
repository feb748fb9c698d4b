"""The errors agentboost raises. Each message says what went wrong and what to do about it."""

from __future__ import annotations


class AgentBoostError(Exception):
    """Base class of every error agentboost raises on purpose."""


class ConfigError(AgentBoostError, ValueError):
    """A setting, argument or data row is invalid."""


class ModelNotFoundError(AgentBoostError, FileNotFoundError):
    """A model directory or package could not be found locally."""


class EnvironmentStepError(AgentBoostError):
    """An environment's own step failed during a rollout (e.g. ``next_user_message`` raised).

    Ends the rollout with termination ``env_error``; fix the environment (its message names the step).
    """


# --- engines -----------------------------------------------------------------------------


class EngineError(AgentBoostError):
    """An engine failed to produce a generation. Ends a rollout with termination `engine_error`."""


class EngineOverloadedError(EngineError):
    """The engine refused work for now (queue full, HTTP 429); retrying later may succeed."""


class ContextLengthError(EngineError):
    """The prompt leaves no room for even one new token in the engine's context window."""


# --- tokens and templates ------------------------------------------------------------------


class TemplateError(AgentBoostError):
    """A chat template cannot render a message, or rendering it would not extend the token sequence.

    Raised instead of silently re-tokenizing: a rollout whose tokens no longer match what the
    model saw is worse than no rollout. Ends a rollout with termination `template_error`.
    """

    def __init__(self, template: str, message: object, reason: str) -> None:
        self.template = template
        self.message = message
        self.reason = reason
        super().__init__(f"chat template {template!r} cannot append message {message!r}: {reason}")


class TokenizerError(AgentBoostError):
    """A tokenizer could not be built or loaded."""


# --- remote engines ------------------------------------------------------------------------


class RemoteEngineError(EngineError):
    """A remote inference server (SGLang, vLLM, `agentboost serve`) failed a request.

    ``url`` is the server that failed last, ``status`` its HTTP status (None when no response came
    back) and ``attempts`` how many requests were sent, retries included.
    """

    def __init__(
        self, message: str, *, url: str | None = None, status: int | None = None, attempts: int = 0
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.attempts = attempts


class EngineConnectionError(RemoteEngineError):
    """The server could not be reached, or it dropped the connection, on every attempt."""


class EngineTimeoutError(RemoteEngineError):
    """The server did not answer within the read timeout, or the retry budget ran out."""


class EngineServerError(RemoteEngineError):
    """The server kept answering HTTP 5xx, or kept aborting the request."""


class EngineResponseError(RemoteEngineError):
    """The server's answer was malformed, truncated, or not in the wire format the client speaks."""


class EngineRequestError(RemoteEngineError):
    """The server rejected the request (HTTP 4xx other than 429). Not retried: it would fail again."""


class EngineRateLimitedError(EngineOverloadedError, RemoteEngineError):
    """The server kept answering HTTP 429 (too many requests) until the retry budget ran out."""
