"""Writes assets/viewer.png and assets/viewer-tokens.png: the viewer on the test suite's rollouts.

The rollouts are the ones tests/view uses: real Qwen3 tokenizer, template, Strands tools and parse
errors, with scripted model output (a correct two-tool solution, a malformed call, reasoning, an
unscored sample, and output that tries to inject markup). Needs Debian's chromium and playwright.

    python docs/viewer_screenshot.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from results_support import scripted_results  # noqa: E402

from agentboost.models.tokenizers import load_qwen3_tokenizer  # noqa: E402
from agentboost.view.html import write_report  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def main() -> None:
    from playwright.sync_api import sync_playwright

    tokenizer = load_qwen3_tokenizer()
    with tempfile.TemporaryDirectory() as directory:
        results = scripted_results(tokenizer, Path(directory) / "results.jsonl")
        page_path = Path(directory) / "report.html"
        write_report([results], page_path, tokenizer=tokenizer, title="agentboost view: results.jsonl")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(page_path.as_uri())
            page.wait_for_selector("#rows tbody tr")
            page.click("#rows tbody tr[data-index='0']")
            page.screenshot(path=str(ROOT / "assets" / "viewer.png"))
            page.click("#tabs button[data-tab='tokens']")
            page.evaluate(  # scroll the token pane (not the page) to the first generated turn
                "const box = document.getElementById('tokens');"
                "const mark = [...box.querySelectorAll('.seg-mark')]"
                ".find((m) => m.textContent.startsWith('assistant'));"
                "box.scrollTop = mark.offsetTop - box.offsetTop - 120;"
            )
            page.screenshot(path=str(ROOT / "assets" / "viewer-tokens.png"))
            browser.close()
    print("assets/viewer.png, assets/viewer-tokens.png")


if __name__ == "__main__":
    main()
