"""Weight-sync checks (issue 41), next to the runs: each is a run of kind "weights" (its row in `runs`,
so `parity runs list` and the history show it) and, in `weight_checks`, its report as JSON with the few
columns the app's list shows. The table comes from the one migration list (runs.py, m009_weight_checks).
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from .runs import set_headline


def save_weight_check(db: Database, run_id: str, created: str, report: dict[str, Any]) -> None:
    """The report (core.weights.WeightReport.to_dict()) and its run's headline, in one transaction."""
    with db.atomic():
        db.table("weight_checks").insert(
            {
                "run_id": run_id,
                "datetime_utc": created,
                "model": report.get("model"),
                "start_from": report.get("start_from"),
                "updated": report.get("updated"),
                "exit_code": int(report.get("exit_code", 2)),
                "differing": len(report.get("differing") or []),
                "tensors": len(report.get("tensors") or []),
                "headline": report.get("headline"),
                "report_json": json.dumps(report, allow_nan=False, default=_finite),
            },
            pk="run_id",
            replace=True,
        )
        if report.get("headline"):
            set_headline(db, run_id, report["headline"])


def _finite(v: Any) -> Any:
    return str(v)


def weight_check(db: Database, run_id: str) -> dict[str, Any] | None:
    rows = list(db.query("SELECT report_json FROM weight_checks WHERE run_id = ?", [run_id]))
    return json.loads(rows[0]["report_json"]) if rows else None


def weight_checks(db: Database, limit: int = 50) -> list[dict[str, Any]]:
    """The newest checks first: run_id, datetime_utc, model, start_from, updated, exit_code, differing,
    tensors, headline."""
    return list(
        db.query(
            "SELECT run_id, datetime_utc, model, start_from, updated, exit_code, differing, tensors, headline "
            "FROM weight_checks ORDER BY datetime_utc DESC, run_id DESC LIMIT ?",
            [limit],
        )
    )
