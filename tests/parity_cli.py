"""The `parity` command as a user runs it, for tests/unit/test_cli.py and tests/engines/test_cli_engines.py:
a subprocess against its own database, and the small model those tests run it on."""
from __future__ import annotations

import subprocess
import sys

import pytest


def parity(*args, db, timeout=600):
    return subprocess.run([sys.executable, "-m", "parity_ui.cli", "--db", str(db), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(build_tiny):
    return build_tiny("llama", max_position_embeddings=64)
