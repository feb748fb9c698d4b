"""The local trainer: collect group rollouts with the current weights, compute advantages, update, repeat.

One step:

1. **Collect.** ``tasks_per_step`` training tasks, ``group_size`` rollouts each, through the rollout
   runner and the embedded :class:`~agentboost.engines.local.LocalEngine`. The engine holds the very
   model object being trained, so it always serves the current weights; collection and update never
   overlap (the runner returns only when every rollout is done). Results go to
   ``rollouts/step_NNNNNN.jsonl``, which a killed run resumes.
2. **Advantages.** Failed rollouts are left out; each task's samples form a group
   (:mod:`agentboost.train.algorithms`). Groups whose rewards are all equal are counted and, by
   default, dropped.
3. **Update.** ``epochs`` passes of ``mini_batches`` optimizer steps each, every mini-batch split into
   bucketed micro-batches under a token budget (gradient accumulation). With one optimizer step per
   training step (the default) the policy before the update *is* pi_old, so pi_old comes from the
   same forward pass; otherwise it is recomputed once, without gradient, before the first update.
   Either way the trainer's logprobs are compared with the engine's (``mismatch/*``).

A checkpoint (weights that train, optimizer, step, data position, RNG states) is written every
``checkpoint.every`` steps; a run started again in the same ``output_dir`` continues from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentboost.agent.limits import RolloutLimits, resolve_limits
from agentboost.engines.base import SamplingParams
from agentboost.envs.base import Environment, RolloutResult
from agentboost.errors import ConfigError
from agentboost.rollout.results import ResultStore, read_results
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs
from agentboost.train import algorithms
from agentboost.train.batching import Sample, TokenBatch, micro_batches, mini_batches, sample_from_result
from agentboost.train.config import TrainConfig
from agentboost.train.logging import MetricsLogger

CHECKPOINT_PREFIX = "step_"


@dataclass
class TrainSummary:
    """What a finished run reports."""

    steps: int
    """Steps completed (fewer than configured when time_limit_minutes stopped the run)."""
    output_dir: Path
    eval_rewards: dict[int, float]
    """step -> held-out mean reward."""
    resumed_from: int | None


class _CountingStore(ResultStore):
    """A ResultStore that reports each written result (to move the step's progress bar)."""

    def __init__(self, path: Path, on_write: Callable[[RolloutResult], None]) -> None:
        super().__init__(path, resume=True)
        self._on_write = on_write

    def write(self, result: RolloutResult) -> None:
        super().write(result)
        self._on_write(result)


class PolicyModel:
    """The model as the trainer sees it: logprobs (and entropy) of target tokens, only where needed.

    The transformer body runs over every position, but the vocabulary projection only over positions
    whose target was generated: prompts and tool results need hidden states, not [V]-sized logits.
    """

    def __init__(self, model: Any) -> None:
        self.model = model  # a transformers causal LM, or a peft model wrapping one
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.decoder = causal_lm.get_decoder()
        self.head = causal_lm.get_output_embeddings()
        if self.decoder is causal_lm or self.head is None:
            raise ConfigError(
                f"{type(causal_lm).__name__} does not expose a decoder body and an output head "
                "(get_decoder / get_output_embeddings); the local trainer needs both"
            )

    def check_head(self, device: torch.device) -> None:
        """Refuse models whose logits are more than ``head(hidden)`` (soft-capping, scaling)."""
        ids = torch.arange(3, 11, device=device).unsqueeze(0)
        with torch.no_grad():
            reference = self.model(input_ids=ids, use_cache=False).logits.float()
            ours = self.head(self.decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
        if not torch.allclose(reference, ours, atol=1e-3, rtol=1e-3):
            raise ConfigError(
                f"{type(self.model).__name__}'s logits are not its output head applied to its decoder's "
                "hidden states (logit soft-capping or scaling?); the local trainer does not support it yet"
            )

    def logprobs(
        self, batch: TokenBatch, temperature: float, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, T] logprobs of the target ids (0 where loss_mask is 0), and [B, T] entropy if asked."""
        hidden = self.decoder(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state  # [B, T, H]
        rows, columns = batch.loss_mask.nonzero(as_tuple=True)  # [N], [N]
        logits = self.head(hidden[rows, columns])  # [N, V]
        token_logprobs = algorithms.token_logprobs(logits, batch.target_ids[rows, columns], temperature)
        shape = batch.loss_mask.shape
        logprobs = torch.zeros(shape, dtype=torch.float32, device=hidden.device).index_put(
            (rows, columns), token_logprobs
        )
        entropy = None
        if with_entropy:
            entropy = torch.zeros(shape, dtype=torch.float32, device=hidden.device)
            entropy[rows, columns] = algorithms.entropy_from_logits(logits.detach(), temperature)
        return logprobs, entropy


class _Sums:
    """Running sums of metrics over micro-batches, divided at the end."""

    def __init__(self) -> None:
        self.values: dict[str, float] = defaultdict(float)

    def add(self, name: str, value: float | torch.Tensor) -> None:
        self.values[name] += float(value)

    def __getitem__(self, name: str) -> float:
        return self.values.get(name, 0.0)


class Trainer:
    """Runs :class:`TrainConfig`. Pass ``environment`` to train on an object instead of a reference."""

    def __init__(self, config: TrainConfig, *, environment: Environment | None = None) -> None:
        self.config = config.validate()
        self.run_dir = Path(config.output_dir)
        self.environment = environment if environment is not None else self._make_environment()
        if config.model.template is not None:
            self.environment.template = config.model.template
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = torch.device(
            config.model.device
            if config.model.device != "auto"
            else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self._seed_everything(config.seed)
        self.tokenizer, self.model = self._load_policy()
        self.policy = PolicyModel(self.model)
        self.policy.check_head(self.device)
        self.reference = self._make_reference()
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        optimizer_config = config.optimizer
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=optimizer_config.lr,
            betas=(optimizer_config.beta1, optimizer_config.beta2),
            eps=optimizer_config.eps,
            weight_decay=optimizer_config.weight_decay,
        )
        from agentboost.engines.local import LocalEngine

        self.engine = LocalEngine(self.model, max_batch_size=max(1, config.rollout.concurrency))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.train_tasks = list(
            self.environment.tasks(
                config.environment.train_tasks, seed=config.environment.task_seed, split="train"
            )
        )
        if len(self.train_tasks) < config.rollout.tasks_per_step:
            raise ConfigError(
                f"the environment gave {len(self.train_tasks)} training tasks but rollout.tasks_per_step "
                f"is {config.rollout.tasks_per_step}; lower it or raise environment.train_tasks"
            )
        self.step = 0
        self.resumed_from: int | None = None
        self.eval_rewards: dict[int, float] = {}

    # --- set-up ----------------------------------------------------------------------------------

    def _make_environment(self) -> Environment:
        from agentboost.envs.registry import make_environment

        return make_environment(self.config.environment.name, self.config.environment.kwargs)

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.seed(seed % 2**32)

    def _dtype(self) -> torch.dtype:
        choice = self.config.model.dtype
        if choice == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[choice]

    def _load_policy(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM

        from agentboost.engines.factory import load_tokenizer
        from agentboost.engines.models import resolve_model

        name = self.config.model.name_or_path
        tokenizer = load_tokenizer(name)
        model = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=self._dtype()).to(self.device)
        if self.config.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        lora = self.config.lora
        if lora.enabled:
            try:
                from peft import LoraConfig, get_peft_model
            except ImportError as error:
                raise ConfigError("lora.enabled needs peft: pip install 'agentboost[train]'") from error
            if self.config.model.gradient_checkpointing:
                model.enable_input_require_grads()
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.rank,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules),
                    task_type="CAUSAL_LM",
                ),
            )
        return tokenizer, model

    def _make_reference(self) -> PolicyModel | None:
        """The frozen policy of the KL penalty: adapters disabled with LoRA, else a frozen copy."""
        if self.config.algorithm.kl_coef == 0:
            return None
        if self.config.lora.enabled:
            return self.policy  # evaluated under disable_adapter(), see _reference_context
        frozen = copy.deepcopy(self.model).eval()
        for parameter in frozen.parameters():
            parameter.requires_grad_(False)
        return PolicyModel(frozen)

    def _reference_context(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.lora.enabled:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    # --- data ------------------------------------------------------------------------------------

    def tasks_for_step(self, step: int) -> list[Any]:
        """The step's tasks: a new permutation of the training pool each epoch, ``tasks_per_step`` at a time.

        The data position is a function of the step alone (the tail of an epoch that does not fill a
        step is skipped), so a resumed run draws exactly the tasks the uninterrupted one would.
        """
        per_step = self.config.rollout.tasks_per_step
        steps_per_epoch = len(self.train_tasks) // per_step
        epoch, offset = divmod(step, steps_per_epoch)
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.train_tasks), generator=generator).tolist()
        return [self.train_tasks[i] for i in order[offset * per_step : (offset + 1) * per_step]]

    def _limits(self, *, evaluation: bool = False) -> RolloutLimits:
        rollout, defaults = self.config.rollout, self.environment.limits
        max_new_tokens = rollout.max_new_tokens
        if evaluation and self.config.eval.max_new_tokens is not None:
            max_new_tokens = self.config.eval.max_new_tokens
        return resolve_limits(
            defaults,
            {
                "max_turns": rollout.max_turns,
                "max_new_tokens": max_new_tokens,
                "max_total_tokens": rollout.max_total_tokens,
                "timeout_s": rollout.timeout_s,
            },
        )

    def _collect(
        self,
        path: Path,
        tasks: Sequence[Any],
        *,
        samples: int,
        sampling: SamplingParams,
        limits: RolloutLimits,
        seed: int,
        on_result: Callable[[RolloutResult], None],
    ) -> list[RolloutResult]:
        """Run ``tasks x samples`` rollouts on the current weights; results in job order."""
        run_config = RunConfig(
            samples=samples,
            concurrency=self.config.rollout.concurrency,
            retries=self.config.rollout.retries,
            seed=seed,
            progress=False,
        )
        jobs = plan_jobs(self.environment, tasks, run_config)
        self.model.eval()
        execute = in_process(self.environment, self.engine, self.tokenizer, sampling=sampling, limits=limits)
        with _CountingStore(path, on_result) as store:
            asyncio.run(run_jobs(jobs, execute, store, run_config))
        by_key = {(r.task_id, r.sample): r for r in read_results(path)}
        return [by_key[(job.task_id, job.sample)] for job in jobs]

    # --- the loop --------------------------------------------------------------------------------

    def train(self) -> TrainSummary:
        """Run (or resume) every step, with evaluations and checkpoints; returns the held-out rewards."""
        config = self.config
        self.step = self._resume()
        self._forget_future(self.step, fresh=self.resumed_from is None)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        logger = MetricsLogger(
            self.run_dir,
            start_step=self.step,
            config=config.to_dict(),
            wandb_project=config.logging.wandb_project,
            wandb_run_name=config.logging.wandb_run_name,
            wandb_mode=config.logging.wandb_mode,
        )
        bar = self._progress_bar()
        started = time.monotonic()
        limit_s = config.time_limit_minutes * 60 if config.time_limit_minutes else math.inf
        try:
            while self.step < config.steps and time.monotonic() - started < limit_s:
                step = self.step
                if config.eval.every and step % config.eval.every == 0:
                    logger.log(step, "eval", self.evaluate(step, bar=bar))
                    logger.plot()
                metrics = self.train_step(step, bar=bar)
                logger.log(step, "train", metrics)
                self.step = step + 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(self._postfix(metrics), refresh=True)
                every = config.checkpoint.every
                out_of_time = time.monotonic() - started >= limit_s
                if (every and self.step % every == 0) or self.step == config.steps or out_of_time:
                    self.save_checkpoint()
            if self.step < config.steps:
                print(
                    f"agentboost: stopped after step {self.step} of {config.steps}: "
                    f"time_limit_minutes={config.time_limit_minutes} reached",
                    file=sys.stderr,
                )
            if config.eval.every and self.step not in self.eval_rewards:
                logger.log(self.step, "eval", self.evaluate(self.step, bar=bar))
            logger.plot()
            if config.checkpoint.save_final_model:
                self.save_model(self.run_dir / "final")
        finally:
            if bar is not None:
                bar.close()
            logger.close()
            self.engine.close()
        return TrainSummary(self.step, self.run_dir, dict(self.eval_rewards), self.resumed_from)

    def _progress_bar(self) -> Any:
        if not self.config.logging.progress:
            return None
        from tqdm import tqdm

        return tqdm(
            total=self.config.steps,
            initial=self.step,
            unit="step",
            desc="train",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def _postfix(self, metrics: dict[str, float]) -> str:
        parts = [f"reward {metrics.get('reward/mean', float('nan')):.3f}"]
        if self.eval_rewards:
            last = max(self.eval_rewards)
            parts.append(f"eval@{last} {self.eval_rewards[last]:.3f}")
        parts.append(f"mismatch {metrics.get('mismatch/logprob_abs_diff', float('nan')):.1e}")
        return " | ".join(parts)

    def _phase(self, bar: Any, text: str) -> Callable[[RolloutResult], None]:
        """A callback that shows ``text done/total`` on the bar as rollouts finish."""
        counter = {"done": 0}

        def on_result(_: RolloutResult) -> None:
            counter["done"] += 1
            if bar is not None:
                bar.set_description_str(f"{text} {counter['done']}", refresh=True)

        return on_result

    def evaluate(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """Held-out mean reward of the current weights on ``split="test"``."""
        config = self.config
        tasks = self.environment.tasks(config.eval.tasks, seed=config.environment.task_seed, split="test")
        sampling = SamplingParams(
            temperature=config.eval.temperature,
            top_p=config.rollout.top_p if config.eval.temperature else 1.0,
            top_k=config.rollout.top_k if config.eval.temperature else 0,
        )
        started = time.perf_counter()
        results = self._collect(
            self.run_dir / "evals" / f"step_{step:06d}.jsonl",
            tasks,
            samples=config.eval.samples,
            sampling=sampling,
            limits=self._limits(evaluation=True),
            seed=config.seed + 7_777_777,  # the same sampler seeds at every evaluation: paired comparisons
            on_result=self._phase(bar, f"eval @{step}"),
        )
        rewards = [r.reward if r.reward is not None else 0.0 for r in results]
        mean = sum(rewards) / len(rewards)
        self.eval_rewards[step] = mean
        return {
            "eval/reward_mean": mean,
            "eval/reward_std": _std(rewards),
            "eval/failed": sum(r.failed for r in results),
            "eval/generated_tokens_mean": sum(r.trajectory.generated_tokens for r in results) / len(results),
            "eval/seconds": time.perf_counter() - started,
        }

    def collect(self, step: int, *, bar: Any = None) -> list[RolloutResult]:
        """The step's group rollouts, sampled by the engine from the current weights."""
        rollout = self.config.rollout
        sampling = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k)
        return self._collect(
            self.run_dir / "rollouts" / f"step_{step:06d}.jsonl",
            self.tasks_for_step(step),
            samples=rollout.group_size,
            sampling=sampling,
            limits=self._limits(),
            seed=self.config.seed * 1_000_003 + step,
            on_result=self._phase(bar, f"rollouts @{step}"),
        )

    def train_step(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """Collect, then update. Returns the step's metrics."""
        started = time.perf_counter()
        results = self.collect(step, bar=bar)
        rollout_seconds = time.perf_counter() - started
        if bar is not None:
            bar.set_description_str(f"update @{step}", refresh=True)
        samples, metrics = self.make_samples(results)
        update_started = time.perf_counter()
        metrics.update(self.update(samples, step))
        generated = sum(r.trajectory.generated_tokens for r in results)
        metrics.update(
            {
                "time/rollout_s": rollout_seconds,
                "time/update_s": time.perf_counter() - update_started,
                "time/step_s": time.perf_counter() - started,
                "rollout/tokens_per_second": generated / rollout_seconds if rollout_seconds else 0.0,
            }
        )
        if bar is not None:
            bar.set_description_str("train", refresh=True)
        return metrics

    def make_samples(self, results: Sequence[RolloutResult]) -> tuple[list[Sample], dict[str, float]]:
        """Advantages per group. Failed rollouts are left out; zero-signal groups counted (maybe dropped)."""
        algorithm = self.config.algorithm
        usable = [r for r in results if not r.failed]
        group_of = {task_id: index for index, task_id in enumerate(dict.fromkeys(r.task_id for r in results))}
        rewards = [r.reward if r.reward is not None else 0.0 for r in results]
        metrics = {
            "reward/mean": sum(rewards) / len(rewards),
            "reward/std": _std(rewards),
            "rollout/failed": float(len(results) - len(usable)),
            "rollout/truncated_fraction": sum(r.termination.truncated for r in results) / len(results),
            "rollout/generated_tokens_mean": sum(r.trajectory.generated_tokens for r in results)
            / len(results),
        }
        if not usable:
            metrics.update({"groups/zero_signal_fraction": 1.0, "groups/dropped": float(len(group_of))})
            return [], metrics
        reward_tensor = torch.tensor([float(r.reward) for r in usable])  # [S]
        group_ids = torch.tensor([group_of[r.task_id] for r in usable])  # [S]
        zero_signal = algorithms.zero_signal_samples(reward_tensor, group_ids)  # [S] bool
        advantages = algorithms.compute_advantages(
            reward_tensor, group_ids, algorithm.advantage, normalize_std=algorithm.normalize_std
        )
        groups = group_ids.unique()
        silent = [int(g) for g in groups if bool(zero_signal[group_ids == g].all())]
        metrics["groups/zero_signal_fraction"] = len(silent) / len(groups)
        metrics["groups/dropped"] = float(len(silent)) if algorithm.drop_zero_signal_groups else 0.0
        samples = [
            sample_from_result(
                result,
                index=index,
                group=int(group_ids[index]),
                advantage=float(advantages[index]),
                zero_signal=bool(zero_signal[index]),
            )
            for index, result in enumerate(usable)
        ]
        metrics["policy/advantage_abs_mean"] = float(advantages.abs().mean())
        return samples, metrics

    def learning_rate(self, step: int) -> float:
        """Linear warm-up for ``warmup_steps``, then constant, linear or cosine decay to lr * min_lr_ratio."""
        optimizer = self.config.optimizer
        if step < optimizer.warmup_steps:
            return optimizer.lr * (step + 1) / (optimizer.warmup_steps + 1)
        if optimizer.schedule == "constant":
            return optimizer.lr
        span = max(1, self.config.steps - optimizer.warmup_steps - 1)
        progress = min(1.0, (step - optimizer.warmup_steps) / span)
        if optimizer.schedule == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return optimizer.lr * (optimizer.min_lr_ratio + (1.0 - optimizer.min_lr_ratio) * factor)

    def update(self, samples: list[Sample], step: int) -> dict[str, float]:
        """The policy-gradient update on one step's samples; returns its metrics (policy/*, optim/*, ...)."""
        config, algorithm = self.config, self.config.algorithm
        temperature = self.config.rollout.temperature
        lr = self.learning_rate(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics: dict[str, float] = {"optim/lr": lr, "optim/updates": 0.0}
        sums = _Sums()
        measured = samples
        if algorithm.drop_zero_signal_groups:
            samples = [s for s in samples if not s.zero_signal]
        if not samples:  # nothing carries a signal: no optimizer step, but still check consistency
            if measured:
                self._annotate(measured, old=True, sums=sums)
            metrics.update(self._mismatch_metrics(sums))
            return metrics
        updates_per_step = algorithm.epochs * algorithm.mini_batches
        budget = config.optimizer.micro_batch_tokens
        recompute = updates_per_step > 1
        if recompute or self.reference is not None:
            self._annotate(samples, old=recompute, sums=sums)
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        grad_norms = []
        self.model.train()
        for _ in range(algorithm.epochs):
            for mini_batch in mini_batches(samples, algorithm.mini_batches, generator):
                normalizer = (
                    sum(s.loss_tokens for s in mini_batch)
                    if algorithm.loss_aggregation == "token_mean"
                    else sum(1 for s in mini_batch if s.loss_tokens)
                )
                self.optimizer.zero_grad(set_to_none=True)
                for micro in micro_batches(mini_batch, max_tokens=budget, pad_id=self.pad_id):
                    micro = micro.to(self.device)
                    logprobs, entropy = self.policy.logprobs(micro, temperature, with_entropy=True)
                    mask = micro.loss_mask
                    if recompute:
                        assert micro.old_logprobs is not None
                        old = micro.old_logprobs
                    else:
                        old = logprobs.detach()  # one update per step: pi_old is the policy right now
                        self._add_mismatch(sums, old, micro)
                    weights = None
                    if algorithm.tis_cap is not None:
                        weights = algorithms.truncated_importance_weights(
                            old, micro.rollout_logprobs, algorithm.tis_cap
                        )
                        sums.add("tis_weight", algorithms.masked_sum(weights, mask))
                        sums.add("tis_truncated", (mask & (weights >= algorithm.tis_cap)).sum())
                    result = algorithms.policy_loss(
                        logprobs,
                        old,
                        micro.advantages,
                        mask,
                        clip_low=algorithm.clip_low,
                        clip_high=algorithm.clip_high,
                        aggregation=algorithm.loss_aggregation,
                        normalizer=max(1, normalizer),
                        ref_logprobs=micro.ref_logprobs,
                        kl_coef=algorithm.kl_coef,
                        kl_estimator=algorithm.kl_estimator,
                        importance_weights=weights,
                    )
                    result.loss.backward()
                    tokens = mask.sum()
                    sums.add("loss", result.loss.detach())
                    sums.add("tokens", tokens)
                    sums.add("padded", micro.padded_tokens)
                    sums.add("real", micro.real_tokens)
                    sums.add("micro_batches", 1)
                    sums.add("entropy", algorithms.masked_sum(entropy, mask))
                    sums.add("clip_low", result.clipped_low.sum())
                    sums.add("clip_high", result.clipped_high.sum())
                    sums.add("ratio", algorithms.masked_sum(result.ratio, mask))
                    log_ratio = torch.where(mask, logprobs.detach() - old, torch.zeros_like(old))
                    sums.add("approx_kl", algorithms.masked_sum(torch.exp(log_ratio) - 1 - log_ratio, mask))
                    if result.kl is not None:
                        sums.add("kl_ref", algorithms.masked_sum(result.kl, mask))
                max_norm = config.optimizer.max_grad_norm
                norm = torch.nn.utils.clip_grad_norm_(
                    self.parameters, max_norm if max_norm > 0 else float("inf")
                )
                grad_norms.append(float(norm))
                self.optimizer.step()
                metrics["optim/updates"] += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        tokens = max(1.0, sums["tokens"])
        metrics.update(
            {
                "policy/loss": sums["loss"] / updates_per_step,
                "policy/entropy": sums["entropy"] / tokens,
                "policy/clip_fraction_low": sums["clip_low"] / tokens,
                "policy/clip_fraction_high": sums["clip_high"] / tokens,
                "policy/ratio_mean": sums["ratio"] / tokens,
                "policy/approx_kl": sums["approx_kl"] / tokens,
                "optim/grad_norm": sum(grad_norms) / len(grad_norms),
                "batch/sequences": float(len(samples)),
                "batch/loss_tokens": float(sum(s.loss_tokens for s in samples)),
                "batch/tokens": float(sum(s.length for s in samples)),
                "batch/padding_fraction": 1.0 - sums["real"] / max(1.0, sums["padded"]),
                "batch/micro_batches": sums["micro_batches"] / updates_per_step,
            }
        )
        if self.reference is not None:
            metrics["policy/kl_ref"] = sums["kl_ref"] / tokens
        metrics.update(self._mismatch_metrics(sums))
        if algorithm.tis_cap is not None:
            metrics["mismatch/tis_weight_mean"] = sums["tis_weight"] / tokens
            metrics["mismatch/tis_truncated_fraction"] = sums["tis_truncated"] / tokens
        return metrics

    @staticmethod
    def _mismatch_metrics(sums: _Sums) -> dict[str, float]:
        tokens = max(1.0, sums["mismatch_tokens"])
        return {
            "mismatch/logprob_abs_diff": sums["mismatch_abs"] / tokens,
            "mismatch/logprob_abs_diff_max": sums["mismatch_max"],
            "mismatch/kl": sums["mismatch_kl"] / tokens,
        }

    @staticmethod
    def _add_mismatch(sums: _Sums, trainer_logprobs: torch.Tensor, batch: TokenBatch) -> None:
        found = algorithms.logprob_mismatch(trainer_logprobs, batch.rollout_logprobs, batch.loss_mask)
        sums.add("mismatch_abs", found["abs_diff"])
        sums.add("mismatch_kl", found["kl"])
        sums.add("mismatch_tokens", found["tokens"])
        sums.values["mismatch_max"] = max(sums["mismatch_max"], float(found["max_abs_diff"]))

    @torch.no_grad()
    def _annotate(self, samples: list[Sample], *, old: bool, sums: _Sums) -> None:
        """Before any update: store pi_old's logprobs (and the reference's) on each sample."""
        temperature = self.config.rollout.temperature
        self.model.eval()
        for micro in micro_batches(
            samples, max_tokens=self.config.optimizer.micro_batch_tokens, pad_id=self.pad_id
        ):
            batch = micro.to(self.device)
            if old:
                logprobs, _ = self.policy.logprobs(batch, temperature)
                self._add_mismatch(sums, logprobs, batch)
                for row, sample in enumerate(micro.samples):
                    sample.old_logprobs = logprobs[row, : sample.length].cpu()
            if self.reference is not None:
                with self._reference_context():
                    reference, _ = self.reference.logprobs(batch, temperature)
                for row, sample in enumerate(micro.samples):
                    sample.ref_logprobs = reference[row, : sample.length].cpu()

    # --- checkpoints -----------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.checkpoint_dir.exists():
            return []
        found = [
            path
            for path in self.checkpoint_dir.iterdir()
            if path.name.startswith(CHECKPOINT_PREFIX) and (path / "state.json").exists()
        ]
        return sorted(found, key=lambda path: int(path.name.removeprefix(CHECKPOINT_PREFIX)))

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        return {
            name: p.detach().cpu().clone() for name, p in self.model.named_parameters() if p.requires_grad
        }

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_NNNNNN`` atomically (a killed save leaves no half checkpoint)."""
        target = self.checkpoint_dir / f"{CHECKPOINT_PREFIX}{self.step:06d}"
        staging = self.checkpoint_dir / f".staging-{self.step:06d}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        torch.save(self._trainable_state(), staging / "model.pt")
        torch.save(self.optimizer.state_dict(), staging / "optimizer.pt")
        torch.save(_rng_state(), staging / "rng.pt")
        state = {
            "step": self.step,
            "tasks_consumed": self.step * self.config.rollout.tasks_per_step,
            "eval_rewards": {str(k): v for k, v in self.eval_rewards.items()},
            "config": self.config.to_dict(),
        }
        (staging / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        for old in self.checkpoints()[: -self.config.checkpoint.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def _resume(self) -> int:
        """Load the latest checkpoint when resuming; returns the step to continue from."""
        found = self.checkpoints()
        if not found:
            return 0
        if not self.config.checkpoint.resume:
            raise ConfigError(
                f"{self.run_dir} already holds checkpoints; set checkpoint.resume=true to continue that run, "
                "or choose a new output_dir"
            )
        return self.load_checkpoint(found[-1])

    def load_checkpoint(self, path: Path) -> int:
        """Restore weights, optimizer, step, evaluations and RNG states from ``path``; returns its step."""
        state = json.loads((path / "state.json").read_text())
        weights = torch.load(path / "model.pt", map_location="cpu")
        parameters = dict(self.model.named_parameters())
        missing = [name for name, p in parameters.items() if p.requires_grad and name not in weights]
        if missing:
            raise ConfigError(
                f"checkpoint {path} does not match this model ({len(missing)} trainable weights missing, "
                f"e.g. {missing[0]!r}); was it written with another model or LoRA setting?"
            )
        with torch.no_grad():
            for name, value in weights.items():
                parameters[name].copy_(value)
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu"))
        _set_rng_state(torch.load(path / "rng.pt", map_location="cpu", weights_only=False))
        saved = state.get("config", {})
        changed = sorted(_differences(saved, self.config.to_dict()))
        if changed:
            print(f"agentboost: resuming {path} with changed settings: {', '.join(changed)}", file=sys.stderr)
        self.eval_rewards = {int(k): v for k, v in state.get("eval_rewards", {}).items()}
        self.resumed_from = int(state["step"])
        return int(state["step"])

    def _forget_future(self, step: int, *, fresh: bool) -> None:
        """Delete rollouts and evaluations made by weights we no longer have.

        Resuming at ``step``, the partial files of ``step`` itself were made by the checkpoint's
        weights and are continued; later ones are deleted. A fresh start deletes them all.
        """
        first_stale = 0 if fresh else step + 1
        for folder in ("rollouts", "evals"):
            directory = self.run_dir / folder
            if not directory.exists():
                continue
            for path in directory.glob("step_*.jsonl"):
                if int(path.stem.removeprefix("step_")) >= first_stale:
                    path.unlink()
        self.eval_rewards = {k: v for k, v in self.eval_rewards.items() if k < step}

    def save_model(self, directory: Path) -> None:
        """The trained policy in the Hugging Face format (LoRA: the adapter), with its tokenizer."""
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy

        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _differences(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            yield from _differences(old.get(key), new.get(key), f"{prefix}{key}.")
    elif old != new:
        yield prefix.rstrip(".")
