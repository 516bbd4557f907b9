"""A sliding-window model on vLLM's CPU backend: measured after the run instead of guessed before it.

Before loading, the vLLM worker can only say that the model has a sliding window and that vLLM's CPU
attention applies it with its own kernel (finding `sliding-window-cpu`, parity_ui.engines.vllm_support).
Whether it applies it as the reference does shows in the run itself: on the tokens whose context ran
past the window. `settle_sliding_window(run)` replaces that finding with what the run measured there,
per side: how many compared tokens had a context past the window, the largest logprob gap to the other
side on them (and on the tokens within the window, where there are some), and whether the streams
forked past the window on a real disagreement. Pure: reads the run's comparisons, changes only
`run.warnings`. The finding is made here also for a side whose worker was already loaded (the
check before loading runs once per worker).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.types import Finding, Run
from .explain import NEAR_TIE_NATS, NOISE_MULTIPLE

CODE = "sliding-window-cpu"
# Two float32 engines computing the same attention agree to ~1e-5 nats (the tests' fp32 bound is 1e-3);
# a window applied differently changes what a token attends to, which moves logprobs by far more.
FP32_NOISE_NATS = 1e-3
_FIX = "compare with prompts shorter than the window, or run the vLLM side on a GPU"


@dataclass
class WindowMeasure:
    """What the comparisons of one side show about the window."""

    window: int
    against: list[str] = field(default_factory=list)  # the sides it was compared with
    past: int = 0  # compared tokens whose context was longer than the window
    within: int = 0  # compared tokens whose context fitted in it
    max_past: float | None = None  # largest |logprob gap| on those
    max_within: float | None = None
    longest_context: int = 0  # the longest context of a compared token
    forks_past: list[str] = field(default_factory=list)  # real disagreements past the window: "prompt 0 token 7"
    other_forks_past: list[str] = field(default_factory=list)  # near-ties, length: "prompt 0 token 7 (near-tie)"
    half_precision: bool = False  # a compared side ran in bf16/fp16


def _max(a: float | None, b: float) -> float:
    return b if a is None else max(a, b)


def measure(run: Run, side: str, window: int, flagged: set[str]) -> WindowMeasure:
    """`side`'s comparisons with sides that are not themselves flagged: tokens whose context (prompt
    plus the tokens before it) is longer than `window`, against those that fit in it."""
    m = WindowMeasure(window=window)
    dtypes = {s.name: s.dtype for s in run.sides}
    for p in run.prompts:
        n_prompt = len(p.prompt_token_ids)
        for c in p.comparisons:
            if side not in (c.a, c.b):
                continue
            other = c.b if c.a == side else c.a
            if other in flagged:
                continue
            if other not in m.against:
                m.against.append(other)
            m.half_precision |= any(dtypes.get(n, "float32") in ("bfloat16", "float16") for n in (side, other))
            for i, gap in enumerate(c.logprob_gaps):
                context = n_prompt + i  # the token at i is predicted from the prompt and the i tokens before it
                m.longest_context = max(m.longest_context, context)
                if gap is None or not math.isfinite(gap):
                    continue
                if context > window:
                    m.past += 1
                    m.max_past = _max(m.max_past, abs(gap))
                else:
                    m.within += 1
                    m.max_within = _max(m.max_within, abs(gap))
            d = c.first_divergence
            if d is None:
                continue
            m.longest_context = max(m.longest_context, n_prompt + d)  # the fork's own context was compared too
            verdict = c.explanation.verdict if c.explanation else None
            if n_prompt + d > window:
                (m.forks_past if verdict == "real disagreement" else m.other_forks_past).append(
                    f"prompt {p.index} token {d}" + ("" if verdict == "real disagreement" else f" ({verdict})")
                )
    return m


def bound(m: WindowMeasure) -> float:
    """The largest gap past the window that the sides' own noise explains: the dtype's floor, or
    NOISE_MULTIPLE times what they showed within the window, whichever is larger."""
    floor = NEAR_TIE_NATS if m.half_precision else FP32_NOISE_NATS
    return max(floor, NOISE_MULTIPLE * m.max_within) if m.max_within is not None else floor


def finding(side: str, m: WindowMeasure) -> Finding:
    """The settled finding for one side: info when the run shows the window applied as the other side
    applies it (or never reached), warning when it shows otherwise or could not tell."""
    w = f"the model's sliding window ({m.window} tokens)"
    if not m.against:
        return Finding(
            code=CODE,
            severity="warning",
            side=side,
            message=f"side {side}: {w} runs on vLLM's CPU attention, and no side that applies it "
            "another way was compared with this one: not measured",
            fix="add an hf side as the reference",
        )
    others = ", ".join(m.against)
    if m.forks_past:
        before = (
            f"on the {m.past} token(s) compared past the window before that, the largest logprob gap was "
            f"{m.max_past:.2g} nats"
            if m.max_past is not None
            else "no token past the window was compared before that"
        )
        return Finding(
            code=CODE,
            severity="warning",
            side=side,
            message=f"side {side}: the streams of {side} and {others} forked past {w} on a real "
            f"disagreement ({'; '.join(m.forks_past)}); {before}: vLLM's CPU attention may not "
            "apply the window as the other side does",
            fix=_FIX,
        )
    if m.past == 0 and m.other_forks_past:
        return Finding(
            code=CODE,
            severity="warning",
            side=side,
            message=f"side {side}: not measured: the streams of {side} and {others} forked "
            f"({'; '.join(m.other_forks_past)}) before any token past {w} could be compared",
            fix="compare in float32, or with a prompt that leaves tokens to compare past the window",
        )
    if m.past == 0:
        return Finding(
            code=CODE,
            severity="info",
            side=side,
            message=f"side {side}: {w} was never reached: the longest context compared with {others} "
            f"was {m.longest_context} tokens, so the window did not apply in this run",
        )
    b = bound(m)
    within = f"; within the window ({m.within} tokens) it was {m.max_within:.2g}" if m.max_within is not None else ""
    measured = (
        f"on the {m.past} compared token(s) whose context ran past {w}, the largest logprob gap to "
        f"{others} was {m.max_past:.2g} nats{within}"
    )
    if m.max_past is not None and m.max_past > b:
        return Finding(
            code=CODE,
            severity="warning",
            side=side,
            message=f"side {side}: {measured}, over the {b:.2g} that the sides' own noise explains: "
            "vLLM's CPU attention may not apply the window as the other side does",
            fix=_FIX,
        )
    how = (
        "consistent with the window applied as the other side does, to within bf16/fp16 noise (float32 "
        "measures it more finely)"
        if m.half_precision
        else "the window was applied as the other side does"
    )
    return Finding(
        code=CODE, severity="info", side=side, message=f"side {side}: {measured} (noise bound {b:.2g}): {how}"
    )


def flagged_sides(run: Run) -> list[str]:
    """The sides whose attention is vLLM's CPU kernel on the run's own model: those the worker flagged
    before loading, and those that reported a CPU device after it (a warm worker is not checked again)."""
    pre = {f.side for f in run.warnings if f.code == CODE and f.side}
    return [
        s.name
        for s in run.sides
        if s.model_path in ("", run.model.path)
        and (s.name in pre or (s.kind.startswith("vllm") and s.device.startswith("cpu")))
    ]


def settle_sliding_window(run: Run) -> None:
    """Put what the run measured in place of each flagged side's `sliding-window-cpu` finding (see
    the module docstring), or add it where the side's worker was warm and not checked. Leaves the
    findings as they are when the run has no comparisons (it failed) or its model no window."""
    window = run.model.sliding_window if run.model else None
    if not isinstance(window, int) or window <= 0 or not any(p.comparisons for p in run.prompts):
        return
    flagged = flagged_sides(run)
    settled = {side: finding(side, measure(run, side, window, set(flagged))) for side in flagged}
    out = [settled.pop(f.side) if f.code == CODE and f.side in settled else f for f in run.warnings]
    run.warnings = out + list(settled.values())
