"""Strict tool-call parsing of generated text. Nothing is repaired.

A parser splits one assistant turn into reasoning, visible content, valid tool calls and errors.
The generated tokens always stay as generated; errors become error tool results the model reads
(see the provider) and are counted per turn in the trajectory.

Two kinds of error:
- turn errors (``unclosed_tag``, ``unmatched_tag``, ``text_after_call``) make the turn's structure
  ambiguous, so none of its calls run;
- call errors (``invalid_json``, ``missing_name``, ``unknown_tool``, ``bad_arguments``) reject only
  that call; the turn's other calls run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from agentboost.errors import ConfigError

ToolSchemas = Mapping[str, Mapping[str, Any]]
"""Tool name -> JSON schema of its arguments."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    raw: str
    """The call exactly as generated, tags included."""


@dataclass
class ParseError:
    kind: str
    message: str
    """A sentence the model reads in its error tool result."""
    raw: str = ""

    TURN_KINDS: ClassVar[frozenset[str]] = frozenset({"unclosed_tag", "unmatched_tag", "text_after_call"})

    @property
    def is_turn_error(self) -> bool:
        return self.kind in self.TURN_KINDS


@dataclass
class ParsedTurn:
    content: str
    """Visible text: the turn minus reasoning and minus valid tool calls."""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    reasoning_unclosed: bool = False
    """The turn ended inside a think block: everything generated was reasoning."""


def split_reasoning(text: str, *, starts_in_think: bool) -> tuple[str | None, str, bool]:
    """Split ``<think>...</think>`` off the front of a turn.

    Returns ``(reasoning, rest, unclosed)``. ``starts_in_think`` says the generation prompt already
    opened the block. A think block is only recognised at the start of the turn (after whitespace).
    """
    if not starts_in_think:
        stripped = text.lstrip()
        if not stripped.startswith(THINK_OPEN):
            return None, text, False
        text = stripped[len(THINK_OPEN) :]
    end = text.find(THINK_CLOSE)
    if end < 0:
        return text.strip("\n"), "", True
    reasoning = text[:end].strip("\n")
    rest = text[end + len(THINK_CLOSE) :].lstrip("\n")
    return reasoning, rest, False


class ToolCallParser(Protocol):
    """Splits an assistant turn's visible text into content, calls and errors."""

    def parse(self, text: str, tools: ToolSchemas) -> ParsedTurn: ...


def _unknown_tool(name: str, tools: ToolSchemas) -> ParseError:
    available = ", ".join(sorted(tools)) or "none"
    return ParseError("unknown_tool", f"there is no tool named {name!r}; the tools are: {available}.")


