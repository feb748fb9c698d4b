"""Choose an engine by name: ``local`` (embedded transformers), ``sglang`` or ``vllm`` (remote servers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentboost.engines.base import Engine
from agentboost.errors import ConfigError

ENGINE_KINDS = ("local", "sglang", "vllm")


def make_engine(kind: str, *, model: str, urls: Sequence[str] = (), **options: Any) -> Engine:
    """Build an engine. Remote kinds need ``urls``; ``local`` loads ``model`` in this process."""
    if kind == "local":
        if urls:
            raise ConfigError("--url is for remote engines; drop it or pass --engine sglang / vllm")
        from agentboost.engines.local import LocalEngine

        return LocalEngine.from_pretrained(model, **options)
    if kind not in ENGINE_KINDS:
        raise ConfigError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
    if not urls:
        raise ConfigError(f"the {kind} engine needs the server's address: --url http://HOST:PORT")
    if kind == "sglang":
        from agentboost.engines.sglang import SGLangEngine

        return SGLangEngine(list(urls), **options)
    from agentboost.engines.vllm import VLLMEngine

    return VLLMEngine(list(urls), **options)


def load_tokenizer(model: str) -> Any:
    """The tokenizer of ``model`` (the default model is pulled first if needed)."""
    from transformers import AutoTokenizer

    from agentboost.engines.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))
