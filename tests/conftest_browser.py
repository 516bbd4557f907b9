"""Helpers for the browser tests and bench/ui_render.py: start the real app in a subprocess on a
free 127.0.0.1 port, and launch Debian's headless Chromium through Playwright (never a download)."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("PARITY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_available() -> bool:
    return Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 180.0, ok: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status in ok:
                    return
        except urllib.error.HTTPError as e:
            if e.code in ok:
                return
            time.sleep(0.5)
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the app did not serve {url} within {timeout:.0f} s")


@contextlib.contextmanager
def running_app(db_path: Path, log_path: Path, env: dict[str, str] | None = None,
                script: Path = ROOT / "app.py") -> Iterator[str]:
    """`python app.py` (or `script`: tests/fake_app.py has the fake engine kinds) on a free port with
    PARITY_DB=db_path; yields its base URL."""
    port = free_port()
    env = {**os.environ, "PARITY_DB": str(db_path), "PARITY_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
           **(env or {})}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_http(url, proc, ok=(200, 401))
        yield url
    finally:
        proc.terminate()  # the app closes its engine workers on the way out
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
