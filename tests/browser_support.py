"""Driving the viewer's page in real Chromium (Playwright), for the tests that open it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("AGENTBOOST_CHROMIUM", "/usr/bin/chromium")


def require_chromium():
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    return playwright


def open_page(playwright_module, path: Path):
    """Start Chromium on the file; returns (manager, browser, page, problems)."""
    manager = playwright_module.sync_playwright().start()
    browser = manager.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
        ],
    )
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on(
        "request", lambda request: None if request.url.startswith("file:") else problems.append(request.url)
    )
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("#rows tbody tr")
    return manager, browser, page, problems
