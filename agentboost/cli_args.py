"""argparse types that validate a value where it enters: counts, ranges, ports.

A zero or a negative number where it makes no sense is rejected with a message, never replaced by a
default. Every subcommand uses these, so the same mistake gets the same message everywhere.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (zeros and negatives are rejected, never replaced)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
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


def port(text: str) -> int:
    """An argparse type: a TCP port, 1-65535 (0 is not accepted: say which port to use)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {value}")
    return value


def probability(text: str) -> float:
    """An argparse type: a probability in [0, 1]."""
    return number(minimum=0, maximum=1)(text)
