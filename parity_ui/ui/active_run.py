"""The runs on the app's engines, whichever tab started them: runs belong to the app, not the tab.

A run (a comparison or workload, a workload's Resume, a Which setting? search) is launched through
`RunGate.launch`: its command runs on a worker thread, and its events feed its live view there, as
they come, whether or not a tab still draws it. The tab that started it draws that view while it is
open; if the tab goes (closed, reloaded), the run goes on, and every tab sees it in the bar above
the tabs (`ActiveRunBar`: its progress, "started in another tab", and Stop). Stop in any tab stops
the run on the engines. A run that waits for another (the service runs one command at a time) says
which one it waits for.

Before issue 46 item 4 a tab's handler fed the live view and held the run's place: a closed tab left
an orphan that ran on with no progress anywhere, Stop answering "Nothing of yours is running", and
the next run waiting on "Queued: waiting for the engines" with no reason.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from ..core.errors import ParityError
from ..render import cards
from ..render.markup import esc

API = "api"  # the session of a call through gradio's API (no browser tab)


def session_of(request: Any) -> str:
    return getattr(request, "session_hash", None) or API if request is not None else API


@dataclass
class ActiveRun:
    """One launched run, until its command returns."""

    session: str  # the tab that started it
    what: str  # for people: "a comparison on demo (hf vs vllm)", "Which setting? ref vs b"
    live: Any  # its live view (parity_ui.ui.live: LiveRun, WorkloadLive, BisectLive)
    started: float = field(default_factory=time.monotonic)
    events: int = 0  # events fed so far: 0 while it still waits for the engines
    followed: bool = True  # the starting tab's handler still draws it
    stop_requested: bool = False
    passed_on: bool = False

    def where(self, session: str) -> str:
        if self.session == session:
            return "started in this tab"
        return "started through the API" if self.session == API else "started in another tab"


class RunGate:
    """The app's runs, oldest first (the oldest holds the engines; the others wait for it), and the
    Run clicks of each tab. One per app: every tab's Stop acts on the same engines."""

    def __init__(self, service: Any):
        self.service = service
        self._lock = threading.RLock()
        self._runs: list[ActiveRun] = []
        self._clicked: set[str] = set()  # sessions whose Run click is queued or running

    # -- clicks ---------------------------------------------------------------------------------

    def claim(self, session: str) -> bool:
        """A Run click: True when the session has no run queued or running. Gradio drops a second
        click of the same event while the first is pending (trigger_mode "once") without a word; the
        page says so instead (CompareTab.click_note)."""
        with self._lock:
            if session in self._clicked:
                return False
            self._clicked.add(session)
            return True

    def release(self, session: str) -> None:
        with self._lock:
            self._clicked.discard(session)

    # -- runs -------------------------------------------------------------------------------------

    def head(self) -> ActiveRun | None:
        """The run on the engines now (the oldest launched), or None."""
        with self._lock:
            return self._runs[0] if self._runs else None

    def holder(self) -> str | None:
        head = self.head()
        return head.session if head is not None else None

    def launch(
        self, session: str, what: str, live: Any, work: Callable[[Callable[[Any], None]], Any]
    ) -> tuple[ActiveRun, queue.Queue]:
        """Start `work(emit)` (a service command given its event callback) on a worker thread as one of
        the app's runs. Each event feeds `live` there and then goes on the queue (a tab's handler
        redraws from it); last comes the command's result: a Run, or the exception it raised (a
        ParityError: refused before it ran)."""
        run = ActiveRun(session, what, live)
        events: queue.Queue = queue.Queue()
        with self._lock:
            self._runs.append(run)

        def emit(ev: Any) -> None:
            with self._lock:
                run.events += 1
                live.feed(ev)
                stop = run.stop_requested and not run.passed_on
                run.passed_on = run.passed_on or stop
            if stop:
                # The service lowers the Stop flag when a command begins (a Stop is for one command), so
                # a Stop pressed before its command began is passed on at its first event, once.
                self.service.cancel()
            events.put(ev)

        def body() -> None:
            try:
                result: Any = work(emit)
            except ParityError as e:  # refused before it ran: nothing stored
                result = e
            except BaseException as e:  # the commands store user and engine errors themselves: a bug guard
                traceback.print_exc(file=sys.stderr)
                result = e
            with self._lock:
                if run in self._runs:
                    self._runs.remove(run)
            events.put(result)

        threading.Thread(target=body, daemon=True, name="parity-run").start()
        return run, events

    def unfollow(self, run: ActiveRun) -> None:
        """The starting tab's handler ended (the run finished, or the tab went away)."""
        with self._lock:
            run.followed = False

    def draw(self, run: ActiveRun, fn: Callable[[Any], Any]) -> Any:
        """`fn(run.live)` while no event is being fed to it (the worker thread feeds it). A run that
        still waits for another says which, and for how long that one has run."""
        with self._lock:
            ahead = self._runs[0] if self._runs and self._runs[0] is not run else None
            if ahead is not None and run.events == 0 and hasattr(run.live, "phase"):
                run.live.phase = waiting_text(ahead, run.session)
            return fn(run.live)

    def stop(self, session: str) -> str:
        """Stop the run on the engines, whichever tab started it: what the page says."""
        with self._lock:
            run = self._runs[0] if self._runs else None
            if run is None:
                return "Nothing is running."
            run.stop_requested = True
            where = run.where(session)
        self.service.cancel()
        if where == "started in this tab":
            return "Stopping: the run is stored as cancelled."
        return f"Stopping {run.what}, {where}: it is stored as cancelled."

    def others(self, session: str) -> ActiveRun | None:
        """The run on the engines when no handler of `session` draws it (another tab's, or this
        session's whose handler ended): what the bar shows; None otherwise."""
        with self._lock:
            run = self._runs[0] if self._runs else None
            if run is None or (run.session == session and run.followed):
                return None
            return run


