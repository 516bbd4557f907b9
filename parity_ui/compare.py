"""Token-level comparison of two engines' streams. Pure functions, no I/O.

Streams are compared by token id, position by position (no text diffing: two different id
sequences can decode to the same text, and that is exactly the kind of difference we must show).
"""
from __future__ import annotations

import math

from .types import Comparison, Divergence, EngineResult, TokenStep


def _topk_ids(step: TokenStep) -> set[int]:
    return {t.token_id for t in step.top}


def _in_topk(token_id: int, step: TokenStep) -> bool | None:
    if not step.top:
        return None
    return token_id in _topk_ids(step)


def compare_streams(vllm: EngineResult, hf: EngineResult) -> Comparison:
    """Compare two engines' outputs for the same prompt.

    The logprob gap and top-k overlap are measured only where both streams hold the same token
    (and so the same context); after the first divergence the contexts differ and free-running
    numbers mean nothing (teacher-forced cross-scoring measures that part).
    """
    a, b = vllm.token_ids, hf.token_ids
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and len(a) != len(b):
        first = n  # one engine stopped while the other went on
    prefix = first if first is not None else n

    gaps: list[float | None] = []
    overlaps: list[float | None] = []
    for i in range(prefix):
        sa = vllm.steps[i] if i < len(vllm.steps) else None
        sb = hf.steps[i] if i < len(hf.steps) else None
        if sa is None or sb is None or sa.logprob is None or sb.logprob is None:
            gaps.append(None)
        else:
            gaps.append(sa.logprob - sb.logprob)
        if sa is None or sb is None or not sa.top or not sb.top:
            overlaps.append(None)
        else:
            k = max(len(sa.top), len(sb.top))
            overlaps.append(len(_topk_ids(sa) & _topk_ids(sb)) / k)

    finite = [abs(g) for g in gaps if g is not None and math.isfinite(g)]
    divergence = _divergence(vllm, hf, first) if first is not None else None
    return Comparison(
        identical=first is None,
        first_divergence=first,
        compared=n,
        length_vllm=len(a),
        length_hf=len(b),
        logprob_gaps=gaps,
        topk_overlap=overlaps,
        max_abs_gap=max(finite) if finite else None,
        mean_abs_gap=sum(finite) / len(finite) if finite else None,
        divergence=divergence,
    )


def _divergence(vllm: EngineResult, hf: EngineResult, i: int) -> Divergence:
    sa = vllm.steps[i] if i < len(vllm.steps) else None
    sb = hf.steps[i] if i < len(hf.steps) else None
    if sa is None or sb is None:
        return Divergence(
            index=i,
            vllm_token_id=sa.token_id if sa else None,
            hf_token_id=sb.token_id if sb else None,
            vllm_token_text=sa.text if sa else "",
            hf_token_text=sb.text if sb else "",
            reason="length",
        )
    a_in_b = _in_topk(sa.token_id, sb)
    b_in_a = _in_topk(sb.token_id, sa)
    accepted = None if a_in_b is None or b_in_a is None else (a_in_b and b_in_a)
    return Divergence(
        index=i,
        vllm_token_id=sa.token_id,
        hf_token_id=sb.token_id,
        vllm_token_text=sa.text,
        hf_token_text=sb.text,
        vllm_token_in_hf_topk=a_in_b,
        hf_token_in_vllm_topk=b_in_a,
        accepted_by_vllm_rule=accepted,
    )


def top_margin(step: TokenStep) -> float | None:
    """Logprob distance between the engine's best and second-best token at one position."""
    if len(step.top) < 2:
        return None
    return step.top[0].logprob - step.top[1].logprob


def rank_of(token_id: int, step: TokenStep) -> int | None:
    """1-based rank of `token_id` among this step's recorded top-k, None when outside it."""
    for r, t in enumerate(step.top, start=1):
        if t.token_id == token_id:
            return r
    return None
