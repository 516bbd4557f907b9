"""A bisect trial's oracle: does the trial side, with some settings flipped, agree with the reference?
The `check_logprobs_close` of trials, as a pure function of what the trial measured.

Two rules, one per kind of pair:

- an exact pair (greedy, both sides' weights in float32, one kind of engine) must be token-identical
  on every prompt. Across engines (HF against vLLM) float32 runs other kernels on each side, so
  "identical" is the wrong rule there: the measured floor decides;
- any other pair must stay within the reference's own noise floor (parity_ui.core.pooled.compare_to_floor:
  every figure at most 1.5x the floor's, the share identical not below it), so a near-tie that flips
  back and forth decides nothing. A side that forks at its first token on every prompt leaves no token
  to weigh, and over a few prompts the share identical alone cannot tell 0/3 from 3/3: that is far
  outside any noise, and judged so.

No I/O, no engine: the driver (parity_ui.commands.setting_bisect) runs the trial and hands in its figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.pooled import WorkloadStats, compare_to_floor
from ..core.settings import reported
from ..core.types import SideInfo

__all__ = ["IDENTICAL", "FLOOR", "TrialVerdict", "exact_pair", "judge", "describe"]

IDENTICAL, FLOOR = "identical tokens", "noise floor"


@dataclass(frozen=True)
class TrialVerdict:
    """What the oracle said of one trial, with the figures it weighed."""

    restores: bool  # the trial side agrees with the reference by the oracle's rule
    oracle: str  # IDENTICAL or FLOOR
    verdict: str  # against the floor: "within noise", "exceeds noise", "not comparable"
    exceeded: list[str] = field(default_factory=list)  # the figures over the floor, the first-token fork first
    identical: int = 0  # prompts token-identical to the reference
    prompts: int = 0
    first_divergence: int | None = None  # the earliest over the prompts
    abs_dlogp_p99: float | None = None
    abs_dlogp_max: float | None = None


def exact_pair(greedy: bool, ref: SideInfo | None, trial: SideInfo | None) -> bool:
    """Whether the pair is exact: a greedy run, both sides' weights resolved as float32, one kind of engine."""
    if not greedy or ref is None or trial is None:
        return False
    return all(reported(i, "dtype") == "float32" for i in (ref, trial)) and ref.kind == trial.kind


def judge(side: WorkloadStats, floor: WorkloadStats, *, exact: bool) -> TrialVerdict:
    """The trial side's pooled figures against the reference (`side`) and the reference's noise floor
    (`floor`, measured once per search): restores parity or not, by the rule for an exact pair or the
    floor's (see the module docstring). Pure."""
    v = compare_to_floor(side, floor)
    verdict, exceeded = v.verdict, list(v.exceeded)
    if side.tokens.pairs == 0 and floor.tokens.pairs > 0:
        verdict = "exceeds noise"
        exceeded = [
            f"forks at the first token on every prompt (the floor compared {floor.tokens.pairs} tokens)",
            *exceeded,
        ]
    seq = side.sequences
    restores = seq.identical == seq.n if exact else verdict == "within noise"
    return TrialVerdict(
        restores=restores,
        oracle=IDENTICAL if exact else FLOOR,
        verdict=verdict,
        exceeded=exceeded,
        identical=seq.identical,
        prompts=seq.n,
        first_divergence=next(
            (w.first_divergence for w in side.worst_by_divergence if w.first_divergence is not None), None
        ),
        abs_dlogp_p99=side.tokens.abs_dlogp_p99,
        abs_dlogp_max=side.tokens.abs_dlogp_max,
    )


def describe(greedy: bool) -> str:
    """The oracle in one sentence, for the record and the screen."""
    exact = (
        "identical tokens on every prompt where the pair is exact (greedy, both sides' weights float32, "
        "one kind of engine)"
        if greedy
        else "(the run samples: no pair is exact)"
    )
    return (
        f"{exact}; otherwise the trial side within the reference's own noise floor (every figure at most "
        "1.5x the floor's, the share identical not below it, some token compared before the forks), the "
        "floor measured once in the first trial and reused"
    )
