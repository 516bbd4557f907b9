"""History tab: every stored run, searchable and filterable; open one to see exactly its view;
deep links `?run=ID`; export a run as the CLI's JSON. A workload run is listed with its headline and
opens in the workload view (parity_ui.ui.workload_view): its header and pair rows only, a prompt's
tokens read when its row is clicked. A run whose sides differ has Which setting? under it
(parity_ui.ui.which_setting_view); a bisect is listed with its answer and opens as its record.
Every way to open a run (a row, the button, Enter, a deep link) is one server event (`open_all`)."""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
import time
import traceback
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Literal

import gradio as gr

from ..core.audit_record import KIND as AUDIT_KIND
from ..core.audit_record import PAIR_KIND
from ..core.bisect_record import TRIAL_KIND, bisect_line
from ..core.types import Run
from .audit_view import AuditView
from .recent import Recent
from .result_view import ResultView, pane_details
from .which_setting_view import WhichSettingView, bisect_result_html
from .workload_view import WorkloadView

STATUSES = ["ok", "diverged", "error", "cancelled", "interrupted", "running"]
PERIODS = {"any time": None, "last 24 hours": 1, "last 7 days": 7, "last 30 days": 30}
# What a user reads first (#33 item 12): status, result, model (short; the full path on hover), the
# sides, the prompt; then dtype, time and the id (what a click opens).
COLUMNS = ["status", "result", "model", "sides (reference first)", "prompt", "dtype", "time (UTC)", "id"]
STATUS, RESULT, MODEL, SIDES, PROMPT, DTYPE, TIME, ID = range(len(COLUMNS))
DATATYPES: list[Literal["str", "markdown"]] = ["str", "str", "markdown", "str", "str", "str", "str", "str"]
COLUMN_WIDTHS: list[str | int] = ["84px", "28%", "13%", "15%", "22%", "72px", "140px", "120px"]
PROMPT_CHARS = 90
_RUN_ID = re.compile(r"^[0-9A-Za-z]{1,64}$")
_HF_CACHE = re.compile(r"models--([^/]+?)--([^/]+)")
# A deep link (`?run=ID`) shows this tab. Selected in the page, not by an output of the load event:
# Gradio's page walks every component an event ever touched, and the tabs' whole tree below them, on
# each status message of every later event (the Tabs as an output made each open ~0.25 s slower on 2
# cores, #33 item 6).
FROM_URL_JS = """() => {
  if (!new URLSearchParams(window.location.search).get('run')) return;
  const tab = Array.from(document.querySelectorAll('button[role="tab"]')).find((b) => b.textContent.trim() === 'History');
  if (tab) tab.click();
}"""
# Characters markdown would read as markup in a model name (the cell is markdown for its hover title).
_MD = str.maketrans({c: f"&#{ord(c)};" for c in "_*[]`~\\|#<>&\"'"})


def short_model(model: str) -> str:
    """A model as a list shows it: a hub id as it is; a hub cache folder (models--org--name/snapshots/..)
    as org/name; any other path by its last folder name."""
    model = (model or "").strip()
    m = _HF_CACHE.search(model)
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    if model.startswith(("/", "~", ".")) or "\\" in model or model.count("/") > 1:
        return model.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] or model
    return model


def model_cell(model: str) -> str:
    """The model column's cell (markdown): the short name, the full path on hover where they differ."""
    short = short_model(model)
    if short == model:
        return short.translate(_MD)
    return f'<span title="{model.translate(_MD)}">{short.translate(_MD)}</span>'


def _result(r: Any, bisects: dict[str, str], trials: dict[str, int]) -> str:
    if r.id in bisects:
        n = trials.get(r.group_id or "", 0)
        return bisects[r.id] + (f" ({n} trial{'s' if n != 1 else ''}: open it)" if n else "")
    if r.kind == "workload" and r.headline:
        return ("" if r.status in ("ok", "diverged") else f"{r.status}: ") + f"workload: {r.headline}"
    if r.kind == "replay" and r.headline:  # the headline begins "replay of N rows"
        return ("" if r.status in ("ok", "diverged") else f"{r.status}: ") + r.headline
    if r.kind == AUDIT_KIND and r.headline and r.status != "error":  # the headline begins "audit VERDICT"
        return ("" if r.status in ("ok", "diverged") else f"{r.status}: ") + r.headline
    if r.kind == "weights" and r.headline:  # a weight-sync check's verdict line (issue 41)
        return r.headline
    if r.status == "error":
        return "error: " + (r.error or "")[:80]
    if r.status in ("cancelled", "interrupted", "running"):
        return r.status
    # A sampled run says so (issue 46 item 11): "identical" means another thing under sampling.
    drawn = "" if r.decoding == "greedy" else f" ({r.decoding})"
    if r.identical:
        return "identical" + drawn
    return f"diverged at token {r.first_divergence}" + drawn


