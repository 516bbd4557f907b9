"""Teacher-forced cross-scoring: the reference re-scores a side's tokens and the side the reference's.

Free-running streams stop being comparable at their first fork (the contexts differ after it).
Scoring side b's sequence with the reference a, and a's with b, compares both on the SAME context
at every position, over the whole sequence (vLLM via prompt_logprobs, HF with one forward pass).

Gap at a position = the generating side's own logprob - the other side's teacher-forced logprob of
the same token. The importance ratio is TRL's with the reference as the trainer:
exp(logp_reference - logp_side).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeGuard

from ..core.findings import MASKED_LOGPROB, CrossScores, GapStats, RatioRange
from ..core.types import Comparison, SideResult, TokenStep

# The batch-logprob-gap study's band: a position "moves" when exp(gap) leaves [0.9, 1.1].
RATIO_BAND = (0.9, 1.1)

ScoreFn = Callable[[str, list[int], list[int], int], list[TokenStep]]  # (side, prompt, continuation, k)


def key(generator: str, scorer: str) -> str:
    return f"{generator}_by_{scorer}"


def _finite(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x) and x > MASKED_LOGPROB


def _exp(x: float) -> float:
    """exp that saturates: a gap of hundreds of nats (a logit masked to float16's minimum on one
    side) is an infinite ratio, not an OverflowError that loses the whole comparison."""
    return math.exp(min(x, 700.0))


def gap_stats(
    generator: str, scorer: str, reference: str, own: Sequence[TokenStep], scored: Sequence[TokenStep]
) -> GapStats:
    """Statistics of own-vs-teacher-forced logprobs for one generated sequence. Pure.

    `own` are the generating side's steps, `scored` the other side's teacher-forced steps for the
    same tokens (same length). Positions where either logprob is missing or masked are counted in
    `skipped` and left out of the numbers."""
    gaps: list[float | None] = []
    ratios: list[float] = []
    other_rank: list[int | None] = []
    for a, b in zip(own, scored):
        other_rank.append(b.rank)
        la, lb = a.logprob, b.logprob
        if not (_finite(la) and _finite(lb)):
            gaps.append(None)
            continue
        gaps.append(la - lb)
        lp_ref, lp_side = (la, lb) if generator == reference else (lb, la)
        ratios.append(_exp(lp_ref - lp_side))
    vals = [g for g in gaps if g is not None]
    n = len(vals)
    lo, hi = RATIO_BAND
    outside = sum(1 for g in vals if not lo <= _exp(g) <= hi)
    return GapStats(
        generator=generator,
        scorer=scorer,
        positions=len(gaps),
        skipped=len(gaps) - n,
        gaps=gaps,  # per position, own - teacher-forced, nats
        other_rank=other_rank,
        other_disagrees=sum(1 for r in other_rank if r is not None and r > 1),
        mean_gap=sum(vals) / n if n else None,
        mean_abs_gap=sum(abs(g) for g in vals) / n if n else None,
        max_abs_gap=max((abs(g) for g in vals), default=None),
        rms_gap=math.sqrt(sum(g * g for g in vals) / n) if n else None,
        share_outside_band=outside / n if n else None,
        ratio_band=list(RATIO_BAND),
        importance_ratio=RatioRange(min(ratios), sum(ratios) / len(ratios), max(ratios)) if ratios else None,
    )


def directions(c: Comparison, results: dict[str, SideResult], can_score: set[str]) -> list[tuple[str, str]]:
    """(generator, scorer) of each direction of comparison c that the scorer can score: b's tokens by
    a, then a's by b."""
    return [(gen, scorer) for gen, scorer in ((c.b, c.a), (c.a, c.b)) if scorer in can_score]


def to_score(res: SideResult | None) -> bool:
    """Whether a generator's result has tokens to score (a direction without is None)."""
    return res is not None and bool(res.token_ids) and not res.error


def cross_scores(
    c: Comparison, results: dict[str, SideResult], can_score: set[str], scored: dict[tuple[str, str], list[TokenStep]]
) -> CrossScores:
    """The CrossScores of comparison c from each direction's teacher-forced steps, `scored[(gen, scorer)]`
    (every direction of `directions` whose generator has tokens). Pure."""
    out: dict[str, GapStats | None] = {}
    for gen, scorer in directions(c, results, can_score):
        res = results.get(gen)
        if res is None or not to_score(res):
            out[key(gen, scorer)] = None
            continue
        out[key(gen, scorer)] = gap_stats(gen, scorer, c.a, res.steps, scored[(gen, scorer)])
    return CrossScores(directions=out)


def cross_score(
    score: ScoreFn,
    c: Comparison,
    prompt_ids: list[int],
    results: dict[str, SideResult],
    logprobs: int,
    can_score: set[str],
) -> CrossScores:
    """Score each side's sequence with the other (when the other can score). Keys "<gen>_by_<scorer>";
    a direction is None when its generator made no tokens. Engine errors propagate."""
    scored = {
        (gen, scorer): score(scorer, prompt_ids, results[gen].token_ids, logprobs)
        for gen, scorer in directions(c, results, can_score)
        if to_score(results.get(gen))
    }
    return cross_scores(c, results, can_score, scored)


def summary_line(cs: CrossScores | None) -> str:
    """One line for the CLI: each direction's RMS/max gap and the ratio range."""
    if cs is None:
        return ""
    if cs.error is not None:
        return f"cross-scoring failed: {cs.error}"
    parts = []
    for s in cs.directions.values():
        if s is None or s.rms_gap is None:
            continue
        r = s.importance_ratio
        ratio = f", ratio {r.min:.3f}..{r.max:.3f}" if r is not None else ""
        parts.append(
            f"{s.generator}'s tokens scored by {s.scorer}: RMS gap {s.rms_gap:.3g}, "
            f"max {s.max_abs_gap:.3g} nats, {100 * (s.share_outside_band or 0):.1f}% outside exp(gap) in "
            f"[0.9, 1.1]{ratio}"
        )
    return "; ".join(parts)
