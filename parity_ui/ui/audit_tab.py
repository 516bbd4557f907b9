"""The Audit tab: certify zero (parity_ui.commands.audit). A model, the sides to audit (each an engine
setup, one per line as on the command line), a few settings, the prompts (the built-in mixed-length set
or a file), the axes; Run shows the audit's progress, then its verdict and the axes x prompts grid
(parity_ui.ui.audit_view), a broken cell opening its tokens below at the break, and the certificate
(JSON and HTML) to download. History lists the audit like any run.

The form is read into an AuditRequest by `audit_request` (no gradio in it: tested alone); the handlers
only move values in and out.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from ..core.audit_record import AXES, AXIS_KEYS
from ..core.config import build_config
from ..core.errors import ParityError, PromptError
from ..inputs.audit_prompts import builtin_prompts, describe_builtin
from ..inputs.demo_model import DEMO_NAME
from ..inputs.prompts import read_prompt_file
from ..render import cards
from ..render.audit import audit_page_html, certificate_json
from ..service import AuditOutcome, AuditRequest
from .active_run import session_of
from .audit_view import AuditView
from .live import StatusLive, follow
from .result_view import ResultView

THROTTLE_S = 0.5
DEFAULT_SIDES = "ref=hf,dtype=float32\nb=vllm,dtype=float32,enable_prefix_caching=true"
DEFAULT_SETTINGS = "max_new_tokens=32"
AXIS_CHOICES = [(f"{label}: {what}", key) for key, (label, what) in AXES.items()]


def audit_request(
    model: str,
    sides_text: str,
    settings_text: str,
    n_prompts: Any,
    longest: Any,
    prompt_file: str | None,
    axes: list[str] | None,
    batch: Any,
    control_setting: bool,
    trust: bool = False,
) -> AuditRequest:
    """The form as an AuditRequest. Raises ParityError naming the field and the fix."""
    sides = [
        line.strip() for line in (sides_text or "").splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    if not sides:
        raise ParityError("no side to audit", "write one per line, e.g. b=vllm,enable_prefix_caching=true")
    settings = [x for x in (settings_text or "").replace(",", " ").split() if x.strip()]
    cfg = build_config(None, settings, sides=sides, min_sides=1)
    if prompt_file:
        path = Path(prompt_file)
        if path.suffix.lower() in (".jsonl", ".parquet"):
            from ..inputs.workload_source import load_workload

            w = load_workload(path)
            prompts, source = list(w.prompts), w.describe()
        else:
            prompts = read_prompt_file(path)
            source = f"{len(prompts)} prompt(s) from {path.name}"
    else:
        n = int(n_prompts or 8)
        words = int(longest or 600)
        if not 1 <= n <= 1024:
            raise PromptError(f"{n} built-in prompts: give 1 to 1024", "e.g. 8")
        prompts, source = builtin_prompts(n, words), describe_builtin(n, words)
    if not axes:
        raise ParityError("no axis is ticked", "tick the axes to audit (all of them certify a setup)")
    return AuditRequest(
        model=(model or DEMO_NAME).strip(),
        config=cfg,
        prompts=prompts,
        axes=list(axes),
        batch_size=int(batch) if batch else None,
        control_setting=bool(control_setting),
        source=source,
        trust_remote_code=bool(trust),
    )


def write_certificate(report: Any, run_id: str) -> list[str]:
    """The certificate as two files (JSON, and the HTML page with the same JSON inside) to download."""
    folder = Path(tempfile.mkdtemp(prefix="parity-audit-"))
    js, page = folder / f"parity-audit-{run_id}.json", folder / f"parity-audit-{run_id}.html"
    js.write_text(json.dumps(certificate_json(report, run_id), indent=1, default=str), encoding="utf-8")
    page.write_text(audit_page_html(report, run_id), encoding="utf-8")
    return [str(js), str(page)]


class AuditTab:
    def __init__(self, service: Any, gate: Any):
        self.service, self.gate = service, gate
        self.view = ResultView(
            "aud",
            localisations=lambda run_id: self.service.reader.localisations_of(run_id),
            images=lambda sha: self.service.reader.image_bytes(sha),
        )
        self.audit = AuditView("aud", service, self.view)

    def create_ui(self) -> None:
        with gr.Tab("Audit", id="audit"):
            gr.Markdown(
                "Certify zero: each side's setup against itself on every axis an engine promises to be invariant "
                "on, token ids AND logprob bits, tolerance 0, with a control that must fail (a planted one-ulp "
                "change). An axis the setup does not have reads *not applicable*, with the reason."
            )
            with gr.Row():
                self.model = gr.Textbox(label="Model", value=DEMO_NAME, scale=2, elem_id="aud-model")
                self.trust = gr.Checkbox(label="trust_remote_code", value=False, scale=1)
            with gr.Row():
                self.sides = gr.Textbox(
                    label="Sides to audit (one per line: NAME=KIND,option=value)",
                    value=DEFAULT_SIDES,
                    lines=3,
                    scale=3,
                    elem_id="aud-sides",
                )
                self.settings = gr.Textbox(
                    label="Settings (KEY=VALUE, space-separated)",
                    value=DEFAULT_SETTINGS,
                    lines=3,
                    scale=2,
                    elem_id="aud-settings",
                )
            with gr.Row():
                self.n_prompts = gr.Number(
                    label="Built-in prompts", value=8, precision=0, minimum=1, scale=1, elem_id="aud-n"
                )
                self.longest = gr.Number(
                    label="Longest (words)", value=600, precision=0, minimum=16, scale=1, elem_id="aud-longest"
                )
                self.batch = gr.Number(label="Full batch (0: every prompt)", value=0, precision=0, minimum=0, scale=1)
                self.file = gr.File(label="Or a prompt file (.txt, .jsonl, .parquet)", type="filepath", scale=2)
            self.axes = gr.CheckboxGroup(choices=AXIS_CHOICES, value=list(AXIS_KEYS), label="Axes", elem_id="aud-axes")
            with gr.Row():
                self.control_setting = gr.Checkbox(
                    label="Also the setting control (the first side with its dtype flipped must break; one engine more)",
                    value=False,
                )
                self.run_btn = gr.Button("Run audit", variant="primary", elem_id="aud-run", scale=1)
                # Not red while nothing runs (issue 46 item 15, as the Compare tab's): it stops the app's run.
                self.stop_btn = gr.Button("Stop", variant="secondary", elem_id="aud-stop", scale=1)
            self.progress = gr.HTML(elem_id="aud-progress")
            self.audit.create_ui()
            self.evidence = gr.File(label="Certificate (JSON and HTML)", visible=False, file_count="multiple")
            self.view.create_ui()

    # -- handlers ------------------------------------------------------------------------------------

    def run(
        self,
        model: str,
        trust: bool,
        sides: str,
        settings: str,
        n_prompts: Any,
        longest: Any,
        batch: Any,
        file: Any,
        axes: list[str],
        control_setting: bool,
        request: gr.Request | None = None,
    ) -> Iterator[dict[Any, Any]]:
        try:
            req = audit_request(model, sides, settings, n_prompts, longest, file, axes, batch, control_setting, trust)
        except ParityError as e:  # refused before anything runs: shown, not stored
            yield {
                self.progress: cards.error_html(e.message, e.fix, "Audit refused"),
                **self.audit.hidden(),
                self.evidence: gr.File(visible=False),
            }
            return
        # One of the app's runs (active_run.RunGate.launch): it runs on a worker thread, goes on if this tab
        # goes, and every tab sees it (the bar above the tabs, its Stop); a run ahead of it is named.
        names = ", ".join(s.name for s in req.config.sides)
        live = StatusLive(f"Auditing {names}")
        active, events = self.gate.launch(
            session_of(request),
            f"an audit of {names} on {_model_name(req.model)}",
            live,
            lambda emit: self.service.audit(req, emit, refuse=True),
        )
        try:
            yield {
                self.progress: self.gate.draw(active, lambda live: live.progress()),
                **self.audit.hidden(),
                **self.view.cleared(),
                self.evidence: gr.File(visible=False),
            }
            for item in follow(events, lambda ev: None, THROTTLE_S):
                if item is None:
                    yield {self.progress: self.gate.draw(active, lambda live: live.progress())}
                    continue
                if isinstance(item, ParityError):  # refused before any side started: shown, not stored
                    yield {self.progress: cards.error_html(item.message, item.fix, "Audit refused")}
                    return
                if not isinstance(item, AuditOutcome):
                    yield {
                        self.progress: cards.error_html(
                            f"internal error: {type(item).__name__}: {item}",
                            "the app keeps serving; please report this",
                        )
                    }
                    return
                run, report = item.run, item.report
                error = (
                    cards.error_html(
                        run.error or run.status, "the axes finished before it are kept", "The audit ended early"
                    )
                    if run.status not in ("ok", "diverged")
                    else ""
                )
                yield {
                    self.progress: error,
                    **self.audit.values(run.id),
                    self.evidence: gr.File(value=write_certificate(report, run.id), visible=bool(report.results)),
                }
                return
        finally:  # the run goes on if this tab went away: every tab's bar then shows it
            self.gate.unfollow(active)

    def stop(self, request: gr.Request | None = None) -> str:
        """Stop the run on the engines, whichever tab started it (an audit keeps the axes it finished)."""
        return cards.notice_html(self.gate.stop(session_of(request)))

    def create_event_handlers(self) -> None:
        inputs = [
            self.model,
            self.trust,
            self.sides,
            self.settings,
            self.n_prompts,
            self.longest,
            self.batch,
            self.file,
            self.axes,
            self.control_setting,
        ]
        self.run_btn.click(
            self.run,
            inputs,
            [self.progress, *self.audit.outputs, *self.view.outputs, self.evidence],
            api_name="audit",
            concurrency_limit=1,
            concurrency_id="engines",
            show_progress="minimal",
        )
        self.stop_btn.click(self.stop, None, self.progress, api_name=False, queue=False)  # type: ignore[arg-type]
        self.audit.create_event_handlers()


def _model_name(model: str) -> str:
    return os.path.basename(str(model).rstrip("/")) or str(model)
