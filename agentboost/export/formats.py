"""The three export forms of rollout results: chat, SFT and token tables (see docs/evaluation.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentboost.envs.base import RolloutResult
from agentboost.errors import ConfigError
from agentboost.io_safety import replaced_atomically
from agentboost.tokens.messages import ChatMessage
from agentboost.tokens.trajectory import Trajectory

if TYPE_CHECKING:
    import pyarrow

INVALID_CALL_NAME = "agentboost_invalid_tool_call"
"""The tool name a chat-form tool result gets when the model's call could not be parsed."""


@dataclass
class ExportFilter:
    """Which rollouts to export. The defaults keep everything."""

    min_reward: float | None = None
    max_reward: float | None = None
    terminations: frozenset[str] | None = None
    """Keep only these termination reasons (e.g. ``{"completed"}``)."""
    scored_only: bool = False
    """Drop rollouts whose reward could not be computed (``reward`` is None)."""
    skip_failed: bool = False
    """Drop rollouts whose ending the termination table marks failed (``TERMINATIONS``: engine,
    template, agent, environment errors and crashed workers)."""
    skip_parse_errors: bool = False
    """Drop rollouts where the model wrote a malformed tool call (SFT on them teaches the mistake)."""

    def accepts(self, result: RolloutResult) -> bool:
        reward = result.reward
        bounded = self.min_reward is not None or self.max_reward is not None
        if reward is None and (self.scored_only or bounded):
            return False
        if self.min_reward is not None and reward is not None and reward < self.min_reward:
            return False
        if self.max_reward is not None and reward is not None and reward > self.max_reward:
            return False
        if self.terminations is not None and result.termination.value not in self.terminations:
            return False
        if self.skip_failed and result.termination.failed:
            return False
        return not (self.skip_parse_errors and int(result.trajectory.metrics.get("parse_errors") or 0))


# --- the chat form ----------------------------------------------------------------------------


def chat_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """A trajectory's messages as people read them: role and content first, the generated ``raw``
    text dropped (it repeats content and calls), tool results with their name, error flag and the
    tool's metadata (e.g. a test status)."""
    chat: list[ChatMessage] = []
    for message in messages:
        role = message["role"]
        item: ChatMessage = {"role": role, "content": message.get("content") or ""}
        if role == "assistant":
            if message.get("reasoning_content"):
                item["reasoning_content"] = message["reasoning_content"]
            if message.get("tool_calls"):
                item["tool_calls"] = [
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": call["function"].get("arguments", {}),
                        },
                    }
                    for call in message["tool_calls"]
                ]
        elif role == "tool":
            item["tool_call_id"] = message.get("tool_call_id")
            item["name"] = message.get("name") or INVALID_CALL_NAME
            if message.get("error"):
                item["error"] = True
            if message.get("metadata"):
                item["metadata"] = message["metadata"]
        chat.append(item)
    return chat


def chat_record(result: RolloutResult) -> dict[str, Any]:
    """One rollout in the chat form: identity, reward, ending and the conversation."""
    record: dict[str, Any] = {
        "task_id": result.task_id,
        "sample": result.sample,
        "reward": result.reward,
        "reward_breakdown": result.reward_breakdown,
    }
    reward_info = getattr(result, "reward_info", None)
    if reward_info:
        record["reward_info"] = reward_info
    if result.reward_error:
        record["reward_error"] = result.reward_error
    record["termination"] = result.termination.value
    record["messages"] = chat_messages(result.trajectory.messages)
    if result.trajectory.forked_rows:
        record["forked_rows"] = [chat_messages(row.messages) for row in result.trajectory.forked_rows]
    return record


# --- SFT ---------------------------------------------------------------------------------------


def sft_record(
    result: RolloutResult,
    tools: Sequence[Mapping[str, Any]],
    *,
    reasoning: bool = True,
    row: Trajectory | None = None,
) -> dict[str, Any]:
    """One SFT example: ``{"messages": [...], "tools": [...]}`` (TRL's conversational format with tools).

    Assistant tool calls keep OpenAI's shape with the arguments as an object (what chat templates
    render); tool results carry ``name`` and ``tool_call_id``. ``row`` picks one of the rollout's
    :attr:`~Trajectory.training_rows` (default: its trajectory).
    """
    messages = []
    for message in chat_messages((row or result.trajectory).messages):
        role = message["role"]
        item: dict[str, Any] = {"role": role, "content": message["content"]}
        if role == "assistant":
            if reasoning and "reasoning_content" in message:
                item["reasoning_content"] = message["reasoning_content"]
            if "tool_calls" in message:
                item["tool_calls"] = message["tool_calls"]
        elif role == "tool":
            item["tool_call_id"] = message["tool_call_id"]
            item["name"] = message["name"]
        messages.append(item)
    return {"messages": messages, "tools": [dict(tool) for tool in tools]}


