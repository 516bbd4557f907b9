"""Text fields that reach the server when they are left (or on Enter), not on every key.

A handler wired to every keystroke is a server round trip per key (re-render the YAML, re-check
the config, recount the prompt); on a busy machine they queue up behind each other and the page
lags by seconds. The fields below write when the user leaves them instead; whether a field holds
edits the YAML has not had yet is decided by comparing contents (parity_ui.ui.sides_panel), never
by counting events: a count kept in the page lags the event that should read it. The page's count
of keystrokes (a script-only event, no server call) still orders two writes in flight: it only
grows, so a write that read a smaller count read older fields.
"""

from __future__ import annotations

import threading
from typing import Any

import gradio as gr

COUNT_JS = "(n) => (n || 0) + 1"


class EditCounter:
    """A hidden number the page keeps: keystrokes in some fields, an order for writes (WriteOrder).
    Build it inside the layout; `count(fields)` before wiring the events that write."""

    def __init__(self, name: str):
        self.edits = gr.Number(0, precision=0, visible=False, elem_id=f"{name}-edits")

    def count(self, fields: list[Any]) -> None:
        """Each user edit of `fields` bumps `edits`, in the page. Wire this before a write that the
        same event triggers (a pick in a dropdown): gradio runs one event's listeners in order, so
        that write reads the count that includes the pick."""
        for field in fields:
            field.input(None, [self.edits], [self.edits], js=COUNT_JS, api_name=False)


class WriteOrder:
    """The newest edit count written, per browser session, kept in the server. Two writes of the
    same fields can be in flight at once (the page starts a second before it has registered the
    first as running, and a busy server may finish them in either order); each carries the count
    it read with the values. A write older than one already done would put older values back, so it
    is dropped: `newer` says whether a write may go ahead, and
    records it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}

    def newer(self, session: str | None, edits: int | float | None) -> bool:
        n = int(edits or 0)
        with self._lock:
            if n < self._written.get(session or "", -1):
                return False
            self._written[session or ""] = n
            return True
