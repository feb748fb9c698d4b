"""Data-parallel training over ``torch.distributed``: N ranks, one model copy and one engine each.

Started by ``torchrun --nproc-per-node N -m agentboost.cli train CONFIG`` (or ``agentboost train
CONFIG --nproc N``, which runs that command). What a step does across the ranks:

1. **Collect.** The step's tasks are cut into N contiguous shares, one per rank; each rank runs its
   share's rollouts (every sample of a task: a GRPO group never spans two ranks) with its own engine,
   into its own partial file (``rollouts/step_NNNNNN.ranks/rank-R-of-N.jsonl``, resumed after a kill).
   The shares are then gathered, so every rank holds the step's results in job order, as one process
   would; rank 0 writes them as the step's results file and the partial files go.
2. **Advantages and metrics** are computed by every rank on the whole step: the same numbers everywhere.
3. **Update.** Each mini-batch is drawn from the whole step (the same shuffle on every rank), so the
   loss normaliser (the token-mean denominator) is counted over all ranks' samples; each rank runs the
   forward and backward of the samples of its own groups, then the gradients are summed across ranks
   (:meth:`Ranks.reduce_gradients`: one ``all_reduce`` per gradient buffer; ``PolicyModel`` calls the
   decoder and head directly, so DDP's forward hooks would never fire) before clipping and the
   optimizer step, which is then the same on every rank.

Rank 0 alone writes checkpoints, metrics, results files and logs; every rank loads the same checkpoint
when a run resumes. Every ``AGENTBOOST_CHECK_RANKS_EVERY`` steps (default 10; 0: never) the ranks
compare a checksum of their weights and stop with :class:`~agentboost.errors.RanksDivergedError` if
they differ. Backends: gloo on CPU, NCCL on CUDA (each rank on device ``LOCAL_RANK``).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentboost.errors import ConfigError, RanksDivergedError
from agentboost.train.logging import MetricsLogger

T = TypeVar("T")

CHECK_EVERY_VARIABLE = "AGENTBOOST_CHECK_RANKS_EVERY"
"""Compare the ranks' weights every this many steps (0: never)."""
DEFAULT_CHECK_EVERY = 10


def _dist() -> Any:
    import torch.distributed as dist

    return dist