class ToolSchemas:
    """OpenAI function schemas of the tools a rollout had, found once per environment.

    Trajectories record tool calls, not the schemas the prompt showed, so the schemas come from
    (in order): ``explicit`` schemas, a ``tools`` list in the trajectory's info, or the environment
    named in the trajectory's info (as the results header ``recorded`` it: a ``module:Class`` reference
    too; ``--env`` overrides it), built and asked for its tools.
    """

    def __init__(
        self,
        explicit: Sequence[Mapping[str, Any]] | None = None,
        environment: str | None = None,
        environment_kwargs: Mapping[str, Any] | None = None,
        *,
        recorded: Mapping[str, Any] | None = None,
    ) -> None:
        self.explicit = [dict(tool) for tool in explicit] if explicit is not None else None
        self.environment = environment
        self.environment_kwargs = dict(environment_kwargs or {})
        self.recorded = dict(recorded or {})
        """The results header's ``run``: the environment as the run named it (a ``module:Class``
        reference for an environment outside the registry) and its kwargs, for the rollouts it made."""
        self._cache: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, result: RolloutResult, row: Trajectory | None = None) -> list[dict[str, Any]]:
        """The schemas of ``result`` (of one of its training rows: a forked session may change tools)."""
        if self.explicit is not None:
            return self.explicit
        info = (row or result.trajectory).info
        if isinstance(info.get("tools"), list):
            return [dict(tool) for tool in info["tools"]]
        name = self.environment or info.get("environment")
        if not name:
            raise ConfigError(
                f"rollout {result.task_id!r} sample {result.sample} does not say which environment made it; "
                "pass --env NAME (or --tools FILE.json with the OpenAI function schemas)"
            )
        kwargs = self.environment_kwargs
        if not self.environment and name == self.recorded.get("environment_name"):
            name = self.recorded.get("environment") or name  # e.g. my_package.envs:Capitals
            kwargs = kwargs or dict(self.recorded.get("environment_kwargs") or {})
        if name not in self._cache:
            self._cache[name] = tool_schemas_for(name, kwargs)
        return self._cache[name]


