"""Weights tab (issue 41): did the weights land? A check run from here (a vLLM started from one
checkpoint, the other pushed into it, then every tensor against a fresh load and a logprob probe), and
the stored checks, each shown with its differing tensors first (render.weights).

The handlers are thin: the request is checked and run by the service (ParityService.weights), the
list and the view are rendered by render.weights. A check holds the engines while it runs (the
service runs one command at a time); its progress lines are not streamed here: the CLI shows them.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..core.errors import ParityError
from ..render import cards
from ..render.weights import check_choices, weights_html


class WeightsTab:
    def __init__(self, service: Any):
        self.service = service

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
        )
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

    def run(self, model: str, start: str, skip: str, sleep: Any) -> tuple[str, Any]:
        from ..service import WeightsCheckRequest

        if not (model or "").strip() or not (start or "").strip():
            return cards.error_html(
                "give the checkpoint the engine must serve and the one it starts from",
                "two model folders of the same architecture",
            ), gr.update()
        req = WeightsCheckRequest(
            model=model.strip(), start_from=start.strip(), skip=(skip or "").strip() or None, sleep=int(sleep or 0)
        )
        try:
            report = self.service.weights(req)
        except ParityError as e:  # the service stores errors as reports; anything else is shown, not raised
            return cards.error_html(e.message, e.fix), gr.update()
        rows = self.service.weight_checks(self.service.reader)
        return weights_html(report), gr.update(choices=check_choices(rows), value=report.run_id or None)
