"""Runs in the HumanEval checker process (trusted): the dataset's prompt helpers and test code, with
``candidate`` a proxy that calls the program over the socket. codec.py is prepended, and before it
``ENTRY_POINT``, ``TEST`` and ``PROMPT``; ``report`` and ``CHANNEL_FD`` come from the sandbox.
"""

import builtins
import linecache
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:  # prepended by agentboost.sandbox.testcases (codec.py too), or given by the sandbox
    from agentboost.sandbox.harness.codec import _decode, _encode, _receive, _send

    ENTRY_POINT: str = ""
    TEST: str = ""
    PROMPT: str | None = None
    CHANNEL_FD: int = 0

    def report(verdict: dict) -> None: ...


class _CandidateGone(BaseException):
    """The program ended, or broke the protocol, before check() finished (not catchable as Exception)."""


_channel = socket.socket(fileno=CHANNEL_FD)
_raised = []


def _candidate_error(name, message):
    kind = getattr(builtins, name, None) if type(name) is str else None
    if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind, message = RuntimeError, f"{name}: {message}"
    try:
        error = kind(str(message))
    except Exception:
        error = RuntimeError(f"{name}: {message}")
    _raised.append(error)
    return error


def candidate(*args, **kwargs):
    try:
        _send(_channel, {"args": _encode(list(args)), "kwargs": {k: _encode(v) for k, v in kwargs.items()}})
        reply = _receive(_channel)
    except (OSError, ValueError) as error:
        raise _CandidateGone(f"the program broke its connection to check() ({error})") from None
    if reply is None:
        raise _CandidateGone("the program ended before check() finished")
    try:
        if "value" in reply:
            return _decode(reply["value"])
        name, message = reply["error"]
    except (KeyError, TypeError, ValueError):
        raise _CandidateGone("the program sent check() a malformed answer") from None
    raise _candidate_error(name, message)


candidate.__name__ = candidate.__qualname__ = ENTRY_POINT


def _assertion_site(error):
    site = ""
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "<test>":
            site = linecache.getline("<test>", trace.tb_lineno).strip()
        trace = trace.tb_next
    message = str(error)
    return site + (f" ({message})" if message else "")


def _run():
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if PROMPT is not None:
        exec(compile(PROMPT, "<prompt>", "exec"), namespace)
    namespace[ENTRY_POINT] = candidate
    linecache.cache["<test>"] = (len(TEST), None, TEST.splitlines(True), "<test>")
    exec(compile(TEST, "<test>", "exec"), namespace)
    try:
        namespace["check"](candidate)
    except _CandidateGone as gone:
        return {"outcome": "candidate_gone", "detail": str(gone)}
    except BaseException as error:
        detail = f"{type(error).__name__}: {error}"
        if _raised and error is _raised[-1]:
            return {"outcome": "candidate_error", "error_type": type(error).__name__, "detail": detail}
        if isinstance(error, AssertionError):
            return {"outcome": "assertion", "detail": _assertion_site(error)}
        if isinstance(error, NameError) and PROMPT is None:
            return {"outcome": "missing_name", "detail": detail}
        return {"outcome": "check_error", "detail": detail}
    return {"outcome": "passed"}


report(_run())
_channel.close()