def _excerpt(text: str) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= PROMPT_CHARS else text[: PROMPT_CHARS - 1] + "…"


def history_rows(
    store: Any,
    search: str = "",
    model: str | None = None,
    status: str | None = None,
    period: str = "any time",
    limit: int = 500,
) -> list[list[Any]]:
    """The History list's rows (COLUMNS), newest first. A bisect's trial runs are not listed: its
    row says how many it ran, and opening it shows them (its record)."""
    days = PERIODS.get(period)
    since = (date.today() - timedelta(days=days)).isoformat() if days else None
    runs = store.list_runs(
        search=search or None,
        model=model or None,
        status=status or None,
        since=since,
        limit=limit,
        exclude_kinds=(TRIAL_KIND, PAIR_KIND),  # an audit's pairs open from its grid
    )
    listed = [r for r in runs if r.kind == "bisect"]
    bisects = {r.id: bisect_line(r) for r in store.bisect_lines([r.id for r in listed])}
    trials = store.trial_counts([r.group_id for r in listed if r.group_id])
    trends = store.trend_lines([r.id for r in runs if r.kind == "trend"])  # {id: (directory, headline)}
    return [
        [
            r.status,
            trends[r.id][1] if r.id in trends else _result(r, bisects, trials),
            model_cell(r.model),
            r.sides,
            _excerpt(trends[r.id][0] if r.id in trends else r.prompt_excerpt),
            r.dtype or "",
            r.datetime_utc[:19].replace("T", " "),
            r.id,
        ]
        for r in runs
    ]


