"""The submission rule: the last fenced Python block of the last assistant message."""

from agentboost.envs.coding.submission import extract_submission, fenced_blocks


def test_the_last_python_block_is_the_submission():
    text = "draft:\n```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\noutput:\n```\n2\n```\n"
    assert extract_submission(text) == "print(2)\n"


def test_untagged_and_other_language_blocks_do_not_count():
    assert extract_submission("```\nprint(1)\n```") is None
    assert extract_submission("```bash\necho hi\n```") is None
    assert extract_submission("no code at all") is None


def test_an_unclosed_block_is_not_a_submission():
    assert extract_submission("```python\nprint(1)\n```\n```python\nprint(2") == "print(1)\n"


def test_longer_fences_and_tildes_keep_inner_backticks():
    text = "````python\ns = '```'\nprint(s)\n````\n~~~Python3\nprint(3)\n~~~"
    assert fenced_blocks(text) == [("python", "s = '```'\nprint(s)"), ("python3", "print(3)")]
    assert extract_submission(text) == "print(3)\n"
