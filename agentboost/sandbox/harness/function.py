"""Runs in the sandbox as a function-call test (``run_function_tests``).

Reads ``{"program", "func_name", "args"}`` from stdin, calls the function and writes one marked JSON line
to the real stdout; the program's own prints go to stderr. The sandbox side prepends ``_PRELUDE`` (the
text of prelude.py) and ``_RESULT_MARKER``.
"""

import json
import linecache
import os
import sys
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # prepended to this file's text by agentboost.sandbox.testcases
    _PRELUDE: str = ""
    _RESULT_MARKER: str = ""

_payload = json.loads(sys.stdin.read())
sys.stdin = open(os.devnull)  # noqa: SIM115 (open for the process's life, as stdin is)
_result_fd = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr
_namespace = {"__name__": "solution", "__builtins__": __builtins__}
exec(_PRELUDE, _namespace)
_source = _payload["program"]
linecache.cache["<solution>"] = (len(_source), None, _source.splitlines(True), "<solution>")
try:
    exec(compile(_source, "<solution>", "exec"), _namespace)
    _name = _payload["func_name"]
    _class = _namespace.get("Solution")
    if isinstance(_class, type) and hasattr(_class, _name):
        _function = getattr(_class(), _name)
    elif callable(_namespace.get(_name)):
        _function = _namespace[_name]
    else:
        raise NameError(f"the program defines neither Solution.{_name} nor a function {_name}")
    _value = _function(*_payload["args"])
    try:
        _line = json.dumps({"ok": True, "value": _value})
    except (TypeError, ValueError):
        _kind = type(_value).__name__
        _line = json.dumps({"ok": True, "unserializable": _kind, "repr": repr(_value)[:500]})
except BaseException:
    _error = traceback.format_exc()
    sys.stderr.write(_error)
    _line = json.dumps({"ok": False, "error": _error})
sys.stderr.flush()
os.write(_result_fd, (_RESULT_MARKER + _line + "\n").encode())
