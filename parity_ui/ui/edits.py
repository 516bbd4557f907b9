"""Text fields that reach the server when they are left (or on Enter), not on every key.

A handler wired to every keystroke is a server round trip per key (re-render the YAML, re-check
the config, recount the prompt); on a busy machine they queue up behind each other and the page
lags by seconds. The fields below write when the user leaves them instead. What makes that safe
is knowing whether a field holds edits the server has not had yet: the page counts keystrokes
itself (a script-only event, no server call), and each write records the count it wrote.
"""

from __future__ import annotations

import threading
from typing import Any

import gradio as gr

COUNT_JS = "(n) => (n || 0) + 1"


def pending(edits: int | float | None, synced: int | float | None) -> bool:
    """Whether there are keystrokes (`edits`) past the count last written (`synced`)."""
    return int(edits or 0) > int(synced or 0)


class EditCounter:
    """Two hidden numbers the page keeps: keystrokes in some fields, and the count last written.
    Build it inside the layout; `count(fields)` before wiring the events that write."""

    def __init__(self, name: str):
        self.edits = gr.Number(0, precision=0, visible=False, elem_id=f"{name}-edits")
        self.synced = gr.Number(0, precision=0, visible=False, elem_id=f"{name}-synced")

    def count(self, fields: list[Any]) -> None:
        """Each user edit of `fields` bumps `edits`, in the page. Wire this before a write that the
        same event triggers (a pick in a dropdown): gradio runs one event's listeners in order, so
        that write reads the count that includes the pick."""
        for field in fields:
            field.input(None, [self.edits], [self.edits], js=COUNT_JS, api_name=False)

    @staticmethod
    def caught_up(edits: int | float | None) -> int:
        """The value for `synced` after a write of everything the fields hold."""
        return int(edits or 0)


class WriteOrder:
    """The newest edit count written, per browser session, kept in the server. Two writes of the
    same fields can be in flight at once (the page starts a second before it has registered the
    first as running, and a busy server may finish them in either order); each carries the count
    it read with the values. A write older than one already done would put older values back and
    move `synced` backwards, so it is dropped: `newer` says whether a write may go ahead, and
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
