"""A workload's reads and writes beyond the run's own (parity_ui.store.runs keeps the pair samples,
their rows and the prompts done, as the report and the prompt table read them): the prompts as the
user gave them (what a resume or a bisect runs again), a chunk's rows in one write, and the stored
route agreements, kept-mass records and distribution columns the routing, sampling and
distribution figures are pooled from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sqlite_utils import Database

from ..core.distribution import DISTRIBUTION_COLUMNS
from ..core.errors import ParityError
from ..core.pooled import PairSample
from ..core.types import PromptResult, SideResult
from ..inputs.prompts import PromptSpec
from .runs import save_comparisons, save_pair_samples, save_side_result


def given_prompts(db: Database, run_id: str) -> list[PromptSpec]:
    """A stored run's prompts as the user gave them (text or messages). Raises ParityError for a run
    stored before prompts were kept as given, or with image prompts (their bytes are not re-read)."""
    rows = db.query("SELECT idx, given_json FROM prompt_results WHERE run_id = ? ORDER BY idx", [run_id])
    out = []
    for r in rows:
        given = json.loads(r["given_json"]) if r["given_json"] else None
        if not given or given.get("images"):
            raise ParityError(
                f"prompt {r['idx']} of run {run_id} is not stored as given"
                + (" (it has images)" if given else " (an older release made the run)"),
                "start a new run with the same prompt file",
            )
        out.append(PromptSpec(text=given.get("text"), messages=given.get("messages")))
    return out


def save_chunk(
    db: Database,
    run_id: str,
    results: list[SideResult],
    prompts: list[PromptResult],
    samples: dict[str, list[PairSample]],
) -> None:
    """A workload chunk's rows: its side results, its prompts' comparisons and each side's pair
    samples. The caller holds the transaction (the recorder's, so its own writes never interleave)."""
    for res in results:
        save_side_result(db, run_id, res)
    for pr in prompts:
        save_comparisons(db, run_id, pr)
    for side, s in samples.items():
        save_pair_samples(db, run_id, side, s)


def route_agreements(db: Database, run_id: str, side: str) -> Iterator[dict[str, Any]]:
    """Every stored route agreement of `side` against its pair's other side (MoE runs with routes=true),
    prompt by prompt, one row at a time: the routing figures are pooled from these, so a resumed run
    counts every chunk, not only the ones its own process ran. Only the agreement is read out of each
    comparison's JSON (json_extract), never its token panes."""
    for r in db.execute(
        "SELECT json_extract(comparison_json, '$.routes') FROM comparisons WHERE run_id = ? AND b = ? "
        "AND json_extract(comparison_json, '$.routes') IS NOT NULL ORDER BY prompt_idx",
        [run_id, side],
    ):
        yield json.loads(r[0])


def kept_masses(db: Database, run_id: str, side: str) -> Iterator[dict[str, Any]]:
    """Every stored kept-mass record of `side`'s comparison (shared-seed sampling), prompt by prompt,
    one row at a time: the sampling family is pooled from these (as the routing family from its
    agreements), so a resumed run counts every chunk."""
    for r in db.execute(
        "SELECT json_extract(comparison_json, '$.kept_mass') FROM comparisons WHERE run_id = ? "
        "AND b = ? AND json_extract(comparison_json, '$.kept_mass') IS NOT NULL ORDER BY prompt_idx",
        [run_id, side],
    ):
        yield json.loads(r[0])


def distribution_columns(db: Database, run_id: str, side: str) -> Iterator[dict[str, list[Any]]]:
    """`side`'s stored whole-distribution columns (full_distribution=true: kl, kl_rev, tv, top1, topk
    on its steps), prompt by prompt: the distribution family is pooled from these. Only those five
    columns are read out of each row's steps (json_extract), never its top-k."""
    paths = ", ".join(f"'$.{c}'" for c in DISTRIBUTION_COLUMNS)
    for r in db.execute(
        f"SELECT json_extract(steps_json, {paths}) FROM side_results WHERE run_id = ? AND side = ? "
        "AND json_extract(steps_json, '$.kl') IS NOT NULL ORDER BY prompt_idx",
        [run_id, side],
    ):
        yield dict(zip(DISTRIBUTION_COLUMNS, json.loads(r[0])))


__all__ = ["given_prompts", "save_chunk", "route_agreements", "kept_masses", "distribution_columns"]
