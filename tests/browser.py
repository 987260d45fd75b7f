"""A real browser for the tests of every page we serve: Debian's Chromium
driven by Playwright (``playwright`` from PyPI, which brings its driver; no
browser is downloaded: the system's ``/usr/bin/chromium`` is launched).

``make test`` installs Chromium (``make browser``). The ``page`` fixture gives
a fresh page per test; :func:`screenshot` saves what a user would see under
``test-artifacts/screenshots/`` (git-ignored) for a person to look at.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Iterator

import pytest

#: Where the screenshots go (QS_ARTIFACTS overrides it).
ARTIFACTS = os.environ.get("QS_ARTIFACTS") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test-artifacts")

#: The flags a headless Chromium needs in a container with no network beyond
#: loopback: no sandbox (root), no GPU, and none of the background fetches
#: that this machine's closed network refuses many at a time.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    """The system Chromium (QS_CHROMIUM overrides it); one clear failure if absent."""
    path = os.environ.get("QS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        pytest.fail("Chromium is not installed: run `make browser` (Debian's chromium package)")
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """One headless Chromium for a test process's whole run."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium_path(), args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser):   # type: ignore[no-untyped-def]
    """A fresh page (its own context: no cookies shared between tests), 1280×900."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    try:
        yield tab
    finally:
        context.close()


def screenshot(tab, name: str, full_page: bool = True) -> str:   # type: ignore[no-untyped-def]
    """Save ``tab`` as ``test-artifacts/screenshots/<name>.png``; returns the path."""
    folder = os.path.join(ARTIFACTS, "screenshots")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, re.sub(r"[^A-Za-z0-9_.-]+", "-", name) + ".png")
    tab.screenshot(path=path, full_page=full_page)
    return path
