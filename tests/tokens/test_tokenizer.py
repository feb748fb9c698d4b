"""The Tokenizer protocol annotates every tokenizer in agentboost: transformers' fast tokenizers meet it."""

from __future__ import annotations

from agentboost.tokens.tokenizer import Tokenizer


def test_a_transformers_fast_tokenizer_meets_the_protocol(qwen_tokenizer):
    assert isinstance(qwen_tokenizer, Tokenizer)
    ids = qwen_tokenizer.encode("Hi  there", add_special_tokens=False)
    text = qwen_tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert text == "Hi  there"
    assert isinstance(qwen_tokenizer.convert_tokens_to_ids("<|im_end|>"), int)
    assert qwen_tokenizer.eos_token_id is not None or qwen_tokenizer.pad_token_id is not None


def test_an_object_without_the_members_does_not():
    class IdsOnly:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [1]

    assert not isinstance(IdsOnly(), Tokenizer)
