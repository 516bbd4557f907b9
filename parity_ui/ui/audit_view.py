"""An audit's view in the app, shared by the Audit tab (after an audit ran) and History (an audit opened):
its verdict card and its axes x prompts grid (parity_ui.render.audit), where a broken cell, or an axis's
first break, opens that axis's pair run in the tab's token view, at the break, marked (the page's script
writes `side|axis|prompt` into the off-screen box and presses the off-screen button: one server call).

Reading one costs the audit's record (store.audit_of) only; the pair run is read when a cell is clicked.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..core.audit_record import KIND, AuditReport, axis_label
from ..render import cards
from ..render.audit import audit_view_html
from .recent import Recent
from .result_view import ResultView


def parse_pick(value: Any) -> tuple[str, str, int] | None:
    """What a clicked cell wrote: "side|axis|prompt"."""
    parts = str(value or "").strip().split("|")
    if len(parts) != 3:
        return None
    try:
        return parts[0], parts[1], int(parts[2])
    except ValueError:
        return None


def break_note(report: AuditReport, run_id: str, side: str, axis: str, prompt: int) -> str:
    """What the token view opened on: the axis, the prompt's break, and the commands that go on from it."""
    r = report.result(side, axis)
    if r is None:
        return ""
    cell = next((c for c in r.cells if c.prompt == prompt), None)
    brk = cell.brk if cell is not None else None
    what = brk.describe() if brk is not None else f"prompt {prompt}: {cell.status if cell else 'not compared'}"
    lines = [
        f"Audit {run_id}, side {side}, {axis_label(axis)}: {what}.",
        f"a: {r.a}; b: {r.b}. The panes open at the break's token, marked.",
    ]
    lines += [f"Go on: {c}" for c in r.commands]
    return cards.notice_html(" ".join(lines))


class AuditView:
    """The components (create_ui() inside a Blocks, before the tab's ResultView: a break's tokens show
    under the grid). `runner`: the app's AppService (reads)."""

    KEEP = 4

    def __init__(self, prefix: str, runner: Any, result_view: ResultView):
        self.prefix, self.runner, self.result_view = prefix, runner, result_view
        self._pairs = Recent(self.KEEP)

    @property
    def store(self) -> Any:
        return self.runner.reader

    def create_ui(self) -> None:
        p = self.prefix
        with gr.Column(visible=False, elem_id=f"{p}-au-box") as self.box:
            self.grid = gr.HTML(elem_id=f"{p}-au")
            self.pick = gr.Textbox(
                show_label=False, container=False, elem_id=f"{p}-au-pick", elem_classes=["pc-offscreen"]
            )
            self.pick_btn = gr.Button("open the break", elem_id=f"{p}-au-open", elem_classes=["pc-offscreen"])
        self.run_id = gr.State(None)

    @property
    def outputs(self) -> list[Any]:
        return [self.box, self.grid, self.run_id]

    def hidden(self) -> dict[Any, Any]:
        return {self.box: gr.Column(visible=False), self.grid: "", self.run_id: None}

    def failed(self, message: str) -> dict[Any, Any]:
        return {
            self.box: gr.Column(visible=True),
            self.grid: cards.error_html(
                message, "the run's other views still show", "The audit view could not be built"
            ),
            self.run_id: None,
        }

    def values(self, run_id: str | None) -> dict[Any, Any]:
        """The audit `run_id` (hidden for any other run)."""
        run_id = str(run_id or "").strip()
        if not run_id:
            return self.hidden()
        state = self.store.run_state(run_id)
        report = self.runner.audit_report(run_id, self.store) if state is not None else None
        if report is None or not report.results:  # an audit refused before any axis: its run's error shows
            return self.hidden()
        return {
            self.box: gr.Column(visible=True),
            self.grid: audit_view_html(report, run_id, pick=self.prefix),
            self.run_id: run_id,
        }

    def show(self, run_id: str | None) -> dict[Any, Any]:
        """History's open: an audit's view, or nothing for another kind of run (one read of its row)."""
        run = self.store.get_run(str(run_id or "").strip(), prompts=[]) if run_id else None
        return self.values(run_id) if run is not None and run.kind == KIND else self.hidden()

    def open_break(self, run_id: str | None, pick: str | None) -> dict[Any, Any]:
        """A clicked cell: its axis's pair run in the token view, at that prompt's break, marked."""
        picked = parse_pick(pick)
        if picked is None or not run_id:
            return gr.skip()
        side, axis, prompt = picked
        report = self.runner.audit_report(str(run_id), self.store)
        r = report.result(side, axis) if report is not None else None
        if r is None or r.pair_run is None:
            return self.result_view.error_values(
                f"side {side}, {axis_label(axis)}: no stored pair of streams",
                "an axis stores its two streams only when it broke",
            )
        j = r.pair_index(prompt)
        pair = self._pairs.get(r.pair_run, lambda: self.store.get_run(r.pair_run), keep=lambda x: x is not None)
        if pair is None or j is None:
            return self.result_view.error_values(
                f"the pair run {r.pair_run} of side {side}, {axis_label(axis)} has no prompt {prompt}",
                "pick a broken cell of the grid",
            )
        cell = next((c for c in r.cells if c.prompt == prompt), None)
        focus = cell.brk.token if cell is not None and cell.brk is not None else None
        other = pair.sides[1].name if len(pair.sides) > 1 else None
        out = self.result_view.values(pair, j, other, plots=False, focus=focus)
        out[self.result_view.summary] = (
            break_note(report, str(run_id), side, axis, prompt) + out[self.result_view.summary]
        )
        return out

    def create_event_handlers(self) -> None:
        self.pick_btn.click(
            self.open_break,
            [self.run_id, self.pick],
            self.result_view.outputs,
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            show_progress="hidden",
            trigger_mode="always_last",
        )
