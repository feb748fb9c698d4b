"""Supervised fine-tuning on agent trajectories: loss on the assistant's tokens only.

Two inputs, one token contract (the loss mask says which tokens the model produced):

- **Results JSONL** (what ``agentboost rollout`` and the trainer write): each row's Trajectory already
  holds ``token_ids`` and ``loss_mask``; they are used as they are. Rows are kept by reward
  (``data.min_reward``) and failed rollouts are left out (policy failures too, though scored: a
  rollout that crashed its agent is never imitated): rejection-sampling fine-tuning is "roll out,
  keep the successes, train on them".
- **Chat JSONL** (``{"messages": [...], "tools": [...]}``, OpenAI message form, e.g. a bigger
  model's conversations): rendered with agentboost's chat template through
  :class:`~agentboost.tokens.builder.TokenBuffer`, exactly as a rollout would be built. Each
  assistant message (text and tool calls) becomes the tokens the model would have generated, up to
  and including its end-of-turn token (mask 1); system, user and tool messages and the generation
  prompts are context (mask 0).

One step is ``batch_size`` examples (a new permutation of the data each epoch, so a resumed run sees
the same batches), split into bucketed micro-batches under a token budget; the loss is the mean
negative log-likelihood per assistant token of the batch. Policy loading, LoRA, the optimizer and its
schedule, checkpoints and metrics are the RL trainer's own (:mod:`agentboost.train.policy`,
:mod:`.schedule`, :mod:`.checkpoint`, :mod:`.logging`). With ``eval.environment`` set, the held-out
reward of an environment is measured during training, as the RL trainer does, so a warm-up and the
RL run after it draw one curve.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from agentboost.errors import ConfigError, TemplateError
from agentboost.memory import trim_heap
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.train import config as config_module
from agentboost.train import schedule
from agentboost.train.batching import Sample, micro_batches
from agentboost.train.buffers import FlatGradients, compact_optimizer_state
from agentboost.train.checkpoint import Checkpoints
from agentboost.train.config import (
    CheckpointConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    RolloutConfig,
)
from agentboost.train.logging import MetricsLogger
from agentboost.train.loop import TrainingLoop
from agentboost.train.policy import (
    PolicyModel,
    load_policy,
    make_optimizer,
    pad_token_id,
    resolve_device,
    resolve_precision,
    seed_everything,
)

# --- settings ------------------------------------------------------------------------------------


@dataclass
class SFTDataConfig:
    """What to train on."""

    paths: list[str] = field(default_factory=list)
    """JSONL files: rollout results or chat conversations (a comma-separated string also works)."""
    format: Literal["auto", "results", "chat"] = "auto"
    """``auto`` reads each row: a ``trajectory`` key means a result row, ``messages`` a chat row."""
    min_reward: float | None = None
    """Results only: keep rows whose reward is >= this (e.g. 1.0 for rejection sampling); None keeps
    every scored row. Failed rollouts (engine/template errors, unscored) are always left out."""
    template: str | None = None
    """Chat rows: the chat template (``qwen3``, ``chatml``, ``tokenizer``); None picks one for the
    tokenizer, as rollouts do."""
    max_tokens: int = 4096
    """Examples longer than this are skipped (and counted), never truncated: a cut-off example would
    teach the model to stop mid-answer."""


@dataclass
class SFTEvalConfig(EvalConfig):
    """Optional held-out reward of an environment during SFT (``split="test"``, as the RL trainer)."""

    environment: str | None = None
    """A registered environment name or ``module:Class``; None: no reward evaluation."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    task_seed: int = 0
    max_turns: int | None = None
    concurrency: int = 64


