"""The view of a workload run, shared by Compare (after a workload ran) and History (when one is
opened): its card (headline, each side's verdict against the floor), the survival curve and the
|Δlogprob| histograms, the figures table, and the prompt table whose rows open a prompt's token view
(the tab's ResultView, that one prompt read alone). A stopped or failed workload has Resume.

Opening one reads the run's header (its pooled report, histograms included) and its pair rows
(store.pair_rows): no logprob and no token step, whatever the workload's size. The prompt table is
sorted in the page (parity_ui.render.assets), not by a server call per click.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..core.errors import ParityError
from ..core.replay_record import RECORDED, ReplayRow
from ..core.types import Run
from ..render import cards
from ..render.sections import workload_html
from ..render.sections.replay_pairs import token_note
from ..render.workload import (
    EAGER_TABLE_ROWS,
    PromptRow,
    figures_table_html,
    histogram_svg,
    prompt_rows,
    prompt_table_html,
    replay_table_labels,
    resumable,
    survival_svg,
    workload_card_html,
)
from .active_run import session_of
from .live import WorkloadLive, follow
from .recent import Recent
from .result_view import ResultView

THROTTLE_S = 0.25


@dataclass
class WorkloadData:
    """What the view shows of a workload: its header (no prompt rows) and one row per prompt."""

    run: Run
    rows: list[PromptRow]


def read_workload(store: Any, run_id: str) -> WorkloadData | None:
    """The stored workload's header and prompt rows (through the store the runner hands out); None
    when there is no such run or it is not a workload with a report (a workload that failed before
    it started has none: a plain error run)."""
    run = store.get_run(run_id, prompts=[])
    if run is None or run.workload is None:
        return None
    return WorkloadData(run, prompt_rows(store.pair_rows(run_id), store.prompt_excerpts(run_id)))


def prompt_view(run: Run) -> Run:
    """A workload's prompt read alone (Store.get_run(id, prompts=[i])), as the token view shows
    it: judged by its own comparisons, not by the workload's pooled figures."""
    div = any(not c.identical for p in run.prompts for c in p.comparisons)
    status = (
        ("diverged" if div else "ok")
        if run.status in ("ok", "diverged", "cancelled", "error", "interrupted")
        else run.status
    )
    return dataclasses.replace(run, workload=None, status=status, error=None, error_code=None)


def read_for_view(store: Any, run_id: str, prompt_index: int) -> Run | None:
    """The run a token view shows: a workload's prompt `prompt_index` alone (prompt_view), any other
    run whole."""
    if store.is_workload(run_id):
        run = store.get_run(run_id, prompts=[int(prompt_index)])
        return prompt_view(run) if run is not None and run.prompts else None
    return store.get_run(run_id)


def _picked(value: Any) -> tuple[int, int | None] | None:
    """What a clicked row wrote: "12" (a prompt) or "12@5" (a replay's worst token: row 12, token 5)."""
    text = str(value or "").strip()
    row, _, at = text.partition("@")
    try:
        return int(row), (int(at) if at else None)
    except ValueError:
        return None


