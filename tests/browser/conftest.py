"""Browser tests: each starts a demo on 127.0.0.1 in this process, drives it with Playwright in
Debian's Chromium (`demos/install_browser.sh`), and saves a screenshot under `tests/browser/out/`.

Skipped unless MMSPEC_BROWSER=1 (`make test-browser`), so `make test` neither needs gradio,
playwright nor a browser, nor waits for them.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUT = Path(__file__).parent / "out"
ENABLED = os.environ.get("MMSPEC_BROWSER") == "1"


def pytest_collection_modifyitems(config, items):
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="browser test: set MMSPEC_BROWSER=1 (make test-browser)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def browser():
    import torch
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(1)
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run demos/install_browser.sh (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(app):
    """Launch a demo's `gr.Blocks` on a free local port; yields its URL; closes the server."""
    from demos.common import serve

    port = free_port()
    serve(app, "127.0.0.1", port, block=False)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        app.close()


def screenshot(page, name: str) -> Path:
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
