"""A dry run of veRL's trainer configuration: compose it as ``verl.trainer.main_ppo`` does, then check it.

    python -m agentboost.integrations.verl.config algorithm.adv_estimator=grpo data.train_files=... ...

takes the same Hydra overrides as ``python -m verl.trainer.main_ppo`` and needs no GPU, Ray or model
weights (unless a critic is configured: veRL then reads the model's config). ``DRY_RUN=1`` in the example
launch scripts runs it instead of training. It fails on:

* a misspelt key: Hydra composes veRL's ``ppo_trainer.yaml`` in struct mode, so overriding a key that does
  not exist is refused (``+key=value`` adds one on purpose; keys added under the rollout, actor, critic and
  algorithm sections are still refused by veRL's dataclasses below);
* what ``main_ppo`` itself rejects before starting Ray (``verl.utils.config.validate_config``: batch sizes,
  micro batch sizes, ...), unresolvable interpolations, and values veRL's rollout and algorithm dataclasses
  refuse, as veRL's workers convert them;
* an unknown ``algorithm.adv_estimator``;
* an agent-loop config that cannot be read, does not register ``rollout.agent.default_agent_loop``, or
  names a class that does not import;
* local data files that do not exist.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from agentboost.errors import ConfigError


def verl_config_dir() -> str:
    """veRL's trainer config directory (``verl/trainer/config``), where ``ppo_trainer.yaml`` lives."""
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def compose_trainer_config(overrides: Sequence[str], config_name: str = "ppo_trainer") -> Any:
    """veRL's trainer config with ``overrides`` applied, composed by Hydra as ``main_ppo`` composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
            return compose(config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(f"veRL's trainer config does not compose: {error}") from error


def check_trainer_config(config: Any) -> None:
    """Raise ConfigError if main_ppo or veRL's workers would refuse ``config`` (see the module docstring)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        OmegaConf.to_container(config, resolve=True)
        validate_config(
            config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(config.algorithm)
        get_adv_estimator_fn(config.algorithm.adv_estimator)
    except ConfigError:
        raise
    except Exception as error:  # veRL reports bad values with assertions, ValueErrors and Hydra errors
        raise ConfigError(f"veRL rejects the trainer config: {type(error).__name__}: {error}") from error
    _check_agent_loop(config.actor_rollout_ref.rollout.agent)
    for key in ("train_files", "val_files"):
        _check_data_files(key, config.data.get(key))


def _check_agent_loop(agent: Any) -> None:
    from omegaconf import OmegaConf
    from verl.experimental import agent_loop  # registers veRL's built-in loops
    from verl.utils.import_utils import resolve_config_path

    names = dict(agent_loop.agent_loop._agent_loop_registry)
    if agent.agent_loop_config_path:
        try:
            entries = OmegaConf.load(resolve_config_path(agent.agent_loop_config_path))
        except Exception as error:
            raise ConfigError(
                f"cannot read the agent-loop config {agent.agent_loop_config_path}: {error}"
            ) from error
        for entry in entries:
            module_name, _, class_name = str(entry._target_).rpartition(".")
            try:
                getattr(importlib.import_module(module_name), class_name)
            except Exception as error:
                raise ConfigError(
                    f"agent loop {entry.name!r} names {entry._target_}, which does not import: "
                    f"{type(error).__name__}: {error}"
                ) from error
            names[entry.name] = entry
    if agent.default_agent_loop not in names:
        raise ConfigError(
            f"rollout.agent.default_agent_loop={agent.default_agent_loop!r} is not a registered agent loop; "
            f"registered: {', '.join(sorted(names))}"
        )


def _check_data_files(key: str, files: Any) -> None:
    if files is None:
        return
    paths = [files] if isinstance(files, str) else list(files)
    for path in paths:
        path = str(path)
        if "://" in path:  # hdfs:// and other remote storage: veRL copies them at start-up
            continue
        if not os.path.exists(os.path.expanduser(path)):
            raise ConfigError(f"data.{key}: {path} does not exist (write it with `agentboost data to-verl`)")


def main(argv: Sequence[str] | None = None) -> int:
    """Compose and check the trainer config from Hydra overrides; print the result."""
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        config = compose_trainer_config(overrides)
        check_trainer_config(config)
    except ConfigError as error:
        print(f"dry run: error: {error}", file=sys.stderr)
        return 2
    rollout = config.actor_rollout_ref.rollout
    print(
        f"dry run: ok: {config.algorithm.adv_estimator} with {rollout.name} rollouts, agent loop "
        f"{rollout.agent.default_agent_loop!r}, {config.trainer.nnodes} node(s) x "
        f"{config.trainer.n_gpus_per_node} GPU(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
