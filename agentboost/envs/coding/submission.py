"""Finding the program a model submitted: the last fenced Python block of its last assistant message.

The rule, in full (the system prompt states it too):

- only the *last* assistant message counts; earlier drafts, tool calls and tool results do not;
- a fenced block opens with a line of three or more backticks (or tildes) followed by ``python``,
  ``py``, ``python3`` or ``py3`` (any case) and closes with a line holding the same fence; untagged
  blocks and other languages do not count (they are usually sample outputs);
- of the blocks that count, the last one is the submission; no such block means no submission
  (recorded as ``submitted = 0`` in the reward breakdown, reward 0);
- an unclosed block (a message cut off by the token limit) is not a submission.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})

_OPENING = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[\w+.#-]*)[^\n`]*$")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every closed fenced block of ``text`` as ``(tag, code)``, in order; tags are lower-cased."""
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    tag = ""
    body: list[str] = []
    for line in text.split("\n"):
        if fence is None:
            opening = _OPENING.match(line)
            if opening:
                fence, tag, body = opening["fence"], opening["tag"].lower(), []
            continue
        stripped = line.strip()
        if (
            stripped
            and stripped[0] == fence[0]
            and set(stripped) == {fence[0]}
            and len(stripped) >= len(fence)
        ):
            blocks.append((tag, "\n".join(body)))
            fence = None
        else:
            body.append(line)
    return blocks


def extract_submission(text: str) -> str | None:
    """The last closed Python-tagged fenced block of ``text``, or None when there is none."""
    code = [body for tag, body in fenced_blocks(text) if tag in PYTHON_TAGS]
    if not code:
        return None
    return code[-1].strip("\n") + "\n"


def last_assistant_index(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the last assistant message of a trajectory's chat view, or None."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None


def message_text(message: Mapping[str, Any]) -> str:
    """The visible text of a chat-view message (reasoning excluded)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # Strands content blocks
        return "".join(str(block.get("text", "")) for block in content if isinstance(block, Mapping))
    return ""
