"""The view of one stored run (summary, token panes, plots), shared by Compare and History so a
run reopened later looks exactly as it did when it finished."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from ..core.types import Localisation, Run
from ..render import cards
from ..render.images import images_html
from ..render.report_parts import localisation_html
from ..render.tokens import Stream, details_json, panes_html
from . import plots
from .op_map_view import cell_html, op_map_figure, swap_target
from .recent import Recent


def prompt_choices(run: Run) -> list[tuple[str, int]]:
    out = []
    for p in run.prompts:
        div = [c.first_divergence for c in p.comparisons if c.first_divergence is not None]
        state = "—" if not p.comparisons else ("identical" if not div else f"diverged at {min(div)}")
        out.append((f"prompt {p.index}: {state}", p.index))
    return out


def side_choices(run: Run) -> list[tuple[str, str]]:
    ref = run.reference or ""
    return [(f"{s.name} vs {ref}", s.name) for s in run.sides[1:]]


def view_parts(run: Run, prompt_index: int = 0, side: str | None = None, reveal: bool = False) -> dict[str, Any]:
    """Everything the view shows for `run`, as plain values (HTML strings and figures). `side`
    picks the comparison the plots and the reference pane show (default: the first to diverge)."""
    return {**pane_parts(run, prompt_index, side, reveal), **plot_parts(run, prompt_index, side)}


def pane_parts(
    run: Run, prompt_index: int = 0, side: str | None = None, reveal: bool = False, focus: int | None = None
) -> dict[str, Any]:
    """The summary card, the side shown and the token panes (opened at `focus`, marked, where given):
    what a reader needs first."""
    idx = _index(run, prompt_index)
    parts: dict[str, Any] = {"summary": cards.run_summary_html(run, idx, reveal=reveal), "panes": "", "side": None}
    if not run.prompts:
        return parts
    streams = _streams(run, idx)
    parts["side"] = side = _picked_side(run, idx, side)
    if any(s.steps for s in streams):
        parts["panes"] = panes_html(
            streams, selected=side, details_src=f"{run.id}:{run.prompts[idx].index}", focus=focus
        )
    return parts


def plot_parts(run: Run, prompt_index: int = 0, side: str | None = None) -> dict[str, Any]:
    """The figures: logprob and margin of the picked comparison, and one bar per prompt of a batch."""
    parts: dict[str, Any] = {"logprob": None, "margin": None, "batch": None}
    if not run.prompts:
        return parts
    idx = _index(run, prompt_index)
    p = run.prompts[idx]
    c = p.comparison(_picked_side(run, idx, side) or "")
    if c is not None:
        parts["logprob"] = plots.logprob_figure(c, p.results.get(c.a), p.results.get(c.b))
        parts["margin"] = plots.margin_figure(c, p.results.get(c.a), p.results.get(c.b))
    if len(run.prompts) > 1:
        parts["batch"] = plots.batch_figure(run)
    return parts


def _position(run: Run, prompt_index: int) -> int | None:
    """Where prompt `prompt_index` (its own .index) is in run.prompts: a workload's prompt is read
    alone (store.get_run(..., prompts=[i])) and keeps its index; None when it is not there."""
    if 0 <= prompt_index < len(run.prompts) and run.prompts[prompt_index].index == prompt_index:
        return prompt_index
    return next((k for k, p in enumerate(run.prompts) if p.index == prompt_index), None)


def _index(run: Run, prompt_index: int) -> int:
    pos = _position(run, prompt_index)
    return pos if pos is not None else prompt_index if 0 <= prompt_index < len(run.prompts) else 0


def _picked_side(run: Run, idx: int, side: str | None) -> str | None:
    """`side` if it was compared on this prompt, else the side that diverged first (or the first)."""
    comps = run.prompts[idx].comparisons
    if side in {c.b for c in comps} or not comps:
        return side
    diverged = [(c.first_divergence, c) for c in comps if c.first_divergence is not None]
    return (min(diverged, key=lambda d: d[0])[1] if diverged else comps[0]).b


def _streams(run: Run, idx: int) -> list[Stream]:
    p = run.prompts[idx]
    divs = {c.b: c.first_divergence for c in p.comparisons}
    return [
        Stream(s.name, f"{s.name} ({s.kind})", p.results[s.name].steps, divs.get(s.name))
        for s in run.sides
        if s.name in p.results
    ]


def pane_details(get_run: Callable[[str], Run | None], src: str) -> str:
    """Every position's hover details of one stored view, `src` = "RUN_ID:PROMPT_INDEX" as
    view_parts wrote it into the panes: what a long view's page script fetches once it shows."""
    run_id, _, index = (src or "").partition(":")
    run = get_run(run_id) if run_id and index.isdigit() else None
    pos = _position(run, int(index)) if run is not None else None
    if run is None or pos is None:  # (pos is None whenever run is)
        raise gr.Error(f"no stored view {src!r}: reopen the run from the History tab")
    return details_json(_streams(run, pos))


