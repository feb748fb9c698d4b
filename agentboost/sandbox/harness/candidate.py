"""Runs as the HumanEval program: defines the solution, then answers the checker's calls until it
hangs up. The program's code runs in this same process, so nothing here is trusted: it only turns calls
into values. codec.py is prepended.
"""

import json
import linecache
import os
import socket
import sys
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # codec.py is prepended to this file's text
    from agentboost.sandbox.harness.codec import _decode, _encode, _receive, _send

_payload = json.loads(sys.stdin.read())
sys.stdin = open(os.devnull)  # noqa: SIM115 (open for the process's life, as stdin is)
_channel = socket.socket(fileno=3)
_source, _name = _payload["program"], _payload["entry_point"]
del _payload
linecache.cache["<solution>"] = (len(_source), None, _source.splitlines(True), "<solution>")
_namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(_source, "<solution>", "exec"), _namespace)
except SystemExit:
    raise
except BaseException as _error:
    traceback.print_exception(type(_error), _error, _error.__traceback__.tb_next)
    sys.exit(1)
while True:
    _request = _receive(_channel)
    if _request is None:
        break
    try:
        _function = _namespace.get(_name)
        if not callable(_function):
            raise NameError(f"the program does not define a function {_name}")
        _args = _decode(_request["args"])
        _kwargs = {key: _decode(value) for key, value in _request["kwargs"].items()}
        _reply = {"value": _encode(_function(*_args, **_kwargs))}
    except BaseException as _error:
        traceback.print_exception(type(_error), _error, _error.__traceback__.tb_next)
        try:
            _message = str(_error)[:500]
        except BaseException:
            _message = ""
        _reply = {"error": [type(_error).__name__[:100], _message]}
    sys.stdout.flush()
    try:
        _send(_channel, _reply)
    except (TypeError, ValueError) as _error:
        _send(_channel, {"error": ["TypeError", f"the return value cannot be sent to check(): {_error}"]})
