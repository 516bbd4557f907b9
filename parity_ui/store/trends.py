"""A run's trend over its steps (parity_ui.commands.replay_steps): its record, written as each step
lands (a follow appends to it), read back by the views; the one line History lists it with.
"""

from __future__ import annotations

import json

from sqlite_utils import Database

from ..core.trend import TrendReport, trend_from_json
from .runs import _json


def save_trend(db: Database, run_id: str, report: TrendReport) -> None:
    """The trend's record as it now stands (replacing the one written before)."""
    db.table("trends").upsert(
        {
            "run_id": run_id,
            "root": report.root,
            "format": report.format,
            "headline": report.headline,
            "trend_json": _json(report.to_json()),  # non-finite floats as every *_json column stores them
        },
        pk="run_id",
    )


def trend(db: Database, run_id: str) -> TrendReport | None:
    row = db.execute("SELECT trend_json FROM trends WHERE run_id = ?", [run_id]).fetchone()
    return trend_from_json(json.loads(row[0])) if row and row[0] else None


def trend_lines(db: Database, ids: list[str]) -> dict[str, tuple[str, str]]:
    """{run id: (root, headline)} of the listed trends (ids that are not trends are left out)."""
    if not ids:
        return {}
    rows = db.execute(
        f"SELECT run_id, root, headline FROM trends WHERE run_id IN ({', '.join('?' * len(ids))})", list(ids)
    ).fetchall()
    return {r[0]: (r[1] or "", r[2] or "") for r in rows}
