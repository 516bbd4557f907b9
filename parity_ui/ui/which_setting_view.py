"""Which setting? in the app (issue 22): under a stored comparison or workload whose sides differ, a
pair (the reference and the first side that differs by default), a number of prompts (8) and the
button. The bisect runs through the AppService in a worker thread; its progress shows as it goes
(the trials table grows as each trial is stored), then its record (render.report_parts.bisect_html).
Shared by Compare (after a run) and History (an opened run, which also shows its newest stored bisect).
Which pairs are offered and what is refused: parity_ui.commands.which_setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gradio as gr

from ..core.bisect_record import DEFAULT_PROMPTS, MAX_PROMPTS, pair_value, parse_pair
from ..core.errors import ParityError
from ..core.types import Run
from ..render import cards
from ..render.report_parts import bisect_html
from .active_run import session_of
from .live import BisectLive, follow

THROTTLE_S = 0.25


def bisect_result_html(run: Run) -> str:
    """A stored bisect as the app shows it: its record, under the error card when it failed or was
    stopped (one that failed before it began has no record: the card alone says what to fix)."""
    head = ""
    if run.status in ("error", "cancelled", "interrupted"):
        msg, fix = cards.split_fix(run.error or run.status)
        title = {
            "error": "Which setting? failed",
            "cancelled": "Which setting? stopped",
            "interrupted": "Which setting? interrupted",
        }[run.status]
        head = cards.error_html(msg, fix, title)
    body = bisect_html(run)
    link = f"<p class=pc-muted>Stored as bisect <code>{cards.esc(run.id)}</code> (History lists it).</p>"
    return f'<div class="pc-bisect-result" data-run="{cards.esc(run.id)}">{head}{body}{link}</div>'


class WhichSettingView:
    """The components (create_ui() inside a Blocks). `runner`: the app's AppService (its `bisect`
    and its read connection); `gate`: the RunGate of the engines (Stop)."""

    def __init__(self, prefix: str, runner: Any, gate: Any):
        self.prefix, self.runner, self.gate = prefix, runner, gate

    # -- layout ---------------------------------------------------------------------------------

    def create_ui(self) -> None:
        p = self.prefix
        with gr.Column(visible=False, elem_id=f"{p}-ws") as self.box:
            with gr.Row(equal_height=True):
                self.pair = gr.Dropdown(
                    label="Which setting? The pair to search (reference first)",
                    choices=[],
                    interactive=True,
                    scale=3,
                    elem_id=f"{p}-ws-pair",
                )
                self.prompts = gr.Number(
                    DEFAULT_PROMPTS,
                    precision=0,
                    minimum=1,
                    maximum=MAX_PROMPTS,
                    label="Prompts (the run's worst first)",
                    scale=1,
                    elem_id=f"{p}-ws-prompts",
                )
                self.btn = gr.Button("Which setting?", variant="secondary", scale=1, elem_id=f"{p}-ws-btn")
                self.stop_btn = gr.Button("Stop", visible=False, variant="stop", scale=1, elem_id=f"{p}-ws-stop")
            gr.Markdown(
                "Flips the side's differing settings to the reference's values, a few at a time, until the "
                "smallest set that restores parity is left; each trial is a stored run.",
                elem_classes=["pc-muted"],
            )
            self.progress = gr.HTML(elem_id=f"{p}-ws-progress")
            self.result = gr.HTML(elem_id=f"{p}-ws-result")
        self.run_id = gr.State(None)

    @property
    def outputs(self) -> list[Any]:
        return [self.box, self.pair, self.btn, self.progress, self.result, self.run_id]

    # -- values ---------------------------------------------------------------------------------

    def hidden(self) -> dict[Any, Any]:
        return {
            self.box: gr.Column(visible=False),
            self.pair: gr.Dropdown(choices=[], value=None),
            self.btn: gr.Button(interactive=True),
            self.progress: "",
            self.result: "",
            self.run_id: None,
        }

    def failed(self, message: str) -> dict[Any, Any]:
        """The panel's place when it could not be built: the error, no search offered (History's open)."""
        return {
            **self.hidden(),
            self.box: gr.Column(visible=True),
            self.btn: gr.Button(interactive=False),
            self.progress: cards.error_html(
                message, "the run's other views still show; please report this", "Which setting? could not be built"
            ),
        }

    def show(self, run_id: str | None) -> dict[Any, Any]:
        """The panel for the opened or finished run `run_id`: shown when it has a pair that differs
        (and then with its newest stored bisect, if any), hidden otherwise."""
        run_id = str(run_id or "").strip()
        choice = self.runner.bisect_choice(run_id, self.runner.reader) if run_id else None
        if choice is not None and choice.nothing_to_flip:
            # The sides differ, but only in the engine itself: say so before anyone clicks (#33 item 10).
            return {
                **self.hidden(),
                self.box: gr.Column(visible=True),
                self.btn: gr.Button(interactive=False),
                self.progress: cards.notice_html(
                    f"Which setting? has nothing to try here: {choice.problem}. {choice.fix}."
                ),
            }
        if choice is None or not choice.pairs:
            return self.hidden()
        last = self.runner.reader.latest_bisect(run_id)
        return {
            self.box: gr.Column(visible=True),
            self.btn: gr.Button(interactive=True),
            self.pair: gr.Dropdown(
                choices=[(f"{a} vs {b}", pair_value((a, b))) for a, b in choice.pairs], value=pair_value(choice.default)
            ),
            self.progress: "",
            self.result: bisect_result_html(last) if last is not None else "",
            self.run_id: run_id,
        }

    # -- the search -----------------------------------------------------------------------------

    def search(
        self, run_id: str | None, pair: str | None, prompts: Any, request: gr.Request | None = None
    ) -> Iterator[dict[Any, Any]]:
        """Start the bisect of `run_id`'s `pair` on its `prompts` worst prompts; yields its progress, then
        its stored record. A request refused before it starts (no such run, no pair that differs, a
        pair or a number it cannot take) shows the problem and the fix; the app keeps serving."""
        run_id = str(run_id or "").strip()
        try:
            shown = " vs ".join(parse_pair(pair) or ())
        except ParityError:
            shown = str(pair)
        live = BisectLive(shown)
        active, events = self.gate.launch(
            session_of(request),
            f"Which setting? {shown}",
            live,
            lambda emit: self.runner.which_setting(run_id, pair, prompts, emit),
        )
        try:
            yield {
                self.btn: gr.Button(interactive=False),
                self.stop_btn: gr.Button(visible=True),
                self.progress: self.gate.draw(active, lambda live: live.progress()),
                self.result: "",
            }
            done = {self.btn: gr.Button(interactive=True), self.stop_btn: gr.Button(visible=False), self.progress: ""}
            for item in follow(events, lambda ev: None, THROTTLE_S):
                if isinstance(item, Run):
                    yield {**done, self.result: bisect_result_html(item)}
                    return
                if isinstance(item, ParityError):  # refused before it started: nothing stored
                    yield {**done, self.result: cards.error_html(item.message, item.fix, "Which setting? cannot start")}
                    return
                if isinstance(item, BaseException):
                    yield {
                        **done,
                        self.result: cards.error_html(
                            f"internal error: {type(item).__name__}: {item}",
                            "the app keeps serving; please report this",
                        ),
                    }
                    return
                progress, changed = self.gate.draw(active, lambda live: (live.progress(), live.take_changed()))
                out = {self.progress: progress}
                if changed and live.bisect_id:  # a trial was stored: its row joins the table
                    so_far = self.runner.reader.get_run(live.bisect_id, prompts=[])
                    if so_far is not None and so_far.bisect is not None:
                        out[self.result] = bisect_html(so_far)
                yield out
        finally:  # the search goes on if this tab went away: the bar above the tabs shows it
            self.gate.unfollow(active)

    def stop(self, request: gr.Request | None = None) -> None:
        self.gate.stop(session_of(request))

    # -- events ---------------------------------------------------------------------------------

    def create_event_handlers(self) -> None:
        """The button (queued with the runs: it uses the same engines) and Stop. No API endpoint, as
        Find the layer and Resume: API clients bisect through `parity bisect` or the service."""
        self.btn.click(
            self.search,
            [self.run_id, self.pair, self.prompts],
            [self.btn, self.stop_btn, self.progress, self.result],
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            concurrency_limit=1,
            concurrency_id="engines",
            show_progress="minimal",
        )
        self.stop_btn.click(self.stop, None, None, api_name=False, queue=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
