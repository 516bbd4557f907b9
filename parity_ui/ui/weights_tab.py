"""Weights tab (issue 41): did the weights land? A check run from here (a vLLM started from one
checkpoint, the other pushed into it, then every tensor against a fresh load and a logprob probe), and
the stored checks, each shown with its differing tensors first (render.weights).

The handlers are thin: the request is checked and run by the service (ParityService.weights), the
list and the view are rendered by render.weights. A check is one of the app's runs
(active_run.RunGate.launch): it runs on a worker thread, holds the engines while it runs (the service
runs one command at a time; a run ahead of it is named), draws its status lines here, goes on if this
tab goes, and every tab sees it and can stop it (the bar above the tabs). Bad input is refused before
an engine starts, shown and not stored (issue 46 item 5).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gradio as gr

from ..core.errors import ParityError
from ..core.weights import WeightReport
from ..render import cards
from ..render.weights import check_choices, weights_html
from .active_run import session_of
from .live import StatusLive, follow

THROTTLE_S = 0.5


class WeightsTab:
    def __init__(self, service: Any, gate: Any):
        self.service, self.gate = service, gate

    def create_ui(self) -> None:
        with gr.Tab("Weights", id="weights"):
            gr.Markdown(
                "A vLLM engine starts from one checkpoint, receives another's weights through vLLM's own update "
                "path (as an RL trainer pushes them), and every tensor is compared with the same checkpoint "
                "loaded fresh, plus a short teacher-forced probe against the noise floor."
            )
            with gr.Row():
                self.model = gr.Textbox(label="Model the engine must serve (B)", scale=3, elem_id="wt-model")
                self.start = gr.Textbox(label="Engine starts from (A)", scale=3, elem_id="wt-from")
                self.skip = gr.Textbox(label="Leave out (regex, optional)", scale=2, elem_id="wt-skip")
                self.sleep = gr.Dropdown(label="Sleep level", choices=[0, 1, 2], value=0, scale=1, elem_id="wt-sleep")
                self.run_btn = gr.Button("Check weights", variant="primary", scale=1, elem_id="wt-run")
                self.stop_btn = gr.Button("Stop", variant="secondary", scale=0, elem_id="wt-stop")
            with gr.Row():
                self.stored = gr.Dropdown(
                    label="Stored weight checks (newest first)", choices=[], value=None, scale=5, elem_id="wt-stored"
                )
                self.refresh_btn = gr.Button("Refresh", scale=1, elem_id="wt-refresh")
            self.view = gr.HTML(elem_id="wt-view")

    def create_event_handlers(self, app: gr.Blocks) -> None:
        self.run_btn.click(
            self.run,
            [self.model, self.start, self.skip, self.sleep],
            [self.view, self.stored],
            api_visibility="private",
            concurrency_limit=1,
            concurrency_id="engines",
        )
        self.stop_btn.click(self.stop, None, self.view, queue=False, api_visibility="private")
        self.refresh_btn.click(self.choices, None, self.stored, api_visibility="private")
        self.stored.change(self.show, self.stored, self.view, api_visibility="private")
        app.load(self.choices, None, self.stored, api_visibility="private")

    def choices(self) -> Any:
        return gr.update(choices=check_choices(self.service.weight_checks(self.service.reader)))

    def show(self, run_id: str | None) -> str:
        if not run_id:
            return ""
        report = self.service.weight_report(run_id, self.service.reader)
        if report is None:
            return cards.error_html(f"no weight check {run_id!r} in this database", "pick one from the list")
        return weights_html(report)

    def stop(self, request: gr.Request | None = None) -> str:
        """Stop the run on the engines, whichever tab started it."""
        return cards.notice_html(self.gate.stop(session_of(request)))

    def run(
        self, model: str, start: str, skip: str, sleep: Any, request: gr.Request | None = None
    ) -> Iterator[tuple[str, Any]]:
        from ..service import WeightsCheckRequest

        if not (model or "").strip() or not (start or "").strip():
            yield (
                cards.error_html(
                    "give the checkpoint the engine must serve and the one it starts from",
                    "two model folders of the same architecture",
                ),
                gr.update(),
            )
            return
        req = WeightsCheckRequest(
            model=model.strip(), start_from=start.strip(), skip=(skip or "").strip() or None, sleep=int(sleep or 0)
        )
        live = StatusLive(f"Checking the weights of {req.model} pushed into a vLLM started from {req.start_from}")
        what = f"a weight check of {req.model} (from {req.start_from})"
        active, events = self.gate.launch(
            session_of(request), what, live, lambda emit: self.service.weights(req, emit, refuse=True)
        )
        try:
            yield self.gate.draw(active, lambda live: live.progress()), gr.update()
            for item in follow(events, lambda ev: None, THROTTLE_S):
                if item is None:
                    yield self.gate.draw(active, lambda live: live.progress()), gr.update()
                    continue
                if isinstance(item, ParityError):  # refused before an engine started: shown, not stored
                    yield cards.error_html(item.message, item.fix, "Weight check refused"), gr.update()
                    return
                if not isinstance(item, WeightReport):  # the service stores errors as reports: a bug guard
                    yield (
                        cards.error_html(
                            f"internal error: {type(item).__name__}: {item}",
                            "the app keeps serving; please report this",
                        ),
                        gr.update(),
                    )
                    return
                rows = self.service.weight_checks(self.service.reader)
                yield weights_html(item), gr.update(choices=check_choices(rows), value=item.run_id or None)
                return
        finally:  # the check goes on if this tab went away: every tab's bar then shows it
            self.gate.unfollow(active)