@dataclass
class Ranks:
    """This process's place among the training ranks; one process alone is ``Ranks()`` (every method a
    no-op, :attr:`writes` true)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    check_every: int = 0
    """Compare the ranks' weights after every this many steps (0: never)."""
    started_group: bool = False
    """This object started the process group (and ends it in :meth:`close`)."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def writes(self) -> bool:
        """Whether this rank writes the run's files: checkpoints, metrics, results, logs."""
        return self.rank == 0

    @classmethod
    def join(cls, device: torch.device) -> Ranks:
        """The ranks torchrun started (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` in the environment) or a
        process group already started by the caller; one process alone otherwise. Starts the group on
        gloo for CPU, NCCL for CUDA."""
        dist = _dist()
        started = False
        if not dist.is_available():
            return cls()
        if not dist.is_initialized():
            if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
                return cls()
            if device.type == "cuda":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
            started = True
        world_size = dist.get_world_size()
        if world_size <= 1:
            return cls(started_group=started)
        check = os.environ.get(CHECK_EVERY_VARIABLE, str(DEFAULT_CHECK_EVERY))
        try:
            check_every = int(check)
        except ValueError:
            raise ConfigError(f"{CHECK_EVERY_VARIABLE}={check!r} is not a whole number of steps") from None
        return cls(
            rank=dist.get_rank(),
            world_size=world_size,
            local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())),
            check_every=max(0, check_every),
            started_group=started,
        )

    def device(self, device: torch.device) -> torch.device:
        """The rank's own device: ``cuda:LOCAL_RANK`` for CUDA runs, ``device`` unchanged otherwise."""
        if self.distributed and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device

    def close(self) -> None:
        """End the process group if :meth:`join` started it."""
        if self.started_group:
            dist = _dist()
            if dist.is_initialized():
                dist.destroy_process_group()
            self.started_group = False

    # --- who does what -------------------------------------------------------------------------------

    def share(self, count: int, rank: int | None = None) -> range:
        """The indices of ``count`` items (tasks, groups) that ``rank`` (default: this one) takes: a
        contiguous block, sizes differing by at most one."""
        rank = self.rank if rank is None else rank
        return range(count * rank // self.world_size, count * (rank + 1) // self.world_size)

    def owns(self, index: int, count: int) -> bool:
        """Whether item ``index`` of ``count`` is this rank's (see :meth:`share`)."""
        return index in self.share(count)

    # --- collectives (no-ops for one process) ---------------------------------------------------------

    def barrier(self) -> None:
        if self.distributed:
            _dist().barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any (e.g. a time limit reached): ranks that must
        take the same branch agree here."""
        if not self.distributed:
            return flag
        return any(self.gather(flag))

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        _dist().all_gather_object(gathered, value)
        return gathered

    def reduce_gradients(self, gradients: Any) -> None:
        """Sum a :class:`~agentboost.train.buffers.FlatGradients` across ranks: each buffer all-reduced,
        and a parameter counts as reached by a backward when any rank's backward reached it."""
        if self.distributed:
            gradients.all_reduce(_dist())

    def combine(self, values: Mapping[str, float], *, maxima: Sequence[str] = ()) -> dict[str, float]:
        """Metric sums from every rank, added up (the names in ``maxima``: their maximum)."""
        if not self.distributed:
            return dict(values)
        combined: dict[str, float] = {}
        for part in self.gather(dict(values)):
            for name, value in part.items():
                if name in maxima:
                    combined[name] = max(combined.get(name, value), value)
                else:
                    combined[name] = combined.get(name, 0.0) + value
        return combined

    def check_weights(self, model: torch.nn.Module, step: int) -> None:
        """Every :attr:`check_every` steps: stop the run when the ranks' weights differ (a float64 sum of
        the trainable weights and of their squares, compared exactly)."""
        if not self.distributed or not self.check_every or step % self.check_every:
            return
        with torch.no_grad():
            trainable = [p.detach().double() for p in model.parameters() if p.requires_grad]
            checksum = (
                float(sum(p.sum() for p in trainable)),
                float(sum((p * p).sum() for p in trainable)),
            )
        sums = self.gather(checksum)
        if len(set(sums)) > 1:
            raise RanksDivergedError(
                f"after step {step} the ranks' weights differ (checksums {sums}): gradients were not "
                "reduced alike; resume from the last checkpoint, and report this as a bug"
            )

    # --- rollouts -------------------------------------------------------------------------------------

    def collect(
        self,
        collect: Callable[[Sequence[Any], Path], list[Any]],
        tasks: Sequence[Any],
        path: Path,
        *,
        samples: int,
        write: Callable[[list[Any], Path], None],
    ) -> list[Any]:
        """The rollouts of ``tasks`` (``samples`` each) split over the ranks; every rank gets all of them,
        in job order. ``collect(share, partial_path)`` runs one share; ``write(results, path)`` writes
        the step's results file (rank 0 only, once every share is in).

        A ``path`` that already holds every rollout (a step whose collection finished before a kill)
        is read, not collected again."""
        planned = [(task.id, sample) for task in tasks for sample in range(samples)]
        if _holds(path, planned):
            return collect(tasks, path)  # resumes a finished file: runs and writes nothing
        share = self.share(len(tasks))
        partial = path.with_suffix(".ranks") / f"rank-{self.rank}-of-{self.world_size}.jsonl"
        mine = collect(tasks[share.start : share.stop], partial) if share else []
        results = [result for part in self.gather(mine) for result in part]
        if self.writes:
            write(results, path)
        self.barrier()  # the step's file is whole before any partial file goes
        if share:
            partial.unlink(missing_ok=True)
        self.barrier()
        if self.writes:
            shutil.rmtree(path.with_suffix(".ranks"), ignore_errors=True)
        return results


def _holds(path: Path, planned: Sequence[tuple[str, int]]) -> bool:
    """Whether the results file ``path`` exists and holds a finished rollout of every planned pair."""
    if not path.exists():
        return False
    from agentboost.rollout.results import read_results

    done = {(r.task_id, r.sample) for r in read_results(path) if not r.failed}
    return done.issuperset(planned)


def forget_partials(directory: Path, first_stale: int) -> None:
    """Remove the partial rollout files (``step_NNNNNN.ranks``) of steps ``first_stale`` and later."""
    for folder in directory.glob("step_*.ranks"):
        if int(folder.stem.removeprefix("step_")) >= first_stale:
            shutil.rmtree(folder, ignore_errors=True)


def say(ranks: Ranks, message: str) -> None:
    """``agentboost: message`` on stderr, from rank 0 only."""
    if ranks.writes:
        print(f"agentboost: {message}", file=sys.stderr)


class SilentLogger(MetricsLogger):
    """The metrics logger of a rank other than 0: it takes every record and writes nothing."""

    def __init__(self) -> None:  # no files, no TensorBoard writer, no wandb run
        pass

    def log(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        pass

    def plot(self) -> Path | None:
        return None

    def close(self) -> None:
        pass
