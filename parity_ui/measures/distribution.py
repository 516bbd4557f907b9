"""The distribution measure (full_distribution=true): the sides' whole next-token rows compared where
both see the same context, pooled as llama.cpp's --kl-divergence reports them (core.distribution).

Where the rows meet, by mode (one class, `FullRows`, keeps the bookkeeping of all three):
- a comparison: where its sides see the same context, its cross-scores. Each side that can writes its
  rows as it generates; per pair ONE cross-scoring direction meets them: the reference scoring the
  side's tokens where the reference can (an hf reference), else the side scoring the reference's
  (an hf side). The pooled figures go on the comparison (core.measures DISTRIBUTION: which sequence,
  which scorer, the family); a pair neither direction can serve is named;
- a scored workload: each side under test writes its rows as it generates (vLLM through its rows
  processor, HF from generate's logits); the reference, scoring that sequence (which it does anyway),
  meets them on its device; with a floor, the reference also writes its own rows of the first side's
  sequences and the floor meets those;
- a replay (every side forces the same tokens): the reference writes its rows, every side whose
  scoring has full rows (and the floor) meets them.
The per-position scalars ride on the scored steps back to this process and are moved onto the side's
stored steps (core.measures: the measure's step columns); a workload's family is pooled per side from
those stored columns, prompt by prompt, never from what this process holds (a stopped-then-resumed run
pools the chunks run before the resume too). A side that cannot give rows, or a reference that cannot
meet them, is named as a finding and the run goes on without those figures. The rows themselves wait
in a scratch dir (in memory where it holds them: parity_ui.measures.scratch) and never cross a worker
pipe or the store.

Its engine half: parity_ui.engines.full_distribution (+ vllm_full_rows, step_rows).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.cluster import LOCAL
from ..core.config import ParityConfig
from ..core.distribution import (
    DISTRIBUTION_COLUMNS,
    Budget,
    DistributionPool,
    DistributionRecord,
    RowsUnavailable,
    pool,
    scratch_bytes,
)
from ..core.errors import ConfigError
from ..core.measures import DISTRIBUTION, FULL_ROWS
from ..core.pooled import distribution_against_floor
from ..core.requests import Rows
from ..core.types import Finding, StepColumns, TokenStep, step_column
from ..core.workload_record import put_family
from .base import MeasureRun, Mode, PairSeen, Plan, ScoreAsk
from .scratch import scratch_dir

if TYPE_CHECKING:
    from ..core.workload_record import WorkloadReport
    from ..store import Store

_OWN = re.compile(r"^.*-(\d+)\.(npy|steps)(\..*)?$")  # a scratch file of sequence j (group 1)


class Distribution:
    spec = FULL_ROWS

    def wanted(self, cfg: ParityConfig, mode: Mode) -> bool:
        return cfg.full_distribution and mode != "free"

    def preflight(self, plan: Plan) -> list[Finding]:
        cfg = plan.config
        if not cfg.full_distribution:
            return []
        if plan.mode == "free":
            return [
                Finding(
                    code="full-distribution-free",
                    severity="info",
                    fix="use --mode scored",
                    message="full_distribution compares the sides where they see the same context: "
                    "a free-running workload has none past each fork, so it is computed "
                    "in scored mode and replays only; this run has no distribution figures",
                )
            ]
        if plan.cluster and plan.cluster != LOCAL:
            raise ConfigError(
                "full_distribution",
                f"cannot run on the Ray cluster {plan.cluster}: a side's full rows wait in a scratch dir on "
                "its own machine for the scorer that meets them, and on a cluster of several machines that "
                "scorer's replica may run on another",
                "run it in process or with --cluster local, or set full_distribution=false",
            )
        Budget(cfg.full_distribution_budget_mb).check(plan.prep.model.vocab_size, cfg.max_new_tokens)
        return Directions(plan).findings

    def start(self, plan: Plan) -> MeasureRun:
        return FullRows(plan)


class Directions:
    """Who writes full rows and who meets them, by mode, asked of the kinds (Kind.rows_when_generating,
    rows_when_scoring); the pairs that get no figures, named."""

    def __init__(self, plan: Plan):
        prep, cfg = plan.prep, plan.config
        ref = prep.reference
        self.ref = ref.name
        self.mode = plan.mode
        self.findings: list[Finding] = []
        # a comparison: per side, (the generator whose rows, the scorer meeting them)
        self.direction: dict[str, tuple[str, str]] = {}
        if plan.mode == "compare":
            writes = {p.name: p.kind.rows_when_generating for p in prep.sides}
            meets = {p.name: p.kind.rows_when_scoring for p in prep.sides}
            for p in prep.sides[1:]:
                if meets[self.ref] and writes[p.name]:
                    self.direction[p.name] = (p.name, self.ref)
                elif meets[p.name] and writes[self.ref]:
                    self.direction[p.name] = (self.ref, p.name)
                elif cfg.cross_score:
                    u = RowsUnavailable(
                        p.name,
                        p.kind.label,
                        f"and the reference {self.ref} ({ref.kind.label}) "
                        "cannot meet each other's full rows (one must generate them, hf or vllm, and the "
                        "other score them, hf)",
                    )
                    self.findings.append(
                        Finding(
                            code="full-distribution-unavailable",
                            severity="warning",
                            message=u.message(),
                            fix="compare the full distribution with an hf side on one end",
                        )
                    )
            if not cfg.cross_score and prep.sides[1:]:
                self.findings.append(
                    Finding(
                        code="full-distribution-unavailable",
                        severity="warning",
                        message="full_distribution compares a comparison's sides where they see the same "
                        "context, its cross-scores, and cross_score is off: no distribution figures",
                        fix="--set cross_score=true",
                    )
                )
                self.direction = {}
            self.writes = {g: True for g, _ in self.direction.values()}
            self.ref_meets = False
            self.floor: str | None = None
            return
        forced = plan.mode == "replay"  # every side teacher-forces the same tokens: the reference's rows are met
        unavailable: list[RowsUnavailable] = []
        self.ref_meets = ref.kind.rows_when_scoring
        if not self.ref_meets:
            unavailable.append(
                RowsUnavailable(
                    ref.name, ref.kind.label, "cannot give its full rows when it scores (only an hf reference can)"
                )
            )
        # Scored: the sides under test write as they generate. Forced (a replay): they score too, and meet
        # the reference's rows where their scoring has full rows (vLLM scores through prompt logprobs: top-k).
        self.writes = {
            p.name: p.kind.rows_when_scoring if forced else p.kind.rows_when_generating for p in prep.sides[1:]
        }
        for p in prep.sides[1:]:
            if not self.writes[p.name]:
                why = (
                    "scores forced tokens through prompt logprobs (a top-k, not the full rows)"
                    if forced and p.kind.rows_when_generating
                    else "cannot give its full rows (a server returns a top-k at most)"
                )
                unavailable.append(RowsUnavailable(p.name, p.kind.label, why))
        floor = plan.floor
        self.floor = floor.name if floor is not None and floor.kind.rows_when_scoring and self.ref_meets else None
        for u in unavailable:
            self.findings.append(
                Finding(
                    code="full-distribution-unavailable",
                    severity="warning",
                    message=u.message(),
                    fix="compare the full distribution between hf and vllm sides (an hf reference)",
                )
            )


class FullRows(MeasureRun):
    """One run's full-distribution bookkeeping (see the module docstring)."""

    def __init__(self, plan: Plan):
        prep, cfg = plan.prep, plan.config
        d = Directions(plan)
        self.mode, self.ref, self.direction, self.writes = d.mode, d.ref, d.direction, d.writes
        self.ref_meets, self.floor = d.ref_meets, d.floor
        self.k = max(cfg.logprobs, 1)
        self.findings = plan.findings
        vocab = prep.model.vocab_size or 0
        if self.mode == "compare":
            n = max(1, len(prep.prompts))  # every prompt's rows wait for the cross-scoring
            need = scratch_bytes(vocab, cfg.max_new_tokens, n) * len(self.writes)
        else:
            forced = self.mode == "replay"
            writers = (len(prep.sides) - 1 if not forced else 1) + (1 if self.floor and not forced else 0)
            # A chunk's files live until it is stored: every writer's rows of every sequence in it.
            need = scratch_bytes(vocab, cfg.max_new_tokens, plan.chunk) * writers
        self.scratch = scratch_dir(need)
        self.dir = self.scratch.path

    def _path(self, who: str, j: int) -> str:
        return os.path.join(self.dir, f"{who}-{j}.npy")

    # -- what it asks of the sides ------------------------------------------------------------------

    def generate_fields(self, side: str, order: Sequence[int]) -> dict[str, Any]:
        """The rows a side writes while it generates (a comparison's writers; a scored workload's sides
        under test, where the reference meets them)."""
        if self.mode == "compare":
            ok = side in self.writes
        else:
            ok = self.mode == "scored" and bool(self.writes.get(side)) and self.ref_meets
        return {"rows": [Rows(write=self._path(side, j), k=self.k) for j in order]} if ok else {}

    def score_fields(self, ask: ScoreAsk) -> dict[str, Any]:
        rows = self._score_rows(ask)
        return {"rows": rows} if rows is not None else {}

    def _score_rows(self, ask: ScoreAsk) -> Rows | None:
        if ask.role == "cross":  # a comparison's cross-scoring: the rows of the pair's one direction
            assert ask.c is not None
            gen, meeter = self.direction.get(ask.c.b, (None, None))
            if meeter != ask.scorer or gen not in (ask.c.a, ask.c.b):
                return None
            return Rows(read=self._path(gen, ask.j), read_is="side" if ask.scorer == self.ref else "ref", k=self.k)
        if not self.ref_meets:
            return None
        if ask.role == "reference":  # scoring the side's sequence: meet its rows; write its own for the floor
            read = self._path(ask.of, ask.j) if self.writes.get(ask.of) else None
            write = self._path("ref", ask.j) if ask.with_floor and self.floor else None
            return Rows(write=write, read=read, read_is="side", k=self.k) if read or write else None
        if ask.role == "floor":  # the floor scoring the same sequence: meet the reference's rows
            return Rows(read=self._path("ref", ask.j), read_is="ref", k=self.k) if self.floor else None
        # a replay: the reference writes its rows, every side that can (and the floor) meets them
        if ask.scorer == self.ref:
            wanted = any(self.writes.values()) or self.floor
            return Rows(write=self._path("ref", ask.j), k=self.k) if wanted else None
        if self.writes.get(ask.scorer) or ask.scorer == self.floor:
            return Rows(read=self._path("ref", ask.j), read_is="ref", k=self.k)
        return None

    # -- what it keeps ------------------------------------------------------------------------------

    def on_scored(self, ask: ScoreAsk, steps: Sequence[TokenStep]) -> None:
        """A comparison's cross-scoring that met rows: the scalars the scorer returned, pooled onto it."""
        if ask.role != "cross" or ask.c is None or not self._score_rows(ask):
            return
        cols = {name: step_column(steps, name) for name in DISTRIBUTION_COLUMNS}
        figs = pool([cols]).figures()
        if figs["positions"]:
            gen, scorer = self.direction[ask.c.b]
            DISTRIBUTION.put(ask.c, DistributionRecord(gen, scorer, figs))

    def harvest(self, pair: PairSeen) -> None:
        """A workload's or replay's pair: the scalars its scorer computed, onto b's steps (stored: the
        family is pooled from them)."""
        if pair.scored is None:
            return
        cols = {c: step_column(pair.scored, c) for c in DISTRIBUTION_COLUMNS}
        if all(v is None for v in cols["kl"]):
            return
        set_columns(pair.b.steps, cols)

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

    # -- pooled from the store ----------------------------------------------------------------------

    def pool(self, store: Store, run_id: str, report: WorkloadReport) -> None:
        """The pooled family onto each side's stats, the floor's too, and each side's verdict against it,
        pooled from every stored prompt of the run."""
        floor = report.floor_figures
        sides = {name: report.side_of(name) for name in report.sides}  # a replay's pair: the side it compares
        wanted = [*(s for s in sides.values() if s is not None), *([floor.side] if floor is not None else [])]
        pools = {s: stored_pool(store, run_id, s) for s in dict.fromkeys(wanted)}
        for name, side in sides.items():
            if side is None or not len(pools[side]):
                self._missing(side or name, report)

        def figures(side: str) -> dict[str, Any] | None:
            got = pools.get(side)
            return got.figures() if got is not None and len(got) else None

        put_family(report, FULL_ROWS.key, figures, distribution_against_floor)

    def _missing(self, name: str, report: WorkloadReport) -> None:
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


def stored_pool(store: Store, run_id: str, side: str) -> DistributionPool:
    """One side's distribution pool from its stored columns, one prompt at a time (bounded memory:
    the pool keeps 40 bytes a position, the rows are read and dropped)."""
    out = DistributionPool()
    for cols in store.distribution_columns(run_id, side):
        out.add_columns(cols)
    return out


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
