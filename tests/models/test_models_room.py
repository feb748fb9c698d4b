"""Models and tokenizers live in ``agentboost.models``; nothing there, or in ``tokens``, imports upward."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agentboost

PACKAGE = Path(agentboost.__file__).parent
ALLOWED = {
    # package -> the agentboost packages its modules may import (anywhere in the file, lazy ones too)
    "models": {"errors", "models", "tokens"},
    "tokens": {"errors", "tokens"},
}


def agentboost_imports(path: Path) -> set[str]:
    """The top-level agentboost packages ``path`` imports (``agentboost.x.y`` -> ``x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "agentboost" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_models_and_tokens_import_nothing_above_them():
    for package, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / package).rglob("*.py")):
            upward = agentboost_imports(path) - allowed
            assert not upward, f"{path.relative_to(PACKAGE)} imports agentboost.{sorted(upward)}"


def test_the_old_split_homes_are_gone_and_the_room_is_light():
    assert not (PACKAGE / "engines" / "models.py").exists()
    assert not (PACKAGE / "tokens" / "qwen.py").exists()
    probe = (
        "import sys; from agentboost.models import DEFAULT_MODEL, load_tokenizer, load_qwen3_tokenizer, "
        "resolve_model; heavy = [m for m in ('torch', 'transformers', 'strands') if m in sys.modules]; "
        "print(DEFAULT_MODEL, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["smollm2-135m-instruct", "[]"]


def test_load_tokenizer_reads_a_model_directory_and_names_what_is_missing(tmp_path, qwen_tokenizer):
    import pytest

    from agentboost.errors import TokenizerError
    from agentboost.models import load_tokenizer

    qwen_tokenizer.save_pretrained(tmp_path / "model")
    loaded = load_tokenizer(str(tmp_path / "model"))
    assert loaded.encode("<|im_end|> hi", add_special_tokens=False) == qwen_tokenizer.encode(
        "<|im_end|> hi", add_special_tokens=False
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="tokenizer files"):
        load_tokenizer(str(tmp_path / "empty"))
    assert agentboost.load_tokenizer is load_tokenizer
