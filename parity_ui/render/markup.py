"""HTML escaping for every render module: one leaf that all of them import, so none imports another for it."""

from __future__ import annotations

import html
from typing import Any


def esc(value: Any) -> str:
    return html.escape(str(value))
