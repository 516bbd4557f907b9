"""Token-level comparison of two sides' streams. Pure functions, no I/O, no engine names.

Streams are compared by token id, position by position (no text diffing: two different id
sequences can decode to the same text, and that is exactly the kind of difference we must show).
`compare(a, b)` is symmetric: swapping the sides swaps every pair and negates the gaps.
"""

from __future__ import annotations

import math

from ..core.pooled import scorable
from ..core.types import Comparison, Divergence, SideResult, TokenStep, step_column, top_ids


def _topk_ids(step: TokenStep) -> set[int]:
    return {t.token_id for t in step.top}


def _in_topk(token_id: int, step: TokenStep) -> bool | None:
    if not step.top:
        return None
    return token_id in _topk_ids(step)


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """The first index where two id streams differ; a shorter stream differs where it ended."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and len(a) != len(b):
        first = n
    return first


def compare(a: SideResult, b: SideResult) -> Comparison:
    """Compare side `b` with side `a` (the reference) for the same prompt.

    The logprob gap (b - a) and top-k overlap are measured only where both streams hold the same
    token (and so the same context); after the first divergence the contexts differ and
    free-running numbers mean nothing (teacher-forced cross-scoring measures that part).
    """
    ia, ib = a.token_ids, b.token_ids
    n = min(len(ia), len(ib))
    first = first_mismatch(ia, ib)
    prefix = first if first is not None else n

    gaps: list[float | None] = []
    overlaps: list[float | None] = []
    # Read as columns: a workload's steps arrive as StepColumns, and building a step object per
    # position just to read two of its fields cost more than the comparison itself.
    la, lb = step_column(a.steps, "logprob"), step_column(b.steps, "logprob")
    for i in range(prefix):
        if i >= len(la) or i >= len(lb) or la[i] is None or lb[i] is None:
            gaps.append(None)
        else:
            gaps.append(lb[i] - la[i])
        ta = top_ids(a.steps, i) if i < len(la) else []
        tb = top_ids(b.steps, i) if i < len(lb) else []
        if not ta or not tb:
            overlaps.append(None)
        else:
            overlaps.append(len(set(ta) & set(tb)) / max(len(ta), len(tb)))

    # The figures leave out infinite gaps and those of a masked logprob (-inf, kept as -1e30 for JSON,
    # a gap of ~1e30): the noise before a fork would be 1e30, and every fork a "near-tie" within it.
    finite = [
        abs(g) for i, g in enumerate(gaps) if g is not None and math.isfinite(g) and scorable(la[i]) and scorable(lb[i])
    ]
    return Comparison(
        a=a.side,
        b=b.side,
        identical=first is None,
        first_divergence=first,
        compared=n,
        lengths=[len(ia), len(ib)],
        logprob_gaps=gaps,
        topk_overlap=overlaps,
        max_abs_gap=max(finite) if finite else None,
        mean_abs_gap=sum(finite) / len(finite) if finite else None,
        divergence=divergence_at(a, b, first) if first is not None else None,
    )


def divergence_at(a: SideResult, b: SideResult, i: int) -> Divergence:
    sa = a.steps[i] if i < len(a.steps) else None
    sb = b.steps[i] if i < len(b.steps) else None
    if sa is None or sb is None:
        return Divergence(
            index=i,
            token_ids=[sa.token_id if sa else None, sb.token_id if sb else None],
            texts=[sa.text if sa else "", sb.text if sb else ""],
            reason="length",
        )
    a_in_b = _in_topk(sa.token_id, sb)
    b_in_a = _in_topk(sb.token_id, sa)
    accepted = None if a_in_b is None or b_in_a is None else (a_in_b and b_in_a)
    return Divergence(
        index=i,
        token_ids=[sa.token_id, sb.token_id],
        texts=[sa.text, sb.text],
        in_other_topk=[a_in_b, b_in_a],
        accepted=accepted,
    )


def top_margin(step: TokenStep) -> float | None:
    """Logprob distance between a side's best and second-best token at one position."""
    if len(step.top) < 2:
        return None
    return step.top[0].logprob - step.top[1].logprob


def rank_of(token_id: int, step: TokenStep) -> int | None:
    """1-based rank of `token_id` among this step's recorded top-k, None when outside it."""
    for r, t in enumerate(step.top, start=1):
        if t.token_id == token_id:
            return r
    return None