def tool_schemas_for(environment: str, kwargs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The OpenAI function schemas of an environment's tools (from one call of ``tools()``)."""
    from agentboost.envs.base import Episode, Task
    from agentboost.envs.registry import make_environment
    from agentboost.tokens.templates import tool_specs_to_openai

    built = make_environment(environment, kwargs)
    try:  # tools of a throwaway episode: schemas do not depend on the task
        tools = built.tools(Episode(Task("agentboost-tool-schemas", "")))
    except Exception as error:
        raise ConfigError(
            f"cannot list the tools of environment {environment!r} outside a rollout ({error}); "
            "pass --tools FILE.json with the OpenAI function schemas"
        ) from error
    specs = []
    for tool in tools:
        spec = getattr(tool, "tool_spec", None)
        if spec is None:
            raise ConfigError(
                f"environment {environment!r} returned a tool provider ({type(tool).__name__}) whose schemas "
                "are not known without starting it; pass --tools FILE.json with the OpenAI function schemas"
            )
        specs.append(spec)
    return tool_specs_to_openai(specs)


# --- token tables (parquet, Hugging Face datasets) -----------------------------------------------


def _arrow_schema() -> pyarrow.Schema:
    import pyarrow as pa

    segment = pa.struct(
        [
            ("role", pa.string()),
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("turn", pa.int64()),
            ("finish_reason", pa.string()),
            ("parse_errors", pa.list_(pa.string())),
        ]
    )
    return pa.schema(
        [
            ("task_id", pa.string()),
            ("sample", pa.int64()),
            ("row", pa.int64()),
            ("rows", pa.int64()),
            ("reward", pa.float64()),
            ("termination", pa.string()),
            ("environment", pa.string()),
            ("input_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("segments", pa.list_(segment)),
            ("turns", pa.int64()),
            ("tool_calls", pa.int64()),
            ("parse_errors", pa.int64()),
            ("reward_breakdown", pa.string()),
            ("messages", pa.string()),
        ]
    )


TOKEN_COLUMNS_DOC = {
    "row": "which training row of the rollout (0 unless a gateway session forked; see docs/gateway.md)",
    "rows": "how many training rows the rollout has; every one carries the rollout's reward",
    "input_ids": "every token of the rollout, prompt included",
    "loss_mask": "1 where the policy generated the token (train on these), else 0",
    "logprobs": "the sampling engine's log-probability where loss_mask is 1, null elsewhere",
    "segments": "spans [start, end) by role (prompt, assistant, tool, user) with turn and parse errors",
    "reward_breakdown": "JSON object text",
    "messages": "JSON text of the chat-form messages",
}


COUNTS = ("turns", "tool_calls", "parse_errors")
"""The per-row counts of a token table, from the trajectory's metrics."""


def _counts(trajectory: Trajectory) -> dict[str, int]:
    return {name: int(trajectory.metrics.get(name) or 0) for name in COUNTS}


def token_rows(result: RolloutResult) -> list[dict[str, Any]]:
    """A rollout's :attr:`~Trajectory.training_rows` as table rows (one, unless a gateway session forked).

    A forked session's trajectory counts the whole rollout; its own row gets what its earlier rows
    leave, so every row's counts are its own.
    """
    rows = result.trajectory.training_rows
    counts = [_counts(row) for row in rows]
    for earlier in counts[:-1]:
        counts[-1] = {name: counts[-1][name] - earlier[name] for name in COUNTS}
    return [
        _token_row(result, *entry, len(rows)) for entry in zip(rows, range(len(rows)), counts, strict=True)
    ]


def _token_row(
    result: RolloutResult, trajectory: Trajectory, index: int, counts: Mapping[str, int], rows: int
) -> dict[str, Any]:
    return {
        "task_id": result.task_id,
        "sample": result.sample,
        "row": index,
        "rows": rows,
        "reward": result.reward,
        "termination": result.termination.value,
        "environment": trajectory.info.get("environment"),
        "input_ids": trajectory.token_ids,
        "loss_mask": trajectory.loss_mask,
        "logprobs": trajectory.logprobs,
        "segments": [
            {
                "role": segment.role,
                "start": segment.start,
                "end": segment.end,
                "turn": segment.turn,
                "finish_reason": segment.finish_reason,
                "parse_errors": list(segment.parse_errors),
            }
            for segment in trajectory.segments
        ],
        **counts,
        "reward_breakdown": json.dumps(result.reward_breakdown, ensure_ascii=False),
        "messages": json.dumps(chat_messages(trajectory.messages), ensure_ascii=False),
    }


def token_table(results: Iterable[RolloutResult]) -> pyarrow.Table:
    """An Arrow table, one row per training row (per rollout unless a session forked), with token ids,
    loss mask and logprobs (float64, exact)."""
    try:
        import pyarrow as pa
    except ImportError as error:
        raise ConfigError("parquet export needs pyarrow: pip install 'agentboost[inspect]'") from error
    rows = [row for result in results for row in token_rows(result)]
    return pa.Table.from_pylist(rows, schema=_arrow_schema())


# --- writers -----------------------------------------------------------------------------------


def _kept(results: Iterable[RolloutResult], keep: ExportFilter | None) -> Iterable[RolloutResult]:
    return results if keep is None else (result for result in results if keep.accepts(result))


def _prepare(path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def write_chat(
    results: Iterable[RolloutResult], path: str | os.PathLike[str], keep: ExportFilter | None = None
) -> int:
    """The chat form: JSON Lines, or one indented JSON list when ``path`` ends in ``.json``."""
    records = [chat_record(result) for result in _kept(results, keep)]
    with replaced_atomically(_prepare(path)) as target:
        if Path(path).suffix == ".json":
            target.write_text(json.dumps(records, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        else:
            with open(target, "w", encoding="utf-8") as handle:
                for record in records:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(records)


def write_sft(
    results: Iterable[RolloutResult],
    path: str | os.PathLike[str],
    tools: ToolSchemas,
    keep: ExportFilter | None = None,
    *,
    reasoning: bool = True,
) -> int:
    """SFT JSON Lines: one ``{"messages", "tools"}`` object per training row of each kept rollout."""
    count = 0
    with replaced_atomically(_prepare(path)) as target, open(target, "w", encoding="utf-8") as handle:
        for result in _kept(results, keep):
            for row in result.trajectory.training_rows:
                record = sft_record(result, tools(result, row), reasoning=reasoning, row=row)
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
    return count


def write_parquet(
    results: Iterable[RolloutResult], path: str | os.PathLike[str], keep: ExportFilter | None = None
) -> int:
    """One parquet file of :func:`token_table` rows."""
    import pyarrow.parquet as pq

    table = token_table(_kept(results, keep))
    with replaced_atomically(_prepare(path)) as target:
        pq.write_table(table, target)
    return table.num_rows


def write_hf_dataset(
    results: Iterable[RolloutResult], directory: str | os.PathLike[str], keep: ExportFilter | None = None
) -> int:
    """A Hugging Face ``datasets`` directory (``Dataset.load_from_disk``) of :func:`token_table` rows."""
    try:
        from datasets import Dataset
        from datasets.table import InMemoryTable
    except ImportError as error:
        raise ConfigError("this export needs datasets: pip install 'agentboost[inspect]'") from error
    table = token_table(_kept(results, keep))
    Dataset(InMemoryTable(table)).save_to_disk(str(directory))
    return table.num_rows
