"""The tokenizer agentboost needs, as a protocol: what crosses layers instead of ``Any``.

Any Hugging Face tokenizer satisfies it (``transformers.AutoTokenizer``); so does a small wrapper
around another library. Chat templates, the token buffer and the tool-call parsers use only these
members. An engine that loaded its model's tokenizer (the embedded engine) carries it as
``engine.tokenizer``: :func:`tokenizer_of` is the one place that asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids and back, with the special ids a chat needs."""

    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """The ids of ``text`` (agentboost passes ``add_special_tokens=False``)."""
        ...

    def decode(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool = ...,
        clean_up_tokenization_spaces: bool | None = ...,
    ) -> str:
        """The text of ``token_ids`` (a user simulator keeps its spaces:
        ``clean_up_tokenization_spaces=False``)."""
        ...

    def convert_tokens_to_ids(self, tokens: str) -> Any:
        """The id of a vocabulary entry (e.g. ``<|im_end|>``); ``unk_token_id`` when it has none."""
        ...


@runtime_checkable
class CarriesTokenizer(Protocol):
    """An engine that holds its model's tokenizer (e.g. ``LocalEngine``)."""

    tokenizer: Tokenizer


def tokenizer_of(engine: object) -> Tokenizer | None:
    """The tokenizer ``engine`` carries, or None (remote engines hold ids only)."""
    if isinstance(engine, CarriesTokenizer):
        return engine.tokenizer
    return None
