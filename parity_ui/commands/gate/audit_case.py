"""A gate case that is an invariance audit (`audit:` in a spec; parity_ui.commands.audit): the case
passes only at zero. Each (side, axis) is one check: identical passes; broken, vacuous, an error or an
asked-for axis that did not run fails; an axis the setup does not have (or that the case left out) is
skipped, its reason said; a case where no axis was judged fails. The
audit's own control is the case's control: detected passes; not detected, the audit is VOID and the
case cannot pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.audit_record import BROKEN, ERROR, IDENTICAL, NOT_ASKED, NOT_RUN, VACUOUS, AuditReport, axis_label
from ...core.config import ParityConfig
from ...core.runlog import EventCallback
from ...core.types import Run
from ...inputs.prompts import PromptSpec
from ..audit.run import AuditRequest, run_audit
from .judge import Outcome, Status
from .spec import AuditSpec

if TYPE_CHECKING:
    from ..service_api import Service

LABEL = "invariance audit: bitwise identical"


def audit_outcomes(report: AuditReport, run_id: str, line: int | None = None) -> list[Outcome]:
    """One outcome per audited (side, axis), in the audit's order. Pure."""
    out = []
    for r in report.results:
        check = f"{axis_label(r.axis)}: identical bit for bit"
        status: Status
        if r.status == IDENTICAL:
            status, message = "pass", f"{r.prompts} prompts, {r.tokens:,} tokens identical (run {run_id})"
        elif r.status in (BROKEN, VACUOUS):
            status = "fail"
            message = f"{r.status}: {r.reason or r.status} (run {run_id}" + (
                f"; pair run {r.pair_run})" if r.pair_run else ")"
            )
        elif r.status == ERROR:
            status, message = "error", f"{r.reason} (run {run_id})"
        elif r.status == NOT_RUN and not r.reason.startswith(NOT_ASKED):
            # Asked for and not run (too few prompts, a prompt too short to chunk): not checked, so not
            # passed, as the audit's own certificate reads it.
            status, message = "fail", f"{r.status}: {r.reason}: asked for and not checked (run {run_id})"
        else:
            status, message = "skipped", f"{r.status}: {r.reason}"
        out.append(Outcome("audit", check, r.side, status, message, value=float(r.broken), limit=0.0, line=line))
    if not any(o.status == "pass" for o in out):  # nothing was identical because nothing was judged
        out.append(
            Outcome(
                "audit",
                "at least one axis judged",
                None,
                "fail",
                f"no axis was judged identical (run {run_id}): the case checked nothing",
                line=line,
            )
        )
    return out


def control_outcome(report: AuditReport, line: int | None = None) -> Outcome:
    label = "control: the audit detects a planted one-ulp change"
    if not report.controls:
        return Outcome("control", label, None, "fail", "no control ran: the audit is VOID", line=line)
    missed = [c for c in report.controls if c.detected is not True]
    if not missed:
        return Outcome(
            "control",
            label,
            None,
            "pass",
            "; ".join(f"{c.kind}: detected ({c.description})" for c in report.controls),
            line=line,
        )
    c = missed[0]
    why = f"could not run: {c.error}" if c.detected is None else "NOT detected"
    return Outcome(
        "control", label, None, "fail", f"the audit is VOID: control {c.kind} {why} ({c.description})", line=line
    )


@dataclass
class AuditCase:
    """An audit case's run and its judgement (parity_ui.commands.gate.check makes the CaseResult)."""

    run: Run
    report: AuditReport
    outcomes: list[Outcome]
    control: Outcome
    control_description: str
    control_run: str | None


def run_audit_case(
    service: Service,
    spec: AuditSpec,
    model: str,
    config: ParityConfig,
    prompts: list[PromptSpec],
    source: str,
    trust_remote_code: bool,
    group: str,
    emit: EventCallback | None,
) -> AuditCase:
    """The case's audit run (stored in the check's group) and judged at zero."""
    out = run_audit(
        service,
        AuditRequest(
            model=model,
            config=config,
            prompts=prompts,
            axes=spec.axes,
            batch_size=spec.batch,
            control_setting=spec.control_setting,
            control_set=spec.control_set,
            source=source,
            trust_remote_code=trust_remote_code,
            group_id=group,
            seed=spec.seed,
        ),
        emit,
    )
    run, report = out.run, out.report
    if run.status not in ("ok", "diverged") and not report.results:
        outcomes = [
            Outcome("run", "the audit runs", None, "error", f"audit {run.id} failed: {run.error}", line=spec.line)
        ]
    else:
        outcomes = audit_outcomes(report, run.id, spec.line)
    return AuditCase(
        run,
        report,
        outcomes,
        control_outcome(report, spec.line),
        "; ".join(c.description for c in report.controls) or "a planted one-ulp change",
        next((c.run_id for c in report.controls if c.run_id), None),
    )
