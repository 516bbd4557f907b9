"""Teacher-forced cross-scoring: each engine re-scores the tokens the other one generated.

Free-running streams stop being comparable at their first fork (the contexts differ after it).
Scoring vLLM's sequence with HF, and HF's with vLLM, compares both engines on the SAME context at
every position, over the whole sequence (vLLM via prompt_logprobs, HF with one forward pass).

Gap at a position = the generating engine's own logprob - the other engine's teacher-forced logprob
of the same token. The importance ratio is TRL's: exp(logp_hf - logp_vllm).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .types import EngineResult, PromptResult, Run, TokenStep

# The batch-logprob-gap study's band: a position "moves" when exp(gap) leaves [0.9, 1.1].
RATIO_BAND = (0.9, 1.1)
# engines.base.clean_logprob stores -inf as -1e30: such a position was masked, not predicted.
MASKED_LOGPROB = -1e20

ScoreFn = Callable[[str, list[int], list[int], int], list[TokenStep]]
OTHER = {"vllm": "hf", "hf": "vllm"}


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > MASKED_LOGPROB


def gap_stats(generator: str, own: list[TokenStep], scored: list[TokenStep]) -> dict[str, Any]:
    """Statistics of own-vs-teacher-forced logprobs for one generated sequence. Pure.

    `own` are the generating engine's steps, `scored` the other engine's teacher-forced steps for
    the same tokens (same length). Positions where either logprob is missing or masked are counted
    in `skipped` and left out of the numbers."""
    gaps: list[float | None] = []
    ratios: list[float] = []
    other_rank: list[int | None] = []
    for a, b in zip(own, scored):
        other_rank.append(b.rank)
        if not (_finite(a.logprob) and _finite(b.logprob)):
            gaps.append(None)
            continue
        gap = a.logprob - b.logprob  # type: ignore[operator]
        gaps.append(gap)
        lp_hf, lp_vllm = (a.logprob, b.logprob) if generator == "hf" else (b.logprob, a.logprob)
        ratios.append(math.exp(lp_hf - lp_vllm))  # type: ignore[operator]
    vals = [g for g in gaps if g is not None]
    n = len(vals)
    lo, hi = RATIO_BAND
    outside = sum(1 for g in vals if not lo <= math.exp(g) <= hi)
    return {
        "generator": generator, "scorer": OTHER[generator], "positions": len(gaps), "skipped": len(gaps) - n,
        "gaps": gaps,  # per position, own - teacher-forced, nats
        "other_rank": other_rank,  # the scorer's rank of each token (1 = it would have chosen it too)
        "other_disagrees": sum(1 for r in other_rank if r is not None and r > 1),
        "mean_gap": sum(vals) / n if n else None,
        "mean_abs_gap": sum(abs(g) for g in vals) / n if n else None,
        "max_abs_gap": max((abs(g) for g in vals), default=None),
        "rms_gap": math.sqrt(sum(g * g for g in vals) / n) if n else None,
        "share_outside_band": outside / n if n else None,
        "ratio_band": list(RATIO_BAND),
        "importance_ratio": {"min": min(ratios), "mean": sum(ratios) / len(ratios), "max": max(ratios)}
        if ratios else None,
    }


def cross_score_prompt(score: ScoreFn, pr: PromptResult, logprobs: int) -> dict[str, Any]:
    """Score each engine's sequence with the other. Keys "vllm_by_hf" and "hf_by_vllm"; a direction
    is None when its generator made no tokens. Engine errors propagate (EngineError)."""
    out: dict[str, Any] = {}
    for gen in ("vllm", "hf"):
        res: EngineResult | None = getattr(pr, gen)
        key = f"{gen}_by_{OTHER[gen]}"
        if res is None or not res.token_ids or res.error:
            out[key] = None
            continue
        scored = score(OTHER[gen], pr.prompt_token_ids, res.token_ids, logprobs)
        out[key] = gap_stats(gen, res.steps, scored)
    return out


def cross_score_run(score: ScoreFn, run: Run, logprobs: int) -> None:
    """Fill `cross_scores` of every prompt of a run in place. A failure is recorded in the prompt's
    cross_scores as {"error": ...} rather than failing the run (the comparison already stands)."""
    for pr in run.prompts:
        if pr.vllm is None or pr.hf is None:
            continue
        try:
            pr.cross_scores = cross_score_prompt(score, pr, logprobs)
        except Exception as e:  # noqa: BLE001 - an EngineError or a worker crash: keep the run
            pr.cross_scores = {"error": f"{type(e).__name__}: {e}"}


def summary_line(cs: dict[str, Any] | None) -> str:
    """One line for the CLI: both directions' RMS/max gap and the ratio range."""
    if not cs:
        return ""
    if "error" in cs:
        return f"cross-scoring failed: {cs['error']}"
    parts = []
    for key, label in (("vllm_by_hf", "vLLM's tokens scored by HF"), ("hf_by_vllm", "HF's tokens scored by vLLM")):
        s = cs.get(key)
        if not s or s["rms_gap"] is None:
            continue
        r = s["importance_ratio"]
        parts.append(f"{label}: RMS gap {s['rms_gap']:.3g}, max {s['max_abs_gap']:.3g} nats, "
                     f"{100 * s['share_outside_band']:.1f}% outside exp(gap) in [0.9, 1.1], "
                     f"ratio {r['min']:.3f}..{r['max']:.3f}")
    return "; ".join(parts)
