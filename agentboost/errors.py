"""Every error agentboost raises on purpose, in one tree. Each message says what went wrong and what to do.

Catch :class:`AgentBoostError` to catch them all. Where callers used to catch a builtin, the class still
derives from it (``ConfigError`` is a ``ValueError``, ``ModelNotFoundError`` a ``FileNotFoundError``)::

    AgentBoostError
    ├── ConfigError (ValueError)          a setting, argument or data row is invalid
    │   ├── UserPathError                 a file or directory the user named cannot be used
    │   ├── LegacyResultsError            a results file written before results files had a header
    │   ├── SettingsChangedError          a results file was written with other settings than its resume
    │   ├── LogprobsModeError             a server's logprobs are not those of the sampling distribution
    │   ├── SplitOverlapError             the train and test sets share problems
    │   └── DamagedCheckpointError        a checkpoint file cannot be read back
    ├── CalculatorError (ValueError)      the calculator refuses an expression (the model reads why)
    ├── ModelNotFoundError (FileNotFoundError)
    ├── TokenizerError                    a tokenizer could not be built or loaded
    ├── TemplateError                     a chat template cannot extend the token sequence exactly
    ├── TokenBufferError (RuntimeError)   a TokenBuffer was used out of order (a bug in the caller)
    ├── TrajectoryError (ValueError)      ids, loss mask and logprobs of a trajectory do not line up
    ├── WireFormatError (ValueError)      a body does not follow the SGLang / vLLM wire format
    │   ├── ResponseFormatError           ... a server's answer (the client turns it into EngineResponseError)
    │   └── RequestFormatError            ... a request to `agentboost serve` (answered with HTTP 4xx)
    ├── EngineError                       no generation: the rollout ends `engine_error` (retryable)
    │   ├── ContextLengthError            no room for one more token: the rollout ends `context_full`
    │   ├── PromptTooLongError            the first prompt is longer than veRL's prompt_length
    │   ├── InvalidGenerationError (ValueError)  an engine returned ids and logprobs that do not pair up
    │   ├── SimulatorEngineError          the tau2 user simulator's engine failed
    │   ├── EngineOverloadedError         the engine refused work for now
    │   │   └── EngineRateLimitedError    HTTP 429 until the retry budget ran out (also a RemoteEngineError)
    │   └── RemoteEngineError             an SGLang / vLLM / `agentboost serve` request failed
    │       ├── EngineConnectionError     unreachable, or the connection dropped
    │       │   └── ServersDownError      every server down for the whole server-down budget: a run stops
    │       ├── EngineTimeoutError        no answer in time
    │       ├── EngineServerError         HTTP 5xx or aborted requests
    │       ├── EngineResponseError       a malformed or truncated answer
    │       ├── EngineRequestError        HTTP 4xx: the request itself is wrong (not retried)
    │       ├── WeightSyncError           a server refused or failed a weight update
    │       └── EngineRateLimitedError
    ├── EngineContractError (TypeError)   an engine lacks a method of the protocol its caller needs
    ├── VLLMServerError                   a vLLM server could not be started
    ├── BuildError (RuntimeError)         a native kernel could not be compiled or loaded
    ├── StaleRolloutError                 a rollout was generated with weights older than those trained
    ├── EnvironmentStepError              an environment step failed: the rollout ends `env_error`
    ├── UnscorableError                   no reward for a reason outside the policy's control (a judge
    │   │                                 down): the rollout is `unscorable`, run again on resume
    │   └── SimulatorFailed               the tau2 simulated customer could not continue
    ├── InvalidToolCall                   answers a malformed tool call (the model reads the message)
    ├── WorkerCrashed                     a worker process died mid-rollout (the rollout is retried)
    ├── WorkerSetupError                  a worker could not build its environment, tokenizer or engine
    │   └── ClusterPreflightError         a Ray node cannot build the environment or reach the engine
    ├── TooManyFailuresError              too many of a training step's rollouts failed: the run stops
    ├── RanksDivergedError                data-parallel training ranks hold different weights: the run stops
    ├── SandboxError                      the sandbox could not start or keep a worker running
    ├── GatewayError                      a request the gateway answers with an error (HTTP status, kind)
    └── AgentCommandError                 a gateway agent command could not start or exited non-zero
"""

