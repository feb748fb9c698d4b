"""Public names imported on first use (PEP 562), for the package root and ``agentboost.engines``.

A package lists ``{name: defining module}`` and assigns the returned function to its module-level
``__getattr__``; ``import package`` then stays light, and a name's module is imported the first time
the name is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, public: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports ``public[name]`` and caches the value in ``namespace``."""

    def __getattr__(name: str) -> object:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    return __getattr__
