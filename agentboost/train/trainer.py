"""The local trainer: collect group rollouts with the current weights, compute advantages, update, repeat.

One step:

0. **Sync.** When the weights changed since the engine last loaded them (after every update, and at
   the start), ``engine.sync_weights()`` makes it serve them: the embedded
   :class:`~agentboost.engines.embedded.engine.LocalEngine` holds the very model object being trained and only
   drops its stale cached prefixes; vLLM servers get the weights pushed. A refused push stops the run
   with one :class:`~agentboost.engines.remote.weight_sync.WeightSyncError` naming its cause. The engine meets
   :class:`~agentboost.engines.base.TrainableEngine`, checked when it is built.
1. **Collect.** ``tasks_per_step`` training tasks, ``group_size`` rollouts each, through the rollout
   runner as the step's :class:`~agentboost.rollout.spec.RunSpec` says (sampling and limits resolved
   there, :func:`~agentboost.train.collect.training_spec`); collection and update never overlap (the
   runner returns only when every rollout is done). Results go to ``rollouts/step_NNNNNN.jsonl``, whose
   header is the spec's identity: a killed run resumes the file, with the settings it began with.
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
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentboost import interrupts
from agentboost.engines.base import TrainableEngine, check_engine
from agentboost.envs.base import Environment, RolloutResult
from agentboost.errors import ConfigError
from agentboost.memory import peak_resident_bytes, resident_bytes, trim_heap
from agentboost.rollout.spec import RunSpec
from agentboost.train import algorithms, schedule
from agentboost.train.async_collect import AsyncCollector, VersionedEngine, WeightGate
from agentboost.train.batching import Sample, TokenBatch, micro_batches, mini_batches, sample_from_result
from agentboost.train.buffers import FlatGradients, compact_optimizer_state
from agentboost.train.checkpoint import Checkpoints
from agentboost.train.collect import (
    collect_rollouts,
    result_metrics,
    step_results,
    training_spec,
    write_results,
)
from agentboost.train.config import TrainConfig
from agentboost.train.distributed import Ranks, forget_partials
from agentboost.train.logging import step_line
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


@dataclass
class TrainSummary:
    """What a finished run reports."""

    steps: int
    """Steps completed (fewer than configured when time_limit_minutes stopped the run)."""
    output_dir: Path
    eval_rewards: dict[int, float]
    """step -> held-out mean reward."""
    resumed_from: int | None


class _Sums:
    """Running sums of metrics over micro-batches, divided at the end."""

    def __init__(self) -> None:
        self.values: dict[str, float] = defaultdict(float)
        self.log_ratios: list[torch.Tensor] = []  # [n] per micro-batch: log pi_trainer - log pi_rollout

    def add(self, name: str, value: float | torch.Tensor) -> None:
        self.values[name] += float(value)

    def __getitem__(self, name: str) -> float:
        return self.values.get(name, 0.0)


class Trainer(TrainingLoop):
    """Runs :class:`TrainConfig`. Pass ``environment`` to train on an object instead of a reference."""

    def __init__(self, config: TrainConfig, *, environment: Environment | None = None) -> None:
        self.config = config.validate()
        self.run_dir = Path(config.output_dir)
        self.environment = environment if environment is not None else self._make_environment()
        # what the rollouts' RunSpec records as the environment: the config's reference, or the name
        # of the object passed in
        self._environment_setting = (
            (config.environment.name, config.environment.kwargs)
            if environment is None
            else (self.environment.name, {})
        )
        if config.model.template is not None:
            self.environment.template = config.model.template
        if config.threads:
            torch.set_num_threads(config.threads)
        self.ranks = Ranks.join(resolve_device(config.model))  # data-parallel ranks (distributed.py)
        self.device = self.ranks.device(resolve_device(config.model))
        if self.ranks.distributed and config.rollout.vllm_url:
            raise ConfigError(
                "rollout.vllm_url with several training ranks: each rank would push its weights to the same "
                "servers; train on one rank with vLLM servers, or let each rank use its embedded engine"
            )
        if self.ranks.distributed and config.rollout.is_async:
            raise ConfigError(
                "asynchronous training (rollout.max_staleness > 0 or rollout.asynchronous) with several "
                "training ranks is not supported yet: train asynchronously on one rank"
            )
        seed_everything(config.seed)
        self.precision = resolve_precision(config.model, config.lora, self.device)
        self.tokenizer, self.model = load_policy(config.model, config.lora, self.device, self.precision)
        self.policy = PolicyModel(self.model, self.precision)
        self.policy.check_head(self.device)
        self.reference = self._make_reference()
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.parameters, config.optimizer)
        self.gradients = FlatGradients(self.parameters)  # one buffer, outside the heap (buffers.py)
        self.checkpointer = Checkpoints(self.run_dir, keep=config.checkpoint.keep)
        self.engine: TrainableEngine = check_engine(self._make_engine(), TrainableEngine)
        self._weights_changed = True  # the engine may hold other weights than the trainer's start
        # every collection's event loop (the engine's connections), whole whenever Ctrl-C comes
        self._rollout_loop: Any = asyncio.Runner(loop_factory=interrupts.new_event_loop)
        self._async: AsyncCollector | None = None
        if config.rollout.is_async:  # rollouts run ahead of the updates, in a loop of their own thread
            self._async = AsyncCollector(self)
            self._rollout_loop = self._async.loop
        self._closed = False
        self.pad_id = pad_token_id(self.tokenizer)
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
        self.run_spec(step=0)  # a setting the rollouts cannot run with fails here, not in step 0
        self.step = 0
        self.resumed_from: int | None = None
        self.eval_rewards: dict[int, float] = {}

    # --- set-up ----------------------------------------------------------------------------------

    def _make_engine(self) -> Any:
        """vLLM servers when ``rollout.vllm_url`` names them (new weights are pushed to them), else the
        embedded engine over the model being trained."""
        config = self.config
        if config.rollout.vllm_url:
            from agentboost.engines.remote.weight_sync import SyncedVLLMEngine

            return SyncedVLLMEngine(config.rollout.vllm_url, self.model, self.run_dir / "vllm-weights")
        from agentboost.engines.embedded.engine import LocalEngine

        budget = config.rollout.engine_memory_gib
        return LocalEngine(
            self.model,
            max_batch_size=max(1, config.rollout.concurrency),
            # PyTorch's own linears, as the update's passes: oneDNN's (packed_linear.py) made the
            # math demonstration's rollouts 1.28x faster on an AMD CPU, but raised its peak, reached
            # during rollouts, from 3.73 to 3.95-4.00 GiB and doubled the tail of the rollout/trainer
            # logprob mismatch (7.5e-5, from 3.3e-5; docs/training.md)
            onednn_linears=False,
            packed_weights=False,
            precision=self.precision,  # the trainer's compute dtype: bfloat16 autocast on CUDA
            cuda_graphs=config.rollout.cuda_graphs,
            **({} if budget is None else {"memory_budget_bytes": int(budget * 2**30)}),
        )

    def _make_environment(self) -> Environment:
        from agentboost.envs.registry import make_environment

        return make_environment(self.config.environment.name, self.config.environment.kwargs)

    def _make_reference(self) -> PolicyModel | None:
        """The frozen policy of the KL penalty: adapters disabled with LoRA, else a frozen copy."""
        if self.config.algorithm.kl_coef == 0:
            return None
        if self.config.lora.enabled:
            return self.policy  # evaluated under disable_adapter(), see _reference_context
        frozen = copy.deepcopy(self.model).eval()
        for parameter in frozen.parameters():
            parameter.requires_grad_(False)
        return PolicyModel(frozen, self.precision)

    def _reference_context(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.lora.enabled:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    # --- data ------------------------------------------------------------------------------------

    def tasks_for_step(self, step: int) -> list[Any]:
        """The step's tasks: a new permutation of the training pool each epoch (see :mod:`.schedule`)."""
        return schedule.items_for_step(
            self.train_tasks, step, self.config.rollout.tasks_per_step, self.config.seed
        )

    def run_spec(self, *, step: int, evaluation: bool = False, tasks: int | None = None) -> RunSpec:
        """The RunSpec of step ``step``'s rollouts (``evaluation``: of its held-out evaluation)."""
        config = self.config
        name, kwargs = self._environment_setting
        if evaluation:
            return training_spec(
                name,
                environment_kwargs=kwargs,
                model=config.model,
                rollout=config.rollout,
                split="test",
                tasks=tasks or config.eval.tasks,
                samples=config.eval.samples,
                seed=config.seed + 7_777_777,  # the same seeds at every evaluation: paired comparisons
                eval_config=config.eval,
            )
        return training_spec(
            name,
            environment_kwargs=kwargs,
            model=config.model,
            rollout=config.rollout,
            split="train",
            tasks=config.rollout.tasks_per_step,
            samples=config.rollout.group_size,
            seed=config.seed * 1_000_003 + step,
        )

    def sync_weights(self) -> dict[str, float]:
        """The engine loads the weights being trained, once after they changed: before a step's rollouts
        (and a held-out evaluation), never inside them. A refused sync stops the run here with one
        :class:`~agentboost.engines.remote.weight_sync.WeightSyncError` naming its cause."""
        from agentboost.engines.remote.weight_sync import WeightSyncError

        if not self._weights_changed:
            return {"time/weight_sync_s": 0.0}
        started = time.perf_counter()
        try:
            self.engine.sync_weights()
        except WeightSyncError as error:
            raise WeightSyncError(
                f"step {self.step}: the rollout engine could not load the trainer's weights, so the step "
                f"did not start: {error} The run can resume from its last checkpoint once it can.",
                url=error.url,
                status=error.status,
                attempts=error.attempts,
            ) from error
        self._weights_changed = False
        return {"time/weight_sync_s": time.perf_counter() - started}

    def _collect(
        self,
        path: Path,
        tasks: Sequence[Any],
        spec: RunSpec,
        on_result: Callable[[RolloutResult], None],
        engine: Any = None,
    ) -> list[RolloutResult]:
        """Run ``tasks x spec.samples`` rollouts on the current weights; results in job order.
        ``engine``: what the rollouts generate through (default: the trainer's engine)."""
        self.sync_weights()  # no-op when the step already synced
        self.model.eval()

        def collect(share: Sequence[Any], out: Path) -> list[RolloutResult]:
            return collect_rollouts(
                self.environment,
                self.engine if engine is None else engine,
                self.tokenizer,
                spec,
                share,
                out,
                on_result=on_result,
                run=self._rollout_loop.run,
                precision=self.precision,
            )

        if not self.ranks.distributed:
            return collect(tasks, path)
        return self.ranks.collect(  # each rank its share of the groups; all of them back on every rank
            collect,
            tasks,
            path,
            samples=spec.samples,
            write=lambda results, out: write_results(
                self.environment, spec, tasks, results, out, precision=self.precision
            ),
        )

    # --- the loop (TrainingLoop.train runs it) ---------------------------------------------------------

    @property
    def total_steps(self) -> int:
        return self.config.steps

    @property
    def time_limit_s(self) -> float:
        minutes = self.config.time_limit_minutes
        return minutes * 60 if minutes else math.inf

    def summary(self) -> TrainSummary:
        return TrainSummary(self.step, self.run_dir, dict(self.eval_rewards), self.resumed_from)

    def close(self) -> None:
        """Close the engine in the event loop its rollouts ran in (its connections live there), then
        that loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._async is not None:
                self._async.stop_collections()
            self._rollout_loop.run(self.engine.aclose())
        finally:
            if self._async is not None:
                self._async.close()
            self._rollout_loop.close()
            self.ranks.close()

    def postfix(self, metrics: dict[str, float]) -> str:
        parts = [step_line(metrics)]
        if self.eval_rewards:
            last = max(self.eval_rewards)
            parts.append(f"eval@{last} {self.eval_rewards[last]:.3f}")
        parts.append(f"mismatch {metrics.get('mismatch/logprob_abs_diff', float('nan')):.1e}")
        return " | ".join(parts)

    def evaluate(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """Held-out mean reward of the current weights on ``split="test"``."""
        config = self.config
        tasks = list(
            self.environment.tasks(config.eval.tasks, seed=config.environment.task_seed, split="test")
        )
        started = time.perf_counter()
        results = self._collect(
            self.run_dir / "evals" / f"step_{step:06d}.jsonl",
            tasks,
            self.run_spec(step=step, evaluation=True, tasks=len(tasks)),
            self._phase(bar, f"eval @{step}", len(tasks) * config.eval.samples),
        )
        metrics = {f"eval/{name}": value for name, value in result_metrics(results).items()}
        self.eval_rewards[step] = metrics["eval/reward_mean"]
        return {**metrics, "eval/seconds": time.perf_counter() - started}

    def collect(self, step: int, *, bar: Any = None) -> list[RolloutResult]:
        """The step's group rollouts, sampled by the engine from the current weights; their tokens
        tagged with the policy version ``step`` (as the asynchronous collector tags them)."""
        return self._collect(
            self.run_dir / "rollouts" / f"step_{step:06d}.jsonl",
            self.tasks_for_step(step),
            self.run_spec(step=step),
            self._phase(bar, f"rollouts @{step}"),
            engine=VersionedEngine(self.engine, WeightGate(), lambda: step),
        )

    def train_step(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """Sync the weights, collect, then update. Returns the step's metrics. Asynchronous
        (``rollout.max_staleness``): the collector's step (agentboost/train/async_collect.py)."""
        if self._async is not None:
            return self._async.train_step(step, bar=bar)
        started = time.perf_counter()
        synced = self.sync_weights()  # the step's one weight sync, before any of its rollouts
        cache_mark = self.engine.prefix_cache_stats()
        results = self.collect(step, bar=bar)
        rollout_seconds = time.perf_counter() - started
        peak_after_rollouts = peak_resident_bytes()
        if bar is not None:
            bar.set_description_str(f"update @{step}", refresh=True)
        samples, metrics = self.make_samples(results)
        update_started = time.perf_counter()
        metrics.update(self.update(samples, step))
        generated = sum(r.trajectory.generated_tokens for r in results)
        metrics.update(
            {
                **synced,
                "time/rollout_s": rollout_seconds,
                "time/update_s": time.perf_counter() - update_started,
                "time/step_s": time.perf_counter() - started,
                "rollout/tokens_per_second": generated / rollout_seconds if rollout_seconds else 0.0,
                "rollout/prefix_cache_hit_rate": self.engine.prefix_cache_stats().hit_rate_since(cache_mark),
                # the process's peak resident memory so far (VmHWM): where it grows tells which phase
                # needs the memory, rollouts (engine KV) or the update (activations, optimizer state)
                "memory/peak_after_rollouts_gib": peak_after_rollouts / 2**30,
                "memory/peak_gib": peak_resident_bytes() / 2**30,
                "memory/resident_gib": resident_bytes() / 2**30,
            }
        )
        if bar is not None:
            bar.set_description_str("train", refresh=True)
        return metrics

    def make_samples(
        self, results: Sequence[RolloutResult], *, groups: Sequence[Any] | None = None
    ) -> tuple[list[Sample], dict[str, float]]:
        """Advantages per group. Unscored rollouts are masked (see :func:`step_results`); zero-signal
        groups counted (maybe dropped). ``groups``: each result's group key (default: its task id; the
        asynchronous collector's may hold one task twice, from two steps)."""
        algorithm = self.config.algorithm
        usable, metrics = step_results(results, max_failed_fraction=self.config.rollout.max_failed_fraction)
        keys = [r.task_id for r in results] if groups is None else list(groups)
        key_of = {id(result): key for result, key in zip(results, keys, strict=True)}
        group_of = {key: index for index, key in enumerate(dict.fromkeys(keys))}
        if not usable:
            metrics.update({"groups/zero_signal_fraction": 1.0, "groups/dropped": float(len(group_of))})
            return [], metrics
        reward_tensor = torch.tensor([float(r.reward) for r in usable])  # [S]
        group_ids = torch.tensor([group_of[key_of[id(r)]] for r in usable])  # [S]
        zero_signal = algorithms.zero_signal_samples(reward_tensor, group_ids)  # [S] bool
        advantages = algorithms.compute_advantages(
            reward_tensor, group_ids, algorithm.advantage, normalize_std=algorithm.normalize_std
        )
        groups = group_ids.unique()
        silent = [int(g) for g in groups if bool(zero_signal[group_ids == g].all())]
        metrics["groups/zero_signal_fraction"] = len(silent) / len(groups)
        metrics["groups/dropped"] = float(len(silent)) if algorithm.drop_zero_signal_groups else 0.0
        # a rollout with several training rows (a gateway session that forked) gives each row the
        # rollout's advantage: the reward is the rollout's, so every row it produced shares the credit
        samples: list[Sample] = []
        for position, result in enumerate(usable):
            for row in result.trajectory.training_rows:
                samples.append(
                    sample_from_result(
                        result,
                        index=len(samples),
                        group=int(group_ids[position]),
                        advantage=float(advantages[position]),
                        zero_signal=bool(zero_signal[position]),
                        row=row,
                    )
                )
        metrics["policy/advantage_abs_mean"] = float(advantages.abs().mean())
        return samples, metrics

    def learning_rate(self, step: int) -> float:
        """The step's learning rate (see :func:`agentboost.train.schedule.learning_rate`)."""
        return schedule.learning_rate(self.config.optimizer, step, self.config.steps)

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
            self._add_other_ranks(sums)
            metrics.update(self._mismatch_metrics(sums))
            return metrics
        updates_per_step = algorithm.epochs * algorithm.mini_batches
        budget = config.optimizer.micro_batch_tokens
        recompute = updates_per_step > 1
        correction = algorithm.correction(exact=self.precision.exact, stale=config.rollout.max_staleness > 0)
        if recompute or self.reference is not None:
            self._annotate(samples, old=recompute, sums=sums)
        # the rollouts' cached prefixes go stale with the first optimizer step: free them before the
        # update's activations and gradients, not at the next prefill
        self.engine.release_memory()
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
                self.gradients.zero()
                for micro in micro_batches(self._mine(mini_batch), max_tokens=budget, pad_id=self.pad_id):
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
                    if correction.correction != "none":  # the engine/trainer gap (algorithms.py)
                        corrected = algorithms.off_policy_weights(
                            old,
                            micro.rollout_logprobs,
                            mask,
                            correction.correction,
                            cap=correction.cap,
                            low=correction.low,
                            high=correction.high,
                        )
                        weights = corrected.weights
                        sums.add("is_weight", algorithms.masked_sum(weights, mask))
                        sums.add("is_masked", corrected.masked.sum())
                        sums.add("is_truncated", corrected.truncated.sum())
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
                    # the micro-batch's freed activations leave holes in the heap that the next one,
                    # of another shape, may not fit: hand their pages back (0.3 GiB off the math
                    # demonstration's peak, no slower; docs/training.md)
                    trim_heap()
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
                self.ranks.reduce_gradients(self.gradients)  # summed over the ranks' samples
                self.gradients.drop_untouched()
                max_norm = config.optimizer.max_grad_norm
                norm = torch.nn.utils.clip_grad_norm_(
                    self.parameters, max_norm if max_norm > 0 else float("inf")
                )
                grad_norms.append(float(norm))
                self.optimizer.step()
                compact_optimizer_state(self.optimizer)  # after the first step: AdamW's moments too
                self._weights_changed = True  # the engine syncs before the next rollouts
                metrics["optim/updates"] += 1
        self.gradients.release()
        self.model.eval()
        trim_heap()  # the activations' pages go back to the system before the next rollouts
        self._add_other_ranks(sums)
        tokens = max(1.0, sums["tokens"])
        weighted = correction.correction != "none"
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
        metrics.update(
            {
                "mismatch/weight_mean": sums["is_weight"] / tokens if weighted else 1.0,
                "mismatch/masked_fraction": sums["is_masked"] / tokens,
                "mismatch/truncated_fraction": sums["is_truncated"] / tokens,
            }
        )
        if correction.correction == "tis":  # the names of the older tis_cap setting
            metrics["mismatch/tis_weight_mean"] = metrics["mismatch/weight_mean"]
            metrics["mismatch/tis_truncated_fraction"] = metrics["mismatch/truncated_fraction"]
        return metrics

    @staticmethod
    def _mismatch_metrics(sums: _Sums) -> dict[str, float]:
        """Engine vs trainer on the step's generated tokens: |diff|, KL and the ratio's quantiles."""
        tokens = max(1.0, sums["mismatch_tokens"])
        return {
            "mismatch/logprob_abs_diff": sums["mismatch_abs"] / tokens,
            "mismatch/logprob_abs_diff_max": sums["mismatch_max"],
            "mismatch/kl": sums["mismatch_kl"] / tokens,
            **algorithms.ratio_quantiles(sums.log_ratios),
        }

    @staticmethod
    def _add_mismatch(sums: _Sums, trainer_logprobs: torch.Tensor, batch: TokenBatch) -> None:
        found = algorithms.logprob_mismatch(trainer_logprobs, batch.rollout_logprobs, batch.loss_mask)
        sums.add("mismatch_abs", found["abs_diff"])
        sums.add("mismatch_kl", found["kl"])
        sums.add("mismatch_tokens", found["tokens"])
        sums.values["mismatch_max"] = max(sums["mismatch_max"], float(found["max_abs_diff"]))
        sums.log_ratios.append(found["log_ratios"].cpu())

    def _mine(self, samples: list[Sample]) -> list[Sample]:
        """The samples this rank's forward and backward passes take: those of the groups it collected
        (all of them in one process)."""
        if not self.ranks.distributed:
            return samples
        groups = self.config.rollout.tasks_per_step
        return [s for s in samples if self.ranks.owns(s.group, groups)]

    def _add_other_ranks(self, sums: _Sums) -> None:
        """The update's metric sums over every rank's samples (a no-op in one process)."""
        if self.ranks.distributed:
            sums.values = defaultdict(float, self.ranks.combine(sums.values, maxima=("mismatch_max",)))
            sums.log_ratios = [ratios for part in self.ranks.gather(sums.log_ratios) for ratios in part]

    @torch.no_grad()
    def _annotate(self, samples: list[Sample], *, old: bool, sums: _Sums) -> None:
        """Before any update: store pi_old's logprobs (and the reference's) on each sample."""
        temperature = self.config.rollout.temperature
        self.model.eval()
        for micro in micro_batches(
            self._mine(samples), max_tokens=self.config.optimizer.micro_batch_tokens, pad_id=self.pad_id
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

    # --- checkpoints (TrainingLoop saves and loads them) ----------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        return {"tasks_consumed": self.step * self.config.rollout.tasks_per_step}

    def resumed_at(self, step: int) -> None:
        self._forget_future(step, fresh=self.resumed_from is None)

    def _forget_future(self, step: int, *, fresh: bool) -> None:
        """Delete rollouts and evaluations made by weights we no longer have.

        Resuming at ``step``, the partial files of ``step`` itself were made by the checkpoint's
        weights and are continued; later ones are deleted. Asynchronous: the rollout files of ``step``
        and later (collected ahead) keep every rollout whose tokens all came from the checkpoint's
        version or older ones, weights the resumed run has had too, and lose those with a token of a
        later version, which are collected again. A fresh start deletes them all.
        """
        from agentboost.rollout.results import drop_results

        first_stale = 0 if fresh else step + 1
        ahead = self._async is not None and not fresh
        lost = 0

        def after_checkpoint(result: RolloutResult) -> bool:
            return max(result.trajectory.weight_versions, default=step) > step

        for folder in ("rollouts", "evals"):
            directory = self.run_dir / folder
            if not directory.exists() or not self.ranks.writes:
                continue
            for path in directory.glob("step_*.jsonl"):
                origin = int(path.stem.removeprefix("step_"))
                if ahead and folder == "rollouts" and origin >= step:
                    lost += drop_results(path, after_checkpoint)
                elif origin >= first_stale:
                    path.unlink()
            forget_partials(directory, first_stale)
        if ahead:
            print(
                f"agentboost: async resume at step {step}: the rollouts collected ahead on the checkpoint's "
                f"weights or older are kept; {lost} with tokens of later weights are collected again",
                file=sys.stderr,
            )
        self.ranks.barrier()  # nothing is collected before the stale files are gone
        self.eval_rewards = {k: v for k, v in self.eval_rewards.items() if k < step}

    def save_model(self, directory: Path) -> None:
        """The trained policy in the Hugging Face format (LoRA: the adapter), with its tokenizer."""
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