class _TaggedParser:
    """Shared scanning of ``<tool_call>...</tool_call>`` blocks; subclasses parse one block's body."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str, tools: ToolSchemas) -> ParsedTurn:
        first = text.find(self.open_tag)
        stray_close = text.find(self.close_tag)
        if first < 0:
            if stray_close >= 0:
                error = ParseError(
                    "unmatched_tag",
                    f"found {self.close_tag} without a matching {self.open_tag}; no tool ran.",
                )
                return ParsedTurn(content=text, errors=[error])
            return ParsedTurn(content=text)
        content = text[:first]
        if self.close_tag in content:
            error = ParseError(
                "unmatched_tag", f"found {self.close_tag} before any {self.open_tag}; no tool ran."
            )
            return ParsedTurn(content=text, errors=[error])
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        position = first
        while position < len(text):
            start = text.find(self.open_tag, position)
            if start < 0:
                trailing = text[position:]
                if trailing.strip():
                    error = ParseError(
                        "text_after_call",
                        f"found text after the last {self.close_tag} ({trailing.strip()[:80]!r}); "
                        "end your turn right after your tool calls. No tool ran.",
                        raw=trailing,
                    )
                    return ParsedTurn(content=text, errors=[error])
                break
            between = text[position:start]
            if between.strip():
                error = ParseError(
                    "text_after_call",
                    f"found text between tool calls ({between.strip()[:80]!r}); no tool ran.",
                    raw=between,
                )
                return ParsedTurn(content=text, errors=[error])
            end = text.find(self.close_tag, start + len(self.open_tag))
            if end < 0:
                error = ParseError(
                    "unclosed_tag",
                    f"a {self.open_tag} was never closed with {self.close_tag}; no tool ran.",
                    raw=text[start:],
                )
                return ParsedTurn(content=text, errors=[error])
            body = text[start + len(self.open_tag) : end]
            if self.open_tag in body:
                error = ParseError(
                    "unclosed_tag",
                    f"a {self.open_tag} opened inside another tool call; no tool ran.",
                    raw=text[start:end],
                )
                return ParsedTurn(content=text, errors=[error])
            raw = text[start : end + len(self.close_tag)]
            outcome = self.parse_body(body, tools)
            if isinstance(outcome, ParseError):
                outcome.raw = raw
                outcome.message = f"tool call {len(calls) + len(errors) + 1}: {outcome.message}"
                errors.append(outcome)
            else:
                name, arguments = outcome
                calls.append(ToolCall(name=name, arguments=arguments, raw=raw))
            position = end + len(self.close_tag)
        if errors:
            # rejected calls stay in the visible content, exactly as generated
            content = text.rstrip()
            for call in calls:
                content = content.replace(call.raw, "", 1)
            return ParsedTurn(content=content.rstrip("\n"), tool_calls=calls, errors=errors)
        return ParsedTurn(content=content.rstrip("\n"), tool_calls=calls)

    def parse_body(self, body: str, tools: ToolSchemas) -> tuple[str, dict[str, Any]] | ParseError:
        raise NotImplementedError


MAX_JSON_DEPTH = 64
"""The deepest nesting of a tool call's JSON that is decoded. Deeper text is an ``invalid_json`` error the
model reads: Python's decoder, and the SDK's copies of the arguments, recurse once per level, and a
model can write a thousand ``[`` (a crash there would end the rollout before its turn is recorded)."""


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON text, brackets inside strings not counted."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


class HermesParser(_TaggedParser):
    """Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    def parse_body(self, body: str, tools: ToolSchemas) -> tuple[str, dict[str, Any]] | ParseError:
        if json_depth(body) > MAX_JSON_DEPTH:
            return ParseError("invalid_json", f"the call nests deeper than {MAX_JSON_DEPTH} levels.")
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as error:
            return ParseError(
                "invalid_json", f"the call is not valid JSON ({error.msg} at column {error.colno})."
            )
        if not isinstance(payload, dict):
            return ParseError(
                "invalid_json", 'the call must be a JSON object {"name": ..., "arguments": {...}}.'
            )
        name = payload.get("name")
        if not isinstance(name, str) or not name:
            return ParseError("missing_name", 'the call has no "name" string.')
        if name not in tools:
            return _unknown_tool(name, tools)
        extra = sorted(set(payload) - {"name", "arguments"})
        if extra:
            return ParseError(
                "bad_arguments", f'unexpected keys {extra}; a call has only "name" and "arguments".'
            )
        if "arguments" not in payload:
            return ParseError("bad_arguments", 'the call has no "arguments" object (use {} for none).')
        arguments = payload["arguments"]
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            return ParseError("bad_arguments", f'"arguments" must be a JSON object, not a {kind}.')
        return name, arguments


_FUNCTION = re.compile(r"\A\s*<function=([^>\n]*)>(.*)</function>\s*\Z", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)


def _convert_parameter(value: str, schema: Mapping[str, Any]) -> Any:
    """Qwen3-Coder writes parameters as text; the tool's schema says what type they are."""
    kind = schema.get("type")
    if kind == "string" or kind is None:
        return value
    if kind == "integer":
        if re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        raise ValueError(f"expected an integer, got {value!r}")
    if kind == "number":
        try:
            return int(value) if re.fullmatch(r"-?\d+", value.strip()) else float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    if kind == "boolean":
        if value.strip() in {"true", "false"}:
            return value.strip() == "true"
        raise ValueError(f"expected true or false, got {value!r}")
    if kind == "null":
        if value.strip() in {"null", "None"}:
            return None
        raise ValueError(f"expected null, got {value!r}")
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"expected JSON ({kind}) nested at most {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise ValueError(f"expected JSON ({kind}), got {value!r}") from None


class Qwen3CoderParser(_TaggedParser):
    """Qwen3-Coder XML: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``.

    Values are text; each is converted with the type its tool's JSON schema gives it.
    """

    def parse_body(self, body: str, tools: ToolSchemas) -> tuple[str, dict[str, Any]] | ParseError:
        match = _FUNCTION.match(body)
        if match is None:
            return ParseError("invalid_json", "expected <function=NAME>...</function> inside the tool call.")
        name, inner = match.group(1).strip(), match.group(2)
        if not name:
            return ParseError("missing_name", "the <function=...> tag has no name.")
        if name not in tools:
            return _unknown_tool(name, tools)
        properties = tools[name].get("properties", {}) or {}
        arguments: dict[str, Any] = {}
        leftover = _PARAMETER.sub("", inner)
        if leftover.strip():
            return ParseError("bad_arguments", f"unexpected text in the call: {leftover.strip()[:80]!r}.")
        for key, raw_value in _PARAMETER.findall(inner):
            key = key.strip()
            value = raw_value[1:] if raw_value.startswith("\n") else raw_value
            value = value[:-1] if value.endswith("\n") else value
            if key in arguments:
                return ParseError("bad_arguments", f"parameter {key!r} is given twice.")
            try:
                arguments[key] = _convert_parameter(value, properties.get(key, {}))
            except ValueError as error:
                return ParseError("bad_arguments", f"parameter {key!r}: {error}.")
        return name, arguments


class PlainTextParser:
    """No tool calls: every turn is text, kept whole (gym-style environments parse the model's answer
    themselves, e.g. ``<sql>...</sql>``)."""

    def parse(self, text: str, tools: ToolSchemas) -> ParsedTurn:
        return ParsedTurn(content=text)


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "text": PlainTextParser,
    "hermes": HermesParser,
    "qwen3": HermesParser,
    "qwen3_coder": Qwen3CoderParser,
}


def register_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    """Make a tool-call format available by name (e.g. in configs: ``parser: my_format``)."""
    _PARSERS[name] = factory


def get_parser(name: str) -> ToolCallParser:
    try:
        return _PARSERS[name]()
    except KeyError:
        raise ConfigError(f"unknown tool-call parser {name!r}; registered: {sorted(_PARSERS)}") from None
