"""The HTML viewer: valid, self-contained, escapes everything from the model; driven in real Chromium."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser

import pytest
from browser_support import CHROMIUM, open_page, require_chromium
from results_support import HOSTILE, scripted_results

from agentboost.cli import main
from agentboost.rollout.results import ResultStore, read_results
from agentboost.view.html import build_page, embed_json

VOID = {"meta", "input", "br", "img", "link", "hr", "col", "source", "wbr", "area", "base", "embed", "track"}


@pytest.fixture(scope="module")
def results_path(qwen_tokenizer, tmp_path_factory):
    return scripted_results(qwen_tokenizer, tmp_path_factory.mktemp("view") / "results.jsonl")


@pytest.fixture(scope="module")
def results(results_path):
    return list(read_results(results_path))


@pytest.fixture(scope="module")
def page_path(results_path, qwen_tokenizer, tmp_path_factory):
    tokenizer_dir = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(tokenizer_dir)
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["view", str(results_path), "-o", str(out), "--tokenizer", str(tokenizer_dir)]) == 0
    return out


class _Structure(HTMLParser):
    """Checks that every non-void element closes in order and collects script elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script":
            self.scripts.append(attributes)
        for name in ("src", "href"):
            if attributes.get(name):
                self.external.append(f"{tag} {name}={attributes[name]}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()


def test_embedded_json_cannot_close_its_element():
    value = {"text": "</script><!-- <script>alert(1)</script> & \u2028 \u2029 </textarea>"}
    text = embed_json(value)
    assert not set("<>&") & set(text) and "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == value


def test_page_is_well_formed_self_contained_and_escapes_the_model(page_path, results):
    page = page_path.read_text(encoding="utf-8")
    structure = _Structure()
    structure.feed(page)
    structure.close()
    assert structure.errors == [] and structure.stack == []
    # one summary, one element per rollout, one page script; nothing from the model became a tag
    assert [s.get("type") for s in structure.scripts] == ["application/json"] * (1 + len(results)) + [None]
    assert structure.external == []  # no src / href: nothing is fetched
    assert HOSTILE not in page and "</textarea>" not in page and "<b>bold" not in page
    assert page.count("</script>") == len(results) + 2
    assert re.search(r"default-src 'none'", page)


def test_titles_are_escaped(results):
    page = build_page(results, title="<img src=x onerror=alert(1)>")
    assert "<img" not in page and "&lt;img src=x" in page


def test_browser_shows_list_conversation_and_tokens(page_path, results, tmp_path):
    playwright = require_chromium()
    manager, browser, page, problems = open_page(playwright, page_path)
    try:
        assert page.text_content("#count").startswith("6 rollouts")
        assert page.locator("#rows tbody tr").count() == 6
        assert page.locator("#stats table").count() >= 5
        assert page.locator("#histogram rect").count() == 3  # rewards 0 and 1, and unscored
        # a rollout with tool calls: every message, the calls, statuses and every token
        page.click("#rows tbody tr[data-index='0']")
        first = results[0].trajectory
        assert page.locator("#conversation .msg").count() == len(first.messages)
        assert page.locator("#conversation .role-tool").count() == 2
        assert "add(" in page.text_content("#conversation .call")
        page.click("#tabs button[data-tab='tokens']")
        assert page.locator("#token-stream .tok").count() == len(first.token_ids)
        assert page.locator("#token-stream .tok.mask0").count() == first.loss_mask.count(0)
        assert page.locator("#token-stream .seg-mark").count() == len(first.segments)
        assert "What is (12 + 30) * 2?" in page.text_content("#token-stream")
        # parse errors are highlighted
        page.click("#tabs button[data-tab='conversation']")
        page.click("#rows tbody tr[data-index='3']")
        assert page.locator("#conversation .parse-error").count() >= 1
        assert "invalid_json" in page.text_content("#conversation")
        # the hostile output is shown as text and runs nothing
        page.click("#rows tbody tr[data-index='4']")
        assert HOSTILE in page.text_content("#conversation")
        assert page.locator("#conversation b").count() == 0
        assert page.evaluate("window.__pwned") is None
        # reasoning is collapsed
        page.click("#rows tbody tr[data-index='2']")
        assert page.locator("#conversation details.reasoning").count() == 1
        assert page.get_attribute("#conversation details.reasoning", "open") is None
        # filters and sorting
        page.select_option("#f-tool", "add")
        assert page.text_content("#count").startswith("2 rollouts (filtered from 6)")
        page.select_option("#f-tool", "")
        page.check("#f-perr")
        assert page.locator("#rows tbody tr").count() == 2
        page.uncheck("#f-perr")
        page.check("#f-unscored")
        assert page.locator("#rows tbody tr").count() == 1
        page.uncheck("#f-unscored")
        page.click("#rows th[data-key='reward']")  # highest first
        rewards = page.locator("#rows tbody tr td:nth-child(4)").all_text_contents()
        assert rewards == ["1.000", "1.000", "1.000", "0.000", "0.000", "n/a"]
        page.screenshot(path=str(tmp_path / "shot.png"), full_page=True)
        assert problems == []
    finally:
        browser.close()
        manager.stop()


def test_thousands_of_rollouts_stay_paginated(results, tmp_path):
    playwright = require_chromium()
    path = tmp_path / "many.jsonl"
    with ResultStore(path, fsync=False) as store:
        for copy in range(500):
            for result in results:
                store.write(dataclasses.replace(result, task_id=f"{result.task_id}-{copy:03d}"))
    out = tmp_path / "many.html"
    assert main(["view", str(path), "-o", str(out)]) == 0  # no tokenizer: the token view shows ids
    manager, browser, page, problems = open_page(playwright, out)
    try:
        assert page.text_content("#count") == "3000 rollouts, showing 1-100"
        assert page.locator("#rows tbody tr").count() == 100
        assert page.locator("#conversation .msg").count() == 0  # nothing rendered before a click
        page.click("#next")
        assert page.text_content("#page") == "page 2 of 30"
        page.click("#rows tbody tr[data-index='150']")
        assert page.text_content("#detail-title") == "t-good-025 / sample 0"
        page.click("#tabs button[data-tab='tokens']")
        assert page.text_content("#token-stream .tok").startswith("[")
        page.fill("#f-task", "t-good-49")
        assert page.text_content("#count").startswith("30 rollouts")
        assert problems == []
    finally:
        browser.close()
        manager.stop()


def test_empty_and_crashed_results_render(tmp_path):
    from agentboost.rollout.runner import Job, crashed_result

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["view", str(empty), "-o", str(tmp_path / "empty.html")]) == 0
    assert main(["stats", str(empty), "-o", str(tmp_path / "empty")]) == 0
    crashed = tmp_path / "crashed.jsonl"
    with ResultStore(crashed) as store:
        store.write(crashed_result(Job("t", {}, 0, 0), "killed by the OOM killer"))
    assert main(["view", str(crashed), "-o", str(tmp_path / "crashed.html")]) == 0
    assert main(["export", str(crashed), "-o", str(tmp_path / "c.parquet"), "--format", "parquet"]) == 0
    assert main(["export", str(crashed), "-o", str(tmp_path / "c.jsonl"), "--format", "sft"]) == 0
    assert (tmp_path / "c.jsonl").read_text() == ""  # unscored and failed: not an SFT example
    try:
        playwright = require_chromium()
    except pytest.skip.Exception:
        return
    for name in ("empty.html", "crashed.html"):
        manager = playwright.sync_playwright().start()
        browser = manager.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            problems = []
            page.on("pageerror", lambda error, problems=problems: problems.append(str(error)))
            page.goto((tmp_path / name).as_uri())
            page.wait_for_selector("#count")
            if name == "crashed.html":
                page.click("#rows tbody tr[data-index='0']")
                assert "worker_crashed" in page.text_content("#detail-facts")
                assert "(no reward: the worker crashed)" in page.text_content("#detail-facts")  # why
            else:
                assert page.text_content("#count") == "0 rollouts"
            assert problems == []
        finally:
            browser.close()
            manager.stop()