def layers_parts(locs: list[Localisation], prompt_index: int) -> tuple[str, Any]:
    """The stored localisations of one prompt (newest first) and the newest one's plot."""
    mine = [x for x in locs if x.prompt_index == prompt_index][::-1]
    html = "".join(localisation_html(x, heatmaps=False) for x in mine)  # the op map is drawn by plotly
    newest = next((x for x in mine if not x.error), None)
    return html, plots.layers_figure(newest) if newest is not None else None


def op_map_part(locs: list[Localisation], prompt_index: int) -> Any:
    """The newest op map of one prompt as a figure (None without one)."""
    newest = next((x for x in locs[::-1] if x.prompt_index == prompt_index and x.op_map and not x.error), None)
    return op_map_figure(newest) if newest is not None else None


@dataclass
class ResultView:
    """The components; create_ui() must be called inside a Blocks context. `localisations` reads
    a run's stored layer localisations (History and Compare show them under the panes)."""

    prefix: str
    localisations: Callable[[str], list[Localisation]] = field(default=lambda run_id: [])
    images: Callable[[str], Any] = field(default=lambda sha: None)  # sha256 -> (bytes, format) | None
    KEEP = 8  # finished views (panes and figures apart) kept built: reopening one costs nothing

    def __post_init__(self) -> None:
        self.built = Recent(self.KEEP)

    def parts(
        self, run: Run, prompt_index: int = 0, side: str | None = None, reveal: bool = False, focus: int | None = None
    ) -> dict[str, Any]:
        """pane_parts, kept for finished runs (a stored run no longer changes; a 16k-token pair's
        panes take ~0.05-0.1 s to build); a view being built (History's read ahead) is waited for."""
        if run.status == "running":
            return pane_parts(run, prompt_index, side, reveal, focus)
        key = (run.id, prompt_index, side, reveal) + ((focus,) if focus is not None else ())
        return self.built.get(key, lambda: pane_parts(run, prompt_index, side, reveal, focus))

    def figures(self, run: Run, prompt_index: int = 0, side: str | None = None) -> dict[str, Any]:
        """plot_parts, kept like `parts` (by the side they show: None and the side it defaults to are one)."""
        if run.status == "running" or not run.prompts:
            return plot_parts(run, prompt_index, side)
        side = _picked_side(run, _index(run, prompt_index), side)
        return self.built.get(("plots", run.id, prompt_index, side), lambda: plot_parts(run, prompt_index, side))

    def create_ui(self) -> None:
        self.summary = gr.HTML(elem_id=f"{self.prefix}-summary")
        with gr.Row():
            self.prompt_pick = gr.Dropdown(
                label="Prompt of this batch",
                choices=[],
                visible=False,
                interactive=True,
                elem_id=f"{self.prefix}-prompt-pick",
            )
            self.side_pick = gr.Dropdown(
                label="Side compared with the reference (plots, reference pane)",
                choices=[],
                visible=False,
                interactive=True,
                elem_id=f"{self.prefix}-side-pick",
            )
        self.panes = gr.HTML(elem_id=f"{self.prefix}-panes")
        self.batch_plot = gr.Plot(visible=False, show_label=False)
        with gr.Row():
            self.logprob_plot = gr.Plot(visible=False, show_label=False)
            self.margin_plot = gr.Plot(visible=False, show_label=False)
        with gr.Row():
            self.layers_btn = gr.Button(
                "Find the layer", visible=False, size="sm", variant="secondary", elem_id=f"{self.prefix}-layers-btn"
            )
            self.ops_box = gr.Checkbox(
                value=True,
                label="op map: every op x token",
                visible=False,
                elem_id=f"{self.prefix}-om-ops",
                info="the error each op adds, fed the reference's input (parity layers --ops)",
            )
            self.window_box = gr.Textbox(
                label="positions",
                placeholder="all, N (the last N) or A:B",
                visible=False,
                elem_id=f"{self.prefix}-om-window",
                max_lines=1,
            )
        self.layers_html = gr.HTML(elem_id=f"{self.prefix}-layers")
        self.layers_plot = gr.Plot(visible=False, show_label=False)
        self.opmap_plot = gr.Plot(visible=False, show_label=False, elem_id=f"{self.prefix}-opmap")
        self.om_cell = gr.HTML(elem_id=f"{self.prefix}-om-cell")
        self.swap_btn = gr.Button(
            "Swap in the reference's output here and run the rest",
            visible=False,
            size="sm",
            elem_id=f"{self.prefix}-om-swap",
        )
        # A cell clicked in the map writes "LOC|row|col" here and presses the button (the page's script;
        # both off screen): one server call shows the cell and opens the panes at its token.
        self.om_pick = gr.Textbox(
            show_label=False, container=False, elem_id=f"{self.prefix}-om-pick", elem_classes=["pc-offscreen"]
        )
        self.om_open = gr.Button("open the cell", elem_id=f"{self.prefix}-om-open", elem_classes=["pc-offscreen"])
        self.om_target = gr.State(None)  # (localisation id, "LAYER.OP") a swap would run

    @property
    def outputs(self) -> list[Any]:
        """Every component `values` may set, in the order the events list them (their API order)."""
        return [
            self.summary,
            self.prompt_pick,
            self.side_pick,
            self.panes,
            self.logprob_plot,
            self.margin_plot,
            self.batch_plot,
            self.layers_btn,
            self.layers_html,
            self.layers_plot,
            self.ops_box,
            self.window_box,
            self.opmap_plot,
            self.om_cell,
            self.swap_btn,
        ]

    def layer_values(self, run: Run | None, prompt_index: int) -> dict[Any, Any]:
        """The "Find the layer" button (only for runs whose sides can be captured) and what is stored."""
        hidden = {
            self.layers_btn: gr.Button(visible=False),
            self.layers_html: "",
            self.layers_plot: gr.Plot(visible=False, value=None),
            self.ops_box: gr.Checkbox(visible=False),
            self.window_box: gr.Textbox(visible=False),
            self.opmap_plot: gr.Plot(visible=False, value=None),
            self.om_cell: "",
            self.swap_btn: gr.Button(visible=False),
        }
        if run is None or run.status not in ("ok", "diverged") or len(run.sides) < 2:
            return hidden
        from ..core.kinds import KINDS

        capturable = [s for s in run.sides if KINDS.get(s.kind) is not None and KINDS[s.kind].can_capture_layers]
        locs = self.localisations(run.id)
        html, fig = layers_parts(locs, prompt_index)
        om = op_map_part(locs, prompt_index)
        can = len(capturable) >= 2
        return {
            self.layers_btn: gr.Button(visible=can),
            self.layers_html: html,
            self.layers_plot: gr.Plot(value=fig, visible=fig is not None),
            self.ops_box: gr.Checkbox(visible=can),
            self.window_box: gr.Textbox(visible=can),
            self.opmap_plot: gr.Plot(value=om, visible=om is not None),
            self.om_cell: "",
            self.swap_btn: gr.Button(visible=False),
        }

    def cleared(self, summary: str = "") -> dict[Any, Any]:
        """No run shown: `summary` (a notice or an error card) and every other part empty or hidden."""
        hidden = gr.Plot(visible=False, value=None)
        return {
            self.summary: summary,
            self.prompt_pick: gr.Dropdown(visible=False),
            self.side_pick: gr.Dropdown(visible=False),
            self.panes: "",
            self.logprob_plot: hidden,
            self.margin_plot: hidden,
            self.batch_plot: hidden,
            **self.layer_values(None, 0),
        }

    def values(
        self,
        run: Run | None,
        prompt_index: int = 0,
        side: str | None = None,
        message: str = "",
        reveal: bool = False,
        plots: bool = True,
        focus: int | None = None,
    ) -> dict[Any, Any]:
        """Every component of `outputs` with its value; `run=None` shows `message` instead. `plots=False`
        hides the figures, for an event that sends them next (`plot_values`): the panes show without
        waiting for the figures to be built, sent and drawn (~0.3 s of a 16k-token pair's first open)."""
        if run is None:
            return self.cleared(cards.notice_html(message) if message else "")
        parts = self.parts(run, prompt_index, side, reveal, focus)
        panes = parts["panes"]
        if run.prompts:  # an image prompt shows its images beside the streams
            panes = images_html(run.prompts[_index(run, prompt_index)].images, self.images) + panes
        sides = side_choices(run)
        return {
            self.summary: parts["summary"],
            self.prompt_pick: gr.Dropdown(
                choices=prompt_choices(run), value=prompt_index, visible=len(run.prompts) > 1
            ),
            self.side_pick: gr.Dropdown(choices=sides, value=parts["side"], visible=len(sides) > 1),
            self.panes: panes,
            **(self.plot_values(run, prompt_index, parts["side"]) if plots else self.plot_values(None)),
            **self.layer_values(run, prompt_index),
        }

    @property
    def plot_outputs(self) -> list[Any]:
        return [self.logprob_plot, self.margin_plot, self.batch_plot]

    def plot_values(self, run: Run | None, prompt_index: int = 0, side: str | None = None) -> dict[Any, Any]:
        """The figures of `plot_outputs` (hidden where there is none, and all hidden for `run=None`)."""
        if run is None:
            return {plot: gr.Plot(visible=False, value=None) for plot in self.plot_outputs}
        figs = self.figures(run, prompt_index, side)
        return {
            plot: gr.Plot(value=figs[k], visible=figs[k] is not None)
            for plot, k in zip(self.plot_outputs, ("logprob", "margin", "batch"))
        }

    def error_values(self, message: str, fix: str = "") -> dict[Any, Any]:
        return self.cleared(cards.error_html(message, fix))

    def wire_layers(self, runner: Any, picks: list[Any]) -> None:
        """ "Find the layer": localise the picked comparison's divergence (parity_ui.commands.layers), store it,
        show every localisation of this prompt. Queued with the runs: it uses the same engines."""

        shown = [self.layers_html, self.layers_plot, self.opmap_plot, self.om_cell, self.swap_btn]

        def after(loc: Localisation) -> dict[Any, Any]:
            locs = self.localisations(loc.run_id)
            html, fig = layers_parts(locs, loc.prompt_index)
            om = op_map_part(locs, loc.prompt_index)
            return {
                self.layers_html: html,
                self.layers_plot: gr.Plot(value=fig, visible=fig is not None),
                self.opmap_plot: gr.Plot(value=om, visible=om is not None),
                self.om_cell: "",
                self.swap_btn: gr.Button(visible=False),
            }

        def find(run_id: str | None, index: int | None, side: str | None, ops: bool, window: str | None) -> Any:
            if not run_id:
                return gr.skip()
            run_id = str(run_id).strip()
            run = runner.get_run(run_id, prompts=[])
            # the picked side against the reference (None: the reference and the first that diverged)
            pair = (run.reference, side) if run and side and run.reference and side != run.reference else None
            loc = runner.localise(
                run_id, int(index or 0), None, pair, ops=bool(ops), window=(window or "").strip() or None
            )
            return after(loc)

        self.layers_btn.click(
            find,
            [*picks, self.ops_box, self.window_box],
            shown,
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            concurrency_limit=1,
            concurrency_id="engines",
            show_progress="full",
        )

        def open_cell(run_id: str | None, side: str | None, pick: str | None) -> Any:
            """A clicked cell: its figures, and the panes opened at its token (a generated one)."""
            loc_id, r, t = _cell_pick(pick)
            run_id = (run_id or "").strip()
            loc = next((x for x in self.localisations(run_id) if x.id == loc_id), None)
            if loc is None or not loc.op_map:
                raise gr.Error(f"no stored op map {loc_id!r} for run {run_id!r}: press Find the layer again")
            out: dict[Any, Any] = {self.om_cell: cell_html(loc, r, t)}
            target = swap_target(loc, r)
            out[self.swap_btn] = gr.Button(visible=target is not None)
            out[self.om_target] = (loc.id, target)
            positions, prompt_len = loc.op_map["positions"], int(loc.op_map["prompt_len"])
            at = positions[t] if 0 <= t < len(positions) else -1
            run = runner.get_run(run_id)
            if run is not None and at >= prompt_len:
                out[self.panes] = self.parts(run, loc.prompt_index, side, focus=at - prompt_len)["panes"]
            return out

        self.om_open.click(
            open_cell,
            [picks[0], picks[2], self.om_pick],
            [self.om_cell, self.swap_btn, self.om_target, self.panes],
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            show_progress="hidden",
            trigger_mode="always_last",
        )

        def swap(run_id: str | None, target: Any) -> Any:
            if not run_id or not target or not target[1]:
                return gr.skip()
            loc = next((x for x in self.localisations(str(run_id).strip()) if x.id == target[0]), None)
            if loc is None or not loc.op_map:
                raise gr.Error("the op map to swap in was not found: press Find the layer again")
            positions = loc.op_map["positions"]
            window = f"{positions[0]}:{positions[-1] + 1}"
            new = runner.localise(
                loc.run_id, loc.prompt_index, loc.position, (loc.a, loc.b), ops=True, window=window, swap=target[1]
            )
            return after(new)

        self.swap_btn.click(
            swap,
            [picks[0], self.om_target],
            shown,
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            concurrency_limit=1,
            concurrency_id="engines",
            show_progress="full",
        )


def _cell_pick(pick: str | None) -> tuple[str, int, int]:
    """ "LOC|row|col" (the page script's message for a clicked cell) -> its parts; gr.Error when garbled."""
    parts = (pick or "").split("|")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise gr.Error(f"not a cell of the op map: {pick!r}")
    return parts[0], int(parts[1]), int(parts[2])
