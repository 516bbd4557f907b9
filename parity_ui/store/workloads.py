"""A workload's reads and writes beyond the run's own (parity_ui.store.runs keeps the pair samples,
their rows and the prompts done, as the report and the prompt table read them): the prompts as the
user gave them (what a resume or a bisect runs again) and a chunk's rows in one write.
"""
from __future__ import annotations

import json

from sqlite_utils import Database

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
            raise ParityError(f"prompt {r['idx']} of run {run_id} is not stored as given"
                              + (" (it has images)" if given else " (an older release made the run)"),
                              "start a new run with the same prompt file")
        out.append(PromptSpec(text=given.get("text"), messages=given.get("messages")))
    return out


def save_chunk(db: Database, run_id: str, results: list[SideResult], prompts: list[PromptResult],
               samples: dict[str, list[PairSample]]) -> None:
    """A workload chunk's rows: its side results, its prompts' comparisons and each side's pair
    samples. The caller holds the transaction (the recorder's, so its own writes never interleave)."""
    for res in results:
        save_side_result(db, run_id, res)
    for pr in prompts:
        save_comparisons(db, run_id, pr)
    for side, s in samples.items():
        save_pair_samples(db, run_id, side, s)


__all__ = ["given_prompts", "save_chunk"]
