"""Browser tests: each starts a demo on 127.0.0.1 in this process, drives it with Playwright in
Debian's Chromium (`demos/install_browser.sh`), and saves a screenshot under `tests/browser/out/`.

Skipped unless MMSPEC_BROWSER=1 (`make test-browser`), so `make test` neither needs gradio,
playwright nor a browser, nor waits for them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUT = Path(__file__).parent / "out"
ROOT = Path(__file__).resolve().parents[2]
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


@contextmanager
def launched(script: str, *args: str, timeout: float = 90.0):
    """Run `python demos/<script> --port P *args` as a subprocess, as a user would; yields
    (url, seconds until the page answered); terminates the server."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = OUT / f"{Path(script).stem}.server.log"
    OUT.mkdir(exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "demos" / script), "--port", str(port),
                                 *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    start = time.perf_counter()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{script} exited with {proc.returncode}: {log.read_text()[-2000:]}")
            if time.perf_counter() - start > timeout:
                pytest.fail(f"{script} did not answer on {url} within {timeout} s")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.25)
        yield url, time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def screenshot(page, name: str) -> Path:
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
