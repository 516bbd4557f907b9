"""Why did the streams fork? A verdict at the first divergence, from what both engines recorded there.

`explain_prompt(prompt_result, cfg)` is a pure function of one prompt's results (both engines' steps,
the comparison, the cross-scores when present). It returns a JSON-ready dict:

- `verdict`: "identical" | "numerical near-tie" | "real disagreement" | "masked token" | "length"
  | "sampling" | "error"
- `summary`: one or two sentences for a human
- numbers: per engine the chosen token, its top-1/top-2 margin, its margin over the other engine's
  token, its rank of the other's token; the noise level measured before the fork.
"""
from __future__ import annotations

import math
from typing import Any

from .compare import rank_of, top_margin
from .config import ParityConfig
from .types import Comparison, EngineResult, PromptResult, TokenStep

# Two bf16 ulps at the logit magnitudes of small LMs (|logit| in [16, 32) has a bf16 step of 0.125):
# two tokens closer than this can swap on rounding alone. Measured on the demo model: the bf16 fork
# at token 27 had a vLLM margin of 0.125 and an exact HF tie.
NEAR_TIE_NATS = 0.25
# A margin is also a near-tie when it is within this multiple of the largest logprob gap the two
# engines showed on the same context before the fork: the noise they demonstrably have.
NOISE_MULTIPLE = 2.0
# engines.base.clean_logprob stores a masked (-inf) logprob as -1e30; anything below this was masked
# by a logits processor, not predicted.
MASKED_LOGPROB = -1e20


def _step(res: EngineResult | None, i: int) -> TokenStep | None:
    if res is None or i >= len(res.steps):
        return None
    return res.steps[i]


def _logprob_of(token_id: int | None, step: TokenStep | None) -> float | None:
    if token_id is None or step is None:
        return None
    if step.token_id == token_id:
        return step.logprob
    return next((t.logprob for t in step.top if t.token_id == token_id), None)


def _side(step: TokenStep | None, other_token: int | None) -> dict[str, Any]:
    """One engine at the divergence: its choice, its confidence, where it put the other's token."""
    if step is None:
        return {"token_id": None, "text": "", "logprob": None, "top12_margin": None,
                "other_token_rank": None, "other_token_logprob": None, "margin_over_other": None}
    other_lp = _logprob_of(other_token, step)
    margin = None
    if step.logprob is not None and other_lp is not None:
        margin = step.logprob - other_lp
    return {
        "token_id": step.token_id, "text": step.text, "logprob": step.logprob,
        "top12_margin": top_margin(step),
        # 1-based within the recorded top-k; None means outside it (rank > k)
        "other_token_rank": None if other_token is None else rank_of(other_token, step),
        "other_token_logprob": other_lp,
        "margin_over_other": margin,
        "recorded_k": len(step.top),
    }


def _masked(*values: float | None) -> bool:
    return any(v is not None and v <= MASKED_LOGPROB for v in values)


def _stopped_summary(pr: PromptResult, c: Comparison, cfg: ParityConfig) -> tuple[str, dict[str, Any]]:
    short, long_ = ("vllm", "hf") if c.length_vllm < c.length_hf else ("hf", "vllm")
    s_res, l_res = getattr(pr, short), getattr(pr, long_)
    names = {"vllm": "vLLM", "hf": "HF"}
    last = s_res.token_ids[-1] if s_res and s_res.token_ids else None
    fields = {"stopped_engine": short, "stopped_after": len(s_res.token_ids) if s_res else 0,
              "stopped_finish_reason": s_res.finish_reason if s_res else None, "stop_token_id": last,
              "continued_engine": long_, "continued_to": len(l_res.token_ids) if l_res else 0}
    if s_res is not None and s_res.error:
        return f"{names[short]} failed after {fields['stopped_after']} tokens: {s_res.error}", fields
    if s_res is not None and s_res.finish_reason == "stop" and last is not None:
        text = s_res.steps[-1].text if s_res.steps else ""
        if c.compared and l_res is not None and l_res.token_ids[c.compared - 1] == last:
            why = (f"both made {text!r} (id {last}) there, but it is a stop id only for {names[short]}: "
                   "the engines were given different EOS/stop ids")
        else:
            why = f"it stopped on {text!r} (id {last})"
        return (f"{names[short]} stopped after {fields['stopped_after']} tokens and {names[long_]} went on "
                f"to {fields['continued_to']}: {why}."), fields
    return (f"{names[short]} ended after {fields['stopped_after']} tokens (finish={fields['stopped_finish_reason']}) "
            f"while {names[long_]} made {fields['continued_to']}."), fields


