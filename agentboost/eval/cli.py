"""``agentboost eval``, ``stats``, ``view`` and ``export``: :func:`register_commands` adds them to the CLI."""

from __future__ import annotations

import argparse


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add the evaluation and inspection commands to the ``agentboost`` command's subparsers."""
    from agentboost.export.cli import register_export_command

    register_export_command(commands)
