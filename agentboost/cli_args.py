"""argparse types that validate a value where it enters: counts, ranges, ports.

A zero or a negative number where it makes no sense is rejected with a message, never replaced by a
default. Every subcommand uses these, so the same mistake gets the same message everywhere.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_TASKS = 1_000_000
"""-n. Tasks are made as a run takes them (memory does not grow with -n), but a resume makes every
task once more to check its file against them, and the repeated-id check
(:class:`~agentboost.rollout.runner.SeenIds`, a fixed 16 MiB) is sized for a million ids: beyond
that its false alarms, each confirmed by another pass, would make a run crawl."""
MAX_SAMPLES = 10_000
"""--samples: rollouts per task. Memory does not grow with it (a task's samples are made as lanes
take them); the limit refuses a slip of the keyboard: pass@k and GRPO groups stop informing long
before 10,000, and ``eval`` reports hold every result."""
MAX_CONCURRENCY = 4_096
"""--concurrency: rollouts in flight at once, each holding its conversation and a slot of the engine."""


TASKS_WHY = (
    " (a resume checks its file against every task, and the check for repeated task ids is sized "
    "for a million; split a bigger run into several with --seed)"
)


def count(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (zeros and negatives are rejected, never replaced)
    and, when given, <= ``maximum`` (``why`` says what the limit protects)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:,}, got {value:,}{why}")
        return value

    return parse


def number(*, minimum: float, inclusive: bool = True, maximum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number in the given range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        low_ok = value >= minimum if inclusive else value > minimum
        if not (low_ok and math.isfinite(value)) or (maximum is not None and value > maximum):
            low = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            high = f" and <= {maximum:g}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"must be {low}{high}, got {text}")
        return value

    return parse


def finite_float(text: str) -> float:
    """An argparse type: any finite number (``nan`` and ``inf`` are refused where a number enters)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def port(text: str) -> int:
    """An argparse type: a TCP port, 1-65535 (0 is not accepted: say which port to use)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {value}")
    return value


def claim_port(host: str, port: int, option: str = "--port") -> None:
    """Fail with one line (ConfigError) when ``host:port`` cannot be listened on: checked before a
    server loads its model, so a port in use costs a second, not a model load and a traceback."""
    import socket

    from agentboost.errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind(address)
        except OSError as error:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {error.strerror or error}; pick another {option}"
            ) from None


def probability(text: str) -> float:
    """An argparse type: a probability in [0, 1]."""
    return number(minimum=0, maximum=1)(text)