def explain_prompt(pr: PromptResult, cfg: ParityConfig) -> dict[str, Any]:
    """The verdict for one prompt's first divergence (see the module docstring). Never raises on
    missing data: fields it cannot compute are None."""
    c = pr.comparison
    base: dict[str, Any] = {"thresholds": {"near_tie_nats": NEAR_TIE_NATS, "noise_multiple": NOISE_MULTIPLE,
                                           "masked_logprob": MASKED_LOGPROB}}
    if c is None:
        return {**base, "verdict": "error", "summary": "no comparison: an engine produced no result."}
    noise = c.max_abs_gap
    base.update(index=c.first_divergence, noise_before=noise)
    if c.identical:
        gap = "n/a" if noise is None else f"{noise:.3g}"
        return {**base, "verdict": "identical",
                "summary": f"identical for all {c.compared} tokens; largest logprob gap {gap} nats."}
    d, i = c.divergence, c.first_divergence
    if d is not None and d.reason == "length":
        summary, fields = _stopped_summary(pr, c, cfg)
        return {**base, **fields, "verdict": "error" if "failed" in summary else "length", "summary": summary}
    sv, sh = _step(pr.vllm, i), _step(pr.hf, i)
    vllm = _side(sv, sh.token_id if sh else None)
    hf = _side(sh, sv.token_id if sv else None)
    out = {**base, "vllm": vllm, "hf": hf,
           "accepted_by_vllm_rule": d.accepted_by_vllm_rule if d else None}
    at = f"at token {i}, vLLM chose {vllm['text']!r} and HF {hf['text']!r}"
    if not cfg.greedy:
        return {**out, "verdict": "sampling",
                "summary": f"{at}: temperature={cfg.temperature}, each engine draws from its own random "
                           "stream, so sampled tokens are expected to differ."}
    if _masked(vllm["logprob"], hf["logprob"], vllm["other_token_logprob"], hf["other_token_logprob"]):
        who = "vLLM" if _masked(vllm["logprob"], vllm["other_token_logprob"]) else "HF"
        return {**out, "verdict": "masked token",
                "summary": f"{at}: {who} recorded a masked logprob (-inf) there: a logits processor "
                           "forbade a token (e.g. EOS under min_new_tokens), so the models were not "
                           "compared on equal terms."}
    margins = [m for m in (vllm["margin_over_other"], hf["margin_over_other"]) if m is not None]
    if not margins:  # the other's token is outside one's top-k: fall back to the top-1/top-2 margins
        margins = [m for m in (vllm["top12_margin"], hf["top12_margin"]) if m is not None]
    worst = max(margins) if margins else None
    tie_bound = max(NEAR_TIE_NATS, NOISE_MULTIPLE * noise) if noise is not None and math.isfinite(noise) \
        else NEAR_TIE_NATS
    out.update(largest_margin=worst, tie_bound=tie_bound)
    in_topk = d is not None and d.accepted_by_vllm_rule
    if worst is not None and worst <= tie_bound and in_topk:
        return {**out, "verdict": "numerical near-tie",
                "summary": f"{at}: a near-tie; each engine preferred its token by at most {worst:.3g} nats "
                           f"(bound {tie_bound:.3g}) and each token is in the other's top-k, so rounding "
                           "alone can flip it. float32 usually removes it."}
    margin_text = "unknown" if worst is None else f"{worst:.3g} nats"
    return {**out, "verdict": "real disagreement",
            "summary": f"{at}: a real disagreement; margin {margin_text} (near-tie bound {tie_bound:.3g})"
                       + ("" if in_topk else ", and a token is outside the other's top-k")
                       + ". Look for a config difference (see warnings) or a model-loading difference."}
