"""The normalized coding task: one JSON object per problem, whatever dataset it came from.

    {"id": "humaneval/0", "source": "humaneval", "problem": "...", "starter_code": "...",
     "test_type": "stdio" | "function" | "humaneval", "fn_name": "twoSum" | null,
     "public_tests": [...], "hidden_tests": [...],
     "time_limit_s": 6.0 | null, "memory_mb": 512 | null, "metadata": {...}}

Test cases by ``test_type``:

- ``stdio``: ``{"input": str, "output": str}``; the program reads stdin and its stdout must match
  line by line (trailing whitespace ignored).
- ``function``: ``{"input": str, "output": str}`` in LiveCodeBench's form: ``input`` is one JSON value
  per line (the arguments), ``output`` one JSON value; called as ``Solution().fn_name(*args)`` or as
  the top-level function ``fn_name``.
- ``humaneval``: public tests ``{"input": "fn(1, 2)", "output": "3"}`` (a call and its expected value,
  both Python expressions, from the docstring examples); hidden tests ``{"test": "def check(candidate):
  ..."}``, the dataset's own test code, run as ``check(fn_name)``.

Public tests are what the testing tool runs; hidden tests are what the reward runs, and never reach the
model. ``time_limit_s`` and ``memory_mb`` (None: the environment's defaults) apply per sandbox run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from agentboost.errors import ConfigError

TEST_TYPES = ("stdio", "function", "humaneval")


@dataclass
class CodingTask:
    """One coding problem with its public and hidden tests (see the module docstring)."""

    id: str
    problem: str
    test_type: str
    hidden_tests: list[dict[str, Any]]
    public_tests: list[dict[str, Any]] = field(default_factory=list)
    starter_code: str = ""
    fn_name: str | None = None
    source: str = ""
    time_limit_s: float | None = None
    memory_mb: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ConfigError saying what is wrong with this task, if anything is."""
        where = f"coding task {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"coding task id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.problem, str) or not self.problem.strip():
            raise ConfigError(f"{where}: problem text is empty")
        if self.test_type not in TEST_TYPES:
            raise ConfigError(
                f"{where}: test_type must be one of {', '.join(TEST_TYPES)}, got {self.test_type!r}"
            )
        if self.test_type in ("function", "humaneval") and not (
            isinstance(self.fn_name, str) and self.fn_name.isidentifier()
        ):
            raise ConfigError(
                f"{where}: {self.test_type} tests need fn_name, a Python identifier, got {self.fn_name!r}"
            )
        if not isinstance(self.hidden_tests, list) or not self.hidden_tests:
            raise ConfigError(f"{where}: no hidden tests, so no reward could be computed")
        for kind, tests in (("public", self.public_tests), ("hidden", self.hidden_tests)):
            if not isinstance(tests, list):
                raise ConfigError(f"{where}: {kind}_tests must be a list")
            for index, test in enumerate(tests):
                _check_test(test, self.test_type, kind, where, index)
        if self.time_limit_s is not None and not (
            isinstance(self.time_limit_s, int | float) and self.time_limit_s > 0
        ):
            raise ConfigError(f"{where}: time_limit_s must be a positive number, got {self.time_limit_s!r}")
        if self.memory_mb is not None and not (isinstance(self.memory_mb, int) and self.memory_mb >= 64):
            raise ConfigError(f"{where}: memory_mb must be an integer >= 64, got {self.memory_mb!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CodingTask:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a coding task must be a JSON object, got {type(data).__name__}")
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        missing = [name for name in ("id", "problem", "test_type", "hidden_tests") if name not in known]
        if missing:
            raise ConfigError(f"coding task {data.get('id')!r} lacks {', '.join(missing)}")
        known["id"] = str(known["id"])
        return cls(**known)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


def _check_test(test: Any, test_type: str, kind: str, where: str, index: int) -> None:
    if not isinstance(test, Mapping):
        raise ConfigError(f"{where}: {kind} test {index} must be an object, got {type(test).__name__}")
    if test_type == "humaneval" and kind == "hidden":
        if not isinstance(test.get("test"), str) or "def check" not in test["test"]:
            raise ConfigError(f"{where}: hidden test {index} must be {{'test': 'def check(candidate): ...'}}")
        return
    for name in ("input", "output"):
        if not isinstance(test.get(name), str):
            raise ConfigError(
                f"{where}: {kind} test {index} needs {name!r} as text, got {test.get(name)!r:.80}"
            )
    if test_type == "function":
        try:
            [json.loads(line) for line in test["input"].split("\n") if line.strip()]
            json.loads(test["output"])
        except ValueError as error:
            raise ConfigError(f"{where}: {kind} test {index} is not JSON arguments/value ({error})") from None
