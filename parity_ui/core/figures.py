"""The figures a workload reports, registered once: each figure's key (its name in the code, the
stored JSON and a gate spec), its display name (the one every view shows: the CLI screen, the app,
the static report, the gate's messages and the verdict text), its direction, its format and what it
means in one line. No view names a figure by its key.

Two estimators of KL(side || ref) are pooled over the side's own tokens, with
rho = p_ref / p_side of each token:
- k1 = mean(logp_side - logp_ref), unbiased but NEGATIVE over few tokens or a side less sure of
  its own tokens than the reference is: it is shown as "mean log-ratio (k1)", never as "KL";
- k3 = mean(rho - log rho - 1) >= 0 term by term: it is the figure named KL ("KL(side‖ref), k3").

Pure: standard library only. May import: nothing else of parity_ui.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The importance-ratio bands (parity-ui's, then maxtext PR #5231's two); core.pooled pools them.
# The fourth, [0.8, 1.2], is PPO's usual clip range (the RL replay's first band); appended, so a stored report's
# bands keep their places.
RHO_BANDS: tuple[tuple[float, float], ...] = ((0.9, 1.1), (0.99, 1.01), (0.999, 1.002), (0.8, 1.2))

RHO = "ρ = p_ref / p_side of a token: the importance ratio (reference = trainer); 1 = the sides agree"
# Truncated importance sampling's cap C on ρ (verl's algorithm.rollout_is_threshold default): the
# clipped-ratio family (core.clipped) counts what a clip at C changes and what it leaves unseen (ρ < 1/C).
RHO_CLIP = 2.0


@dataclass(frozen=True)
class Figure:
    key: str  # the code's and the store's name; a gate spec's key
    name: str  # shown to people, in every view
    meaning: str  # one line: what it measures
    higher_is_worse: bool = True  # False: larger is better (share identical, Pearson r)
    kind: str = "number"  # "number" (3 significant digits), "share" (a percentage), "index" (a token index)
    unit: str = ""  # "nats", "" (a ratio or a share)
    family: str = "tokens"  # "sequences" and "tokens" (the logprob gap), "sampling" (kept mass and support),
    # "routing" (mixture-of-experts routes), "distribution" (the full next-token rows), "clipped" (a
    # replay's importance ratio as the trainer clips it)

    def format(self, x: float | None, missing: str = "–") -> str:
        """The value as every view prints it."""
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return missing
        if self.kind == "share":
            return f"{100 * x:.0f}%"
        if self.kind == "index":
            return str(int(x)) if float(x).is_integer() else f"{x:g}"
        if self.key == "pearson":
            return format(x + 0.0, ".7g")  # r near 1 differs in its later digits
        return format(x + 0.0, ".3g")  # + 0.0: no "-0"


def _band_key(lo: float, hi: float) -> str:
    return f"outside_{lo:g}_{hi:g}"


_ALL: list[Figure] = [
    # -- sequences
    Figure(
        "share_identical",
        "prompts identical",
        "share of prompts whose tokens equal the reference's",
        higher_is_worse=False,
        kind="share",
    ),
    Figure(
        "identical_wilson_lower",
        "prompts identical, 95% lower bound",
        "one-sided 95% Wilson lower bound of the share identical (vLLM's accuracy gate's bound)",
        higher_is_worse=False,
        kind="share",
    ),
    Figure(
        "not_identical",
        "prompts not identical",
        "share of prompts whose tokens leave the reference's (judged by 95% Wilson intervals)",
        kind="share",
    ),
    Figure(
        "median_first_divergence",
        "median first divergence",
        "generated-token index where the median diverged prompt first left the reference "
        "(the lower median: a real index)",
        higher_is_worse=False,
        kind="index",
    ),
    # -- tokens: the logprob gap
    Figure("abs_dlogp_mean", "|Δlogprob| mean", "mean |logp_side − logp_ref| over every compared token", unit="nats"),
    Figure("abs_dlogp_p50", "|Δlogprob| median", "median |logp_side − logp_ref|", unit="nats"),
    Figure("abs_dlogp_p95", "|Δlogprob| p95", "95th percentile of |logp_side − logp_ref|", unit="nats"),
    Figure("abs_dlogp_p99", "|Δlogprob| p99", "99th percentile of |logp_side − logp_ref|", unit="nats"),
    Figure("abs_dlogp_max", "|Δlogprob| max", "largest |logp_side − logp_ref|", unit="nats"),
    Figure("abs_dprob_mean", "|Δprob| mean", "mean |p_side − p_ref| of the chosen tokens"),
    Figure("abs_dprob_max", "|Δprob| max", "largest |p_side − p_ref| of a chosen token"),
    # -- tokens: the two KL estimators (see the module docstring)
    Figure(
        "k1",
        "mean log-ratio (k1)",
        "mean(logp_side − logp_ref): the k1 estimator of KL(side‖ref); unbiased but can be negative, "
        "so it is not called KL",
        unit="nats",
    ),
    Figure("abs_kl", "|mean log-ratio (k1)|", "|mean(logp_side − logp_ref)|, the k1 estimator's size", unit="nats"),
    Figure(
        "k3",
        "KL(side‖ref), k3 estimate",
        "mean(ρ − log ρ − 1) over the side's tokens: the k3 estimator of KL(side‖ref), never negative",
        unit="nats",
    ),
    Figure(
        "pearson",
        "Pearson r of probabilities",
        "Pearson correlation of the two sides' token probabilities",
        higher_is_worse=False,
    ),
    Figure("one_minus_pearson", "1 − Pearson r", "1 − the Pearson r of the two sides' token probabilities"),
    Figure(
        "token_mult_prob_error",
        "mult. prob. error",
        "mean(exp(|Δlogprob|)), NeMo-RL's token_mult_prob_error; 1 = the sides agree",
    ),
    Figure("token_mult_prob_error_minus_1", "mult. prob. error − 1", "mean(exp(|Δlogprob|)) − 1; 0 = the sides agree"),
    # -- the importance ratio
    Figure("rho_min", "ratio ρ min", f"the smallest {RHO}", higher_is_worse=False),
    Figure("rho_mean", "ratio ρ mean", f"the mean of {RHO}", higher_is_worse=False),
    Figure("rho_max", "ratio ρ max", f"the largest {RHO}"),
    *(
        Figure(
            _band_key(lo, hi),
            f"ρ outside [{lo:g}, {hi:g}]",
            f"share of tokens whose ratio ρ = p_ref / p_side is outside [{lo:g}, {hi:g}]",
            kind="share",
        )
        for lo, hi in RHO_BANDS
    ),
    Figure(
        "extreme_share",
        "|Δlogprob| > ln 2",
        "share of tokens whose |logp_side − logp_ref| exceeds ln 2 (ρ beyond ½ or 2: AReaL's extreme fraction)",
        kind="share",
    ),
    # -- routing (mixture-of-experts, routes=true): over (token, layer) cells compared, up to each fork
    Figure(
        "route_same_set",
        "routes identical",
        "share of (token, layer) routes where both sides chose the same experts",
        higher_is_worse=False,
        kind="share",
        family="routing",
    ),
    Figure(
        "route_same_order",
        "routes identical, same slots",
        "share of (token, layer) routes with the same "
        "experts in the same slots (what a replay of ids, weights and order needs)",
        higher_is_worse=False,
        kind="share",
        family="routing",
    ),
    Figure(
        "route_overlap",
        "expert overlap@k",
        "mean share of the k experts both sides chose, over (token, layer)",
        higher_is_worse=False,
        kind="share",
        family="routing",
    ),
    Figure(
        "route_differ",
        "routes differing",
        "share of (token, layer) routes whose experts differ (1 − routes identical)",
        kind="share",
        family="routing",
    ),
    Figure(
        "route_tokens_any_differ",
        "tokens with routes differing",
        "share of tokens where at least one MoE layer chose other experts (R3's 94%)",
        kind="share",
        family="routing",
    ),
    Figure(
        "seq_abs_log_ratio_max",
        "largest sequence |log ρ|",
        "over prompts, the largest |mean(logp_ref − logp_side)|: how far one whole answer's geometric-mean ρ is from 1",
        unit="nats",
    ),
]

# -- the sampling family: kept mass and support of sampled tokens (core.kept_mass; reference = trainer,
# side = rollout reporting processed logprobs). Keys match KeptMass.figures().
NAIVE = "naive ρ = p_ref(raw, whole vocabulary) / p_side(processed, renormalised over its kept set)"
RENORM = "renormalised ρ = p_ref renormalised over the same kept set / p_side(processed)"
_SAMPLING: list[Figure] = [
    Figure(
        "kept_mass_mean",
        "kept mass S mean",
        "mean mass of the side's kept set under its own raw distribution (1 = nothing cut by top-p / top-k / min-p)",
        higher_is_worse=False,
        family="sampling",
    ),
    Figure(
        "kept_mass_min",
        "kept mass S min",
        "the smallest kept mass of a sampled token",
        higher_is_worse=False,
        family="sampling",
    ),
    Figure(
        "kept_mass_ref_mean",
        "reference kept mass S mean",
        "mean mass of the reference's kept set",
        higher_is_worse=False,
        family="sampling",
    ),
    Figure(
        "kept_size_mean",
        "kept set size mean",
        "mean number of tokens the side's sampled tokens were drawn from",
        higher_is_worse=False,
        family="sampling",
    ),
    Figure(
        "kept_sets_differ",
        "kept sets differ",
        "share of sampled tokens whose kept sets differ between the sides (a top-p / top-k boundary near-tie)",
        kind="share",
        family="sampling",
    ),
    Figure("naive_rho_mean", "naive ratio mean", f"mean of the {NAIVE}", higher_is_worse=False, family="sampling"),
    Figure(
        "renorm_rho_mean", "renormalised ratio mean", f"mean of the {RENORM}", higher_is_worse=False, family="sampling"
    ),
    Figure(
        "raw_minus_processed_mean",
        "raw − processed logprob mean",
        "mean of the side's raw minus processed logprob of its token (log S at temperature 1, <= 0: S the kept mass)",
        unit="nats",
        family="sampling",
    ),
    *(
        f
        for lo, hi in RHO_BANDS
        for f in (
            Figure(
                f"naive_outside_{lo:g}_{hi:g}",
                f"naive ratio outside [{lo:g}, {hi:g}]",
                f"share of sampled tokens whose {NAIVE} is outside [{lo:g}, {hi:g}]",
                kind="share",
                family="sampling",
            ),
            Figure(
                f"renorm_outside_{lo:g}_{hi:g}",
                f"renormalised ratio outside [{lo:g}, {hi:g}]",
                f"share of sampled tokens whose {RENORM} is outside [{lo:g}, {hi:g}]",
                kind="share",
                family="sampling",
            ),
        )
    ),
]
_ALL += _SAMPLING

# -- the clipped-ratio family: a replay pair's ρ = p_trainer / p_rollout as truncated importance sampling
# uses it (core.clipped). Keys match ClipStats.figures().
_CLIPPED: list[Figure] = [
    Figure(
        "rho_clipped_mean",
        "ratio ρ clipped, mean",
        f"mean of min(ρ, {RHO_CLIP:g}): the importance ratio as truncated importance sampling uses it",
        higher_is_worse=False,
        family="clipped",
    ),
    Figure(
        "rho_clipped_share",
        f"ρ > {RHO_CLIP:g} (clipped)",
        f"share of tokens whose ratio the clip at {RHO_CLIP:g} changed",
        kind="share",
        family="clipped",
    ),
    Figure(
        "rho_low_share",
        f"ρ < {1 / RHO_CLIP:g} (not clipped)",
        f"share of tokens whose ratio is below {1 / RHO_CLIP:g}: the gradient starvation a clip at "
        f"{RHO_CLIP:g} leaves unseen (TRL #5243, rllm #760)",
        kind="share",
        family="clipped",
    ),
]
_ALL += _CLIPPED

# -- the distribution family: the sides' FULL next-token rows compared per position (core.distribution;
# full_distribution=true), pooled as llama.cpp's --kl-divergence reports them. Keys match
# DistributionPool.figures().
_DIST_WHAT = {
    "kl": ("KL(ref‖side)", "Σ p_ref (log p_ref − log p_side) over the whole vocabulary, per position"),
    "kl_rev": ("KL(side‖ref)", "Σ p_side (log p_side − log p_ref) over the whole vocabulary, per position"),
    "tv": ("total variation", "½ Σ |p_ref − p_side| over the whole vocabulary, per position"),
}
_DISTRIBUTION: list[Figure] = [
    *(
        f
        for key, (name, what) in _DIST_WHAT.items()
        for f in (
            Figure(
                f"{key}_mean",
                f"{name} mean",
                f"mean of {what}",
                unit="" if key == "tv" else "nats",
                family="distribution",
            ),
            *(
                Figure(
                    f"{key}_p{q}",
                    f"{name} p{q}",
                    f"{q}th percentile of {what}",
                    unit="" if key == "tv" else "nats",
                    family="distribution",
                )
                for q in (90, 95, 99)
            ),
            Figure(
                f"{key}_max",
                f"{name} max",
                f"largest {what}",
                unit="" if key == "tv" else "nats",
                family="distribution",
            ),
        )
    ),
    Figure(
        "top1_agree",
        "top-1 agreement",
        "share of positions where both sides' most likely next token is the same",
        higher_is_worse=False,
        kind="share",
        family="distribution",
    ),
    Figure(
        "top1_differ",
        "top-1 disagreement",
        "share of positions where the sides' most likely next tokens differ",
        kind="share",
        family="distribution",
    ),
    Figure(
        "topk_contained",
        "top-k containment",
        "share of positions where the reference's most likely token is "
        "among the side's k most likely (k = the config's logprobs)",
        higher_is_worse=False,
        kind="share",
        family="distribution",
    ),
]
_ALL += _DISTRIBUTION
FIGURES: dict[str, Figure] = {f.key: f for f in _ALL}
# Figure families: every family's keys in registration order, from each figure's `family` (the views,
# the gate and the pooled report list a family's figures together).
FAMILIES: dict[str, tuple[str, ...]] = {}
for _f in _ALL:
    FAMILIES[_f.family] = (*FAMILIES.get(_f.family, ()), _f.key)
assert len(FIGURES) == len(_ALL), "a figure key registered twice"


def family(name: str) -> list[Figure]:
    """The figures of one family, in registration order."""
    return [f for f in _ALL if f.family == name]


# The distribution family's table rows, as every view shows them.
DISTRIBUTION_ROWS: tuple[str, ...] = (
    "kl_mean",
    "kl_p90",
    "kl_p95",
    "kl_p99",
    "kl_max",
    "kl_rev_mean",
    "kl_rev_p99",
    "kl_rev_max",
    "tv_mean",
    "tv_p99",
    "tv_max",
    "top1_agree",
    "topk_contained",
)

# The sampling family's table rows, as every view shows them (the [0.9, 1.1] band first: trl#7269's).
SAMPLING_ROWS: tuple[str, ...] = (
    "kept_mass_mean",
    "kept_mass_min",
    "kept_size_mean",
    "kept_sets_differ",
    "raw_minus_processed_mean",
    "naive_rho_mean",
    "renorm_rho_mean",
    "naive_outside_0.9_1.1",
    "renorm_outside_0.9_1.1",
)


def figure(key: str) -> Figure:
    """The registered figure; KeyError names the known keys."""
    try:
        return FIGURES[key]
    except KeyError:
        raise KeyError(f"unknown figure {key!r}; known: {', '.join(FIGURES)}") from None


def display_name(key: str) -> str:
    """The figure's name for people; an unregistered key is shown as it is."""
    f = FIGURES.get(key)
    return f.name if f is not None else key


