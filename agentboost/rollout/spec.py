"""One rollout run's specification: :class:`RunSpec`.

Everything that defines a run of ``tasks x samples`` rollouts lives in this one typed object: which
environment and tasks, which model, engine and servers, how to sample, the rollout limits, and how
much runs at once. It validates once (on construction), and it is every shape a run takes:

- the ``agentboost rollout`` / ``eval`` options (:func:`add_run_options`, :meth:`RunSpec.from_args`,
  :meth:`RunSpec.to_argv`, generated from the fields' metadata),
- the ``run`` header of a results file, i.e. what a resume compares (:meth:`RunSpec.identity`;
  fields marked ``compared=False`` may change between a run and its resume: :data:`NOT_COMPARED`),
- what a worker process rebuilds its setup from (:meth:`RunSpec.to_dict` / :meth:`RunSpec.from_dict`),
- the ``run`` metadata of an evaluation report (the same identity).

Adding a field (docs/rollouts.md, "The run specification"): declare it below with :func:`_setting`,
saying its option, whether a resume compares it, and (for a compared field that older results files
lack) ``omit_default=True`` so a file written before the field existed still resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentboost.cli_args import MAX_CONCURRENCY, MAX_SAMPLES, MAX_TASKS, TASKS_WHY, count, number
from agentboost.engines.factory import ENGINE_KINDS
from agentboost.errors import ConfigError
from agentboost.models.weights import DEFAULT_MODEL


def _json_object(text: str) -> dict[str, Any]:
    from agentboost.envs.registry import parse_json_object

    try:
        return parse_json_object(text, "--env-kwargs")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _tasks(text: str) -> int | None:
    """``-n``: a count >= 1, or ``all``."""
    return None if text == "all" else count(1, MAX_TASKS, TASKS_WHY)(text)


RAY = "ray"
"""``--workers ray``: rollouts run in actors on a Ray cluster's nodes (:mod:`agentboost.rollout.ray_pool`)."""


def _workers(text: str) -> int | str:
    """``--workers``: a count >= 0, or ``ray``."""
    if text == RAY:
        return RAY
    if not text.strip().lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer or ray, got {text!r}")
    return count(0)(text)


_CONCURRENCY_WHY = " (rollouts in flight at once; more only adds waiting)"


def _setting(
    *flags: str,
    help: str,
    parse: Callable[[str], Any] | None = None,
    compared: bool = True,
    record: str | None = None,
    omit_default: bool = False,
    **argparse_options: Any,
) -> dict[str, Any]:
    """A RunSpec field's metadata: its command-line option (``flags``; none: Python only), whether a
    resume compares it, and where the results header records it (``record``: a dotted key, default
    the name; ``omit_default``: left out while it has its default, for fields added after files
    were written)."""
    return {
        "flags": flags,
        "help": help,
        "parse": parse,
        "compared": compared,
        "record": record,
        "omit_default": omit_default,
        "argparse": argparse_options,
    }


_LIMIT_OPTIONS: dict[str, tuple[str, Callable[[str], Any], str | None]] = {
    "max_turns": ("--max-turns", count(1), None),
    "max_tool_calls": ("--max-tool-calls", count(1), None),
    "max_total_tokens": ("--max-total-tokens", count(1), None),
    "max_new_tokens": ("--max-new-tokens", count(1), "per turn"),
    "timeout_s": ("--timeout", number(minimum=0, inclusive=False), "seconds per rollout"),
}
"""The rollout limits a command line can set (each replaces the environment's value)."""


