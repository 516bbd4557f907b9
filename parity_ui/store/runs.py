"""Every run in SQLite (runs.db) through sqlite-utils.

Schema changes are append-only migrations, each in one transaction (sqlite-utils Migrations): a
failure leaves the file as it was. Columns follow one convention: `*_json` holds JSON text,
`datetime_utc` an ISO timestamp, `duration_ms` an integer; run ids are time-sortable ULIDs.

Tables: `runs` (one row a run, its sides in `sides_json`), `prompt_results` (one a prompt),
`side_results` (one per prompt and side; its generated steps as columns in `steps_json`), `comparisons` (one per prompt and non-reference side),
`localisations` (layer localisations, several per run); a bisect's record is a run of kind "bisect"
(`runs.bisect_json`); a trend's, a run of kind "trend" (`trends`).
Datasette reads the file as it is.
"""

from __future__ import annotations

import base64
import json
import math
import secrets
import sqlite3
import sys
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from ..core.bulk import gc_paused
from ..core.paths import default_db_path
from ..core.pooled import PairSample
from ..core.runlog import owner_alive
from ..core.types import (
    Localisation,
    PromptResult,
    Run,
    SideResult,
    StepColumns,
    comparison_from_dict,
    localisation_from_dict,
    prompt_result_from_dict,
    run_from_dict,
    side_result_from_dict,
    step_from_dict,
    to_dict,
)
from .legacy import legacy_comparison, legacy_config, legacy_explanation, legacy_probes, legacy_sides

migrations = Migrations("parity_ui")

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_run_id() -> str:
    """A ULID: 48-bit millisecond time + 80 random bits, Crockford base32, sorts by time."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def _jsonable(v: Any) -> Any:
    """JSON has no infinities or NaN: a masked -inf logprob is stored as -1e30 (as the engines clean
    it), NaN as null, so every *_json column is valid JSON for SQLite's json functions and Datasette."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else math.copysign(1e30, v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


def _dumps(value: Any) -> str | None:
    return None if value is None else _json(to_dict(value))


def _json(value: Any) -> str:
    try:  # the usual case: nothing to clean, and no walk over a 16k-token pair's columns
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_jsonable(value), allow_nan=False)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@migrations()
def m001_runs(db: Database) -> None:
    db.table("runs").create(
        {
            "id": str,
            "datetime_utc": str,
            "kind": str,
            "group_id": str,
            "status": str,
            "identical": int,
            "first_divergence": int,
            "model": str,
            "model_path": str,
            "dtype": str,
            "device": str,
            "n_prompts": int,
            "prompt_excerpt": str,
            "error": str,
            "error_code": str,
            "duration_ms": int,
            "config_json": str,
            "model_json": str,
            "engines_json": str,
            "versions_json": str,
            "warnings_json": str,
            "probes_json": str,
        },
        pk="id",
    )
    db.table("runs").create_index(["datetime_utc"])
    db.table("runs").create_index(["group_id"])
    db.table("prompt_results").create(
        {
            "run_id": str,
            "idx": int,
            "prompt_text": str,
            "prompt_token_ids_json": str,
            "messages_json": str,
            "vllm_json": str,
            "hf_json": str,
            "comparison_json": str,
            "explanation_json": str,
            "cross_scores_json": str,
        },
        pk=("run_id", "idx"),
        foreign_keys=[("run_id", "runs", "id")],
    )


