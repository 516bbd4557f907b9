"""The tokens measure: each pair's logprobs against the reference's (its pair samples), pooled into the
token figures (core.pooled) and judged against the floor's (SideFigures.verdict).

A free-running pair compares the two sides' own logprobs up to its first divergence; a scored pair
the side's own logprobs against the reference's teacher-forced ones, every token (the reference's
view: what it would have chosen given the side's prefix, `reference_view`). A replay's pairs are the
replay-pairs measure's (parity_ui.measures.replay_pairs): its forced tokens are sampled there, with
the loss mask applied.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.config import ParityConfig
from ..core.measures import TOKENS
from ..core.pooled import Accumulator, PairSample, compare_to_floor
from ..core.types import Comparison, Finding, SideResult, StepColumns, TokenStep, step_column
from ..core.workload_record import DlogpHistogram, SideFigures
from ..run.plan import Prepared
from ..run.recorder import decode_columns
from .base import MeasureRun, Mode, PairSeen, Plan

if TYPE_CHECKING:
    from ..core.workload_record import WorkloadReport
    from ..store import Store


class Tokens:
    spec = TOKENS

    def wanted(self, cfg: ParityConfig, mode: Mode) -> bool:
        return mode in ("free", "scored")  # a comparison's token figures are its comparisons; a replay's, its pairs'

    def preflight(self, plan: Plan) -> list[Finding]:
        return []

    def start(self, plan: Plan) -> MeasureRun:
        return TokensRun()


class TokensRun(MeasureRun):
    def sample(self, pair: PairSeen) -> None:
        if pair.forced:
            assert pair.sample_side is not None and pair.ref_steps is not None
            pair.samples[pair.name] = scored_sample(pair.c, pair.sample_side, pair.ref_steps)
        else:
            pair.samples[pair.name] = free_sample(pair.c, pair.a, pair.b)


def free_sample(c: Comparison, ref: SideResult, side: SideResult) -> PairSample:
    """Free-running: the two sides' own logprobs on the same context, up to the first divergence."""
    n = c.first_divergence if c.first_divergence is not None else c.compared
    return PairSample(
        prompt_index=side.prompt_index,
        identical=c.identical,
        first_divergence=c.first_divergence,
        length=len(side.token_ids),
        verdict=c.explanation.verdict if c.explanation else None,
        logp_side=step_column(side.steps, "logprob")[:n],
        logp_ref=step_column(ref.steps, "logprob")[:n],
        positions=list(range(n)),
    )


def scored_sample(c: Comparison, side: SideResult, scored: Sequence[TokenStep]) -> PairSample:
    """Scored: the side's own logprobs against the reference's teacher-forced ones, every token."""
    lr = step_column(scored, "logprob")
    return PairSample(
        prompt_index=side.prompt_index,
        identical=c.identical,
        first_divergence=c.first_divergence,
        length=len(side.token_ids),
        verdict=c.explanation.verdict if c.explanation else None,
        logp_side=step_column(side.steps, "logprob"),
        logp_ref=lr,
        positions=list(range(len(lr))),
    )


def reference_view(name: str, side: SideResult, scored: Sequence[TokenStep], prep: Prepared) -> SideResult:
    """What the scorer would have chosen at each position of the side's sequence (its top-1 given the
    side's prefix): the side's own sequence up to where the scorer ranks a token second or worse,
    which is where a greedy scorer would have forked. Built as columns from the scored columns."""
    cols = StepColumns.from_steps(scored)
    decode_columns(prep.tokenizer, cols)
    starts = cols.top_starts()
    first = [starts[i] if cols.top_n[i] else None for i in range(len(cols))]
    ids = [cols.top_token_id[k] if k is not None else cols.token_id[i] for i, k in enumerate(first)]
    view = StepColumns(
        {
            "position": list(cols.position),
            "token_id": ids,
            "text": [cols.top_text[k] if k is not None else cols.text[i] for i, k in enumerate(first)],
            "logprob": [cols.top_logprob[k] if k is not None else cols.logprob[i] for i, k in enumerate(first)],
            "rank": [1] * len(cols),
            "top_n": list(cols.top_n),
            "top_token_id": list(cols.top_token_id),
            "top_logprob": list(cols.top_logprob),
            "top_text": list(cols.top_text),
            "raw": {i: cols.top_raw[k] for i, k in enumerate(first) if k is not None and k in cols.top_raw},
            "top_raw": dict(cols.top_raw),
        }
    )
    return SideResult(
        side=name,
        prompt_index=side.prompt_index,
        token_ids=ids,
        steps=view,
        text=prep.tokenizer.decode(ids),
        finish_reason="scored",
    )


def max_gap(s: PairSample) -> float | None:
    """The largest |Δlogprob| of a pair sample (None: no finite pair)."""
    gaps = [
        abs(x - y) for x, y in zip(s.logp_side, s.logp_ref) if x is not None and y is not None and math.isfinite(x - y)
    ]
    return max(gaps) if gaps else None


def as_result(side: SideResult, scored: Sequence[TokenStep]) -> SideResult:
    """Another scorer's logprobs of the side's tokens, as a result whose steps carry them."""
    return dataclasses.replace(side, steps=scored if isinstance(scored, StepColumns) else list(scored))


# -- pooling: from the store, one prompt at a time ----------------------------------------------------


class PairPool:
    """A pair's token figures and its |dlogp| histogram, pooled one sample at a time: from the store
    (side_figures) or, in a recorded-only replay, as its rows come (parity_ui.commands.replay_recorded),
    so both give the same figures to the digit."""

    def __init__(self) -> None:
        self.acc, self.hist = Accumulator(), DlogpHistogram()

    def add(self, sample: PairSample) -> None:
        self.acc.add(sample)
        self.hist.add(sample.logp_side, sample.logp_ref)

    def figures(self, name: str) -> SideFigures:
        """The pooled figures (no verdict)."""
        return SideFigures(name, self.acc.result(), hist=self.hist)


def side_figures(store: Store, run_id: str, side: str) -> SideFigures:
    """A pair's pooled token figures and its |dlogp| histogram, in one read of its stored pair samples
    (one prompt at a time); no verdict."""
    pool = PairPool()
    for sample in store.pair_samples(run_id, side):
        pool.add(sample)
    return pool.figures(side)


def pool_tokens(store: Store, run_id: str, report: WorkloadReport, names: list[str]) -> None:
    """The report's figures, from the store: the floor's, and each pair's in `names` judged against it.
    Every other measure's family goes onto these (so this pools first)."""
    floor = report.floor.side
    report.floor_figures = side_figures(store, run_id, floor) if floor else None
    report.sides = {}
    for name in names:
        figs = side_figures(store, run_id, name)
        figs.verdict = compare_to_floor(figs.stats, report.floor_figures.stats) if report.floor_figures else None
        report.sides[name] = figs