@dataclass(frozen=True)
class RunSpec:
    """What defines a rollout run. Built from Python or from ``agentboost rollout`` / ``eval`` options."""

    environment: str = field(
        default="arithmetic", metadata=_setting("--env", help="environment name or module:Class")
    )
    environment_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata=_setting(
            "--env-kwargs", parse=_json_object, help="JSON keyword arguments for the environment"
        ),
    )
    split: str = field(default="train", metadata=_setting("--split", help="task split"))
    seed: int = field(default=0, metadata=_setting("--seed", parse=int, help="task and sampling seed"))
    model: str = field(
        default=DEFAULT_MODEL, metadata=_setting("--model", help="model id or directory (tokenizer too)")
    )
    template: str | None = field(
        default=None,
        metadata=_setting(
            "--template",
            help="chat template: qwen3, chatml or tokenizer (default: the environment's, else the "
            "tokenizer's)",
        ),
    )
    temperature: float = field(
        default=0.7,
        metadata=_setting(
            "--temperature", parse=number(minimum=0), record="sampling.temperature", help="0 for greedy"
        ),
    )
    top_p: float = field(
        default=1.0,
        metadata=_setting(
            "--top-p",
            parse=number(minimum=0, inclusive=False, maximum=1),
            record="sampling.top_p",
            help="nucleus sampling mass (1: off)",
        ),
    )
    top_k: int = field(
        default=0, metadata=_setting("--top-k", parse=count(0), record="sampling.top_k", help="0: off")
    )
    limits: dict[str, Any] = field(
        default_factory=dict,
        metadata=_setting(help="rollout limits that replace the environment's (RolloutLimits field names)"),
    )
    """Overrides of the environment's :class:`RolloutLimits` (``--max-turns`` ...); the results
    header records the resolved limits (:meth:`resolve_limits`)."""
    tasks: int | None = field(
        default=None,
        metadata=_setting(
            "-n", "--n", parse=_tasks, compared=False, help="number of tasks (all: every task of the split)"
        ),
    )
    samples: int = field(
        default=1,
        metadata=_setting("--samples", parse=count(1, MAX_SAMPLES), compared=False, help="rollouts per task"),
    )
    engine: str = field(
        default="local",
        metadata=_setting(
            "--engine", compared=False, choices=ENGINE_KINDS, help="which engine serves the model"
        ),
    )
    urls: tuple[str, ...] = field(
        default=(),
        metadata=_setting(
            "--url", compared=False, action="append", help="server URL for remote engines (repeatable)"
        ),
    )
    workers: int | str = field(
        default=0,
        metadata=_setting(
            "--workers",
            parse=_workers,
            compared=False,
            help="worker processes (0: run in this process), or ray: actors on a Ray cluster's nodes",
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=_setting(
            "--ray-address",
            compared=False,
            omit_default=True,
            help="with --workers ray: the cluster to join (host:port or ray://...; default: RAY_ADDRESS, "
            "else a local cluster started for the run)",
        ),
    )
    concurrency: int = field(
        default=16,
        metadata=_setting(
            "--concurrency",
            parse=count(1, MAX_CONCURRENCY, _CONCURRENCY_WHY),
            compared=False,
            help="rollouts in flight at once",
        ),
    )
    retries: int = field(
        default=2,
        metadata=_setting(
            "--retries", parse=count(0), compared=False, help="extra attempts after an engine error or crash"
        ),
    )
    worker_setup_timeout_s: float = field(
        default=600.0,
        metadata=_setting(
            "--worker-setup-timeout",
            parse=number(minimum=0, inclusive=False),
            compared=False,
            help="seconds a worker may take to build its environment, tokenizer and engine",
        ),
    )
    read_timeout_s: float = field(
        default=600.0,
        metadata=_setting(
            "--read-timeout",
            parse=number(minimum=0, inclusive=False),
            compared=False,
            omit_default=True,
            help="remote engines: seconds a request may wait for its answer",
        ),
    )
    connect_timeout_s: float = field(
        default=10.0,
        metadata=_setting(
            "--connect-timeout",
            parse=number(minimum=0, inclusive=False),
            compared=False,
            omit_default=True,
            help="remote engines: seconds to connect",
        ),
    )
    server_down_timeout_s: float = field(
        default=120.0,
        metadata=_setting(
            "--server-down-timeout",
            parse=number(minimum=0),
            compared=False,
            omit_default=True,
            help="remote engines: seconds every server may refuse connections (a restart) before the run "
            "gives up",
        ),
    )
    engine_memory_gib: float | None = field(
        default=None,
        metadata=_setting(
            "--engine-memory-gib",
            parse=number(minimum=0, inclusive=False),
            compared=False,
            omit_default=True,
            help="embedded engine: GiB of KV for its running batch and prefix cache together (default: 2)",
        ),
    )

    def __post_init__(self) -> None:
        def text(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"RunSpec.{name} must be a non-empty string, got {value!r}")

        def integer(name: str, minimum: int, *, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"RunSpec.{name} must be an integer >= {minimum}, got {value!r}")

        for name in ("environment", "split", "model", "engine"):
            text(name)
        if self.template is not None:
            text("template")
        if self.engine not in ENGINE_KINDS:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINE_KINDS)}")
        if isinstance(self.urls, str) or not all(isinstance(url, str) and url for url in self.urls):
            raise ConfigError(f"RunSpec.urls must be a list of server URLs, got {self.urls!r}")
        object.__setattr__(self, "urls", tuple(self.urls))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"RunSpec.seed must be an integer, got {self.seed!r}")
        integer("tasks", 1, optional=True)
        integer("samples", 1)
        integer("top_k", 0)
        if self.workers != RAY:
            integer("workers", 0)
        if self.ray_address is not None:
            text("ray_address")
        integer("concurrency", 1)
        integer("retries", 0)
        for name, limit in (("tasks", MAX_TASKS), ("samples", MAX_SAMPLES), ("concurrency", MAX_CONCURRENCY)):
            value = getattr(self, name)
            if value is not None and value > limit:
                raise ConfigError(f"RunSpec.{name} must be at most {limit:,}, got {value:,}")
        for name in ("read_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"RunSpec.{name} must be a finite number of seconds > 0, got {value!r}")
        if not (
            isinstance(self.server_down_timeout_s, int | float)
            and math.isfinite(self.server_down_timeout_s)
            and self.server_down_timeout_s >= 0
        ):
            raise ConfigError(
                f"RunSpec.server_down_timeout_s must be a finite number of seconds >= 0, "
                f"got {self.server_down_timeout_s!r}"
            )
        if not (isinstance(self.worker_setup_timeout_s, int | float) and self.worker_setup_timeout_s > 0):
            raise ConfigError(
                f"RunSpec.worker_setup_timeout_s must be > 0 seconds, got {self.worker_setup_timeout_s!r}"
            )
        _check_engine_memory(self.engine_memory_gib)
        if not isinstance(self.environment_kwargs, Mapping):
            raise ConfigError(
                f"RunSpec.environment_kwargs must be a mapping, got {type(self.environment_kwargs).__name__}"
            )
        object.__setattr__(self, "environment_kwargs", dict(self.environment_kwargs))
        try:
            json.dumps(self.environment_kwargs)
        except (TypeError, ValueError) as error:
            raise ConfigError(
                f"RunSpec.environment_kwargs must be JSON (it is recorded and sent to workers): {error}"
            ) from error
        if not isinstance(self.limits, Mapping):
            raise ConfigError(f"RunSpec.limits must be a mapping of limit names, got {self.limits!r}")
        object.__setattr__(self, "limits", {k: v for k, v in self.limits.items() if v is not None})
        self.resolve_limits()  # unknown names and bad values fail here, not in the first rollout
        self.sampling()

    # --- what the run is made of ---------------------------------------------------------------------

    def sampling(self) -> Any:
        """The run's :class:`~agentboost.engines.base.SamplingParams` (each rollout gets its own seed)."""
        from agentboost.engines.base import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    def resolve_limits(self, environment_limits: Any = None) -> Any:
        """The limits the rollouts run under: the environment's, with :attr:`limits` in their place."""
        from agentboost.agent.limits import resolve_limits

        return resolve_limits(environment_limits, self.limits)

    def engine_options(self) -> dict[str, float]:
        """Options for :func:`~agentboost.engines.factory.make_engine`: the remote engine's timeouts, or
        the embedded engine's memory budget when one was set."""
        if self.engine == "local":
            if self.engine_memory_gib is None:
                return {}
            return {"memory_budget_bytes": int(self.engine_memory_gib * 2**30)}
        return {
            "read_timeout_s": self.read_timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
            "down_budget_s": self.server_down_timeout_s,
        }

    def worker_concurrency(self, workers: int) -> int:
        """Rollouts in flight in each of ``workers`` processes (``concurrency`` split over them)."""
        return max(1, self.concurrency // max(1, workers))

    # --- shapes ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; :meth:`from_dict` rebuilds an equal spec (how it travels to workers)."""
        data = dataclasses.asdict(self)
        data["urls"] = list(self.urls)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown run settings {unknown}; a RunSpec has {', '.join(sorted(known))}")
        return cls(**data)

    def identity(
        self,
        *,
        environment_name: str,
        limits: Any,
        tasks: int | None,
        servers: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """The ``run`` header of a results file and the eval report's ``run``: every field (the compared
        ones decide whether a resume may continue), with the facts resolved from the environment: its
        ``name``, the ``limits`` in force and the number of ``tasks`` planned; and, for remote engines,
        what the ``servers`` said they are (``server``: version, model, dtype, logprobs; compared)."""
        record: dict[str, Any] = {}
        for spec_field in dataclasses.fields(self):
            value = getattr(self, spec_field.name)
            if spec_field.metadata["omit_default"] and value == _default(spec_field):
                continue
            if spec_field.name == "limits":
                value = dataclasses.asdict(limits)
            elif spec_field.name == "tasks":
                value = tasks
            elif isinstance(value, tuple):
                value = list(value)
            *groups, key = (spec_field.metadata["record"] or spec_field.name).split(".")
            place = record
            for group in groups:
                place = place.setdefault(group, {})
            place[key] = value
            if spec_field.name == "environment":
                record["environment_name"] = environment_name
        if servers:
            record["server"] = dict(servers[0]) if len(servers) == 1 else [dict(s) for s in servers]
        return record

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunSpec:
        """The spec of parsed ``agentboost rollout`` / ``eval`` options (see :func:`add_run_options`)."""
        values: dict[str, Any] = {}
        for spec_field in dataclasses.fields(cls):
            if spec_field.metadata["flags"]:
                value = getattr(args, spec_field.name)
                if spec_field.name in ("urls", "environment_kwargs") and value is None:
                    value = _default(spec_field)  # argparse's default: the option was not given
                values[spec_field.name] = value
        values["limits"] = {name: getattr(args, f"limit_{name}") for name in _LIMIT_OPTIONS}
        return cls(**values)

    def to_argv(self) -> list[str]:
        """Command-line options that :meth:`from_args` turns back into this spec."""
        argv: list[str] = []
        for spec_field in dataclasses.fields(self):
            flags = spec_field.metadata["flags"]
            value = getattr(self, spec_field.name)
            if not flags:
                continue
            flag = flags[-1]
            if spec_field.name == "urls":
                for url in value:
                    argv += [flag, url]
            elif spec_field.name == "environment_kwargs":
                if value:
                    argv += [flag, json.dumps(value)]
            elif spec_field.name == "tasks":
                argv += [flag, "all" if value is None else str(value)]
            elif value is not None:
                argv += [flag, _text(value)]
        for name, (flag, _, _) in _LIMIT_OPTIONS.items():
            if name in self.limits:
                argv += [
                    flag,
                    repr(self.limits[name])
                    if isinstance(self.limits[name], float)
                    else str(self.limits[name]),
                ]
        return argv


def _check_engine_memory(gib: Any) -> None:
    """``engine_memory_gib``: None (the engine's default) or a finite number of GiB > 0."""
    if gib is not None and (
        isinstance(gib, bool) or not isinstance(gib, int | float) or not math.isfinite(gib) or gib <= 0
    ):
        raise ConfigError(f"RunSpec.engine_memory_gib must be a finite number of GiB > 0, got {gib!r}")


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _default(spec_field: dataclasses.Field[Any]) -> Any:
    if spec_field.default_factory is not dataclasses.MISSING:
        return spec_field.default_factory()
    return spec_field.default


NOT_COMPARED = frozenset(
    (f.metadata["record"] or f.name).split(".")[0]
    for f in dataclasses.fields(RunSpec)
    if not f.metadata["compared"]
) | {"precision"}
"""Keys of a results header that a resume may change (how much to run, and how): the fields declared
``compared=False``, and the embedded engine's ``precision`` (a fact recorded since it was added: files
written before it lack it)."""


def add_run_options(parser: argparse.ArgumentParser, defaults: RunSpec) -> None:
    """Add every RunSpec option to ``parser`` (with ``defaults``' values), plus the resume options
    ``--fresh`` and ``--allow-different-settings``. The options validate where they enter, so
    ``rollout`` and ``eval`` refuse the same input with the same message."""
    for spec_field in dataclasses.fields(RunSpec):
        flags: Sequence[str] = spec_field.metadata["flags"]
        if not flags:
            continue
        default = getattr(defaults, spec_field.name)
        options = dict(spec_field.metadata["argparse"])
        if spec_field.metadata["parse"] is not None:
            options["type"] = spec_field.metadata["parse"]
        if spec_field.name == "urls":
            default = None
        elif spec_field.name == "environment_kwargs":
            default = dict(default) or None
        shown = "all" if spec_field.name == "tasks" and default is None else default
        text = spec_field.metadata["help"]
        if shown not in (None, (), "") and "default" not in text:
            text = f"{text} (default: {shown})"
        parser.add_argument(*flags, dest=spec_field.name, default=default, help=text, **options)
    for name, (flag, parse, text) in _LIMIT_OPTIONS.items():
        parser.add_argument(
            flag, dest=f"limit_{name}", type=parse, default=defaults.limits.get(name), help=text
        )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start over instead of resuming --out (an agentboost results file)",
    )
    parser.add_argument(
        "--allow-different-settings",
        action="store_true",
        help="resume --out even though it was written with other settings (they are listed)",
    )