@migrations()
def m002_sides(db: Database) -> None:
    """The fixed vLLM/HF pair becomes sides: a row per (prompt, side) and per comparison instead of
    a column per engine. Old rows are rewritten once into the new shapes (parity_ui.store.legacy)."""
    db.table("side_results").create(
        {
            "run_id": str,
            "prompt_idx": int,
            "side": str,
            "n_tokens": int,
            "finish_reason": str,
            "error": str,
            "result_json": str,
        },
        pk=("run_id", "prompt_idx", "side"),
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("comparisons").create(
        {
            "run_id": str,
            "prompt_idx": int,
            "a": str,
            "b": str,
            "identical": int,
            "first_divergence": int,
            "verdict": str,
            "comparison_json": str,
            "explanation_json": str,
            "cross_scores_json": str,
        },
        pk=("run_id", "prompt_idx", "b"),
        foreign_keys=[("run_id", "runs", "id")],
    )
    for col in ("sides", "sides_json", "timings_json", "owner_json"):
        db.table("runs").add_column(col, str)
    runs = {r["id"]: r for r in db.query("SELECT id, model_path, config_json, engines_json, probes_json FROM runs")}
    load_s: dict[str, dict[str, float | None]] = {}
    for p in list(db.query("SELECT * FROM prompt_results")):
        for side, column in (("hf", "hf_json"), ("vllm", "vllm_json")):
            res = _loads(p[column])
            if res is None:
                continue
            res["side"] = res.pop("engine", side)
            load_s.setdefault(p["run_id"], {}).setdefault(side, (res.get("timings") or {}).get("load_s"))
            db.table("side_results").insert(
                {  # the steps stay in result_json until m005 moves them
                    "run_id": p["run_id"],
                    "prompt_idx": p["idx"],
                    "side": res["side"],
                    "n_tokens": len(res.get("token_ids") or []),
                    "finish_reason": res.get("finish_reason"),
                    "error": res.get("error"),
                    "result_json": _dumps(res),
                },
                pk=("run_id", "prompt_idx", "side"),
                replace=True,
            )
        comp = _loads(p["comparison_json"])
        if comp is not None:
            new = legacy_comparison(comp)
            new["explanation"] = legacy_explanation(_loads(p["explanation_json"]))
            new["cross_scores"] = _loads(p["cross_scores_json"])
            _insert_comparison(db, p["run_id"], p["idx"], new)
    for run_id, r in runs.items():
        config = _loads(r["config_json"]) or {}
        sides = legacy_sides(config, _loads(r["engines_json"]) or {}, r["model_path"] or "", load_s.get(run_id, {}))
        db.execute(
            "UPDATE runs SET config_json = ?, sides_json = ?, sides = ?, probes_json = ? WHERE id = ?",
            [
                json.dumps(legacy_config(config)),
                json.dumps(sides),
                _sides_text(sides),
                _dumps(legacy_probes(_loads(r["probes_json"]))),
                run_id,
            ],
        )
    db.table("runs").transform(drop={"engines_json"})
    db.table("prompt_results").transform(
        drop={"vllm_json", "hf_json", "comparison_json", "explanation_json", "cross_scores_json"}
    )
    db.table("runs").create_index(["status"])


@migrations()
def m003_localisations(db: Database) -> None:
    """Layer localisations (parity_ui.commands.layers): several per run, each with its figures."""
    db.table("localisations").create(
        {
            "id": str,
            "run_id": str,
            "prompt_idx": int,
            "datetime_utc": str,
            "a": str,
            "b": str,
            "position": int,
            "first_divergent_layer": int,
            "first_divergent_block": str,
            "localisation_json": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("localisations").create_index(["run_id"])


MAX_STORED_IMAGE_BYTES = 20 * 2**20  # an image over this keeps its record (hash, size) but not its bytes


@migrations()
def m004_images(db: Database) -> None:
    """Image prompts: each image's bytes once per content hash (`images`), which prompt of which run used
    it (`run_images`), and each prompt's image records (`prompt_results.images_json`)."""
    db.table("images").create(
        {"sha256": str, "format": str, "width": int, "height": int, "n_bytes": int, "data": bytes}, pk="sha256"
    )
    db.table("run_images").create(
        {"run_id": str, "prompt_idx": int, "position": int, "sha256": str, "name": str},
        pk=("run_id", "prompt_idx", "position"),
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("run_images").create_index(["sha256"])
    db.table("prompt_results").add_column("images_json", str)


@migrations()
def m005_step_columns(db: Database) -> None:
    """A side's steps move out of `result_json` into `steps_json`, as columns (types.StepColumns):
    a stored 16k-token pair reads back in a few hundredths of a second instead of ~0.6 s."""
    db.table("side_results").add_column("steps_json", str)
    # One row at a time: a database of long runs holds gigabytes of steps.
    for (rowid,) in db.execute("SELECT rowid FROM side_results WHERE result_json IS NOT NULL").fetchall():
        res = _loads(db.execute("SELECT result_json FROM side_results WHERE rowid = ?", [rowid]).fetchone()[0])
        steps = [step_from_dict(s) for s in res.pop("steps", None) or []]
        db.execute(
            "UPDATE side_results SET result_json = ?, steps_json = ? WHERE rowid = ?",
            [_json(res), _steps_json(steps), rowid],
        )


@migrations()
def m006_workloads(db: Database) -> None:
    """Workload runs: each (prompt, side) pair's logprobs against the reference's, packed
    (`pair_samples`: what the pooled figures are computed from, read back one row at a time), and on
    the run its pooled report (`workload_json`) and a one-line headline for the history list."""
    db.table("runs").add_column("workload_json", str)
    db.table("runs").add_column("headline", str)
    db.table("prompt_results").add_column("given_json", str)  # the prompt as the user gave it (text, messages)
    db.table("pair_samples").create(
        {
            "run_id": str,
            "side": str,
            "prompt_idx": int,
            "identical": int,
            "first_divergence": int,
            "length": int,
            "verdict": str,
            "max_abs_dlogp": float,
            "logp_side": bytes,
            "logp_ref": bytes,
            "positions": bytes,
        },
        pk=("run_id", "side", "prompt_idx"),
        foreign_keys=[("run_id", "runs", "id")],
    )


@migrations()
def m007_bisect(db: Database) -> None:
    """A bisect (parity_ui.commands.setting_bisect) is a run of kind "bisect": its trials and answer in `bisect_json`."""
    db.table("runs").add_column("bisect_json", str)


@migrations()
def m008_gate(db: Database) -> None:
    """The gate's tables (parity_ui.store.checks): a check's results (`gate_checks`) and one row per
    case (`gate_cases`, what "baseline: last-pass" looks up). A file the gate used before they joined
    this list has them already (from the gate's own migration set), hence "if not exists"."""
    db.table("gate_checks").create(
        {"run_id": str, "group_id": str, "datetime_utc": str, "spec_path": str, "exit_code": int, "result_json": str},
        pk="run_id",
        if_not_exists=True,
    )
    db.table("gate_cases").create(
        {
            "check_run_id": str,
            "case_name": str,
            "datetime_utc": str,
            "model": str,
            "model_path": str,
            "content_hash": str,
            "run_id": str,
            "control_run_id": str,
            "status": str,
            "passed": int,
        },
        pk=("check_run_id", "case_name"),
        if_not_exists=True,
    )
    db.table("gate_cases").create_index(["case_name", "passed", "datetime_utc"], if_not_exists=True)


@migrations()
def m009_replay_pair_names(db: Database) -> None:
    """A replay's pairs get one name each, "b vs a" (core.replay_record): its stored pair samples move
    from the pair's old key ("recorded", "vllm", "recorded~vllm", ...) to its name, and its report is
    rewritten in the new shape (the old keys stay in it as each pair's `key`). The floor's samples stay
    under the floor side, as a workload's."""
    from ..core.workload_record import report_from_json

    for r in list(db.query("SELECT id, workload_json FROM runs WHERE kind = 'replay' AND workload_json IS NOT NULL")):
        data = json.loads(r["workload_json"])
        old = (data.get("replay") or {}).get("pairs") or []
        if not old or all("kind" in p for p in old):
            continue
        report = report_from_json(data)
        for pair in report.replay.pairs if report.replay is not None else []:
            if pair.key and pair.key != pair.stored:
                db.execute(
                    "UPDATE pair_samples SET side = ? WHERE run_id = ? AND side = ?", [pair.stored, r["id"], pair.key]
                )
        db.execute("UPDATE runs SET workload_json = ? WHERE id = ?", [_json(_jsonable(report.to_json())), r["id"]])


@migrations()
def m010_audits(db: Database) -> None:
    """Invariance audits (parity_ui.store.audits): an audit is a run of kind "audit"; its record, every
    axis of every side judged bit for bit, in `audits` (one row per audit run)."""
    db.table("audits").create(
        {"run_id": str, "datetime_utc": str, "verdict": str, "certified": int, "report_json": str},
        pk="run_id",
        foreign_keys=[("run_id", "runs", "id")],
        if_not_exists=True,
    )


@migrations()
def m011_weight_checks(db: Database) -> None:
    """Weight-sync checks (parity_ui.store.weights, issue 41): a check is a run of kind "weights" (its row in
    `runs`, so the history lists it) and its report as JSON, with what the app's list shows."""
    table = db.table("weight_checks")
    table.create(
        {
            "run_id": str,
            "datetime_utc": str,
            "model": str,
            "start_from": str,
            "updated": str,
            "exit_code": int,
            "differing": int,
            "tensors": int,
            "headline": str,
            "report_json": str,
        },
        pk="run_id",
        if_not_exists=True,
    )
    table.create_index(["datetime_utc"], if_not_exists=True)


@migrations()
def m012_trends(db: Database) -> None:
    """A run's trend over its steps (parity_ui.commands.replay_steps): a run of kind "trend" whose
    record is here (`trend_json`: core.trend.TrendReport), one row per trend, its steps' replays runs
    of kind "replay" with the trend's id as their group_id (parity_ui.store.trends)."""
    db.table("trends").create(
        {"run_id": str, "root": str, "format": str, "headline": str, "trend_json": str},
        pk="run_id",
        foreign_keys=[("run_id", "runs", "id")],
        if_not_exists=True,
    )


PACKED = "top_logprob"  # five floats a step: most of a stored run's bytes and of its parse time


def _steps_json(steps: Any) -> str:
    """A side's steps as the JSON of their columns (types.StepColumns). The top-k logprobs are
    packed: base64 of little-endian float64, exact, and read 7x faster than JSON numbers (a
    16k-token side: ~6 ms against ~40 ms); the rest stays plain JSON that SQL and Datasette read.
    Like every *_json column, infinities are stored as +-1e30 and NaN as null (here: a NaN)."""
    cols = StepColumns.from_steps(steps).columns()
    values = array("d", (_finite(x) for x in cols[PACKED]))
    if sys.byteorder != "little":
        values.byteswap()
    cols[PACKED] = {"f64le": base64.b64encode(values.tobytes()).decode("ascii")}
    return _json(cols)


def _finite(x: float | None) -> float:
    if x is None or math.isnan(x):
        return math.nan
    return x if math.isfinite(x) else math.copysign(1e30, x)


def _unpack_steps(cols: dict[str, Any]) -> dict[str, Any]:
    packed = cols.get(PACKED)
    if isinstance(packed, dict):
        values = array("d")
        values.frombytes(base64.b64decode(packed["f64le"]))
        if sys.byteorder != "little":
            values.byteswap()
        floats = values.tolist()
        total = sum(floats)  # NaN only when one is (the others are finite), found in C
        cols[PACKED] = [None if x != x else x for x in floats] if total != total else floats
    return cols


def save_images(db: Database, run_id: str, prompts: list[Any]) -> None:
    """Store the images of a run's prompts (PromptSpec.images): bytes once per hash, size-limited."""
    rows = [(i, k, img) for i, p in enumerate(prompts) for k, img in enumerate(getattr(p, "images", None) or [])]
    if not rows:
        return
    with db.atomic():
        for i, k, img in rows:
            keep = len(img.data) <= MAX_STORED_IMAGE_BYTES
            db.table("images").insert(
                {
                    "sha256": img.sha256,
                    "format": img.format,
                    "width": img.width,
                    "height": img.height,
                    "n_bytes": len(img.data),
                    "data": img.data if keep else None,
                },
                pk="sha256",
                ignore=True,
            )
            db.table("run_images").insert(
                {"run_id": run_id, "prompt_idx": i, "position": k, "sha256": img.sha256, "name": img.name},
                pk=("run_id", "prompt_idx", "position"),
                replace=True,
            )


def image_bytes(db: Database, sha256: str) -> tuple[bytes, str] | None:
    """A stored image's bytes and format (PNG, JPEG...), by content hash; None when not stored."""
    rows = list(db.query("SELECT data, format FROM images WHERE sha256 = ?", [sha256]))
    if not rows or rows[0]["data"] is None:
        return None
    return bytes(rows[0]["data"]), rows[0]["format"] or ""


def save_localisation(db: Database, loc: Localisation) -> Localisation:
    """Store a localisation with its run; fills its id and time."""
    loc.id = loc.id or new_run_id()
    loc.created_utc = loc.created_utc or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with db.conn:
        db.table("localisations").insert(
            {
                "id": loc.id,
                "run_id": loc.run_id,
                "prompt_idx": loc.prompt_index,
                "datetime_utc": loc.created_utc,
                "a": loc.a,
                "b": loc.b,
                "position": loc.position,
                "first_divergent_layer": loc.first_divergent_layer,
                "first_divergent_block": loc.first_divergent_block,
                "localisation_json": _dumps(loc.to_dict()),
            },
            replace=True,
        )
    return loc


def localisations_of(db: Database, run_id: str) -> list[Localisation]:
    """A run's localisations, oldest first."""
    rows = db.query("SELECT localisation_json FROM localisations WHERE run_id = ? ORDER BY datetime_utc, id", [run_id])
    return [localisation_from_dict(_loads(r["localisation_json"])) for r in rows]


def _insert_side_result(db: Database, run_id: str, idx: int, res: SideResult) -> None:
    # The steps go to `steps_json` as columns straight from the steps: no dict per step and top-k
    # entry on the way to JSON.
    row = to_dict(replace(res, steps=[]))
    db.table("side_results").insert(
        {
            "run_id": run_id,
            "prompt_idx": idx,
            "side": row["side"],
            "n_tokens": len(row.get("token_ids") or []),
            "finish_reason": row.get("finish_reason"),
            "error": row.get("error"),
            "result_json": _dumps(row),
            "steps_json": _steps_json(res.steps),
        },
        pk=("run_id", "prompt_idx", "side"),
        replace=True,
    )


def _insert_comparison(db: Database, run_id: str, idx: int, comp: dict[str, Any]) -> None:
    explanation = comp.pop("explanation", None)
    cross = comp.pop("cross_scores", None)
    db.table("comparisons").insert(
        {
            "run_id": run_id,
            "prompt_idx": idx,
            "a": comp["a"],
            "b": comp["b"],
            "identical": int(comp["identical"]),
            "first_divergence": comp.get("first_divergence"),
            "verdict": (explanation or {}).get("verdict"),
            "comparison_json": _dumps(comp),
            "explanation_json": _dumps(explanation),
            "cross_scores_json": _dumps(cross),
        },
        pk=("run_id", "prompt_idx", "b"),
        replace=True,
    )


def _sides_text(sides: list[dict[str, Any]]) -> str:
    """`hf=hf, vllm=vllm` for the history list: name=kind, the reference first."""
    return ", ".join(f"{s['name']}={s['kind']}" for s in sides)


def open_db(path: str | Path | None = None) -> Database:
    """Open (creating if needed) and migrate the run database; runs left "running" by a process that
    is gone are marked "interrupted". `:memory:` works for tests."""
    p = str(path or default_db_path())
    if p == ":memory:":  # written from a run's side threads too (serialised by the service)
        db = Database(sqlite3.connect(":memory:", check_same_thread=False))
    else:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        # Gradio calls handlers from a thread pool; the service serialises writes with its lock.
        db = Database(sqlite3.connect(p, check_same_thread=False, timeout=30))
        db.execute("PRAGMA journal_mode=WAL")  # the app reads history while a run is written
    migrations.apply(db)
    mark_interrupted(db)
    return db


def mark_interrupted(db: Database) -> list[str]:
    """Runs whose writing process ended before they finished become "interrupted" (their streamed
    tokens, flushed while they ran, are kept). Returns their ids."""
    done = []
    for r in list(db.query("SELECT id, owner_json FROM runs WHERE status = 'running'")):
        owner = _loads(r["owner_json"])
        if owner_alive(owner) is False:
            pid = (owner or {}).get("pid")
            with db.conn:
                db.execute(
                    "UPDATE runs SET status = 'interrupted', error = ?, error_code = 'interrupted', "
                    "owner_json = NULL WHERE id = ? AND status = 'running'",
                    [
                        f"interrupted: the process that ran it (pid {pid}) ended before the run finished; "
                        "the tokens streamed until then are kept",
                        r["id"],
                    ],
                )
            done.append(r["id"])
    return done


def save_run(db: Database, run: Run) -> None:
    """Insert or replace the whole run with its prompts, side results and comparisons, in one
    transaction (rows the run no longer has are removed). A run being made is written in parts
    instead (save_run_row, save_prompt_rows, save_side_result, save_comparisons: what changed)."""
    with db.atomic():
        save_run_row(db, run)
        for table in ("prompt_results", "side_results", "comparisons"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", [run.id])
        save_prompt_rows(db, run)
        for p in run.prompts:
            for res in p.results.values():
                _insert_side_result(db, run.id, p.index, res)
            save_comparisons(db, run.id, p)


def forget_run(db: Database, run_id: str) -> None:
    """Remove a run and every row that names it (a run refused before anything ran leaves nothing:
    issue 46 item 5), and the image bytes no run names any more."""
    with db.atomic():
        for table in db.tables:
            if table.name != "runs" and "run_id" in table.columns_dict:
                db.execute(f"DELETE FROM [{table.name}] WHERE run_id = ?", [run_id])
        db.execute("DELETE FROM runs WHERE id = ?", [run_id])
        if "images" in db.table_names() and "run_images" in db.table_names():
            db.execute("DELETE FROM images WHERE sha256 NOT IN (SELECT sha256 FROM run_images)")


def save_run_row(db: Database, run: Run) -> None:
    """The run's own row (status, figures, config, sides, timings): what every flush writes."""
    db.table("runs").upsert(
        {
            "id": run.id,
            "datetime_utc": run.created_utc,
            "kind": run.kind,
            "group_id": run.group_id,
            "status": run.status,
            "identical": None if run.identical is None else int(run.identical),
            "first_divergence": run.first_divergence,
            "model": run.model.name,
            "model_path": run.model.path,
            "dtype": _dtype(run),
            "device": run.device,
            "n_prompts": len(run.prompts),
            "prompt_excerpt": _excerpt(run),
            "error": run.error,
            "error_code": run.error_code,
            "duration_ms": run.duration_ms,
            "config_json": _dumps(run.config),
            "model_json": _dumps(run.model),
            "versions_json": _dumps(run.versions),
            "warnings_json": _dumps(run.warnings),
            "probes_json": _dumps(run.probes),
            "sides": _sides_text([to_dict(s) for s in run.sides]),
            "sides_json": _dumps(run.sides),
            "timings_json": _dumps(run.timings),
            "owner_json": _dumps(run.owner),
            "workload_json": _dumps(run.workload),
            "headline": run.workload.headline if run.workload else None,
            "bisect_json": _dumps(run.bisect),
        },
        pk="id",
    )


def save_prompt_rows(db: Database, run: Run, indices: Any = None) -> None:
    """The prompts' rows (text, token ids, messages, images): all, or those at `indices`."""
    prompts = run.prompts if indices is None else [run.prompts[i] for i in indices]
    db.table("prompt_results").insert_all(
        (
            {
                "run_id": run.id,
                "idx": p.index,
                "prompt_text": p.prompt_text,
                "prompt_token_ids_json": _dumps(p.prompt_token_ids),
                "messages_json": _dumps(p.messages),
                "images_json": _dumps(p.images) if p.images else None,
                "given_json": _dumps(p.given),
            }
            for p in prompts
        ),
        pk=("run_id", "idx"),
        replace=True,
    )


def save_side_result(db: Database, run_id: str, res: SideResult) -> None:
    """One side's result for one prompt (replacing what a flush wrote of it before)."""
    _insert_side_result(db, run_id, res.prompt_index, res)


def save_comparisons(db: Database, run_id: str, prompt: PromptResult) -> None:
    """One prompt's comparisons, each side against the reference."""
    for c in prompt.comparisons:
        _insert_comparison(db, run_id, prompt.index, to_dict(c))


def _dtype(run: Run) -> str | None:
    """The dtypes the sides' weights actually ran in ('auto' resolved), else what was asked for."""
    dtypes = list(dict.fromkeys(s.dtype for s in run.sides if s.dtype))
    return "/".join(dtypes) if dtypes else run.config.get("dtype")


def _excerpt(run: Run, n: int = 120) -> str:
    source = run.workload.options.source if run.workload is not None else {}
    if run.kind == "replay" and source.get("description"):
        # A replay's "prompts" are the dump's rows (named "line 1"...): the dump says more in History.
        return "replay of " + source["description"]
    if not run.prompts:
        return ""
    p = run.prompts[0]
    text = p.prompt_text
    if p.messages:
        from ..inputs.prompts import content_text  # image parts read as [image NAME]

        text = " | ".join(content_text(m.get("content", "")) for m in p.messages)
    if p.images and not p.messages:
        text = f"[{len(p.images)} image{'s' if len(p.images) > 1 else ''}] " + text
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def get_run(db: Database, run_id: str, prompts: list[int] | None = None) -> Run | None:
    """The stored run, or None. `prompts`: only these prompts' rows (a workload of 10,000 prompts is
    opened one prompt at a time); the run's own row always."""
    with gc_paused():
        return _get_run(db, run_id, prompts)


def _get_run(db: Database, run_id: str, only: list[int] | None = None) -> Run | None:
    rows = list(db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
    if not rows:
        return None
    r = rows[0]
    where = ""
    params: list[str | int] = [run_id]
    if only is not None:
        where = f"AND {{col}} IN ({', '.join('?' * len(only))})"
        params += [int(i) for i in only]
    results: dict[int, dict[str, Any]] = {}
    for s in db.query(
        "SELECT prompt_idx, side, result_json, steps_json FROM side_results WHERE run_id = ? "
        f"{where.format(col='prompt_idx')} ORDER BY rowid",
        params,
    ):
        res = _loads(s["result_json"])
        if s["steps_json"] is not None:  # else a row an older release wrote: its steps are in result_json
            res["steps"] = _unpack_steps(_loads(s["steps_json"]))
        results.setdefault(s["prompt_idx"], {})[s["side"]] = res
    comparisons: dict[int, list[dict[str, Any]]] = {}
    for c in db.query(
        f"SELECT * FROM comparisons WHERE run_id = ? {where.format(col='prompt_idx')} ORDER BY rowid", params
    ):
        comparisons.setdefault(c["prompt_idx"], []).append(
            {
                **_loads(c["comparison_json"]),
                "explanation": _loads(c["explanation_json"]),
                "cross_scores": _loads(c["cross_scores_json"]),
            }
        )
    prompts = [
        prompt_result_from_dict(
            {
                "index": p["idx"],
                "prompt_text": p["prompt_text"],
                "prompt_token_ids": _loads(p["prompt_token_ids_json"]) or [],
                "messages": _loads(p["messages_json"]),
                "images": _loads(p.get("images_json")) or [],
                "given": _loads(p.get("given_json")),
                "results": results.get(p["idx"], {}),
                "comparisons": comparisons.get(p["idx"], []),
            }
        )
        for p in db.query(
            f"SELECT * FROM prompt_results WHERE run_id = ? {where.format(col='idx')} ORDER BY idx", params
        )
    ]
    run = run_from_dict(
        {
            "id": r["id"],
            "created_utc": r["datetime_utc"],
            "model": _loads(r["model_json"]),
            "config": _loads(r["config_json"]) or {},
            "status": r["status"],
            "error": r["error"],
            "error_code": r["error_code"],
            "warnings": _loads(r["warnings_json"]) or [],
            "sides": _loads(r["sides_json"]) or [],
            "versions": _loads(r["versions_json"]) or {},
            "duration_ms": r["duration_ms"],
            "group_id": r["group_id"],
            "kind": r["kind"] or "compare",
            "probes": _loads(r["probes_json"]),
            "timings": _loads(r["timings_json"]) or {},
            "owner": _loads(r["owner_json"]),
            "workload": _loads(r.get("workload_json")),
            "bisect": _loads(r.get("bisect_json")),
        }
    )
    run.prompts = prompts
    return run


# -- workloads: each (prompt, side) pair's logprobs, packed ------------------------------------------


def _pack(values: Any, code: str) -> bytes:
    arr = array(code, values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def _unpack(data: bytes | None, code: str) -> list[Any]:
    arr = array(code)
    if data:
        arr.frombytes(data)
        if sys.byteorder != "little":
            arr.byteswap()
    return arr.tolist()


def save_pair_samples(db: Database, run_id: str, side: str, samples: list[PairSample]) -> None:
    """One row per (prompt, side): the side's and the reference's logprobs of the same tokens as
    float64 (a missing one as NaN), with the first divergence and the verdict."""
    db.table("pair_samples").insert_all(
        (
            {
                "run_id": run_id,
                "side": side,
                "prompt_idx": s.prompt_index,
                "identical": int(s.identical),
                "first_divergence": s.first_divergence,
                "length": s.length,
                "verdict": s.verdict,
                "max_abs_dlogp": s.max_abs_gap(),  # the prompt table's column
                "logp_side": _pack((math.nan if x is None else x for x in s.logp_side), "d"),
                "logp_ref": _pack((math.nan if x is None else x for x in s.logp_ref), "d"),
                "positions": _pack(s.positions, "i"),
            }
            for s in samples
        ),
        pk=("run_id", "side", "prompt_idx"),
        replace=True,
    )


def pair_rows(db: Database, run_id: str) -> list[dict[str, Any]]:
    """Every (prompt, side) of a workload without its logprobs: what a prompt table lists."""
    return list(
        db.query(
            "SELECT prompt_idx, side, identical, first_divergence, length, verdict, max_abs_dlogp "
            "FROM pair_samples WHERE run_id = ? ORDER BY prompt_idx, side",
            [run_id],
        )
    )


def prompt_excerpts(db: Database, run_id: str, n: int = 160) -> dict[int, str]:
    """Each prompt's first `n` characters as the user gave it (text, or the last message's text
    content), else as the engines saw it: what a prompt table lists, without reading token ids."""
    rows = db.execute(
        "SELECT idx, substr(coalesce(json_extract(given_json, '$.text'), "
        "json_extract(given_json, '$.messages[#-1].content'), prompt_text), 1, ?) FROM prompt_results "
        "WHERE run_id = ? ORDER BY idx",
        [n, run_id],
    ).fetchall()
    return {idx: text if isinstance(text, str) else "" for idx, text in rows}


def pair_samples(db: Database, run_id: str, side: str) -> Iterator[PairSample]:
    """A side's stored samples, prompt by prompt, read one row at a time (bounded memory)."""
    for r in db.query("SELECT * FROM pair_samples WHERE run_id = ? AND side = ? ORDER BY prompt_idx", [run_id, side]):
        yield PairSample(
            prompt_index=r["prompt_idx"],
            identical=bool(r["identical"]),
            first_divergence=r["first_divergence"],
            length=r["length"] or 0,
            verdict=r["verdict"],
            logp_side=_unpack(r["logp_side"], "d"),
            logp_ref=_unpack(r["logp_ref"], "d"),
            positions=_unpack(r["positions"], "i"),
        )


def prompts_done(db: Database, run_id: str, sides: list[str]) -> set[int]:
    """The prompts whose samples are stored for every one of `sides` (a resumed workload skips them)."""
    if not sides:
        return set()
    rows = db.execute(
        "SELECT prompt_idx FROM pair_samples WHERE run_id = ? AND side IN ("
        + ", ".join("?" * len(sides))
        + ") GROUP BY prompt_idx HAVING count(DISTINCT side) = ?",
        [run_id, *sides, len(sides)],
    ).fetchall()
    return {r[0] for r in rows}


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
    sides: str = ""
    headline: str | None = None  # a workload's one line (its prompts, each side's share identical and verdict)
    decoding: str = "greedy"  # how tokens were chosen (core.config.decoding_text): a sampled run says so


def list_runs(
    db: Database,
    *,
    search: str | None = None,
    model: str | None = None,
    status: str | None = None,
    since: str | None = None,
    until: str | None = None,
    group_id: str | None = None,
    limit: int = 200,
    offset: int = 0,
    exclude_kinds: tuple[str, ...] = (),
) -> list[RunSummary]:
    """Newest first. `search` matches the id, model, sides, prompt excerpt and error; `since`/`until`
    are ISO dates compared against datetime_utc; runs of `exclude_kinds` are left out (History
    folds a bisect's trials under their bisect)."""
    where: list[str] = []
    params: list[str | int] = []
    if exclude_kinds:
        where.append(f"coalesce(kind, 'compare') NOT IN ({', '.join('?' * len(exclude_kinds))})")
        params += list(exclude_kinds)
    if search:
        where.append("(id LIKE ? OR model LIKE ? OR sides LIKE ? OR prompt_excerpt LIKE ? OR error LIKE ?)")
        params += [f"%{search}%"] * 5
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
    return [
        RunSummary(
            id=r["id"],
            datetime_utc=r["datetime_utc"],
            kind=r["kind"] or "compare",
            status=r["status"],
            identical=None if r["identical"] is None else bool(r["identical"]),
            first_divergence=r["first_divergence"],
            model=r["model"] or "",
            dtype=r["dtype"],
            device=r["device"] or "",
            n_prompts=r["n_prompts"] or 0,
            prompt_excerpt=r["prompt_excerpt"] or "",
            error=r["error"],
            duration_ms=r["duration_ms"],
            group_id=r["group_id"],
            error_code=r["error_code"],
            sides=r["sides"] or "",
            headline=r.get("headline"),
            decoding=_decoding(r.get("config_json")),
        )
        for r in db.query(sql, params)
    ]


def _decoding(config_json: str | None) -> str:
    from ..core.config import decoding_text

    config = _loads(config_json) if config_json else None
    return decoding_text(config) if isinstance(config, dict) else "greedy"


def distinct_models(db: Database) -> list[str]:
    return [r["model"] for r in db.query("SELECT DISTINCT model FROM runs ORDER BY model")]


@dataclass(frozen=True)
class RunState:
    """What a stored run's own row says of how far it got: a view built from a run is built again
    when this changes (a stopped workload resumed, here or by the CLI)."""

    status: str
    duration_ms: int | None
    headline: str | None


def run_state(db: Database, run_id: str) -> RunState | None:
    """The run's status, duration and headline (one read of its row), or None for no such run."""
    row = db.execute("SELECT status, duration_ms, headline FROM runs WHERE id = ?", [run_id]).fetchone()
    return RunState(*row) if row else None


def is_workload(db: Database, run_id: str) -> bool:
    """Whether the stored run is a workload (or a replay: a workload of a dump's rows) with a report
    (one query on the runs row)."""
    row = db.execute("SELECT kind, workload_json IS NOT NULL FROM runs WHERE id = ?", [run_id]).fetchone()
    return bool(row and row[0] in ("workload", "replay") and row[1])


def set_headline(db: Database, run_id: str, headline: str) -> None:
    """The run row's one line for the history list (a check's, written when its cases are judged)."""
    db.execute("UPDATE runs SET headline = ? WHERE id = ?", [headline, run_id])


__all__ = [
    "save_images",
    "image_bytes",
    "MAX_STORED_IMAGE_BYTES",
    "migrations",
    "new_run_id",
    "open_db",
    "mark_interrupted",
    "save_run",
    "save_run_row",
    "save_prompt_rows",
    "save_side_result",
    "save_comparisons",
    "save_pair_samples",
    "pair_samples",
    "pair_rows",
    "prompt_excerpts",
    "prompts_done",
    "get_run",
    "list_runs",
    "distinct_models",
    "RunSummary",
    "RunState",
    "run_state",
    "is_workload",
    "set_headline",
    "save_localisation",
    "localisations_of",
    "comparison_from_dict",
    "side_result_from_dict",
]
