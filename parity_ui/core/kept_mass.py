"""Kept mass and support of sampled tokens: the record one comparison (or a pooled workload) keeps.

With top-p / top-k / min-p a side samples from a kept set of mass S < 1. A rollout engine's processed
logprob is renormalised over that set (log p − log S) while a trainer log-softmaxes the whole
vocabulary, so the naive importance ratio carries log S (trl#6789, trl#7269: 51.8% of tokens outside
[0.9, 1.1] at top_p=0.8; 4.3% once renormalised over the replayed support). Per token, with the
reference as the trainer and the side as the rollout:

- naive ρ = p_ref(raw, full vocabulary) / p_side(processed);
- renormalised ρ = p_ref renormalised over the kept set / p_side(processed): the reference's own
  processed logprob when both sides kept the same set (their fingerprints agree), the sampling-mask
  replay of prime-rl, SkyRL and NeMo-RL. Where the kept sets differ (a top-p boundary near-tie, its own
  finding: `kept_sets_differ`) the reference's processed logprob is over ITS kept set, and the token
  is counted there.

Everything is kept as counts and sums, so records pool exactly by adding them (core.pooled.pool_kept_mass).
Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .figures import RHO_BANDS

# The per-token columns a side's shared-seed draws add to its steps (TokenStep; absent = not recorded).
SAMPLING_COLUMNS = ("margin", "kept", "kept_mass", "processed_logprob", "kept_hash")


def band_key(lo: float, hi: float) -> str:
    return f"{lo:g}_{hi:g}"


@dataclass
class KeptMass:
    """Sums and counts over the tokens both sides drew (their draws recorded, the same context)."""

    tokens: int = 0
    kept_ref: float = 0.0  # sum of the reference's kept set sizes
    kept_side: float = 0.0  # sum of the side's kept set sizes
    mass_ref: float = 0.0  # sum of the reference's kept mass S (under its raw distribution)
    mass_side: float = 0.0  # sum of the side's S
    mass_side_min: float | None = None
    sets_differ: int = 0  # positions whose kept sets differ (fingerprints), the fork's included
    # Positions whose kept sets were compared: the tokens above and the fork (its context is the same on
    # both sides, so its sets compare, and a fork of the sets is the one that matters: issue 46 item 3).
    # 0 in a record stored before: `tokens` then.
    sets_compared: int = 0
    naive_rho: float = 0.0  # sum of the naive ratios
    renorm_rho: float = 0.0  # sum of the renormalised ratios
    raw_minus_processed: float = 0.0  # sum over the side's tokens of logp_raw − logp_processed (= log S at T=1)
    naive_outside: dict[str, int] = field(default_factory=dict)  # band -> tokens whose naive ratio is outside
    renorm_outside: dict[str, int] = field(default_factory=dict)

    def add(self, other: KeptMass) -> None:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "mass_side_min":
                setattr(self, f.name, b if a is None else a if b is None else min(a, b))
            elif isinstance(a, dict):
                setattr(self, f.name, {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}})
            else:
                setattr(self, f.name, a + b)

    def figures(self) -> dict[str, float | None]:
        """The sampling family's figures (core.figures: the `sampling` family), None where no token counts."""
        n = self.tokens
        if n == 0:  # a fork at the first token: only its kept sets compare
            out0: dict[str, float | None] = {key: None for key in SAMPLING_FIGURE_KEYS}
            if self.sets_compared:
                out0["kept_sets_differ"] = self.sets_differ / self.sets_compared
            return out0
        out: dict[str, float | None] = {
            "kept_mass_mean": self.mass_side / n,
            "kept_mass_min": self.mass_side_min,
            "kept_mass_ref_mean": self.mass_ref / n,
            "kept_size_mean": self.kept_side / n,
            "kept_sets_differ": self.sets_differ / (self.sets_compared or n),
            "naive_rho_mean": self.naive_rho / n,
            "renorm_rho_mean": self.renorm_rho / n,
            "raw_minus_processed_mean": self.raw_minus_processed / n,
        }
        for lo, hi in RHO_BANDS:
            out[f"naive_outside_{band_key(lo, hi)}"] = self.naive_outside.get(band_key(lo, hi), 0) / n
            out[f"renorm_outside_{band_key(lo, hi)}"] = self.renorm_outside.get(band_key(lo, hi), 0) / n
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def kept_mass_from_json(d: dict[str, Any] | KeptMass | None) -> KeptMass | None:
    if isinstance(d, KeptMass):
        return d
    if not d:
        return None
    names = {f.name for f in fields(KeptMass)}
    return KeptMass(**{k: v for k, v in d.items() if k in names})


SAMPLING_FIGURE_KEYS: tuple[str, ...] = (
    "kept_mass_mean",
    "kept_mass_min",
    "kept_mass_ref_mean",
    "kept_size_mean",
    "kept_sets_differ",
    "naive_rho_mean",
    "renorm_rho_mean",
    "raw_minus_processed_mean",
    *(f"{kind}_outside_{band_key(lo, hi)}" for lo, hi in RHO_BANDS for kind in ("naive", "renorm")),
)
