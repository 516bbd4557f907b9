"""The gate's records, next to the runs in the same database.

A check is stored as a run of kind "check" (its row in `runs`, so `parity runs list` and the app's
history show it, with the cases' workload runs under the same group_id) and, in the gate's tables,
its results per case and threshold as JSON (`gate_checks`) and one row per case (`gate_cases`:
what "baseline: last-pass" looks up). The tables are made by the one migration list
(parity_ui.store.runs, m008_gate), so reading them needs no set-up of its own.
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from .runs import set_headline


def save_check(
    db: Database,
    run_id: str,
    group_id: str,
    created: str,
    spec_path: str,
    exit_code: int,
    result: dict[str, Any],
    cases: list[dict[str, Any]],
) -> None:
    """The check's results, its cases' rows and its run's headline, in one transaction."""
    with db.atomic():
        db.table("gate_checks").insert(
            {
                "run_id": run_id,
                "group_id": group_id,
                "datetime_utc": created,
                "spec_path": spec_path,
                "exit_code": exit_code,
                "result_json": json.dumps(result, allow_nan=False, default=str),
            },
            pk="run_id",
            replace=True,
        )
        db.table("gate_cases").insert_all(
            ({"check_run_id": run_id, "datetime_utc": created, **c} for c in cases),
            pk=("check_run_id", "case_name"),
            replace=True,
        )
        headline = result.get("headline")
        if headline:  # the history list's one line (the run row's own headline column)
            set_headline(db, run_id, headline)


def check_result(db: Database, run_id: str) -> dict[str, Any] | None:
    """A stored check's results (the JSON save_check wrote), or None."""
    rows = list(db.query("SELECT result_json FROM gate_checks WHERE run_id = ?", [run_id]))
    return json.loads(rows[0]["result_json"]) if rows else None


def last_pass(db: Database, case: str, models: tuple[str, ...], content_hash: str) -> str | None:
    """The workload run of the newest passing check of `case` on one of `models` (as given or its
    path) with the same prompts (content hash), or None."""
    marks = ", ".join("?" * len(models))
    rows = list(
        db.query(
            f"SELECT run_id FROM gate_cases WHERE case_name = ? AND passed = 1 AND content_hash = ? "
            f"AND (model IN ({marks}) OR model_path IN ({marks})) ORDER BY datetime_utc DESC, check_run_id DESC LIMIT 1",
            [case, content_hash, *models, *models],
        )
    )
    return rows[0]["run_id"] if rows else None
