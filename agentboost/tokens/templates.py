"""Chat templates: turning OpenAI-style messages into the exact text a model was trained on.

agentboost ships one ChatML template with Hermes-style tool calls (`templates/hermes.jinja`) under
two names: ``qwen3`` (think blocks, Qwen3's special tokens) and ``chatml`` (no think markup; for
SmolLM2 and other ChatML models without tool tokens). Users' own Jinja templates work too, when
they are extension-safe; :class:`~agentboost.tokens.builder.TokenBuffer` checks that on every turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agentboost.errors import ConfigError, TemplateError
from agentboost.tokens.messages import ChatMessage
from agentboost.tokens.tokenizer import Tokenizer

Message = ChatMessage
"""An OpenAI-style chat message (:class:`~agentboost.tokens.messages.ChatMessage`)."""


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    return _environment().from_string(source)


@dataclass
class ChatTemplate:
    """A compiled Jinja chat template with default variables (e.g. ``thinking``)."""

    name: str
    source: str
    defaults: dict[str, Any] = field(default_factory=dict)
    content_verbatim: bool = False
    """True when the template copies user and tool message content unchanged and ignores their other
    fields, so deltas can be rendered once per message shape and filled in (agentboost's built-ins)."""

    def __post_init__(self) -> None:
        try:
            self._compiled = _compile(self.source)
        except jinja2.TemplateSyntaxError as error:
            raise ConfigError(f"chat template {self.name!r} does not compile: {error}") from error

    def with_defaults(self, **defaults: Any) -> ChatTemplate:
        """A copy whose default variables are updated (e.g. ``thinking="off"``)."""
        return ChatTemplate(self.name, self.source, {**self.defaults, **defaults}, self.content_verbatim)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
        **variables: Any,
    ) -> str:
        """Render messages (and tool schemas) to text. Raises TemplateError naming the last message."""
        context = {**self.defaults, **variables}
        try:
            return self._compiled.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.TemplateError as error:
            last = messages[-1] if messages else None
            raise TemplateError(self.name, last, f"the template failed: {error}") from error


_BUILTIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"thinking": "auto"},
    "chatml": {"thinking": "none"},
}


@cache
def _builtin_source() -> str:
    return resources.files("agentboost.tokens").joinpath("templates/hermes.jinja").read_text(encoding="utf-8")


def get_template(name: str, **defaults: Any) -> ChatTemplate:
    """A built-in template by name: ``qwen3`` or ``chatml``; keyword arguments set default variables."""
    if name not in _BUILTIN_DEFAULTS:
        raise ConfigError(
            f"unknown chat template {name!r}; built-in templates are {sorted(_BUILTIN_DEFAULTS)}"
        )
    return ChatTemplate(
        name, _builtin_source(), {**_BUILTIN_DEFAULTS[name], **defaults}, content_verbatim=True
    )


def template_for(tokenizer: Tokenizer, name: str | None = None, **defaults: Any) -> ChatTemplate:
    """Pick a template for a tokenizer.

    ``name`` may be a built-in name, ``"tokenizer"`` (the tokenizer's own ``chat_template``), or None:
    then ``qwen3`` if the vocabulary has Qwen3's ``<think>`` and ``<tool_call>`` tokens, else ``chatml``
    if it has ``<|im_start|>``, else the tokenizer's own template.
    """
    if name in _BUILTIN_DEFAULTS:
        return get_template(name, **defaults)

    def has(token: str) -> bool:
        token_id = tokenizer.convert_tokens_to_ids(token)
        return token_id is not None and token_id != tokenizer.unk_token_id

    if name is None:
        if has("<think>") and has("<tool_call>") and has("<|im_start|>"):
            return get_template("qwen3", **defaults)
        if has("<|im_start|>"):
            return get_template("chatml", **defaults)
        name = "tokenizer"
    if name == "tokenizer":
        source = getattr(tokenizer, "chat_template", None)
        if not isinstance(source, str):
            raise ConfigError("the tokenizer has no chat_template; pass template='chatml' or 'qwen3'")
        return ChatTemplate(getattr(tokenizer, "name_or_path", "tokenizer") or "tokenizer", source, defaults)
    raise ConfigError(f"unknown chat template {name!r}: use 'qwen3', 'chatml' or 'tokenizer'")


def tool_specs_to_openai(tool_specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Strands ToolSpecs (name, description, inputSchema.json) as OpenAI function schemas."""
    tools = []
    for spec in tool_specs:
        schema = spec.get("inputSchema", {})
        parameters = schema.get("json", schema) if isinstance(schema, Mapping) else {}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec["name"],
                    "description": spec.get("description", ""),
                    "parameters": parameters,
                },
            }
        )
    return tools
