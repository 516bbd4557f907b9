"""An invariance audit's record (parity_ui.core.audit_record), next to its run.

The audit itself is a run of kind "audit" (its row in `runs`: History and `parity runs list` show it,
its headline the audit's one line); the runs of its broken axes' stream pairs share its group. The
record, every axis of every side with its cells, its control and its evidence, is one JSON row in
`audits`, written again as each axis finishes (a stopped audit keeps what it finished). The table
comes from the one migration list (parity_ui.store.runs, m009_audits).
"""

from __future__ import annotations

import json

from sqlite_utils import Database

from ..core.audit_record import AuditReport, report_from_json
from .runs import _json, set_headline


def save_audit(db: Database, run_id: str, created: str, report: AuditReport) -> None:
    """The audit's record and its run's headline, in one transaction (replacing what was written before)."""
    data = report.to_json()
    with db.atomic():
        db.table("audits").insert(
            {
                "run_id": run_id,
                "datetime_utc": created,
                "verdict": report.verdict,
                "certified": int(report.certified),
                "report_json": _json(data),  # an infinite difference (a NaN against a number) as 1e30
            },
            pk="run_id",
            replace=True,
        )
        set_headline(db, run_id, report.headline())


def audit_of(db: Database, run_id: str) -> AuditReport | None:
    """A stored audit's record, or None (no such audit)."""
    row = db.execute("SELECT report_json FROM audits WHERE run_id = ?", [run_id]).fetchone()
    return report_from_json(json.loads(row[0])) if row else None
