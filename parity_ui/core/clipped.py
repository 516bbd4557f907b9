"""The importance ratio as a trainer clips it: a replay pair's ρ = p_trainer / p_rollout counted token
by token as truncated importance sampling uses it (min(ρ, C), C = core.figures.RHO_CLIP: verl's
rollout_is_threshold default), the share the clip changed, and the share below 1 / C that a clip
leaves unseen (ρ ≪ 1 starves a token's gradient: TRL #5243, NeMo-RL #3900 report the raw ratios for
this reason). The clipped-ratio measure (parity_ui.measures.clipped) pools it per pair from the stored
pair samples; a recorded-only replay (parity_ui.commands.replay_recorded) as its rows come; the trend
follows it over a run's steps (core.trend).

Pure: standard library only.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import sub
from typing import Any

from .figures import FAMILIES, RHO_CLIP
from .pooled import EXP_CAP, all_scorable, scorable

CLIPPED_ROWS: tuple[str, ...] = FAMILIES["clipped"]  # its figures, in every view's order


@dataclass
class ClipStats:
    """The importance ratio ρ = p_trainer / p_rollout as a trainer clips it, counted token by token."""

    tokens: int = 0
    clipped_sum: float = 0.0  # sum of min(ρ, C)
    clipped: int = 0  # tokens with ρ > C
    low: int = 0  # tokens with ρ < 1 / C
    cap: float = RHO_CLIP

    def add(self, trainer: Sequence[float | None], rollout: Sequence[float | None]) -> None:
        """One sample's parallel logprobs (a PairSample's logp_ref, logp_side); a pair with a missing,
        non-finite or masked logprob is left out, as the pooled figures leave it out (core.pooled.scorable)."""
        if all_scorable(trainer) and all_scorable(rollout):  # the usual case, checked at C speed
            d = list(map(sub, trainer, rollout))
        else:
            d = [a - b for a, b in zip(trainer, rollout) if scorable(a) and scorable(b)]
        d.sort()
        log_cap = math.log(self.cap)
        kept = bisect_right(d, log_cap)  # d <= log C: rho not clipped
        self.tokens += len(d)
        self.clipped += len(d) - kept
        self.low += bisect_left(d, -log_cap)
        self.clipped_sum += self.cap * (len(d) - kept) + sum(map(math.exp, map(max, d[:kept], repeat(-EXP_CAP))))

    def figures(self) -> dict[str, float | None]:
        n = self.tokens
        return {
            "rho_clipped_mean": self.clipped_sum / n if n else None,
            "rho_clipped_share": self.clipped / n if n else None,
            "rho_low_share": self.low / n if n else None,
        }

    def family(self) -> dict[str, Any] | None:
        """The pooled family as a report keeps it (WorkloadStats.families["clipped"]): its figures and the
        tokens counted; None where no token was."""
        return {"tokens": self.tokens, **self.figures()} if self.tokens else None