class HistoryTab:
    RECENT = 2  # finished runs kept parsed: a 16k-token pair takes ~0.5 s to read back
    PREFETCH_AFTER_S = 0.4  # a listed run is read ahead after this long without an open (no one clicks faster)
    QUIET_S = 2.0  # nor when a run was opened this shortly before the list: its page is still being built

    def __init__(self, service: Any, gate: Any = None):
        from .active_run import RunGate

        self.service = service
        self.gate = gate if gate is not None else RunGate(service)
        # The view, its background details fetch and a prompt/side switch all read the same run
        # within seconds; a finished run no longer changes, so it is read once.
        self._recent = Recent(self.RECENT)
        self._opens_lock = threading.Lock()
        self._opened_at = -1e9  # time.monotonic() of the last open: a read ahead near it stands down
        self._opening = 0  # opens under way (handlers run in threads): a read ahead stands down meanwhile
        self.view = ResultView(
            "hist",
            localisations=lambda run_id: self.store.localisations_of(run_id),
            images=lambda sha: self.store.image_bytes(sha),
        )
        self.wview = WorkloadView("hist", service, self.gate, self.view)
        self.which = WhichSettingView("hist", service, self.gate)
        self.audit = AuditView("hist", service, self.view)

    @property
    def store(self) -> Any:
        """The store the service hands out (the app's runner: one per handler thread)."""
        return self.service.reader

    def create_ui(self) -> None:
        with gr.Tab("History", id="history") as self.tab:
            with gr.Row():
                self.search = gr.Textbox(
                    label="Search", placeholder="id, model, side, prompt or error text", scale=3, elem_id="hist-search"
                )
                self.model = gr.Dropdown(label="Model", choices=[], value=None, scale=2)
                self.status = gr.Dropdown(label="Status", choices=STATUSES, value=None, scale=1)
                self.period = gr.Dropdown(label="When", choices=list(PERIODS), value="any time", scale=1)
                self.refresh_btn = gr.Button("Refresh", scale=1)
            self.table = gr.Dataframe(
                headers=COLUMNS,
                value=[],
                interactive=False,
                wrap=False,
                datatype=DATATYPES,
                column_widths=COLUMN_WIDTHS,
                max_height=640,
                elem_id="hist-table",
                label="Runs (newest first; click one to open it; a bisect's trials are under the bisect)",
            )
            with gr.Row():
                self.run_id = gr.Textbox(
                    label="Run id", scale=3, elem_id="hist-run-id", placeholder="click a row above, or paste an id"
                )
                self.open_btn = gr.Button("Open run", scale=1, elem_id="hist-open")
                # /open_run's trigger for API clients (the page's own opens are open_all: one event).
                self.api_open = gr.Button("Open run", visible=False, elem_id="hist-open-api")
                self.export_btn = gr.Button("Export as JSON", scale=1, elem_id="hist-export")
                self.report_btn = gr.Button("HTML report", scale=1, elem_id="hist-report")
                self.export_file = gr.File(label="Exported run", interactive=False, visible=False, scale=2)
            with gr.Accordion("Compare two stored runs side by side", open=False, elem_id="hist-pair-box"):
                with gr.Row():
                    self.pair_a = gr.Textbox(
                        label="Run A",
                        scale=2,
                        elem_id="hist-pair-a",
                        placeholder="click a row, then 'Use as A'; or paste an id",
                    )
                    self.use_a = gr.Button("Use as A", scale=1, size="sm", elem_id="hist-use-a")
                    self.pair_b = gr.Textbox(
                        label="Run B", scale=2, elem_id="hist-pair-b", placeholder="click another row, then 'Use as B'"
                    )
                    self.use_b = gr.Button("Use as B", scale=1, size="sm", elem_id="hist-use-b")
                    self.pair_btn = gr.Button("Compare A and B", scale=1, variant="primary", elem_id="hist-pair-btn")
                self.pair_out = gr.HTML(elem_id="hist-pair")
            self.wview.create_ui()
            self.audit.create_ui()
            self.view.create_ui()
            self.which.create_ui()

    # -- handlers ------------------------------------------------------------------------------

    def refresh(self, search: str, model: str | None, status: str | None, period: str) -> dict[Any, Any]:
        models = self.store.distinct_models()
        rows = history_rows(self.store, search, model, status, period)
        newest = next((r[ID] for r in rows if r[STATUS] != "running"), None)
        if newest is not None:
            threading.Thread(
                target=self.prefetch, args=(newest, time.monotonic()), name="parity-prefetch", daemon=True
            ).start()
        return {
            self.table: gr.Dataframe(value=rows, headers=COLUMNS, datatype=DATATYPES),
            self.model: gr.Dropdown(choices=models, value=model if model in models else None),
        }

    def prefetch(self, run_id: str, listed_at: float) -> None:
        """Read the newest listed run and build its view while the user looks at the list: the run
        most often opened next (the one that just finished) then opens without the read (~0.5 s
        for a 16k-token pair) and the build. It waits PREFETCH_AFTER_S and stands down when the
        user opens a run first: two reads in one process share its CPU (and the GIL), which made
        an open of another run twice as slow."""
        time.sleep(self.PREFETCH_AFTER_S)

        def wanted() -> bool:  # no open under way, none since the list, none just before it
            return not self._opening and self._opened_at < listed_at - self.QUIET_S

        try:
            if not wanted():
                return
            run = self._load(run_id)
            if run is not None and run.kind in ("bisect", "trend", AUDIT_KIND):
                return  # its record is the whole view: nothing to build ahead
            if run is not None and run.workload is not None:
                if wanted():
                    self.wview.parts(run.id)  # its view: what an open shows (no prompt is read)
                return
            if run is not None and wanted():
                self.view.parts(run)
            if run is not None and wanted():
                self.view.figures(run)
        except Exception:  # noqa: BLE001 - a guess; opening the run reports whatever is wrong with it
            pass

    def select(self, evt: gr.SelectData, table: Any) -> str:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        try:
            return str(table.iloc[row, ID]) if hasattr(table, "iloc") else str(table[row][ID])
        except (IndexError, KeyError):
            return gr.skip()

    def _load(self, run_id: str) -> Run | None:
        """The stored run, read once while it is recent; a read already under way for it (the
        prefetch) is waited for, not repeated. A run still running is read again each time. A
        workload is read without its prompts (its view reads its pair rows; a prompt, alone)."""
        run_id = (run_id or "").strip()
        if not _RUN_ID.match(run_id):
            return None

        def read() -> Run | None:
            if self.store.is_workload(run_id):
                return self.store.get_run(run_id, prompts=[])
            return self.store.get_run(run_id)

        def keep(run: Run | None) -> bool:  # a stopped workload may be resumed: its header changes
            if run is None:
                return False
            return run.status in ("ok", "diverged") if run.workload is not None else run.status != "running"

        return self._recent.get(run_id, read, keep=keep)

    def _view_run(self, run_id: str, index: int) -> Run | None:
        """The run a token view shows: a workload's prompt `index` alone, any other run whole."""
        run = self._load(run_id)
        if run is not None and run.workload is not None:
            return self.wview.prompt_run(run.id, index)
        return run

    def open(self, run_id: str) -> dict[Any, Any]:
        with self._opens_lock:
            self._opened_at = time.monotonic()
            self._opening += 1
        try:
            return self._open(run_id)
        finally:
            with self._opens_lock:
                self._opening -= 1

    def _open(self, run_id: str) -> dict[Any, Any]:
        run_id = (run_id or "").strip()
        if not run_id:
            return self.view.values(None, message="Pick a run in the table above.")
        run = self._load(run_id)
        if run is None:
            return self.view.error_values(
                f"no run with id {run_id!r} in this database", "pick one from the table, or check the link"
            )
        if run.kind == "bisect":  # its record: the trials and the answer (its prompts have no tokens of their own)
            return self.view.cleared(bisect_result_html(run))
        if run.kind == AUDIT_KIND and run.status != "error":  # its grid shows above (`audit.show`); a break's
            # tokens on a click there. One that failed shows its error as any run does.
            return self.view.values(
                None, message="An audit: click a broken cell of its grid to see that break's tokens here."
            )
        if run.kind == "weights":  # a weight-sync check: its report (the probe's sequences have no tokens to show)
            from ..render.weights import weights_html

            report = self.service.weight_report(run_id, self.service.reader)
            return self.view.cleared(weights_html(report) if report is not None else run.error or "no report stored")
        if run.kind == "trend":  # its record: the steps, the charts, the jumps; a step opens its replay
            from ..render.trend import trend_html

            report = self.store.trend(run.id)
            if report is None:
                return self.view.error_values(f"trend {run.id} has no record", "run parity replay DIR again")
            return self.view.cleared(trend_html(report, run.id))
        if run.workload is not None:  # its view shows above (`wview.show`); a prompt's tokens on a click there
            return self.view.values(
                None, message="A workload run: pick a prompt in its table above to see its tokens here."
            )
        return self.view.values(run, plots=False)  # the figures follow (`figures`), once the panes show

    def figures(self, run_id: str, index: int | None, side: str | None) -> dict[Any, Any]:
        """The opened run's figures, sent after its panes (`open`)."""
        run = self._load((run_id or "").strip())
        return self.view.plot_values(run, int(index or 0), side)

    def pane_details(self, src: str) -> str:
        """The `pane_details` endpoint: the hover details a long view fetches after it shows."""
        _, _, index = (src or "").partition(":")
        return pane_details(lambda run_id: self._view_run(run_id, int(index) if index.isdigit() else 0), src)

    def switch_view(self, run_id: str, index: int | None, side: str | None) -> dict[Any, Any]:
        return self.view.values(self._view_run(run_id, int(index or 0)), int(index or 0), side)

    def compare_pair(self, a: str, b: str) -> str:
        """Two stored runs side by side (render.run_pair): their settings diff and headline figures,
        and for two single comparisons their token panes (prompt 0). A workload is read without its
        prompts (its pooled figures are its headline)."""
        from ..render.cards import error_html
        from ..render.run_pair import run_pair_html
        from .result_view import pane_parts

        a, b = (a or "").strip(), (b or "").strip()
        if not a or not b:
            return error_html(
                "Pick two runs to compare",
                "click a row and press 'Use as A', then another and 'Use as B' (or paste two ids)",
                "Nothing to compare",
            )
        runs = {}
        for label, run_id in (("A", a), ("B", b)):
            run = self._load(run_id)
            if run is None:
                return error_html(
                    f"no run with id {run_id!r} (run {label}) in this database",
                    "pick it from the table above",
                    "Nothing to compare",
                )
            runs[label] = run

        def panes(run: Run) -> str:
            if run.workload is not None or run.bisect is not None or not run.prompts:
                return ""
            return pane_parts(run)["panes"]

        ra, rb = runs["A"], runs["B"]
        single = ra.workload is None and rb.workload is None and ra.bisect is None and rb.bisect is None
        return run_pair_html(ra, rb, panes(ra) if single else "", panes(rb) if single else "")

    def _stored(self, run_id: str) -> Any:
        run = self._load(run_id)
        if run is None:
            raise gr.Error("Open a stored run first: no run with that id.")
        return run

    def export(self, run_id: str) -> Any:
        from ..render.report import run_json

        run = self._stored(run_id)
        out = Path(tempfile.mkdtemp(prefix="parity-export-")) / f"parity-run-{run.id}.json"
        data = run_json(run)
        trend = self.store.trend(run.id) if run.kind == "trend" else None
        if trend is not None:  # as `parity runs show ID --json` prints it
            data["trend"] = trend.to_json()
        out.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
        return gr.File(value=str(out), visible=True)

    def report(self, run_id: str) -> Any:
        from ..render.report import html_report, stored_html_report, workload_report_prompts

        run = self._stored(run_id)
        out = Path(tempfile.mkdtemp(prefix="parity-report-")) / f"parity-run-{run.id}.html"
        if run.kind == "trend":
            page = stored_html_report(self.store.for_report(run.id, workload_report_prompts)) or ""
        elif run.workload is not None:
            stored = stored_html_report(self.store.for_report(run.id, workload_report_prompts))
            assert stored is not None  # the run was just read (_stored): for_report finds it
            page = stored
        else:
            page = html_report(run, self.store.localisations_of(run.id), self.store.image_bytes)
        out.write_text(page, encoding="utf-8")
        return gr.File(value=str(out), visible=True)

    def open_all(self, run_id: str) -> dict[Any, Any]:
        """An open as the page makes it, in ONE event: the token view's parts (`open`), the workload
        view (shown for a workload, hidden otherwise) and Which setting? (for a run whose sides
        differ). Gradio's page runs the listeners of one click one after the other, each a round
        trip and a redraw of its own (and, as three, the workload view waited for the other two:
        ~0.3 s of a 1,000-prompt workload's open, #33 item 6). A panel that fails to build (a stored
        record it cannot read) shows its error in its own place; the rest of the open still shows."""
        out = self.open(run_id)
        for panel in (self.wview, self.which, self.audit):
            try:
                out.update(panel.show(run_id))
            except Exception as e:  # noqa: BLE001 - one panel's failure must not blank the run's view
                traceback.print_exc(file=sys.stderr)
                out.update(panel.failed(f"run {run_id}: {type(e).__name__}: {e}"))
        return out

    @property
    def open_outputs(self) -> list[Any]:
        return [*self.view.outputs, *self.wview.outputs, *self.which.outputs, *self.audit.outputs]

    def from_url(self, request: gr.Request) -> Any:
        """Page load: `?run=ID` opens that run (the page's script selects this tab: FROM_URL_JS)."""
        run_id = (request.query_params.get("run") or "").strip() if request is not None else ""
        if not run_id:
            return gr.skip()
        return {self.run_id: run_id, **self.open_all(run_id)}

    # -- events --------------------------------------------------------------------------------

    def create_event_handlers(self, tabs: Any, app: Any) -> None:
        self.tabs = tabs
        filters = [self.search, self.model, self.status, self.period]
        listing = [self.table, self.model]
        self.tab.select(self.refresh, filters, listing, api_name="history")
        self.refresh_btn.click(self.refresh, filters, listing, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.search.submit(self.refresh, filters, listing, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        for f in (self.model, self.status, self.period):
            f.input(self.refresh, filters, listing, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        picks = [self.run_id, self.view.prompt_pick, self.view.side_pick]

        def then_figures(event: Any) -> None:  # the last run opened wins (its figures, not an earlier one's)
            event.then(
                self.figures,
                picks,
                self.view.plot_outputs,
                api_name=False,
                show_progress="hidden",
                trigger_mode="always_last",
            )

        # Every way to open a run is one event (open_all), its figures chained after the panes show.
        picked = self.table.select(self.select, [self.table], [self.run_id], api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        then_figures(
            picked.then(self.open_all, [self.run_id], self.open_outputs, api_name=False, trigger_mode="always_last")
        )
        then_figures(self.open_btn.click(self.open_all, [self.run_id], self.open_outputs, api_name=False))  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        then_figures(self.run_id.submit(self.open_all, [self.run_id], self.open_outputs, api_name=False))  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        # API clients keep /open_run with its inputs and outputs (the token view's parts).
        self.api_open.click(self.open, [self.run_id], self.view.outputs, api_name="open_run")
        self.export_btn.click(self.export, [self.run_id], [self.export_file], api_name="export_run")
        self.report_btn.click(self.report, [self.run_id], [self.export_file], api_name="report_run")
        self.use_a.click(
            lambda run_id: (run_id or "").strip(),
            [self.run_id],
            [self.pair_a],
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            queue=False,
        )
        self.use_b.click(
            lambda run_id: (run_id or "").strip(),
            [self.run_id],
            [self.pair_b],
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            queue=False,
        )
        self.pair_btn.click(self.compare_pair, [self.pair_a, self.pair_b], [self.pair_out], api_name="compare_runs")
        self.view.prompt_pick.input(self.switch_view, picks, self.view.outputs, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.view.side_pick.input(self.switch_view, picks, self.view.outputs, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.view.wire_layers(self.service, picks)
        self.wview.create_event_handlers()
        self.which.create_event_handlers()
        self.audit.create_event_handlers()
        then_figures(app.load(self.from_url, None, [self.run_id, *self.open_outputs], api_name=False))
        app.load(None, None, None, js=FROM_URL_JS, api_name=False)
