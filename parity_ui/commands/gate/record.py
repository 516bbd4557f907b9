"""The gate's own records, next to the runs in the same database.

A check is stored as a run of kind "check" (its row in `runs`, so `parity runs list` and the app's
history show it, with the cases' workload runs under the same group_id) and, in the gate's tables,
its results per case and threshold as JSON (`gate_checks`) and one row per case (`gate_cases`:
what "baseline: last-pass" looks up). The gate's tables are its own migration set, so the core
store's migrations stay as they are.
"""
from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

migrations = Migrations("parity_ui.commands.gate")


@migrations()
def m001_checks(db: Database) -> None:
    db["gate_checks"].create({"run_id": str, "group_id": str, "datetime_utc": str, "spec_path": str,
                              "exit_code": int, "result_json": str}, pk="run_id")
    db["gate_cases"].create({"check_run_id": str, "case_name": str, "datetime_utc": str, "model": str,
                             "model_path": str, "content_hash": str, "run_id": str, "control_run_id": str,
                             "status": str, "passed": int}, pk=("check_run_id", "case_name"))
    db["gate_cases"].create_index(["case_name", "passed", "datetime_utc"])


def ensure_tables(db: Database) -> None:
    migrations.apply(db)


def save_check(db: Database, run_id: str, group_id: str, created: str, spec_path: str, exit_code: int,
               result: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    """The check's results and its cases' rows, in one transaction."""
    ensure_tables(db)
    with db.atomic():
        db["gate_checks"].insert({"run_id": run_id, "group_id": group_id, "datetime_utc": created,
                                  "spec_path": spec_path, "exit_code": exit_code,
                                  "result_json": json.dumps(result, allow_nan=False, default=str)},
                                 pk="run_id", replace=True)
        db["gate_cases"].insert_all(({"check_run_id": run_id, "datetime_utc": created, **c} for c in cases),
                                    pk=("check_run_id", "case_name"), replace=True)
        headline = result.get("headline")
        if headline:  # the history list's one line (the run row's own headline column)
            db.execute("UPDATE runs SET headline = ? WHERE id = ?", [headline, run_id])


def check_result(db: Database, run_id: str) -> dict[str, Any] | None:
    """A stored check's results (the JSON save_check wrote), or None."""
    ensure_tables(db)
    rows = list(db.query("SELECT result_json FROM gate_checks WHERE run_id = ?", [run_id]))
    return json.loads(rows[0]["result_json"]) if rows else None


def last_pass(db: Database, case: str, models: tuple[str, ...], content_hash: str) -> str | None:
    """The workload run of the newest passing check of `case` on one of `models` (as given or its
    path) with the same prompts (content hash), or None."""
    ensure_tables(db)
    marks = ", ".join("?" * len(models))
    rows = list(db.query(
        f"SELECT run_id FROM gate_cases WHERE case_name = ? AND passed = 1 AND content_hash = ? "
        f"AND (model IN ({marks}) OR model_path IN ({marks})) ORDER BY datetime_utc DESC, check_run_id DESC LIMIT 1",
        [case, content_hash, *models, *models]))
    return rows[0]["run_id"] if rows else None
