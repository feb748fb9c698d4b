"""Export rollout results for people and for other trainers.

- :func:`chat_record`: the chat form people read (one rollout's messages, tool calls and results);
- :func:`sft_record`: one SFT example (``messages`` + ``tools``, the format TRL's SFT trainer reads);
- :func:`token_table`: an Arrow table with token ids, loss mask and logprobs (parquet / ``datasets``).

Formats are described in docs/evaluation.md; ``agentboost export`` runs them from the command line.
"""

from agentboost.export.formats import (
    ExportFilter,
    ToolSchemas,
    chat_messages,
    chat_record,
    sft_record,
    token_table,
    tool_schemas_for,
    write_chat,
    write_hf_dataset,
    write_parquet,
    write_sft,
)

__all__ = [
    "ExportFilter",
    "ToolSchemas",
    "chat_messages",
    "chat_record",
    "sft_record",
    "token_table",
    "tool_schemas_for",
    "write_chat",
    "write_hf_dataset",
    "write_parquet",
    "write_sft",
]
