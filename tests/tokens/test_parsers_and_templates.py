from __future__ import annotations

import pytest

from agentboost.errors import ConfigError, TemplateError
from agentboost.tokens.builder import TokenBuffer
from agentboost.tokens.parsers import get_parser, register_parser, split_reasoning
from agentboost.tokens.templates import get_template, template_for

TOOLS = {
    "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    "note": {"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array"}}},
}


def test_hermes_parses_several_calls_and_keeps_content():
    parsed = get_parser("hermes").parse(
        'Let me.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "note", "arguments": {}}\n</tool_call>\n',
        TOOLS,
    )
    assert parsed.content == "Let me." and not parsed.errors
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 1, "b": 2}), ("note", {})]


def test_qwen3_coder_converts_by_schema_and_reports_bad_values():
    parser = get_parser("qwen3_coder")
    good = parser.parse(
        "<tool_call>\n<function=note>\n<parameter=text>\nhi there\n</parameter>\n"
        '<parameter=tags>\n["a"]\n</parameter>\n</function>\n</tool_call>',
        TOOLS,
    )
    assert good.tool_calls[0].arguments == {"text": "hi there", "tags": ["a"]}
    bad = parser.parse(
        "<tool_call>\n<function=add>\n<parameter=a>\nseven\n</parameter>\n</function>\n</tool_call>", TOOLS
    )
    assert bad.errors[0].kind == "bad_arguments" and "expected an integer" in bad.errors[0].message


def test_reasoning_split_and_parser_registry():
    assert split_reasoning("<think>\nhm\n</think>\n\nok", starts_in_think=False) == ("hm", "ok", False)
    assert split_reasoning("hm\n</think>\nok", starts_in_think=True) == ("hm", "ok", False)
    assert split_reasoning("no think", starts_in_think=False) == (None, "no think", False)
    register_parser("mine", lambda: get_parser("hermes"))
    assert get_parser("mine").parse("plain", TOOLS).content == "plain"
    with pytest.raises(ConfigError, match="unknown tool-call parser"):
        get_parser("nope")


def test_template_choice_and_typed_errors(qwen_tokenizer):
    assert template_for(qwen_tokenizer).name == "qwen3"
    with pytest.raises(ConfigError):
        get_template("llama9")
    with pytest.raises(TemplateError, match="only allowed first"):
        get_template("chatml").render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])


def test_buffer_refuses_a_delta_whose_tokens_merge_with_the_generation(qwen_tokenizer):
    """A template that glues text onto the model's last word makes a token straddle the boundary."""
    from agentboost.tokens.templates import ChatTemplate

    source = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.role == 'assistant' %}s{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    buffer = TokenBuffer(qwen_tokenizer, ChatTemplate("glued", source))
    buffer.start([{"role": "user", "content": "name an animal"}])
    ids = qwen_tokenizer.encode(" cat", add_special_tokens=False)  # " cat" + "s" tokenizes as " cats"
    buffer.append_generation(ids, [-1.0] * len(ids), finish_reason="stop")
    with pytest.raises(TemplateError, match="merge with the model's last tokens"):
        buffer.append_messages([{"role": "user", "content": "another"}])
    assert buffer.segments[-1].role == "assistant"  # nothing was appended


def test_the_text_parser_reads_no_tool_calls():
    """Gym-style environments get the whole turn: tags that look like calls stay text, with no error."""
    turn = '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call> then </tool_call>'
    parsed = get_parser("text").parse(turn, {"add": {}})
    assert (parsed.content, parsed.tool_calls, parsed.errors) == (turn, [], [])