from __future__ import annotations

import errno
import traceback


class AgentBoostError(Exception):
    """Base class of every error agentboost raises on purpose."""


def describe_error(error: BaseException) -> str:
    """An exception as one line, ``module.Type: message``, as rollouts record it."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()


class ConfigError(AgentBoostError, ValueError):
    """A setting, argument or data row is invalid."""


class ModelNotFoundError(AgentBoostError, FileNotFoundError):
    """A model directory or package could not be found locally."""


class SettingsChangedError(ConfigError):
    """A results file (``agentboost rollout --out``, a training step's ``rollouts/step_N.jsonl``) was
    written by a run with other settings than the one resuming it. ``differences`` lists each as
    ``key: recorded -> current``."""

    def __init__(self, message: str, *, differences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.differences = differences


class UserPathError(ConfigError):
    """A file or directory the user named cannot be used: missing, a directory, unwritable, disk full."""

    @classmethod
    def from_os_error(cls, path: object, error: OSError, action: str) -> UserPathError:
        """``cannot <action> <path>: <reason>; <what to do>`` for an OSError raised on ``path``."""
        advice = _PATH_ADVICE.get(error.errno or 0, "check the path and try again")
        return cls(f"cannot {action} {path}: {error.strerror or error}; {advice}")


_PATH_ADVICE = {
    errno.ENOENT: "check the path (it does not exist)",
    errno.EACCES: "choose a location you can write to, or fix its permissions",
    errno.EPERM: "choose a location you can write to, or fix its permissions",
    errno.EISDIR: "name a file, not a directory",
    errno.ENOTDIR: "a part of the path is a file, not a directory; fix the path",
    errno.ENOSPC: "free some disk space or choose another location; finished work is kept",
    errno.EDQUOT: "free some disk space (quota exceeded) or choose another location; finished work is kept",
    errno.EROFS: "the file system is read-only; choose another location",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
    errno.EEXIST: "a file is in the way where a directory is needed; move it or choose another path",
    errno.EFBIG: "the file size limit was reached; free space, raise the limit or choose another location",
}


class UnscorableError(AgentBoostError):
    """Raise it from a reward when the reward cannot be computed for a reason the policy did not cause
    (a judge or grading service down, a simulated user that broke). The rollout's outcome is
    ``unscorable``: reported apart from scored and failed rollouts and run again on resume.

    Never raise it for anything the model wrote: a malformed answer is a reward of 0.
    """


class EnvironmentStepError(AgentBoostError):
    """An environment's own step failed during a rollout (e.g. ``next_user_message`` raised).

    Ends the rollout with termination ``env_error``; fix the environment (its message names the step).
    """


# --- engines -----------------------------------------------------------------------------


class EngineContractError(AgentBoostError, TypeError):
    """An engine lacks a method of the protocol its caller needs (:class:`~agentboost.engines.base.Engine`
    for rollouts, :class:`~agentboost.engines.base.TrainableEngine` for the trainer); refused when
    the engine is built, naming what is missing. ``missing`` lists the names."""

    def __init__(self, message: str, *, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


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


class ServersDownError(EngineConnectionError):
    """Every server has refused connections for the whole server-down budget: a run stops there (its
    results so far are kept, and running the same command again resumes it)."""


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


# --- tokens, trajectories and wire formats ---------------------------------------------------


class TokenBufferError(AgentBoostError, RuntimeError):
    """A :class:`~agentboost.tokens.builder.TokenBuffer` was used out of order: a bug in the caller."""


class TrajectoryError(AgentBoostError, ValueError):
    """A trajectory's token ids, loss mask and logprobs do not line up, so it cannot be trained on."""


class WireFormatError(AgentBoostError, ValueError):
    """A JSON body does not follow the SGLang or vLLM wire format (see
    :mod:`agentboost.engines.remote.wire`)."""


class ResponseFormatError(WireFormatError):
    """A server's answer is not what the wire format promises.

    ``retryable`` marks server-side faults worth another attempt (an aborted request); anything else
    means client and server disagree on the format, which a retry will not fix. Remote engines turn it
    into :class:`EngineResponseError` (or :class:`EngineServerError` once retries of an abort ran out).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RequestFormatError(WireFormatError):
    """A request to `agentboost serve` that its wire-format subset cannot honour; ``status`` is the HTTP
    status it is answered with (400 by default, 404 for an unknown model, 429 or 500 for engine faults)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# --- more engine errors --------------------------------------------------------------------


class InvalidGenerationError(EngineError, ValueError):
    """An engine returned a generation whose ids and log-probabilities do not pair up one to one."""


class PromptTooLongError(EngineError):
    """The first prompt of a rollout is longer than veRL's ``rollout.prompt_length``; nothing was sent."""


# --- rollouts and environments -------------------------------------------------------------------


class CalculatorError(AgentBoostError, ValueError):
    """An expression the calculator refuses: bad syntax, an unsupported construct or a limit exceeded."""


class InvalidToolCall(AgentBoostError):
    """Raised by the internal tool that answers malformed tool calls; its message is what the model reads."""


class WorkerCrashed(AgentBoostError):
    """The process running a rollout died; the runner retries the rollout (termination `worker_crashed`)."""


# --- sandbox -------------------------------------------------------------------------------


class TooManyFailuresError(AgentBoostError):
    """More of a training step's rollouts failed than ``rollout.max_failed_fraction`` allows: the run
    stops rather than learn from what is left. Fix the cause it names, then resume the run."""


class SandboxError(AgentBoostError):
    """The sandbox itself could not start or keep a worker running (not a failure of the program)."""


class WorkerSetupError(AgentBoostError):
    """A worker could not build its environment, tokenizer or engine, or workers kept dying at start.

    Its message is the one the same mistake gives without workers, so the run ends the same way.
    """


class ClusterPreflightError(WorkerSetupError):
    """A node of the Ray cluster (``--workers ray``) cannot run rollouts: its actor could not be placed,
    could not build the environment, tokenizer or engine, or cannot reach the engine's servers.

    Raised before any rollout runs; the message names the node and the cause in one line."""


class LegacyResultsError(ConfigError):
    """The file holds results written before results files had a header."""


class SplitOverlapError(ConfigError):
    """The train and test sets share problems; the message says how many and gives examples."""


class DamagedCheckpointError(ConfigError):
    """A checkpoint file cannot be read back (truncated, garbled, not what agentboost wrote)."""


# --- engines: servers, weights, kernels ---------------------------------------------------------


class LogprobsModeError(ConfigError):
    """A server's log-probabilities are not those of the distribution agentboost samples from."""


class VLLMServerError(AgentBoostError):
    """The vLLM server could not be started (missing interpreter, crash at start-up, not ready in time)."""


class WeightSyncError(RemoteEngineError):
    """A server refused or failed a weight update."""


class StaleRolloutError(AgentBoostError):
    """A rollout was generated with weights older than the ones being trained."""


class RanksDivergedError(AgentBoostError):
    """The ranks of a data-parallel run hold different weights after a step (a bug: they must agree)."""


class BuildError(AgentBoostError, RuntimeError):
    """A native kernel could not be compiled or loaded (callers fall back to the portable path)."""


# --- environments: the tau2 simulator ----------------------------------------------------------


class SimulatorFailed(UnscorableError):
    """The simulated customer could not continue; the rollout carries no signal about the agent
    (raised by the reward, the rollout is ``unscorable``; raised by reset, it ends ``env_error``)."""


class SimulatorEngineError(EngineError):
    """The simulator's engine failed: the rollout ends ``engine_error``, which the runner retries."""


# --- the gateway -------------------------------------------------------------------------------


class GatewayError(AgentBoostError):
    """A request the gateway answers with an error: HTTP status, error kind and one actionable sentence."""

    def __init__(self, status: int, kind: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        """``invalid_request``, ``not_found``, ``authentication``, ``session_ended`` or ``engine``."""
        self.message = message
        self.code = code


class AgentCommandError(AgentBoostError):
    """A gateway environment's agent command could not be started, or exited with a non-zero status."""
