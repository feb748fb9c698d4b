"""The typed :class:`Task`: what one rollout is asked to do, as plain data any process can rebuild.

A task is an id, a prompt (text, or a starting conversation), the ground truth a reward compares
against, and free metadata (hidden tests, a customer scenario, a difficulty). It round-trips through
JSON (:meth:`Task.to_dict` / :meth:`Task.from_dict`, used by results files, worker processes and task
files) and through flat parquet rows (:meth:`Task.to_row` / :meth:`Task.from_row`, whose nested
fields are JSON text so every parquet reader, veRL's included, reads them without a schema).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from agentboost.errors import ConfigError
from agentboost.tokens.messages import ChatMessage

PROMPT_ROLES = ("system", "user", "assistant")
"""Roles a starting conversation may hold. Its messages are prompt tokens: never trained on."""


@dataclass
class Task:
    """One thing to do. ``prompt`` is the user's text, or a conversation that ends with a user message."""

    id: str
    prompt: str | list[dict[str, Any]]
    ground_truth: Any = None
    """What the reward compares against (an answer, gold actions...). JSON-serialisable."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything else the environment needs (hidden tests, a scenario, limits). JSON-serialisable."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"a task id must be a non-empty string, got {self.id!r}")
        if isinstance(self.prompt, str):
            return
        if not isinstance(self.prompt, list) or not self.prompt:
            raise ConfigError(
                f"task {self.id!r}: prompt must be text or a non-empty list of messages, "
                f"got {type(self.prompt).__name__}"
            )
        for index, message in enumerate(self.prompt):
            if (
                not isinstance(message, Mapping)
                or message.get("role") not in PROMPT_ROLES
                or not isinstance(message.get("content"), str)
            ):
                raise ConfigError(
                    f"task {self.id!r}: prompt message {index} must be "
                    f'{{"role": one of {"/".join(PROMPT_ROLES)}, "content": text}}, got {message!r}'
                )
        if self.prompt[-1]["role"] != "user":
            raise ConfigError(
                f"task {self.id!r}: a starting conversation must end with a user message "
                f"(the agent answers next), not {self.prompt[-1]['role']!r}"
            )
        if any(message["role"] == "system" for message in self.prompt[1:]):
            raise ConfigError(f"task {self.id!r}: only the first prompt message may be a system message")
        if not isinstance(self.metadata, dict):
            raise ConfigError(
                f"task {self.id!r}: metadata must be a dict, got {type(self.metadata).__name__}"
            )

    @property
    def messages(self) -> list[ChatMessage]:
        """The prompt as a conversation: ``[{"role": "user", "content": prompt}]`` for a text prompt."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [{"role": message["role"], "content": message["content"]} for message in self.prompt]

    @property
    def text(self) -> str:
        """The last user message: the question, for rewards and reports."""
        return self.messages[-1]["content"]

    def to_dict(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "prompt": self.prompt,
            "ground_truth": self.ground_truth,
            "metadata": self.metadata,
        }
        try:
            json.dumps(data, ensure_ascii=False)
        except (TypeError, ValueError) as error:
            raise ConfigError(
                f"task {self.id!r} is not JSON-serialisable ({error}); keep ground_truth and metadata "
                "to str, int, float, bool, None, lists and dicts"
            ) from error
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a task must be a JSON object, got {type(data).__name__}")
        missing = [key for key in ("id", "prompt") if key not in data]
        if missing:
            raise ConfigError(f"task row {dict(data)!r:.200} lacks {', '.join(missing)}")
        unknown = sorted(set(data) - {"id", "prompt", "ground_truth", "metadata"})
        if unknown:
            raise ConfigError(
                f"task {data.get('id')!r} has unknown fields {unknown}; put extra facts in 'metadata'"
            )
        return cls(
            id=data["id"],
            prompt=data["prompt"],
            ground_truth=data.get("ground_truth"),
            metadata=dict(data.get("metadata") or {}),
        )

    def to_row(self) -> dict[str, str]:
        """A flat row for parquet: the id, and the rest as JSON text columns."""
        data = self.to_dict()
        return {
            "id": self.id,
            "prompt": json.dumps(data["prompt"], ensure_ascii=False),
            "ground_truth": json.dumps(data["ground_truth"], ensure_ascii=False),
            "metadata": json.dumps(data["metadata"], ensure_ascii=False),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Task:
        decoded: dict[str, Any] = {"id": row.get("id")}
        for key in ("prompt", "ground_truth", "metadata"):
            value = row.get(key)
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError as error:
                    raise ConfigError(
                        f"task row {row.get('id')!r}: column {key!r} is not JSON text ({error.msg})"
                    ) from error
            decoded[key] = value
        return cls.from_dict(decoded)


class GeneratedTasks(Sequence[Task]):
    """``count`` tasks made one at a time as they are iterated, never all held: what a generated
    environment's ``tasks()`` returns, so a run of a million tasks holds only those in flight.

    ``make()`` yields the tasks in order and must yield the same ones each time (each pass, e.g. a
    resume's check and then the run, calls it again). ``len()`` is ``count``; indexing and slicing
    work (they iterate up to the index), so code written for lists keeps working.
    """

    def __init__(self, count: int, make: Callable[[], Iterator[Task]]) -> None:
        self._count = count
        self._make = make

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Task]:
        yield from itertools.islice(self._make(), self._count)

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...

    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step < 0:
                return list(self)[index]
            return list(itertools.islice(self, start, stop, step))
        position = index + self._count if index < 0 else index
        if not 0 <= position < self._count:
            raise IndexError(f"task index {index} out of range for {self._count} tasks")
        for number, task in enumerate(self):
            if number == position:
                return task
        raise IndexError(f"task index {index}: the generator stopped early")

    def __repr__(self) -> str:
        return f"GeneratedTasks({self._count})"
