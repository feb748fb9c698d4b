"""Checkpoints a killed run resumes from: the weights that train, optimizer, RNG states and a state.json.

``checkpoints/step_NNNNNN/`` holds ``model.pt`` (trainable weights only: with LoRA, the adapters),
``optimizer.pt``, ``rng.pt`` and ``state.json`` (the step, the run's own facts, its config). A save
goes to a staging folder renamed into place, so a killed save leaves no half checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agentboost.errors import ConfigError, DamagedCheckpointError

CHECKPOINT_PREFIX = "step_"


class Checkpoints:
    """The checkpoints of one run directory."""

    def __init__(self, run_dir: Path, *, keep: int) -> None:
        self.directory = Path(run_dir) / "checkpoints"
        self.keep = keep

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.directory.exists():
            return []
        found = [
            path
            for path in self.directory.iterdir()
            if path.name.startswith(CHECKPOINT_PREFIX) and (path / "state.json").exists()
        ]
        return sorted(found, key=lambda path: int(path.name.removeprefix(CHECKPOINT_PREFIX)))

    def save(self, step: int, model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> Path:
        """Write ``step_NNNNNN`` atomically; ``state`` (JSON) must hold ``step``. Old ones beyond keep go."""
        target = self.directory / f"{CHECKPOINT_PREFIX}{step:06d}"
        staging = self.directory / f".staging-{step:06d}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        trainable = {n: _own_storage(p) for n, p in model.named_parameters() if p.requires_grad}
        torch.save(trainable, staging / "model.pt")
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        torch.save(rng_state(), staging / "rng.pt")
        (staging / "state.json").write_text(json.dumps({"step": step, **state}, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        for old in self.list()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def load(
        self, path: Path, model: Any, optimizer: torch.optim.Optimizer, *, config: dict[str, Any]
    ) -> dict[str, Any]:
        """Restore weights, optimizer and RNG states from ``path``; returns its state.json.

        Settings that differ from the checkpoint's ``config`` are named on stderr.
        """
        state = _read(path / "state.json", lambda file: json.loads(file.read_text()))
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise DamagedCheckpointError(f"{path / 'state.json'} is damaged (no step number)")
        weights = _read(path / "model.pt", lambda file: torch.load(file, map_location="cpu"))
        parameters = dict(model.named_parameters())
        missing = [name for name, p in parameters.items() if p.requires_grad and name not in weights]
        if missing:
            raise ConfigError(
                f"checkpoint {path} does not match this model ({len(missing)} trainable weights missing, "
                f"e.g. {missing[0]!r}); was it written with another model or LoRA setting?"
            )
        with torch.no_grad():
            for name, value in weights.items():
                parameters[name].copy_(value)
        optimizer.load_state_dict(
            _read(path / "optimizer.pt", lambda file: torch.load(file, map_location="cpu"))
        )
        set_rng_state(
            _read(path / "rng.pt", lambda file: torch.load(file, map_location="cpu", weights_only=False))
        )
        changed = sorted(differences(state.get("config", {}), config))
        if changed:
            print(f"agentboost: resuming {path} with changed settings: {', '.join(changed)}", file=sys.stderr)
        return state

    def latest_for_resume(self, *, resume: bool, run_dir: Path) -> Path | None:
        """The checkpoint to continue from, None for a fresh run; refuses to overwrite when not resuming."""
        found = self.list()
        if not found:
            return None
        if not resume:
            raise ConfigError(
                f"{run_dir} already holds checkpoints; set checkpoint.resume=true to continue that run, "
                "or choose a new output_dir"
            )
        return found[-1]

    def load_latest(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        *,
        config: dict[str, Any],
        resume: bool,
        run_dir: Path,
    ) -> tuple[Path, dict[str, Any]] | None:
        """Resume from the newest intact checkpoint, saying on stderr whether the run resumes or starts fresh.

        A damaged checkpoint (a truncated ``model.pt``, a garbled ``state.json``) is named and the one
        before it is used; when none is intact, a ConfigError names them and the way out.
        """
        if self.latest_for_resume(resume=resume, run_dir=run_dir) is None:
            print(f"agentboost: starting a fresh run in {run_dir}", file=sys.stderr)
            return None
        damaged: list[str] = []
        for path in reversed(self.list()):
            try:
                state = self.load(path, model, optimizer, config=config)
            except DamagedCheckpointError as error:
                damaged.append(str(error))
                print(f"agentboost: {error}; trying the checkpoint before it", file=sys.stderr)
                continue
            print(f"agentboost: resuming {run_dir} from {path.name} (step {state['step']})", file=sys.stderr)
            return path, state
        raise ConfigError(
            f"no intact checkpoint in {self.directory} ({'; '.join(damaged)}); move the damaged ones "
            "away to resume from an older one, or choose a new output_dir to start fresh"
        )


def _read(path: Path, read: Any) -> Any:
    """``read(path)``; any failure to read the file becomes a :class:`DamagedCheckpointError` naming it."""
    try:
        return read(path)
    except Exception as error:  # torch.load and json raise many types for a damaged file
        raise DamagedCheckpointError(
            f"checkpoint file {path} is damaged ({type(error).__name__}: {error})"
        ) from error


def _own_storage(parameter: torch.Tensor) -> torch.Tensor:
    """The parameter's values in a tensor that owns exactly its storage, copied only where needed.

    ``torch.save`` writes whole storages: a CPU parameter that owns its storage is written as it is
    (no model-sized copy in memory while checkpointing); a view into a larger one, or a GPU tensor,
    is copied first.
    """
    tensor = parameter.detach().cpu()  # a copy for GPU tensors, the parameter itself on CPU
    exact = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    return tensor if exact and tensor.is_contiguous() and tensor.storage_offset() == 0 else tensor.clone()


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy

        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def differences(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            yield from differences(old.get(key), new.get(key), f"{prefix}{key}.")
    elif old != new:
        yield prefix.rstrip(".")