class WorkloadView:
    """The components (create_ui() inside a Blocks, before the tab's ResultView: the token view of a
    prompt shows under the workload). `runner`: the app's AppService (reads, Resume); `gate`: the
    RunGate of the engines (Stop)."""

    KEEP = 4  # finished workloads' views kept built: History and Compare reopen the same one

    def __init__(self, prefix: str, runner: Any, gate: Any, result_view: ResultView):
        self.prefix, self.runner, self.gate, self.result_view = prefix, runner, gate, result_view
        self.built = Recent(self.KEEP)
        self._prompts = Recent(self.KEEP)  # prompt runs read alone, by (run id, index)

    @property
    def store(self) -> Any:
        return self.runner.reader

    # -- layout ---------------------------------------------------------------------------------

    def create_ui(self) -> None:
        p = self.prefix
        with gr.Column(visible=False, elem_id=f"{p}-wl") as self.box:
            self.card = gr.HTML(elem_id=f"{p}-wl-card")
            with gr.Row():
                self.resume_btn = gr.Button(
                    "Resume: run the prompts not done yet",
                    visible=False,
                    size="sm",
                    variant="primary",
                    elem_id=f"{p}-wl-resume",
                    scale=3,
                )
                self.stop_btn = gr.Button(
                    "Stop", visible=False, size="sm", variant="stop", elem_id=f"{p}-wl-stop", scale=1
                )
            self.progress = gr.HTML(elem_id=f"{p}-wl-progress")
            with gr.Row(equal_height=False):
                # Inline SVG (render.workload, as the static report draws them), not plotly: two plotly
                # figures cost the page 0.3-0.5 s of drawing on 2 busy cores (#33 item 6).
                self.survival_plot = gr.HTML(visible=False, elem_id=f"{p}-wl-survival")
                self.hist_plot = gr.HTML(visible=False, elem_id=f"{p}-wl-hist")
            self.figures = gr.HTML(elem_id=f"{p}-wl-figures")
            self.replay = gr.HTML(
                elem_id=f"{p}-wl-replay"
            )  # a replay's pairs and worst tokens (render.sections.replay_pairs)
            self.table = gr.HTML(elem_id=f"{p}-wl-prompts")
            # A row clicked in the table writes its prompt here and presses the button (the page's
            # script; both off screen): one server call opens that prompt's token view.
            self.pick = gr.Textbox(
                show_label=False, container=False, elem_id=f"{p}-wl-pick", elem_classes=["pc-offscreen"]
            )
            self.pick_btn = gr.Button("open the prompt", elem_id=f"{p}-wl-open", elem_classes=["pc-offscreen"])
        self.run_id = gr.State(None)

    @property
    def outputs(self) -> list[Any]:
        return [
            self.box,
            self.card,
            self.resume_btn,
            self.stop_btn,
            self.progress,
            self.survival_plot,
            self.hist_plot,
            self.figures,
            self.replay,
            self.table,
            self.run_id,
        ]

    # -- values ---------------------------------------------------------------------------------

    def hidden(self) -> dict[Any, Any]:
        """No workload shown."""
        return {
            self.box: gr.Column(visible=False),
            self.card: "",
            self.resume_btn: gr.Button(visible=False),
            self.stop_btn: gr.Button(visible=False),
            self.progress: "",
            self.survival_plot: gr.HTML(visible=False, value=""),
            self.hist_plot: gr.HTML(visible=False, value=""),
            self.figures: "",
            self.replay: "",
            self.table: "",
            self.run_id: None,
        }

    def failed(self, message: str) -> dict[Any, Any]:
        """The view's place when it could not be built: the error, nothing else (History's open)."""
        return {
            **self.hidden(),
            self.box: gr.Column(visible=True),
            self.progress: cards.error_html(
                message, "the run's other views still show; please report this", "The workload view could not be built"
            ),
        }

    def parts(self, run_id: str, reveal: bool = False) -> dict[str, Any] | None:
        """The view's parts (HTML and figures) of a stored workload, built once per stored state (a
        stopped workload resumed, here or by the CLI, is built again); None when `run_id` is not a
        workload with a report."""
        state = self.store.run_state(run_id)
        if state is None:
            return None

        def build() -> dict[str, Any] | None:
            data = read_workload(self.store, run_id)
            if data is None:
                return None
            run, w = data.run, data.run.workload
            assert w is not None  # read_workload returns only a workload with a report
            floor = w.floor_figures.side if w.floor_figures else None
            return {
                "run": run,
                "card": workload_card_html(run, reveal=reveal),
                # A replay forces the run's own tokens: no side forks, so no survival curve.
                "survival": None if w.replay else survival_svg(run) or None,
                "hist": histogram_svg(w) or None,
                "figures": figures_table_html(w),
                "replay": workload_html(w, pick=self.prefix),  # a replay's pairs and worst tokens
                "table": prompt_table_html(
                    data.rows,
                    list(w.sides),
                    pick=self.prefix,
                    floor=floor,
                    eager=EAGER_TABLE_ROWS,
                    **replay_table_labels(w),
                ),
            }

        return self.built.get(
            (run_id, state, reveal), build, keep=lambda parts: parts is not None and parts["run"].status != "running"
        )

    def values(self, run_id: str | None, reveal: bool = False) -> dict[Any, Any]:
        """Every component of `outputs`: the workload `run_id`, or hidden when it is not one."""
        run_id = str(run_id or "").strip()
        parts = self.parts(run_id, reveal) if run_id else None
        if parts is None:
            return self.hidden()
        return {
            self.box: gr.Column(visible=True),
            self.card: parts["card"],
            self.resume_btn: gr.Button(visible=resumable(parts["run"])),
            self.stop_btn: gr.Button(visible=False),
            self.progress: "",
            self.survival_plot: gr.HTML(value=parts["survival"] or "", visible=parts["survival"] is not None),
            self.hist_plot: gr.HTML(value=parts["hist"] or "", visible=parts["hist"] is not None),
            self.figures: parts["figures"],
            self.replay: parts["replay"],
            self.table: parts["table"],
            self.run_id: run_id,
        }

    def show(self, run_id: str | None) -> dict[Any, Any]:
        """The workload `run_id` (or nothing, for any other run): what an opened run shows."""
        return self.values(run_id)

    def revealed(self, run_id: str | None) -> dict[Any, Any]:
        """As `show`, its card brought into view: a workload that just finished in this page."""
        return self.values(run_id, reveal=True)

    def prompt_run(self, run_id: str, index: int) -> Run | None:
        """The workload's prompt `index` read alone, as the token view shows it (kept while recent)."""

        def read() -> Run | None:
            run = self.store.get_run(run_id, prompts=[index])
            done = run is not None and run.prompts and run.prompts[0].results
            return prompt_view(run) if done else None

        return self._prompts.get((run_id, index), read, keep=lambda run: run is not None)

    def open_prompt(self, run_id: str | None, index: str | None) -> dict[Any, Any]:
        """A row of the prompt table clicked: that prompt's token view (the tab's ResultView)."""
        picked = _picked(index)
        if picked is None:
            return gr.skip()
        i, at = picked
        run = self.prompt_run(str(run_id or ""), i) if run_id else None
        if run is None:
            return self.result_view.error_values(
                f"prompt {i} of run {run_id} has no stored tokens",
                "pick another prompt (a prompt skipped as too long, or not done yet when the run stopped, has none)",
            )
        if run.kind == "replay":  # the trainer against the recorded rollout first, where the row has it
            side = _replay_side(run)
            out = self.result_view.values(run, i, side, plots=False, focus=at)  # opened (and marked) at its token
            parts = self.parts(run.id)
            record = parts["run"].workload.replay if parts else None
            row = replay_row(run, i)
            note = cards.notice_html(token_note(run.id, row, at, record.worst_tokens if record else []))
        else:
            out = self.result_view.values(run, i, plots=False)  # the figures follow (prompt_figures)
            note = cards.notice_html(f"Prompt {i} of workload {run.id}: its tokens, each side against the reference.")
        out[self.result_view.summary] = note + out[self.result_view.summary]
        return out

    def prompt_figures(self, run_id: str | None, index: str | None) -> dict[Any, Any]:
        """The opened prompt's figures, sent after its panes (open_prompt): the panes show without
        waiting for two plotly figures to be built, sent and drawn (#33 item 6)."""
        picked = _picked(index)
        if picked is None:
            return gr.skip()
        run = self.prompt_run(str(run_id or ""), picked[0]) if run_id else None
        # The same side the panes' selector shows (a replay's: the recorded rollout), not the first one.
        return self.result_view.plot_values(run, picked[0], _replay_side(run) if run is not None else None)

    # -- Resume ---------------------------------------------------------------------------------

    def resume(self, run_id: str | None, request: gr.Request | None = None) -> Iterator[dict[Any, Any]]:
        """Go on with a stopped or failed workload (workload.run.resume_workload) in a worker thread,
        its progress shown as it goes; then the view of the run as it now stands."""
        run_id = str(run_id or "").strip()
        if not run_id:
            yield gr.skip()
            return
        before = self.parts(run_id)
        w = before["run"].workload if before else None
        live = WorkloadLive(w.n_prompts if w else 0, (w.options.source.get("description") or "") if w else "")
        active, events = self.gate.launch(
            session_of(request), f"the resumed workload {run_id}", live, lambda emit: self.runner.resume(run_id, emit)
        )
        try:
            yield {
                self.resume_btn: gr.Button(visible=False),
                self.stop_btn: gr.Button(visible=True),
                self.progress: self.gate.draw(active, lambda live: live.progress()),
            }
            for item in follow(events, lambda ev: None, THROTTLE_S):
                if isinstance(item, Run):
                    yield self.values(item.id)
                    return
                if isinstance(item, ParityError):  # nothing to resume (finished, running elsewhere, not a workload)
                    yield {
                        self.resume_btn: gr.Button(visible=True),
                        self.stop_btn: gr.Button(visible=False),
                        self.progress: cards.error_html(item.message, item.fix, "Nothing to resume"),
                    }
                    return
                if isinstance(item, BaseException):
                    yield {
                        self.stop_btn: gr.Button(visible=False),
                        self.progress: cards.error_html(
                            f"internal error: {type(item).__name__}: {item}",
                            "the app keeps serving; please report this",
                        ),
                    }
                    return
                yield {self.progress: self.gate.draw(active, lambda live: live.progress())}
        finally:  # the resume goes on if this tab went away: the bar above the tabs shows it
            self.gate.unfollow(active)

    def stop(self, request: gr.Request | None = None) -> None:
        self.gate.stop(session_of(request))

    # -- events ---------------------------------------------------------------------------------

    def create_event_handlers(self, on_prompt: Callable[[Any], None] | None = None) -> None:
        """Resume and Stop, and a row of the prompt table opening its prompt (`on_prompt(event)`:
        what the tab chains after the token view is shown)."""
        ev = self.pick_btn.click(
            self.open_prompt,
            [self.run_id, self.pick],
            self.result_view.outputs,
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            show_progress="hidden",
            trigger_mode="always_last",
        )
        ev.then(
            self.prompt_figures,
            [self.run_id, self.pick],
            self.result_view.plot_outputs,
            api_name=False,
            show_progress="hidden",
            trigger_mode="always_last",
        )
        if on_prompt is not None:
            on_prompt(ev)
        self.resume_btn.click(
            self.resume,
            [self.run_id],
            self.outputs,
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            concurrency_limit=1,
            concurrency_id="engines",
            show_progress="minimal",
        )
        self.stop_btn.click(self.stop, None, None, api_name=False, queue=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API


def replay_row(run: Any, i: int) -> ReplayRow:
    """A replayed row by its one name: its place in the dump, as the replay gave it (the prompt's given text)."""
    pr = run.prompts[0] if run.prompts else None
    return ReplayRow(i, str(((pr.given or {}).get("text") if pr is not None else None) or f"row {i}"))


def _replay_side(run: Any) -> str | None:
    """The side a replay's row opens on: the recorded rollout against the trainer, where the row has it
    (None: any other run, or a row without it: the view's first side)."""
    return RECORDED if run.kind == "replay" and run.prompts and RECORDED in run.prompts[0].results else None
