"""`agentboost view` shows where a gateway session forked or reset, and why; driven in real Chromium."""

from __future__ import annotations

import pytest
from browser_support import open_page, require_chromium
from gateway_support import forked_results

from agentboost.cli import main


@pytest.fixture(scope="module")
def page_path(qwen_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("drift-view")
    forked_results(qwen_tokenizer, folder / "fork.jsonl")
    forked_results(qwen_tokenizer, folder / "reset.jsonl", policy="reset")
    tokenizer_dir = folder / "tokenizer"
    qwen_tokenizer.save_pretrained(tokenizer_dir)
    out = folder / "report.html"
    paths = [str(folder / "fork.jsonl"), str(folder / "reset.jsonl")]
    assert main(["view", *paths, "-o", str(out), "--tokenizer", str(tokenizer_dir)]) == 0
    return out, folder


def test_the_viewer_marks_where_a_session_forked_and_shows_every_row(page_path, qwen_tokenizer):
    from agentboost.rollout.results import read_results

    out, folder = page_path
    forked = list(read_results(folder / "fork.jsonl"))
    playwright = require_chromium()
    manager, browser, page, problems = open_page(playwright, out)
    try:
        # every rollout drifted once: the list's drift column says so
        assert page.locator("#rows tbody tr td:nth-child(10)").all_text_contents() == ["1"] * 4
        page.click("#rows tbody tr[data-index='0']")
        assert "2 training rows (the session forked)" in page.text_content("#detail-facts")
        assert page.locator("#conversation .drift-event").all_text_contents() == [
            "fork at message 1: assistant_edited (after 1 turns)"
        ]
        # both rows, in order; the kept row's served assistant turn is where the history changed
        rows = forked[0].trajectory.training_rows
        assert page.locator("#conversation .row-mark").all_text_contents() == [
            "training row 1 of 2",
            "training row 2 of 2",
        ]
        assert page.locator("#conversation .msg").count() == sum(len(row.messages) for row in rows)
        marked = page.locator("#conversation .msg.drift-at")
        assert marked.count() == 1 and "I will add first." in marked.text_content()
        assert "the session forked: fork at message 1: assistant_edited" in marked.text_content()
        assert "Let me add." in page.text_content("#conversation")  # the edited history starts row 2
        # the token view holds both rows' tokens
        page.click("#tabs button[data-tab='tokens']")
        assert page.locator("#token-stream .row-mark").count() == 2
        assert page.locator("#token-stream .tok").count() == sum(len(row.token_ids) for row in rows)
        assert page.locator("#token-stream .tok.mask0").count() == sum(row.loss_mask.count(0) for row in rows)
        # a reset session: one row, which says it started after a reset and why
        page.click("#tabs button[data-tab='conversation']")
        page.click("#rows tbody tr[data-index='2']")
        assert page.locator("#conversation .row-mark").count() == 0
        (note,) = page.locator("#conversation .drift-note").all_text_contents()
        assert note == (
            "started after a reset (the previous row was dropped): reset at message 1: assistant_edited "
            "(after 1 turns)"
        )
        assert problems == []
    finally:
        browser.close()
        manager.stop()
