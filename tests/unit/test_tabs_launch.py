"""The Audit and Weights tabs launch their runs as the Compare tab does (issue 46 item 4 across the tabs
the audit and weights merges added): through the app's RunGate, on a worker thread, so a run whose tab
went away goes on, every other tab sees it in the bar above the tabs and can stop it, and a refusal
before any side started is shown, not stored. A service that holds its one command lock and counts
Stops: no engine (the tabs' own Chromium tests run the real thing)."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("gradio")

import gradio as gr  # noqa: E402

from parity_ui.core.errors import PromptError  # noqa: E402
from parity_ui.core.runlog import RunEvent  # noqa: E402
from parity_ui.ui.active_run import ActiveRunBar, RunGate  # noqa: E402
from parity_ui.ui.audit_tab import AuditTab  # noqa: E402
from parity_ui.ui.weights_tab import WeightsTab  # noqa: E402


class Service:
    """What the tabs call: audit and weights block until `release`, saying where they are first."""

    def __init__(self):
        self.cancels = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.began = threading.Event()
        self.refusals: list[bool] = []
        self.reader = None

    def cancel(self):
        self.cancels += 1

    def _work(self, emit, refuse, first_line, result):
        self.refusals.append(refuse)
        with self.lock:
            emit(RunEvent("status", first_line))
            self.began.set()
            self.release.wait(30)
            if isinstance(result, BaseException):
                raise result
            return result

    def audit(self, req, on_event=None, *, refuse=False):
        over = PromptError("1 of the 3 prompts do not fit the context of 64 positions", "drop or shorten them")
        return self._work(on_event, refuse, "ref: replay (the prompts in one full batch, twice)", over)

    def weights(self, req, on_event=None, *, refuse=False):
        return self._work(on_event, refuse, "digesting every tensor of the fresh load and of the updated engine", "r")

    def weight_checks(self, store=None):
        return []


def _request(session):
    return type("Request", (), {"session_hash": session})()


def _bar(gate):
    bar = ActiveRunBar(gate)
    with gr.Blocks():
        bar.create_ui()
    return bar


def test_an_audit_is_one_of_the_apps_runs_seen_and_stopped_from_another_tab_and_a_refusal_is_shown():
    svc = Service()
    gate = RunGate(svc)
    tab = AuditTab(svc, gate)
    with gr.Blocks():
        tab.create_ui()
    bar = _bar(gate)
    handler = tab.run("demo", False, "ref=hf,dtype=float32", "max_new_tokens=4", 3, 60, 0, None, ["replay"], False,
                      _request("tab-a"))
    next(handler)  # launched
    assert svc.began.wait(30) and svc.refusals == [True]  # the app's audit refuses (stores nothing)
    run = gate.head()
    assert run is not None and run.what == "an audit of ref on demo" and run.session == "tab-a"
    html = bar.values(_request("tab-b"))[bar.html]
    assert "A run is under way, started in another tab" in html and "an audit of ref on demo" in html
    assert "ref: replay" in html  # its progress, fed by the run itself
    assert "started in another tab" in gate.stop("tab-b") and svc.cancels == 1  # any tab's Stop reaches it
    svc.release.set()
    last = list(handler)[-1]
    assert "Audit refused" in last[tab.progress] and "do not fit the context" in last[tab.progress]
    assert gate.head() is None


def test_a_weight_check_goes_on_when_its_tab_goes_and_the_other_tabs_see_it():
    svc = Service()
    gate = RunGate(svc)
    tab = WeightsTab(svc, gate)
    with gr.Blocks():
        tab.create_ui()
    bar = _bar(gate)
    handler = tab.run("./step-200", "./step-100", "", 0, _request("tab-a"))
    next(handler)
    assert svc.began.wait(30) and svc.refusals == [True]
    run = gate.head()
    assert run is not None and run.what == "a weight check of ./step-200 (from ./step-100)"
    assert gate.others("tab-a") is None  # tab A draws it itself: its bar shows nothing
    handler.close()  # tab A went away: its handler ends, the check goes on
    assert gate.head() is run and gate.others("tab-a") is run
    html = bar.values(_request("tab-a"))[bar.html]
    assert "a weight check of ./step-200" in html and "digesting every tensor" in html
    svc.release.set()
    for _ in range(300):
        if gate.head() is None:
            break
        threading.Event().wait(0.1)
    assert gate.head() is None
