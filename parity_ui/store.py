"""Every run in SQLite (runs.db) through sqlite-utils.

Schema changes are append-only migrations. Columns follow one convention: `*_json` holds JSON text,
`datetime_utc` an ISO timestamp, `duration_ms` an integer; run ids are time-sortable ULIDs.
"""
from __future__ import annotations

import json
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from .paths import default_db_path
from .types import Run, prompt_result_from_dict, run_from_dict, to_dict

migrations = Migrations("parity_ui")

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_run_id() -> str:
    """A ULID: 48-bit millisecond time + 80 random bits, Crockford base32, sorts by time."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


@migrations()
def m001_runs(db: Database) -> None:
    db["runs"].create({
        "id": str, "datetime_utc": str, "kind": str, "group_id": str, "status": str,
        "identical": int, "first_divergence": int, "model": str, "model_path": str, "dtype": str,
        "device": str, "n_prompts": int, "prompt_excerpt": str, "error": str, "error_code": str,
        "duration_ms": int, "config_json": str, "model_json": str, "engines_json": str,
        "versions_json": str, "warnings_json": str, "probes_json": str,
    }, pk="id")
    db["runs"].create_index(["datetime_utc"])
    db["runs"].create_index(["group_id"])
    db["prompt_results"].create({
        "run_id": str, "idx": int, "prompt_text": str, "prompt_token_ids_json": str,
        "messages_json": str, "vllm_json": str, "hf_json": str, "comparison_json": str,
        "explanation_json": str, "cross_scores_json": str,
    }, pk=("run_id", "idx"), foreign_keys=[("run_id", "runs", "id")])


def open_db(path: str | Path | None = None) -> Database:
    """Open (creating if needed) and migrate the run database. `:memory:` works for tests."""
    p = str(path or default_db_path())
    if p == ":memory:":
        db = Database(memory=True)
    else:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        # Gradio calls handlers from a thread pool; the service serialises writes with its lock.
        db = Database(sqlite3.connect(p, check_same_thread=False))
        db.execute("PRAGMA journal_mode=WAL")  # the app reads history while a run is written
    migrations.apply(db)
    return db


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(to_dict(value))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def save_run(db: Database, run: Run) -> None:
    """Insert or replace the run and its prompt results, in one transaction."""
    with db.conn:
        db["runs"].upsert({
            "id": run.id, "datetime_utc": run.created_utc, "kind": run.kind, "group_id": run.group_id,
            "status": run.status,
            "identical": None if run.identical is None else int(run.identical),
            "first_divergence": run.first_divergence, "model": run.model.name, "model_path": run.model.path,
            "dtype": _dtype(run), "device": run.device, "n_prompts": len(run.prompts),
            "prompt_excerpt": _excerpt(run), "error": run.error, "error_code": run.error_code,
            "duration_ms": run.duration_ms, "config_json": _dumps(run.config), "model_json": _dumps(run.model),
            "engines_json": _dumps(run.engines), "versions_json": _dumps(run.versions),
            "warnings_json": _dumps(run.warnings), "probes_json": _dumps(run.probes),
        }, pk="id")
        db.execute("DELETE FROM prompt_results WHERE run_id = ?", [run.id])
        db["prompt_results"].insert_all(({
            "run_id": run.id, "idx": p.index, "prompt_text": p.prompt_text,
            "prompt_token_ids_json": _dumps(p.prompt_token_ids), "messages_json": _dumps(p.messages),
            "vllm_json": _dumps(p.vllm), "hf_json": _dumps(p.hf), "comparison_json": _dumps(p.comparison),
            "explanation_json": _dumps(p.explanation), "cross_scores_json": _dumps(p.cross_scores),
        } for p in run.prompts), pk=("run_id", "idx"))


def _dtype(run: Run) -> str | None:
    """The dtype the weights actually ran in ('auto' resolved), else what was asked for."""
    hf = run.engines.get("hf")
    return hf.dtype if hf is not None else run.config.get("dtype")


def _excerpt(run: Run, n: int = 120) -> str:
    if not run.prompts:
        return ""
    p = run.prompts[0]
    text = p.prompt_text
    if p.messages:
        text = " | ".join(m.get("content", "") for m in p.messages)
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def get_run(db: Database, run_id: str) -> Run | None:
    rows = list(db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
    if not rows:
        return None
    r = rows[0]
    prompts = [prompt_result_from_dict({
        "index": p["idx"], "prompt_text": p["prompt_text"],
        "prompt_token_ids": _loads(p["prompt_token_ids_json"]) or [],
        "messages": _loads(p["messages_json"]), "vllm": _loads(p["vllm_json"]), "hf": _loads(p["hf_json"]),
        "comparison": _loads(p["comparison_json"]), "explanation": _loads(p["explanation_json"]),
        "cross_scores": _loads(p["cross_scores_json"]),
    }) for p in db.query("SELECT * FROM prompt_results WHERE run_id = ? ORDER BY idx", [run_id])]
    run = run_from_dict({
        "id": r["id"], "created_utc": r["datetime_utc"], "model": _loads(r["model_json"]),
        "config": _loads(r["config_json"]) or {}, "status": r["status"], "error": r["error"],
        "error_code": r["error_code"], "warnings": _loads(r["warnings_json"]) or [],
        "engines": _loads(r["engines_json"]) or {}, "versions": _loads(r["versions_json"]) or {},
        "device": r["device"] or "", "duration_ms": r["duration_ms"], "group_id": r["group_id"],
        "kind": r["kind"] or "compare", "probes": _loads(r["probes_json"]),
    })
    run.prompts = prompts
    return run


@dataclass
class RunSummary:
    id: str
    datetime_utc: str
    kind: str
    status: str
    identical: bool | None
    first_divergence: int | None
    model: str
    dtype: str | None
    device: str
    n_prompts: int
    prompt_excerpt: str
    error: str | None
    duration_ms: int | None
    group_id: str | None
    error_code: str | None = None


def list_runs(db: Database, *, search: str | None = None, model: str | None = None,
              status: str | None = None, since: str | None = None, until: str | None = None,
              group_id: str | None = None, limit: int = 200, offset: int = 0) -> list[RunSummary]:
    """Newest first. `search` matches the id, model, prompt excerpt and error; `since`/`until`
    are ISO dates compared against datetime_utc."""
    where, params = [], []
    if search:
        where.append("(id LIKE ? OR model LIKE ? OR prompt_excerpt LIKE ? OR error LIKE ?)")
        params += [f"%{search}%"] * 4
    for col, val in (("model", model), ("status", status), ("group_id", group_id)):
        if val:
            where.append(f"{col} = ?")
            params.append(val)
    if since:
        where.append("datetime_utc >= ?")
        params.append(since)
    if until:
        where.append("datetime_utc < ?")
        params.append(until)
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY datetime_utc DESC, id DESC LIMIT ? OFFSET ?"
    params += [limit, offset]
    return [RunSummary(
        id=r["id"], datetime_utc=r["datetime_utc"], kind=r["kind"] or "compare", status=r["status"],
        identical=None if r["identical"] is None else bool(r["identical"]),
        first_divergence=r["first_divergence"], model=r["model"], dtype=r["dtype"], device=r["device"] or "",
        n_prompts=r["n_prompts"] or 0, prompt_excerpt=r["prompt_excerpt"] or "", error=r["error"],
        duration_ms=r["duration_ms"], group_id=r["group_id"], error_code=r["error_code"],
    ) for r in db.query(sql, params)]


def distinct_models(db: Database) -> list[str]:
    return [r["model"] for r in db.query("SELECT DISTINCT model FROM runs ORDER BY model")]

