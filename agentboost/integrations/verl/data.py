"""veRL's parquet rows for any environment's tasks, and reading them back in the agent loop.

One row per task, in the columns veRL's ``RLHFDataset`` passes to the agent loop::

    data_source    the environment's name (veRL groups validation metrics by it)
    agent_name     "agentboost": the loop veRL runs for the row
    prompt         [system, user] chat messages, for people and veRL's tools; the loop renders the real
                   prompt (tools included) from the environment, so editing this column changes nothing
    reward_model   {"style": "rule", "ground_truth": str}: informational; the loop scores with the
                   environment's reward and sets veRL's reward_score itself
    extra_info     {"index": int, "split": str, "task_id": str,
                    "environment": "package.module:Class", "environment_kwargs": JSON object text,
                    "task": JSON object text (Task.to_dict)}

The environment is stored as an import reference (never a name registered only in this process) and the
task as JSON text (so tasks of any shape share one parquet schema): any veRL worker on any node rebuilds
both with :func:`read_row`.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentboost.envs.base import Environment
from agentboost.envs.registry import make_environment, parse_json_object
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.integrations.verl import AGENT_LOOP_NAME


@dataclass(frozen=True)
class RowTask:
    """What the agent loop needs from one row: how to rebuild the environment, and the task."""

    environment: str
    environment_kwargs: dict[str, Any]
    task: dict[str, Any]
    task_id: str


def environment_import_reference(environment: Environment) -> str:
    """``package.module:Class`` for ``environment``; ConfigError if another process could not import it."""
    cls = type(environment)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ConfigError(
            f"environment class {cls.__qualname__} is defined in {cls.__module__!r}; veRL's workers import "
            "environments by reference, so define it at the top level of an importable module"
        )
    return f"{cls.__module__}:{cls.__qualname__}"


def ground_truth(task: Task) -> str:
    """The task's reference answer as text ('' when it has none)."""
    value = task.ground_truth
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def task_rows(environment: Environment, tasks: Iterable[Task], **options: Any) -> list[dict[str, Any]]:
    """One veRL row per task (see the module docstring for the columns); options as :func:`iter_task_rows`."""
    return list(iter_task_rows(environment, tasks, **options))


def iter_task_rows(
    environment: Environment,
    tasks: Iterable[Task],
    *,
    environment_kwargs: Mapping[str, Any] | None = None,
    split: str = "train",
    agent_name: str = AGENT_LOOP_NAME,
    data_source: str | None = None,
) -> Iterator[dict[str, Any]]:
    """One veRL row per task, made as they are taken (see the module docstring for the columns)."""
    reference = environment_import_reference(environment)
    kwargs_text = _json_text(dict(environment_kwargs or {}), "the environment kwargs")
    for index, task in enumerate(tasks):
        task_id = task.id
        task_text = _json_text(task.to_dict(), f"task {task_id!r}")
        messages = task.messages
        if environment.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": environment.system_prompt})
        yield (
            {
                "data_source": data_source or environment.name,
                "agent_name": agent_name,
                "prompt": messages,
                "reward_model": {"style": "rule", "ground_truth": ground_truth(task)},
                "extra_info": {
                    "index": index,
                    "split": split,
                    "task_id": task_id,
                    "environment": reference,
                    "environment_kwargs": kwargs_text,
                    "task": task_text,
                },
            }
        )


WRITE_BATCH = 4096
"""Rows built and written at a time: writing a million tasks holds 4,096 rows, not a million."""


def write_parquet(rows: Iterable[Mapping[str, Any]], out: str | os.PathLike[str]) -> Path:
    """Write rows as one parquet file, atomically (a temporary file, then a rename)."""
    return write_parquet_rows(rows, out)[0]


def write_parquet_rows(rows: Iterable[Mapping[str, Any]], out: str | os.PathLike[str]) -> tuple[Path, int]:
    """:func:`write_parquet`, taking ``rows`` :data:`WRITE_BATCH` at a time; the path and the row count."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ConfigError("writing parquet needs pyarrow: pip install 'agentboost[verl]'") from error
    path = Path(out)
    if path.suffix != ".parquet":
        raise ConfigError(f"{path} must end in .parquet (veRL reads data files by their extension)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    writer = None
    written = 0
    try:
        source = iter(rows)
        while batch := list(itertools.islice(source, WRITE_BATCH)):
            if writer is None:
                table = pa.Table.from_pylist(batch)
                writer = pq.ParquetWriter(partial, table.schema)
            else:
                table = pa.Table.from_pylist(batch, schema=writer.schema)
            writer.write_table(table)
            written += len(batch)
        if writer is None:
            raise ConfigError("no tasks to write: the environment returned none (check -n and --split)")
        writer.close()
        os.replace(partial, path)
    except BaseException:
        if writer is not None:
            writer.close()
        partial.unlink(missing_ok=True)
        raise
    return path, written


def write_verl_dataset(
    environment: str,
    out: str | os.PathLike[str],
    *,
    environment_kwargs: Mapping[str, Any] | None = None,
    n: int | None = None,
    seed: int = 0,
    split: str = "train",
    agent_name: str = AGENT_LOOP_NAME,
    data_source: str | None = None,
) -> tuple[Path, int]:
    """Build ``environment`` (a registered name or ``module:Class``), take its tasks, write veRL's parquet.

    Returns the path written and the number of rows.
    """
    kwargs = dict(environment_kwargs or {})
    env = make_environment(environment, kwargs)
    from agentboost.rollout.runner import RunTasks

    tasks = RunTasks(env, lambda: env.tasks(n, seed=seed, split=split), limit=n)
    rows = iter_task_rows(
        env, tasks, environment_kwargs=kwargs, split=split, agent_name=agent_name, data_source=data_source
    )
    return write_parquet_rows(rows, out)


def read_row(row: Mapping[str, Any]) -> RowTask:
    """The environment reference, its kwargs and the task of one row as veRL hands it to the agent loop."""
    extra_info = row.get("extra_info")
    if not isinstance(extra_info, Mapping) or not extra_info.get("environment"):
        raise ConfigError(
            "the row has no extra_info.environment: agentboost's agent loop needs rows written by "
            "`agentboost data to-verl` (or with the same extra_info fields, see docs/verl.md)"
        )
    environment = str(extra_info["environment"])
    environment_kwargs = parse_json_object(
        extra_info.get("environment_kwargs") or "{}", "extra_info.environment_kwargs"
    )
    task = parse_json_object(extra_info.get("task"), "extra_info.task")
    return RowTask(environment, environment_kwargs, task, str(extra_info.get("task_id") or ""))


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{what} cannot be written as JSON ({error}); make it plain data") from error
