"""The figures a gate can hold a side to, read from a workload's pooled figures (WorkloadStats).

Each metric has ONE direction, so a spec says only the limit: `share_identical: 0.95` means ">=
0.95", `abs_dlogp_p99: 0.05` means "<= 0.05". `within_floor` is not here: it judges every figure
against the reference's own noise (parity_ui.core.pooled.compare_to_floor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...core.figures import FAMILIES, FIGURES
from ...core.pooled import RHO_BANDS, WorkloadStats


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool  # True: the value must be >= the limit; False: <= the limit
    get: Callable[[WorkloadStats], float | None]
    doc: str
    # What a missing value means: "pass" where None says the best happened (no prompt diverged, so
    # there is no median first divergence), else the check cannot be made and fails.
    none_passes: bool = False

    @property
    def display(self) -> str:
        """Its name for people (core.figures); `k1` is the k1 estimator's size, never called KL."""
        return FIGURES["abs_kl" if self.name == "k1" else self.name].name

    @property
    def op(self) -> str:
        return ">=" if self.higher_is_better else "<="


def _abs(x: float | None) -> float | None:
    return None if x is None else abs(x)


def _band(i: int) -> Callable[[WorkloadStats], float | None]:
    return lambda s: s.tokens.outside[i].outside if i < len(s.tokens.outside) else None


def _family_figure(family: str, key: str) -> Callable[[WorkloadStats], float | None]:
    """Figure `key` of a family (None: the workload did not measure that family)."""
    return lambda s: (s.family(family) or {}).get(key)


def _wilson_lower(s: WorkloadStats) -> float | None:
    ci = s.sequences.identical_ci
    return None if ci is None else ci.lower_one_sided


_LIST: list[Metric] = [
    Metric(
        "share_identical",
        True,
        lambda s: s.sequences.share_identical,
        "share of prompts whose tokens equal the reference's",
    ),
    Metric(
        "identical_wilson_lower",
        True,
        _wilson_lower,
        "one-sided 95% Wilson lower bound of the share identical (vLLM's accuracy gate's bound)",
    ),
    Metric(
        "median_first_divergence",
        True,
        lambda s: s.sequences.median_first_divergence,
        "median generated-token index of the first divergence, over the prompts that diverged (none diverged: passes)",
        none_passes=True,
    ),
    Metric("abs_dlogp_mean", False, lambda s: s.tokens.abs_dlogp_mean, "mean |logp_side - logp_ref| (nats)"),
    Metric("abs_dlogp_p50", False, lambda s: s.tokens.abs_dlogp_p50, "median |logp_side - logp_ref|"),
    Metric("abs_dlogp_p95", False, lambda s: s.tokens.abs_dlogp_p95, "95th percentile |logp_side - logp_ref|"),
    Metric("abs_dlogp_p99", False, lambda s: s.tokens.abs_dlogp_p99, "99th percentile |logp_side - logp_ref|"),
    Metric("abs_dlogp_max", False, lambda s: s.tokens.abs_dlogp_max, "largest |logp_side - logp_ref|"),
    Metric("abs_dprob_mean", False, lambda s: s.tokens.abs_dprob_mean, "mean |p_side - p_ref|"),
    Metric("abs_dprob_max", False, lambda s: s.tokens.abs_dprob_max, "largest |p_side - p_ref|"),
    Metric(
        "k1",
        False,
        lambda s: _abs(s.tokens.k1),
        "|mean(logp_side - logp_ref)|: the size of the k1 estimator of "
        "KL(side || ref) (k1 itself can be negative; shown as |mean log-ratio (k1)|)",
    ),
    Metric(
        "k3",
        False,
        lambda s: s.tokens.k3,
        "KL(side || ref) by the k3 estimator mean(rho - log rho - 1), never negative; rho = p_ref / p_side",
    ),
    Metric(
        "token_mult_prob_error",
        False,
        lambda s: s.tokens.token_mult_prob_error,
        "mean(exp(|dlogp|)), NeMo-RL's figure (1.0 = perfect)",
    ),
    Metric("pearson", True, lambda s: s.tokens.pearson, "Pearson r of the two sides' token probabilities"),
    *(
        Metric(
            f"outside_{lo:g}_{hi:g}",
            False,
            _band(i),
            f"share of tokens whose ratio rho = exp(logp_ref - logp_side) is outside [{lo:g}, {hi:g}]",
        )
        for i, (lo, hi) in enumerate(RHO_BANDS)
    ),
    # MoE (routes=true): the routing family; a workload without routes cannot be checked (fails, says so)
    *(
        Metric(
            key,
            not FIGURES[key].higher_is_worse,
            _family_figure("routing", key),
            FIGURES[key].meaning,
        )
        for key in FAMILIES["routing"]
    ),
    # full_distribution=true (scored mode): the distribution family; a workload without it cannot be checked
    *(
        Metric(
            key,
            not FIGURES[key].higher_is_worse,
            _family_figure("distribution", key),
            FIGURES[key].meaning,
        )
        for key in FAMILIES["distribution"]
    ),
    # shared-seed sampled workloads: the sampling family (kept mass and both ratios)
    *(
        Metric(
            key,
            not FIGURES[key].higher_is_worse,
            _family_figure("sampling", key),
            FIGURES[key].meaning,
        )
        for key in FAMILIES["sampling"]
    ),
]
METRICS: dict[str, Metric] = {m.name: m for m in _LIST}
# A spec's metric names from before schema 3, read as their new names (kept for one schema version).
METRIC_ALIASES: dict[str, str] = {"kl": "k1"}
WITHIN_FLOOR = "within_floor"


def value_of(metric: str, stats: WorkloadStats) -> float | None:
    return METRICS[metric].get(stats)


def fmt(x: float | None) -> str:
    """A figure for a message: enough digits to see why it failed."""
    if x is None:
        return "none"
    if x == 0:
        return "0"
    return f"{x:.4g}"