# The figures table's rows, in order: (the TokenStats field, the floor check that judges it or None).
# Every view's table (CLI, app, report) is built from these; names and formats come from FIGURES.
TABLE_ROWS: tuple[tuple[str, str | None], ...] = (
    ("abs_dlogp_mean", "abs_dlogp_mean"),
    ("abs_dlogp_p50", "abs_dlogp_p50"),
    ("abs_dlogp_p95", "abs_dlogp_p95"),
    ("abs_dlogp_p99", "abs_dlogp_p99"),
    ("abs_dlogp_max", "abs_dlogp_max"),
    ("abs_dprob_mean", "abs_dprob_mean"),
    ("abs_dprob_max", "abs_dprob_max"),
    ("k3", "k3"),
    ("k1", "abs_kl"),
    ("pearson", "one_minus_pearson"),
    ("token_mult_prob_error", "token_mult_prob_error_minus_1"),
    ("rho_min", None),
    ("rho_mean", None),
    ("rho_max", None),
    ("extreme_share", None),
)
# As (display name, TokenStats field): what render.workload and the CLI screen read.
FIGURE_ROWS: tuple[tuple[str, str], ...] = tuple((FIGURES[k].name, k) for k, _ in TABLE_ROWS)
CHECK_OF_ROW: dict[str, str] = {k: c for k, c in TABLE_ROWS if c is not None}
BAND_KEYS: tuple[str, ...] = tuple(_band_key(lo, hi) for lo, hi in RHO_BANDS)

# What a reader needs to read the table: shown under it in the CLI, the app and the report.
LEGEND: tuple[str, ...] = (
    RHO + ".",
    "KL(side‖ref), k3 estimate = mean(ρ − log ρ − 1): never negative. Mean log-ratio (k1) = "
    "mean(logp_side − logp_ref): the other KL estimator, unbiased but it can be negative.",
    "A factor is the side's figure over the floor's (the reference against itself); its 95% interval "
    "comes from resampling the prompts (a seeded bootstrap).",
)


def count(n: int, word: str, plural: str | None = None) -> str:
    """'1 position', '2 positions'."""
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"
