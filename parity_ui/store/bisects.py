"""The named reads a bisect (parity_ui.commands.setting_bisect) and Which setting?
(parity_ui.commands.which_setting) make: which sides of a run forked from the reference, how each
prompt of a side fared (to take the worst first), the bisects stored for a run and their one-line
answers. A bisect is written as a run (kind "bisect", its record in `runs.bisect_json`) through the
recorder, like every run; nothing here writes. Each function takes the open Database, as
parity_ui.store.runs' do.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlite_utils import Database

from ..core.bisect_record import KIND, TRIAL_KIND
from ..core.types import Run
from .runs import get_run

__all__ = [
    "PromptFork",
    "BisectLine",
    "forked_sides",
    "prompt_forks",
    "bisects_of",
    "latest_bisect",
    "bisect_lines",
    "trial_counts",
]


@dataclass(frozen=True)
class PromptFork:
    """How one prompt of a side fared against the reference in a stored comparison."""

    prompt_idx: int
    identical: bool
    first_divergence: int | None


@dataclass(frozen=True)
class BisectLine:
    """A stored bisect's row, as a runs table lists it (the record's pair and answer)."""

    id: str
    status: str
    error: str | None
    run_id: str | None  # the run it searched
    side: str | None
    reference: str | None
    summary: str | None


def forked_sides(db: Database, run_id: str, reference: str) -> set[str]:
    """The sides of run `run_id` whose tokens were not identical to `reference`'s on some prompt."""
    return {
        r["b"]
        for r in db.query(
            "SELECT DISTINCT b FROM comparisons WHERE run_id = ? AND a = ? AND identical = 0", [run_id, reference]
        )
    }


def prompt_forks(db: Database, run_id: str, side: str) -> list[PromptFork]:
    """Each stored comparison of `side` against the reference in run `run_id`, in no set order."""
    return [
        PromptFork(r["prompt_idx"], bool(r["identical"]), r["first_divergence"])
        for r in db.query(
            "SELECT prompt_idx, identical, first_divergence FROM comparisons WHERE run_id = ? AND b = ?", [run_id, side]
        )
    ]


def _bisect_ids(db: Database, run_id: str, limit: int | None = None) -> list[str]:
    sql = (
        "SELECT id FROM runs WHERE kind = ? AND json_extract(bisect_json, '$.run_id') = ? "
        "ORDER BY datetime_utc DESC, id DESC" + (f" LIMIT {int(limit)}" if limit else "")
    )
    return [r["id"] for r in db.query(sql, [KIND, run_id])]


def bisects_of(db: Database, run_id: str) -> list[Run]:
    """The stored bisects of run `run_id`, newest first (their records; their prompts are not read)."""
    return [run for i in _bisect_ids(db, run_id) if (run := get_run(db, i, prompts=[])) is not None]


def latest_bisect(db: Database, run_id: str) -> Run | None:
    """The newest stored bisect of run `run_id` (its record; its prompts are not read), or None."""
    ids = _bisect_ids(db, run_id, limit=1)
    return get_run(db, ids[0], prompts=[]) if ids else None


def bisect_lines(db: Database, ids: list[str]) -> list[BisectLine]:
    """The listed bisects' rows (ids not stored are left out)."""
    if not ids:
        return []
    marks = ", ".join("?" * len(ids))
    return [
        BisectLine(r["id"], r["status"], r["error"], r["of"], r["side"], r["ref"], r["summary"])
        for r in db.query(
            "SELECT id, status, error, json_extract(bisect_json, '$.run_id') AS of, "
            "json_extract(bisect_json, '$.side') AS side, "
            "json_extract(bisect_json, '$.reference') AS ref, "
            f"json_extract(bisect_json, '$.summary') AS summary FROM runs WHERE id IN ({marks})",
            ids,
        )
    ]


def trial_counts(db: Database, group_ids: list[str]) -> dict[str, int]:
    """How many trial runs each of these bisects' groups holds (History shows the count on the bisect's
    row instead of listing each trial)."""
    if not group_ids:
        return {}
    marks = ", ".join("?" * len(group_ids))
    return {
        r[0]: r[1]
        for r in db.execute(
            f"SELECT group_id, count(*) FROM runs WHERE kind = ? AND group_id IN ({marks}) GROUP BY group_id",
            [TRIAL_KIND, *group_ids],
        ).fetchall()
    }
