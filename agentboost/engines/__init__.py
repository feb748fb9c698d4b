"""Engines: token ids in, token ids and their log-probabilities out.

The public names are importable from here whatever room they live in (``from agentboost.engines import
LocalEngine``), each imported on first use, so ``import agentboost.engines.base`` stays light. The rooms
(docs/architecture.md, "Engines, file by file"): ``base`` (the protocol), ``embedded/`` (the engine in
this process), ``remote/`` (clients of SGLang, vLLM and ``agentboost serve``), ``servers/`` (servers
and launchers).
"""

from __future__ import annotations

from agentboost.lazy_names import lazy_getattr

_PUBLIC: dict[str, str] = {
    # the protocol
    "Engine": "agentboost.engines.base",
    "SamplingParams": "agentboost.engines.base",
    "Generation": "agentboost.engines.base",
    "RolloutKey": "agentboost.engines.base",
    "bound": "agentboost.engines.base",
    "make_engine": "agentboost.engines.factory",
    "ScriptedEngine": "agentboost.engines.scripted",
    # the embedded engine
    "LocalEngine": "agentboost.engines.embedded.engine",
    # remote clients
    "RemoteEngine": "agentboost.engines.remote.engine",
    "SGLangEngine": "agentboost.engines.remote.sglang",
    "VLLMEngine": "agentboost.engines.remote.vllm",
    # launchers
    "VLLMServer": "agentboost.engines.servers.vllm_server",
    "VLLMServerConfig": "agentboost.engines.servers.vllm_server",
}
"""Public name -> the module that defines it (imported when the name is first used)."""

__all__ = [
    "Engine",
    "Generation",
    "LocalEngine",
    "RemoteEngine",
    "RolloutKey",
    "SGLangEngine",
    "SamplingParams",
    "ScriptedEngine",
    "VLLMEngine",
    "VLLMServer",
    "VLLMServerConfig",
    "bound",
    "make_engine",
]
"""The public names (each in :data:`_PUBLIC`, with its module)."""


__getattr__ = lazy_getattr(__name__, _PUBLIC, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers know the idiom)
if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports on demand
    from agentboost.engines.base import Engine, Generation, RolloutKey, SamplingParams, bound
    from agentboost.engines.embedded.engine import LocalEngine
    from agentboost.engines.factory import make_engine
    from agentboost.engines.remote.engine import RemoteEngine
    from agentboost.engines.remote.sglang import SGLangEngine
    from agentboost.engines.remote.vllm import VLLMEngine
    from agentboost.engines.scripted import ScriptedEngine
    from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig
