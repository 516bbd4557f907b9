"""The view of one stored run (summary, token panes, plots), shared by Compare and History so a
run reopened later looks exactly as it did when it finished."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..types import Run
from . import cards, plots
from .tokens import panes_html


def prompt_choices(run: Run) -> list[tuple[str, int]]:
    out = []
    for p in run.prompts:
        c = p.comparison
        state = "—" if c is None else ("identical" if c.identical else f"diverged at {c.first_divergence}")
        out.append((f"prompt {p.index}: {state}", p.index))
    return out


def view_parts(run: Run, prompt_index: int = 0) -> dict[str, Any]:
    """Everything the view shows for `run`, as plain values (HTML strings and figures)."""
    idx = prompt_index if 0 <= prompt_index < len(run.prompts) else 0
    parts: dict[str, Any] = {"summary": cards.run_summary_html(run, idx), "panes": "", "logprob": None,
                             "margin": None, "batch": None}
    if not run.prompts:
        return parts
    p = run.prompts[idx]
    v = p.vllm.steps if p.vllm else []
    h = p.hf.steps if p.hf else []
    if v or h:
        div = p.comparison.first_divergence if p.comparison else None
        parts["panes"] = panes_html(v, h, divergence=div)
        parts["logprob"] = plots.logprob_figure(p)
        parts["margin"] = plots.margin_figure(p)
    if len(run.prompts) > 1:
        parts["batch"] = plots.batch_figure(run)
    return parts


@dataclass
class ResultView:
    """The components; create_ui() must be called inside a Blocks context."""

    prefix: str

    def create_ui(self) -> None:
        self.summary = gr.HTML(elem_id=f"{self.prefix}-summary")
        self.prompt_pick = gr.Dropdown(label="Prompt of this batch", choices=[], visible=False,
                                       interactive=True, elem_id=f"{self.prefix}-prompt-pick")
        self.panes = gr.HTML(elem_id=f"{self.prefix}-panes")
        self.batch_plot = gr.Plot(visible=False, show_label=False)
        with gr.Row():
            self.logprob_plot = gr.Plot(visible=False, show_label=False)
            self.margin_plot = gr.Plot(visible=False, show_label=False)

    @property
    def outputs(self) -> list[Any]:
        return [self.summary, self.prompt_pick, self.panes, self.logprob_plot, self.margin_plot, self.batch_plot]

    def values(self, run: Run | None, prompt_index: int = 0, message: str = "") -> tuple:
        """Output values for `outputs`; `run=None` shows `message` instead."""
        if run is None:
            hidden = gr.Plot(visible=False, value=None)
            return (cards.notice_html(message) if message else "", gr.Dropdown(visible=False),
                    "", hidden, hidden, hidden)
        parts = view_parts(run, prompt_index)
        many = len(run.prompts) > 1
        pick = gr.Dropdown(choices=prompt_choices(run), value=prompt_index, visible=many)
        return (parts["summary"], pick, parts["panes"],
                gr.Plot(value=parts["logprob"], visible=parts["logprob"] is not None),
                gr.Plot(value=parts["margin"], visible=parts["margin"] is not None),
                gr.Plot(value=parts["batch"], visible=parts["batch"] is not None))

    def error_values(self, message: str, fix: str = "") -> tuple:
        hidden = gr.Plot(visible=False, value=None)
        return (cards.error_html(message, fix), gr.Dropdown(visible=False), "", hidden, hidden, hidden)
