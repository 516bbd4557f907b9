"""The browser modules' Chromium: one headless Chromium per test process, shared by every module, and
pages in contexts of their own (cookies, storage and viewport apart).

A Chromium per module (each with its Playwright driver, a Node process) cost a launch each, thirteen a
run. Pages in separate contexts see nothing of each other, as pages in separate browsers did.
Playwright's sync API allows one driver per thread, so every browser test takes this one (bench/ and
scripts/ keep conftest_browser.chromium for a browser of their own).

Close a page before its app stops: the app's server waits for its open connections on the way out
(measured: 5.5 s with a page still connected, 0.7 s without). `with running_app(...) as url,
new_page() as page:` closes them in that order."""
from __future__ import annotations

import contextlib

import pytest


@pytest.fixture(scope="session")
def browser():
    pytest.importorskip("playwright")
    from conftest_browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def new_page(browser):
    """`with new_page(width=1400, height=1000) as page:` a page in a fresh context of the shared
    Chromium, the context closed on the way out."""

    @contextlib.contextmanager
    def page(width: int = 1400, height: int = 1000):
        ctx = browser.new_context(viewport={"width": width, "height": height})
        try:
            yield ctx.new_page()
        finally:
            ctx.close()

    return page
