"""An invariance audit's record (parity_ui.core.audit_record), next to its run.

The audit itself is a run of kind "audit" (its row in `runs`: History and `parity runs list` show it,
its headline the audit's one line); the runs of its broken axes' stream pairs share its group. The
record, every axis of every side with its cells, its control and its evidence, is one JSON row in
`audits`, written again as each axis finishes (a stopped audit keeps what it finished). The table
comes from the one migration list (parity_ui.store.runs, m009_audits).
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlite_utils import Database

from ..core.audit_record import AuditReport, report_from_json
from .runs import set_headline


def _finite(v: Any) -> Any:
    """JSON has no infinity: an abs difference of inf (a NaN against a number) is stored as 1e308."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else math.copysign(1e308, v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


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
                "report_json": json.dumps(_finite(data), allow_nan=False),
            },
            pk="run_id",
            replace=True,
        )
        set_headline(db, run_id, report.headline())


def audit_of(db: Database, run_id: str) -> AuditReport | None:
    """A stored audit's record, or None (no such audit)."""
    row = db.execute("SELECT report_json FROM audits WHERE run_id = ?", [run_id]).fetchone()
    return report_from_json(json.loads(row[0])) if row else None