def _ago(t: float) -> str:
    s = time.monotonic() - t
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def waiting_text(ahead: ActiveRun, session: str) -> str:
    """What a queued run waits for: "Queued: waiting for a comparison on demo (hf vs vllm), started
    in another tab 40 s ago, to end (Stop ends it)"."""
    return f"Queued: waiting for {ahead.what}, {ahead.where(session)} {_ago(ahead.started)} ago, to end (Stop ends it)"


class ActiveRunBar:
    """Above the tabs: the run on the engines when this tab does not draw it itself (another tab
    started it, or its tab went away), with its progress and Stop. Polled every POLL_S."""

    POLL_S = 1.0

    def __init__(self, gate: RunGate):
        self.gate = gate
        self._shown: dict[str, str] = {}  # per tab, what the bar shows now (a tick that changes nothing sends nothing)

    def create_ui(self) -> None:
        with gr.Row(visible=False, elem_id="active-run") as self.row:
            self.html = gr.HTML(elem_id="active-run-progress")
            self.stop_btn = gr.Button("Stop that run", variant="secondary", scale=0, elem_id="active-stop")
        self.note = gr.HTML(elem_id="active-note")
        self.timer = gr.Timer(self.POLL_S)

    def values(self, request: gr.Request | None = None) -> dict[Any, Any]:
        session = session_of(request)
        run = self.gate.others(session)
        if run is None:
            if self._shown.pop(session, None) is None:
                return gr.skip()
            return {self.row: gr.Row(visible=False), self.html: ""}
        head = (
            f'<div class="pc-title ar-head">A run is under way, {esc(run.where(session))} '
            f"{esc(_ago(run.started))} ago: {esc(run.what)}</div>"
        )
        html = head + self.gate.draw(run, lambda live: live.progress())
        if self._shown.get(session) == html:
            return gr.skip()
        self._shown[session] = html
        return {self.row: gr.Row(visible=True), self.html: html}

    def stop(self, request: gr.Request | None = None) -> str:
        return cards.notice_html(self.gate.stop(session_of(request)))

    def create_event_handlers(self, app: Any) -> None:
        outputs = [self.row, self.html]
        self.timer.tick(self.values, None, outputs, queue=False, show_progress="hidden", api_visibility="private")
        app.load(self.values, None, outputs, queue=False, show_progress="hidden", api_visibility="private")
        self.stop_btn.click(self.stop, None, self.note, queue=False, api_visibility="private")
