"""A scored workload's whole-distribution figures (full_distribution=true; core.distribution).

Where the rows meet, per chunk:
- each side under test writes its full rows as it generates (vLLM through its rows processor, HF
  from generate's logits) to a scratch file per sequence;
- the reference, scoring that sequence (teacher forcing, which it does anyway), reads the file and
  computes the five per-position scalars on its device (parity_ui.engines.full_distribution.meet);
- with a floor, the reference also writes its own rows of the first side's sequences, and the floor
  meets those (the floor's figures are the reference against itself under the floor's change);
- the chunk's files are deleted once it is stored; the scratch dir when the run ends (in memory,
  /dev/shm, where it holds a chunk: commands.rows_scratch).

The scalars ride on the scored steps back to this process and are moved onto the side's stored steps
(optional columns: the token panes and `--json` read them). The family is pooled per side
(DistributionPool) from those stored columns, prompt by prompt, never from what this process holds:
a stopped-then-resumed run pools the chunks run before the resume too, as an uninterrupted one.
A side that cannot give rows, or a reference that cannot meet them, is named as a finding and the
run goes on without those figures.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from typing import Any

from ...core.distribution import (
    DISTRIBUTION_COLUMNS,
    ROWS_WHEN_GENERATING,
    ROWS_WHEN_SCORING,
    Budget,
    DistributionPool,
    RowsUnavailable,
    against_floor,
    scratch_bytes,
)
from ...core.requests import Rows
from ...core.types import Finding, StepColumns, TokenStep, step_column
from ..rows_scratch import scratch_dir

_OWN = re.compile(r"^.*-(\d+)\.(npy|steps)(\..*)?$")  # a scratch file of sequence j (group 1)


class FullRows:
    """One workload's full-distribution bookkeeping (see the module docstring)."""

    def __init__(
        self, prep: Any, floor: Any, compared: list[str], findings: list[Finding], forced: bool = False, chunk: int = 1
    ):
        cfg = prep.config
        self.forced = forced  # a replay: every side teacher-forces the same tokens, the reference's rows are met
        vocab = prep.model.vocab_size
        Budget(cfg.full_distribution_budget_mb).check(vocab, cfg.max_new_tokens)
        self.k = max(cfg.logprobs, 1)
        self.pools: dict[str, DistributionPool] = {n: DistributionPool() for n in compared}
        self.unavailable: list[RowsUnavailable] = []
        ref = prep.reference
        self.ref = ref.name
        self.ref_meets = ref.kind.name in ROWS_WHEN_SCORING
        if not self.ref_meets:
            self.unavailable.append(
                RowsUnavailable(
                    ref.name, ref.kind.label, "cannot give its full rows when it scores (only an hf reference can)"
                )
            )
        # Scored: the sides under test write as they generate. Forced (a replay): they score too, and meet
        # the reference's rows where their scoring has full rows (vLLM scores through prompt logprobs: top-k).
        can = ROWS_WHEN_SCORING if forced else ROWS_WHEN_GENERATING
        self.writes = {p.name: p.kind.name in can for p in prep.sides[1:]}
        for p in prep.sides[1:]:
            if not self.writes[p.name]:
                why = (
                    "scores forced tokens through prompt logprobs (a top-k, not the full rows)"
                    if forced and p.kind.name == "vllm"
                    else "cannot give its full rows (a server returns a top-k at most)"
                )
                self.unavailable.append(RowsUnavailable(p.name, p.kind.label, why))
        self.floor = (
            floor.name if floor is not None and floor.kind.name in ROWS_WHEN_SCORING and self.ref_meets else None
        )
        writers = (len(prep.sides) - 1 if not forced else 1) + (1 if self.floor and not forced else 0)
        # A chunk's files live until it is stored: every writer's rows of every sequence in it.
        self.scratch = scratch_dir(scratch_bytes(vocab or 0, cfg.max_new_tokens, chunk) * writers)
        self.dir = self.scratch.path
        self.findings = findings
        for u in self.unavailable:
            findings.append(
                Finding(
                    code="full-distribution-unavailable",
                    severity="warning",
                    message=u.message(),
                    fix="compare the full distribution between hf and vllm sides (an hf reference)",
                )
            )

    def _path(self, who: str, j: int) -> str:
        return os.path.join(self.dir, f"{who}-{j}.npy")

    def generate_rows(self, side: str, order: Sequence[int]) -> list[Rows] | None:
        """The rows a side under test writes while it generates (None: it cannot, or nobody meets them)."""
        if not self.writes.get(side) or not self.ref_meets:
            return None
        return [Rows(write=self._path(side, j), k=self.k) for j in order]

    def score_rows(self, side: str, j: int, with_floor: bool) -> Rows | None:
        """The reference scoring `side`'s sequence j: meet its rows; write its own for the floor."""
        if not self.ref_meets:
            return None
        read = self._path(side, j) if self.writes.get(side) else None
        write = self._path("ref", j) if with_floor and self.floor else None
        return Rows(write=write, read=read, read_is="side", k=self.k) if read or write else None

    def floor_rows(self, j: int) -> Rows | None:
        """The floor scoring the same sequence: meet the reference's rows (the floor is the side)."""
        return Rows(read=self._path("ref", j), read_is="ref", k=self.k) if self.floor else None

    def forced_rows(self, name: str, j: int) -> Rows | None:
        """A replay's scoring of row j by side `name`: the reference writes its rows, every side that can
        (and the floor) meets them."""
        if not self.ref_meets:
            return None
        if name == self.ref:
            return Rows(write=self._path("ref", j), k=self.k) if any(self.writes.values()) or self.floor else None
        if self.writes.get(name) or name == self.floor:
            return Rows(read=self._path("ref", j), read_is="ref", k=self.k)
        return None

    def harvest(self, name: str, target: Any, scored: Sequence[TokenStep]) -> None:
        """The scalars the scorer computed, onto `target` (the stored steps of that pair's side: `report`
        pools them from the store)."""
        cols = {c: step_column(scored, c) for c in DISTRIBUTION_COLUMNS}
        if all(v is None for v in cols["kl"]):
            return
        set_columns(target, cols)

    def end_chunk(self, chunk: Sequence[int]) -> None:
        """The chunk's rows files deleted (its scalars are stored); only its own: on a Ray cluster other
        blocks' chunks are under way in the same dir."""
        mine = {str(j) for j in chunk}
        for f in os.listdir(self.dir):
            # side-j.npy (a whole sequence), side-j.npy.steps.json (its index into a step log), side-j.steps*
            # (vLLM's log of the batch that sequence j began: every sequence in it is of this chunk)
            m = _OWN.match(f)
            if m and m.group(1) in mine:
                try:
                    os.remove(os.path.join(self.dir, f))
                except OSError:
                    pass

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def report(self, report: Any, store: Any = None, run_id: str | None = None) -> None:
        """The pooled family onto each side's stats, the floor's too, and each side's verdict against it,
        pooled from every stored prompt of the run (`store`; without one, nothing is pooled)."""
        floor = report.floor_figures
        if store is not None and run_id is not None:
            names = dict.fromkeys([*report.sides, *([floor.side] if floor is not None else [])])
            self.pools = {n: stored_pool(store, run_id, n) for n in names}
        fl = None
        if floor is not None and floor.side in self.pools and len(self.pools[floor.side]):
            fl = floor.stats.distribution = self.pools[floor.side].figures()
        for name, figs in report.sides.items():
            pool = self.pools.get(name)
            if pool is None or not len(pool):
                if (
                    self.writes.get(name)
                    and self.ref_meets
                    and report.done
                    and not any(f.code == "full-distribution-missing" and name in f.message for f in self.findings)
                ):
                    self.findings.append(
                        Finding(
                            code="full-distribution-missing",
                            severity="warning",
                            message=f"full_distribution: no full rows of side {name} reached the scorer (a vLLM with "
                            "tensor or pipeline parallelism runs its logits processors in its own workers, "
                            "an hf side with decode=graphed keeps no logits): its pair has no distribution figures",
                            fix="run that side on one GPU (no TP/PP) or with decode=eager, or set full_distribution=false",
                        )
                    )
                continue
            figs.stats.distribution = pool.figures()
            figs.distribution_verdict = against_floor(figs.stats.distribution, fl)


def stored_pool(store: Any, run_id: str, side: str) -> DistributionPool:
    """One side's distribution pool from its stored columns, one prompt at a time (bounded memory:
    the pool keeps 40 bytes a position, the rows are read and dropped)."""
    pool = DistributionPool()
    for cols in store.distribution_columns(run_id, side):
        pool.add_columns(cols)
    return pool


def set_columns(steps: Any, cols: dict[str, list[Any]]) -> None:
    """Optional per-position columns onto stored steps (StepColumns) or plain TokenSteps."""
    if isinstance(steps, StepColumns):
        for c, values in cols.items():
            setattr(steps, c, list(values[: len(steps)]) + [None] * max(0, len(steps) - len(values)))
        steps._built.clear()
        return
    for i, s in enumerate(steps):
        for c, values in cols.items():
            if i < len(values):
                setattr(s, c, values[i])
