"""Kept mass and support of one comparison's sampled tokens (core.kept_mass has the record and the ratios'
definitions). Pure: reads the two sides' steps over their shared prefix (the same tokens, the same
context), where both recorded the draw: the kept set's size, mass S, fingerprint and the processed logprob
(shared-seed sampling records them on every side; parity_ui.engines.shared_seed). The kept sets are
compared at the fork too: its context is still the same, and where the sets differ there, they made it.
"""

from __future__ import annotations

import math

from ..core.figures import RHO_BANDS
from ..core.kept_mass import KeptMass, band_key
from ..core.types import Comparison, SideResult, step_column

# exp() of a log-ratio beyond this saturates (as core.pooled's EXP_CAP): a sum must stay finite.
_CAP = 600.0


def _rho(log_ratio: float) -> float:
    return math.exp(max(-_CAP, min(_CAP, log_ratio)))


def kept_mass(c: Comparison, ref: SideResult, side: SideResult) -> KeptMass | None:
    """The comparison's kept-mass record, or None when the sides recorded no draws (greedy, native
    sampling, an engine that samples elsewhere)."""
    n = c.first_divergence if c.first_divergence is not None else c.compared
    cols = {}
    for who, res in (("ref", ref), ("side", side)):
        for name in ("logprob", "processed_logprob", "kept", "kept_mass", "kept_hash"):
            cols[who, name] = step_column(res.steps, name)
    out = KeptMass()
    for i in range(min(n, len(cols["ref", "logprob"]), len(cols["side", "logprob"]))):
        lr, ls = cols["ref", "logprob"][i], cols["side", "logprob"][i]
        pr, ps = cols["ref", "processed_logprob"][i], cols["side", "processed_logprob"][i]
        sr, ss = cols["ref", "kept_mass"][i], cols["side", "kept_mass"][i]
        if None in (lr, ls, pr, ps, sr, ss):
            continue
        out.tokens += 1
        out.sets_compared += 1
        out.kept_ref += cols["ref", "kept"][i] or 0
        out.kept_side += cols["side", "kept"][i] or 0
        out.mass_ref += sr
        out.mass_side += ss
        out.mass_side_min = ss if out.mass_side_min is None else min(out.mass_side_min, ss)
        if cols["ref", "kept_hash"][i] != cols["side", "kept_hash"][i]:
            out.sets_differ += 1
        naive, renorm = _rho(lr - ps), _rho(pr - ps)
        out.naive_rho += naive
        out.renorm_rho += renorm
        out.raw_minus_processed += ls - ps
        for lo, hi in RHO_BANDS:
            key = band_key(lo, hi)
            if not lo <= naive <= hi:
                out.naive_outside[key] = out.naive_outside.get(key, 0) + 1
            if not lo <= renorm <= hi:
                out.renorm_outside[key] = out.renorm_outside.get(key, 0) + 1
    fork = c.first_divergence
    if fork is not None and fork < min(len(cols["ref", "kept_hash"]), len(cols["side", "kept_hash"])):
        hr, hs = cols["ref", "kept_hash"][fork], cols["side", "kept_hash"][fork]
        if hr is not None and hs is not None:
            out.sets_compared += 1
            out.sets_differ += hr != hs
    return out if out.tokens or out.sets_compared else None
