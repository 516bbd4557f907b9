"""Runs belong to the app, not the tab (issue 46 item 4): a run whose tab went away goes on and every
other tab sees it (its progress, who started it) and can stop it; a run that waits for it says which
run it waits for. The gate above the engines, with a service that only counts Stops: no engine."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("gradio")

from parity_ui.core.runlog import RunEvent  # noqa: E402
from parity_ui.ui.active_run import ActiveRunBar, RunGate  # noqa: E402
from parity_ui.ui.live import LiveRun  # noqa: E402


class Service:
    def __init__(self):
        self.cancels = 0
        self.lock = threading.Lock()  # one command at a time, as ParityService

    def cancel(self):
        self.cancels += 1


def _wait(events, kind="token"):
    while True:
        item = events.get(timeout=30)
        if not isinstance(item, RunEvent) or item.kind == kind:
            return item


def test_a_run_whose_tab_went_away_is_seen_stopped_and_waited_for_from_another_tab():
    svc = Service()
    gate = RunGate(svc)
    go_on, stopped = threading.Event(), threading.Event()

    def first(emit):
        with svc.lock:
            emit(RunEvent("status", message="preparing: tokenizing"))
            emit(RunEvent("token", side="hf", prompt_index=0, step=None))
            go_on.wait(30)
            return "first done"

    run, events = gate.launch("tab-a", "a comparison of 1 prompt on demo (hf vs vllm)", LiveRun(["hf", "vllm"], 1, 8),
                              first)
    assert _wait(events).kind == "token"
    # Tab A's handler draws it: A's bar shows nothing, B's shows it, started in another tab.
    assert gate.others("tab-a") is None and gate.others("tab-b") is run
    gate.unfollow(run)  # tab A closed: its handler ended, the run goes on
    assert gate.others("tab-a") is run and gate.head() is run
    bar = ActiveRunBar(gate)
    import gradio as gr

    with gr.Blocks():
        bar.create_ui()
    shown = bar.values(type("R", (), {"session_hash": "tab-b"})())
    html = shown[bar.html]
    assert "A run is under way, started in another tab" in html and "hf vs vllm" in html
    assert "Preparing" in html  # its live progress, fed by the run itself with no tab drawing it
    # A run from tab B waits for it, and says which run it waits for.
    second_started = threading.Event()

    def second(emit):
        with svc.lock:
            second_started.set()
            emit(RunEvent("status", message="preparing: tokenizing"))
            return "second done"

    queued, qevents = gate.launch("tab-b", "a comparison of 1 prompt on demo (hf vs b)", LiveRun(["hf", "b"], 1, 8),
                                  second)
    waiting = gate.draw(queued, lambda live: live.progress())
    assert "Queued: waiting for a comparison of 1 prompt on demo (hf vs vllm), started in another tab" in waiting
    assert "Stop ends it" in waiting
    # Stop in tab B stops the run on the engines, whichever tab started it, and says whose it is.
    said = gate.stop("tab-b")
    assert svc.cancels == 1 and "started in another tab" in said and "hf vs vllm" in said
    go_on.set()
    assert _wait(events, "never") == "first done"
    assert _wait(qevents, "never") == "second done" and second_started.is_set()
    assert gate.head() is None and gate.stop("tab-b") == "Nothing is running."
    # The Stop was for the first run: the second, begun after it, was not passed the Stop.
    assert svc.cancels == 1


def test_a_stop_pressed_before_a_run_began_its_command_is_passed_on_once():
    svc = Service()
    gate = RunGate(svc)
    release = threading.Event()

    def work(emit):
        release.wait(30)
        emit(RunEvent("status", message="preparing"))  # the command began: the service lowered its flag
        emit(RunEvent("status", message="starting the sides"))
        return "done"

    run, events = gate.launch("tab-a", "a run", LiveRun(["a", "b"], 1, 8), work)
    assert gate.stop("tab-a") == "Stopping: the run is stored as cancelled." and svc.cancels == 1
    release.set()
    assert _wait(events, "never") == "done"
    assert svc.cancels == 2  # passed on at its first event, once
