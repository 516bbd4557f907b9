"""Where parity-ui keeps things: the run database and the model cache. All overridable by env."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$PARITY_CACHE_DIR, else ~/.cache/parity-ui."""
    return Path(os.environ.get("PARITY_CACHE_DIR") or Path.home() / ".cache" / "parity-ui")


def default_db_path() -> Path:
    """$PARITY_DB, else runs.db in the current directory (the design card's top-level runs.db)."""
    return Path(os.environ.get("PARITY_DB") or "runs.db")
