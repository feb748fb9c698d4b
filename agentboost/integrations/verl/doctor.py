"""``agentboost doctor``: are the packages veRL training needs installed, in the versions we test?

Versions are read from package metadata (nothing heavy is imported for them); the agent loop is then
imported for real, as veRL's workers will import it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from agentboost.integrations.verl import AGENT_LOOP_NAME, AGENT_LOOP_TARGET, agent_loop_config_path


@dataclass(frozen=True)
class Requirement:
    package: str
    tested: str
    """The versions we test, as a PEP 440 specifier."""
    needed_for: str | None = None
    """None: always needed; else what needs it (a missing one is then only a warning)."""


REQUIREMENTS = (
    Requirement("verl", "==0.9.1"),
    # the rollout servers: the versions veRL 0.9.1 pins in its own vllm / sglang extras
    Requirement("vllm", "==0.24.0", "ROLLOUT_BACKEND=vllm"),
    Requirement("sglang", "==0.5.12", "ROLLOUT_BACKEND=sglang"),
    Requirement("torch", ">=2.4"),
    # veRL 0.9.1 requires transformers>=5.5.3,!=5.6.0,<5.11; agentboost itself takes >=5.0,<6
    Requirement("transformers", ">=5.5.3,!=5.6.0,<5.11"),
    Requirement("strands-agents", ">=1.62,<1.70"),
)


@dataclass(frozen=True)
class PackageStatus:
    requirement: Requirement
    installed: str | None

    @property
    def ok(self) -> bool:
        return self.installed is not None and _within(self.installed, self.requirement.tested)

    @property
    def blocking(self) -> bool:
        """A required package that is missing: training cannot start."""
        return self.installed is None and self.requirement.needed_for is None

    @property
    def status(self) -> str:
        if self.installed is None:
            if self.requirement.needed_for is None:
                return "MISSING: required"
            return f"not installed (needed for {self.requirement.needed_for})"
        if not self.ok:
            return "untested version"
        return "ok"


def _within(version: str, specifier: str) -> bool:
    try:
        return Version(version) in SpecifierSet(specifier)
    except InvalidVersion:
        return False


def package_statuses() -> list[PackageStatus]:
    statuses = []
    for requirement in REQUIREMENTS:
        try:
            installed: str | None = metadata.version(requirement.package)
        except metadata.PackageNotFoundError:
            installed = None
        statuses.append(PackageStatus(requirement, installed))
    return statuses


def check_agent_loop() -> str | None:
    """Import the agent loop and read the shipped config as veRL's workers do. None if both work, else why."""
    path = agent_loop_config_path()
    try:
        with open(path, encoding="utf-8") as handle:
            entries = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        return f"cannot read the agent-loop config {path}: {error}"
    if {"name": AGENT_LOOP_NAME, "_target_": AGENT_LOOP_TARGET} not in (entries or []):
        return f"{path} does not register {AGENT_LOOP_NAME!r} -> {AGENT_LOOP_TARGET}"
    module_name, _, class_name = AGENT_LOOP_TARGET.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        loop_class = getattr(module, class_name)
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase
    except Exception as error:  # any import failure is the answer, not a crash
        return f"{AGENT_LOOP_TARGET} does not import: {type(error).__name__}: {error}"
    if not issubclass(loop_class, AgentLoopBase):
        return f"{AGENT_LOOP_TARGET} is not a veRL AgentLoopBase subclass"
    return None


def doctor_report() -> tuple[str, bool]:
    """The report's text, and whether the agent loop can run (no required package missing, it imports)."""
    statuses = package_statuses()
    lines = ["agentboost doctor: veRL training", f"  {'package':<16}{'installed':<16}{'tested':<26}status"]
    for item in statuses:
        requirement = item.requirement
        lines.append(
            f"  {requirement.package:<16}{item.installed or '-':<16}{requirement.tested:<26}{item.status}"
        )
    backends = [
        item.requirement.package for item in statuses if item.requirement.needed_for and item.installed
    ]
    if not backends:
        lines.append("  rollout backend: neither vllm nor sglang is installed here; the GPU nodes need one")
    problem = check_agent_loop()
    lines.append(f"  agent loop: {'ok' if problem is None else 'FAILED: ' + problem} ({AGENT_LOOP_TARGET})")
    lines.append(f"  agent loop config: {agent_loop_config_path()}")
    ready = problem is None and not any(item.blocking for item in statuses)
    return "\n".join(lines), ready