@dataclass
class SFTConfig:
    """One supervised fine-tuning run (``agentboost sft CONFIG.yaml``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    eval: SFTEvalConfig = field(default_factory=lambda: SFTEvalConfig(every=0))
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    batch_size: int = 8
    """Examples per optimizer step."""
    epochs: float = 1.0
    """Passes over the data; sets the number of steps unless ``steps`` is given."""
    steps: int | None = None
    seed: int = 0
    output_dir: str = "runs/sft"
    threads: int | None = None

    def validate(self) -> SFTConfig:
        """Reject settings that cannot train; returns self. The sections shared with the RL trainer
        (``lora``, ``optimizer``, ``eval``, ``checkpoint``) check themselves as they do there."""
        own = [
            (bool(self.data.paths), "data.paths is empty: name at least one JSONL file"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.epochs > 0, "epochs must be > 0"),
            (self.steps is None or self.steps >= 1, "steps must be >= 1 (or null to follow epochs)"),
            (self.data.max_tokens >= 2, "data.max_tokens must be >= 2"),
        ]
        sections = (self.lora, self.optimizer, self.eval, self.checkpoint)
        config_module.raise_first(
            [
                *(message for ok, message in own if not ok),
                *(problem for section in sections for problem in section.problems()),
                *config_module.run_problems(self.threads, self.output_dir),
            ]
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        import dataclasses

        return dataclasses.asdict(self)


def load_sft_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> SFTConfig:
    """Read YAML, apply dotted ``key=value`` overrides, validate (the trainer's config rules)."""
    return config_module.load_config(path, overrides, cls=SFTConfig)


# --- data ----------------------------------------------------------------------------------------


@dataclass
class Example:
    """One training sequence: token ids and which of them the model is trained to produce."""

    source: str
    """``file:line`` it came from."""
    token_ids: list[int]
    loss_mask: list[int]

    def to_sample(self, index: int) -> Sample:
        ids = torch.tensor(self.token_ids, dtype=torch.long)
        mask = torch.tensor(self.loss_mask, dtype=torch.bool)
        return Sample(
            index=index,
            group=index,
            reward=0.0,
            advantage=0.0,
            input_ids=ids[:-1],
            target_ids=ids[1:],
            loss_mask=mask[1:],
            rollout_logprobs=torch.zeros(len(ids) - 1, dtype=torch.float32),
        )


@dataclass
class DataReport:
    """What loading kept and why it left rows out."""

    kept: int = 0
    low_reward: int = 0
    failed: int = 0
    too_long: int = 0
    no_assistant_tokens: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {f"data/{key}": float(value) for key, value in self.__dict__.items()}


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    template: str | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a chat, built as a rollout would be: mask 1 exactly on assistant turns.

    Each assistant message becomes the text the template renders for it after the generation prompt,
    up to and including the end-of-turn token, tokenized on its own (as the engine generates it). The
    messages after it are appended as a rollout appends tool results and user turns.
    """
    from agentboost.agent.episode import stop_token_ids
    from agentboost.tokens.builder import TokenBuffer
    from agentboost.tokens.templates import template_for

    chat_template = template_for(tokenizer, template)
    messages = [dict(message) for message in messages]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise ConfigError("a chat row needs context messages followed by at least one assistant message")
    buffer = TokenBuffer(tokenizer, chat_template, tools=tools)
    buffer.start(messages[:first])
    stops = set(stop_token_ids(tokenizer))
    index = first
    while index < len(messages):
        message = messages[index]
        if message.get("role") != "assistant":
            raise ConfigError(f"message {index} ({message.get('role')!r}) follows no assistant turn")
        before = chat_template.render(messages[:index], tools, add_generation_prompt=True)
        after = chat_template.render(messages[: index + 1], tools, add_generation_prompt=False)
        if not after.startswith(before):
            raise TemplateError(
                chat_template.name, message, "rendering the assistant turn changes the conversation before it"
            )
        ids = buffer.encode(after[len(before) :])
        end = next((i for i, token in enumerate(ids) if token in stops), None)
        if end is not None:  # the engine stops at its first stop token: so does the demonstration
            ids = ids[: end + 1]
        buffer.append_generation(ids, [0.0] * len(ids), finish_reason="stop" if end is not None else "length")
        following = []
        index += 1
        while index < len(messages) and messages[index].get("role") != "assistant":
            following.append(messages[index])
            index += 1
        if following and index < len(messages):  # context after the last assistant turn is not needed
            buffer.append_messages(following)
        elif index < len(messages):
            raise ConfigError(f"two assistant messages in a row at {index}: merge them into one turn")
    return list(buffer.token_ids), list(buffer.loss_mask)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file; the header of an agentboost results file is skipped."""
    from agentboost.rollout.results import RESULTS_FORMAT

    try:
        handle = path.open("rb")
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from error
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8 text"
                raise ConfigError(
                    f"{path}:{number} is not JSON ({reason}); --data takes JSONL of chats or results"
                ) from error
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{number} must be a JSON object")
            if number == 1 and row.get("format") == RESULTS_FORMAT:
                continue  # the run header of a results file written by rollout, eval or train
            yield number, row


def load_examples(data: SFTDataConfig, tokenizer: Tokenizer) -> tuple[list[Example], DataReport]:
    """Every usable example of ``data.paths``, in file order, and a report of what was left out."""
    from agentboost.envs.base import RolloutResult

    examples: list[Example] = []
    report = DataReport()
    for name in data.paths:
        path = Path(name)
        for number, row in _rows(path):
            source = f"{path}:{number}"
            kind = data.format
            if kind == "auto":
                kind = "results" if "trajectory" in row else "chat" if "messages" in row else ""
                if not kind:
                    raise ConfigError(
                        f"{source}: neither a result row ('trajectory') nor a chat ('messages')"
                    )
            if kind == "results":
                try:
                    result = RolloutResult.from_dict(row)
                except (KeyError, TypeError, ValueError) as error:
                    raise ConfigError(f"{source} is not a rollout result row: {error}") from error
                if result.failed or result.policy_failure:  # never imitate a rollout that crashed its agent
                    report.failed += 1
                    continue
                if data.min_reward is not None and float(result.reward or 0.0) < data.min_reward:
                    report.low_reward += 1
                    continue
                ids, mask = list(result.trajectory.token_ids), list(result.trajectory.loss_mask)
            else:
                messages = row.get("messages")
                if not isinstance(messages, list):
                    raise ConfigError(f"{source}: 'messages' must be a list of chat messages")
                try:
                    ids, mask = render_chat(tokenizer, messages, row.get("tools"), template=data.template)
                except (ConfigError, TemplateError) as error:
                    raise ConfigError(f"{source}: {error}") from error
            if len(ids) > data.max_tokens:
                report.too_long += 1
                continue
            if not any(mask[1:]):
                report.no_assistant_tokens += 1
                continue
            examples.append(Example(source, ids, mask))
    report.kept = len(examples)
    return examples, report


# --- the run -------------------------------------------------------------------------------------


@dataclass
class SFTSummary:
    steps: int
    output_dir: Path
    losses: dict[int, float]
    eval_rewards: dict[int, float]
    resumed_from: int | None


class SFTTrainer(TrainingLoop):
    """Runs :class:`SFTConfig`."""

    def __init__(self, config: SFTConfig) -> None:
        self.config = config.validate()
        self.run_dir = Path(config.output_dir)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.model)
        seed_everything(config.seed)
        self.precision = resolve_precision(config.model, config.lora, self.device)
        self.tokenizer, self.model = load_policy(config.model, config.lora, self.device, self.precision)
        self.policy = PolicyModel(self.model, self.precision)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.parameters, config.optimizer)
        self.gradients = FlatGradients(self.parameters)  # one buffer, outside the heap (buffers.py)
        self.pad_id = pad_token_id(self.tokenizer)
        self.checkpointer = Checkpoints(self.run_dir, keep=config.checkpoint.keep)
        self.examples, self.data_report = load_examples(config.data, self.tokenizer)
        if not self.examples:
            raise ConfigError(
                f"no usable example in {', '.join(config.data.paths)} ({self.data_report.as_metrics()}); "
                "check data.min_reward, data.max_tokens and the files"
            )
        self.batch_size = min(config.batch_size, len(self.examples))
        steps_per_epoch = max(1, len(self.examples) // self.batch_size)
        self.total_steps = config.steps or max(1, math.ceil(config.epochs * steps_per_epoch))
        self.step = 0
        self.resumed_from: int | None = None
        self.losses: dict[int, float] = {}
        self.eval_rewards: dict[int, float] = {}
        self._environment: Any = None
        self._engine: Any = None

    def batch_for_step(self, step: int) -> list[Example]:
        return schedule.items_for_step(self.examples, step, self.batch_size, self.config.seed)

    def train_step(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """One optimizer step on the step's batch; returns sft/* and optim/* metrics."""
        started = time.perf_counter()
        lr = schedule.learning_rate(self.config.optimizer, step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        samples = [example.to_sample(i) for i, example in enumerate(self.batch_for_step(step))]
        normalizer = max(1, sum(s.loss_tokens for s in samples))
        if self._engine is not None:  # the last evaluation's cached prefixes go stale with this step
            self._engine.release_memory()
        self.model.train()
        self.gradients.allocate()
        total_loss = 0.0
        for micro in micro_batches(
            samples, max_tokens=self.config.optimizer.micro_batch_tokens, pad_id=self.pad_id
        ):
            micro = micro.to(self.device)
            logprobs, _ = self.policy.logprobs(micro, 1.0)  # [B, T], 0 off the mask
            loss = -(logprobs * micro.loss_mask).sum() / normalizer
            loss.backward()
            trim_heap()  # as in the RL trainer: the next micro-batch's shapes may not fit the freed holes
            total_loss += float(loss.detach())
        self.gradients.drop_untouched()
        max_norm = self.config.optimizer.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, max_norm if max_norm > 0 else float("inf"))
        self.optimizer.step()
        compact_optimizer_state(self.optimizer)
        self.gradients.release()
        self.model.eval()
        return {
            "sft/loss": total_loss,
            "sft/perplexity": math.exp(min(total_loss, 50.0)),
            "sft/loss_tokens": float(normalizer),
            "sft/sequences": float(len(samples)),
            "optim/lr": lr,
            "optim/grad_norm": float(norm),
            "time/step_s": time.perf_counter() - started,
        }

    @torch.no_grad()
    def loss_on(self, examples: Sequence[Example]) -> float:
        """Mean NLL per assistant token of ``examples`` under the current weights (no update)."""
        self.model.eval()
        samples = [example.to_sample(i) for i, example in enumerate(examples)]
        total, tokens = 0.0, 0
        for micro in micro_batches(
            samples, max_tokens=self.config.optimizer.micro_batch_tokens, pad_id=self.pad_id
        ):
            micro = micro.to(self.device)
            logprobs, _ = self.policy.logprobs(micro, 1.0)
            total -= float((logprobs * micro.loss_mask).sum())
            tokens += int(micro.loss_mask.sum())
        return total / max(1, tokens)

    # --- held-out reward (optional) ----------------------------------------------------------------

    def evaluate(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """Held-out mean reward of ``eval.environment`` on ``split="test"`` (greedy by default)."""
        from agentboost.engines.embedded.engine import LocalEngine
        from agentboost.envs.registry import make_environment
        from agentboost.train.collect import collect_rollouts, result_metrics, training_spec

        evaluation = self.config.eval
        if self._environment is None:
            self._environment = make_environment(str(evaluation.environment), evaluation.kwargs)
            if self.config.model.template is not None:
                self._environment.template = self.config.model.template
            # no packed weights (they cost the linear weights' size again beside the optimizer's state)
            # and PyTorch's own linears, as the RL trainer's engine (trainer.py says why)
            self._engine = LocalEngine(
                self.model,
                max_batch_size=max(1, evaluation.concurrency),
                packed_weights=False,
                onednn_linears=False,
                precision=self.precision,
            )
        tasks = list(self._environment.tasks(evaluation.tasks, seed=evaluation.task_seed, split="test"))
        started = time.perf_counter()
        self.model.eval()
        spec = training_spec(
            str(evaluation.environment),
            environment_kwargs=evaluation.kwargs,
            model=self.config.model,
            rollout=RolloutConfig(max_turns=evaluation.max_turns, concurrency=evaluation.concurrency),
            split="test",
            tasks=len(tasks),
            samples=evaluation.samples,
            seed=self.config.seed + 7_777_777,
            eval_config=evaluation,
        )
        results = collect_rollouts(
            self._environment,
            self._engine,
            self.tokenizer,
            spec,
            tasks,
            self.run_dir / "evals" / f"step_{step:06d}.jsonl",
            on_result=self._phase(bar, f"eval @{step}", len(tasks) * evaluation.samples),
            precision=self.precision,
        )
        metrics = {f"eval/{name}": value for name, value in result_metrics(results).items()}
        self.eval_rewards[step] = metrics["eval/reward_mean"]
        return {**metrics, "eval/seconds": time.perf_counter() - started}

    # --- the loop (TrainingLoop.train runs it) -------------------------------------------------------

    progress_name = "sft"
    plots_without_evaluation = False

    @property
    def evaluates(self) -> bool:
        return bool(self.config.eval.every and self.config.eval.environment)

    def started(self, logger: MetricsLogger) -> None:
        if self.resumed_from is None:
            logger.log(0, "data", self.data_report.as_metrics())

    def finished_step(self, step: int, metrics: dict[str, float]) -> None:
        self.losses[step] = metrics["sft/loss"]

    def postfix(self, metrics: dict[str, float]) -> str:
        return f"loss {metrics['sft/loss']:.3f}"

    def summary(self) -> SFTSummary:
        return SFTSummary(
            self.step, self.run_dir, dict(self.losses), dict(self.eval_rewards), self.resumed_from
        )

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "examples_consumed": self.step * self.batch_size,
            "losses": {str(k): v for k, v in self.losses.items()},
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        self.losses = {int(k): v for k, v in state.get("losses", {}).items()}

    def save_model(self, directory: Path) -> None:
        """The fine-tuned policy in the Hugging Face format (LoRA: merged, so RL can start from it)."""
        directory.mkdir(parents=True, exist_ok=True)
        model = self.model
        if hasattr(model, "merge_and_unload"):
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
