"""Pooled parity statistics over a workload, and the verdict against the reference's noise floor.

One `PairSample` per (prompt, side) against the reference; an `Accumulator` takes them one at a
time (as they are read from the database) and `result()` gives a `WorkloadStats`:

- sequences: how many prompts are token-identical (with a 95% Wilson interval), where the others
  first diverge (a survival curve, medians), the explanations' verdicts, and the per-sequence
  geometric-mean importance ratio;
- tokens: the teacher-forced figures pooled over every (side, reference) logprob pair, with the
  field's definitions (TRL, verl, NeMo-RL; see the workloads design notes):
  dlogp = logp_side - logp_ref, rho = exp(logp_ref - logp_side) (reference = trainer),
  kl = mean(dlogp) (the k1 estimator of KL(side||ref) over the side's sampled tokens: it can be
  negative, so no view calls it KL; see core.figures), k3 = mean(rho - log rho - 1) >= 0,
  token_mult_prob_error = mean(exp(|dlogp|)), Pearson r of the two probability vectors, the share
  of rho outside [0.9, 1.1], [0.99, 1.01], [0.999, 1.002], rho min/mean/max before any clipping;
- the same token figures per position bucket (DEFAULT_BUCKETS: [0,16) [16,64) [64,256) [256,inf):
  the first tokens, where a batch-variant prefill shows; a short answer; a long one; the tail where
  drift accumulates);
- the worst prompts, by first divergence and by largest |dlogp|.

`compare_to_floor(side, floor)` judges a side's figures against the reference's own noise (the
reference against itself under a change that must not matter) and says by what factor each is
worse, with a 95% interval from a seeded bootstrap over prompts (`WorkloadStats.resamples`: each
floor figure recomputed on BOOTSTRAP_RESAMPLES resamples of the prompts, drawn in prompt order from
one seed, so a side and its floor measured on the same prompts resample the same prompts: a paired
bootstrap). A figure "exceeds" only when the excess holds in 97.5% of the resamples; a point factor
over the limit whose interval reaches it is "too few prompts to tell". Everything here is pure, deterministic and standard library only: the parent process never
imports numpy or torch. Exact quantiles (linear interpolation between order statistics, numpy's
default; core.stats holds them and the Wilson intervals) from values held in array('d'): 10,000 prompts x 128 tokens hold ~20 MB; pooling them
took ~3 s of CPU before the bootstrap and ~6 s with it on a busy 2-core machine (the test's timing).

The bands test rho itself, as TRL and maxtext do; crossscore.gap_stats's one-prompt
share_outside_band tests exp(side - ref), its reciprocal (the same for a symmetric gap, not at the
edges of an asymmetric band).

Positions where either logprob is None, not finite or masked (<= MASKED_LOGPROB: a logits processor
set it to -inf) are skipped and counted, as in crossscore.gap_stats.
"""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from itertools import islice, repeat
from operator import le, mul, neg, sub
from statistics import median, median_low
from typing import Any, TypeGuard, cast

from .figures import BAND_KEYS, RHO_BANDS, display_name
from .findings import MASKED_LOGPROB
from .measures import POOLED

# The exact statistics live in core.stats; the names imported "as" themselves lived here before and
# their callers import them from here still.
from .stats import ONE_SIDED_CONFIDENCE as ONE_SIDED_CONFIDENCE
from .stats import WILSON_Z as WILSON_Z
from .stats import WeightedRanks, abs_quantile, interval_quantile, weighted_quantile, wilson, wilson_lower
from .stats import quantile as quantile

# Position buckets: each value starts a bucket, the last one is open-ended.
DEFAULT_BUCKETS: tuple[int, ...] = (0, 16, 64, 256)
# RHO_BANDS (the importance-ratio bands: parity-ui's, then maxtext PR #5231's two) live in core.figures.
# The bootstrap over prompts: resamples per figure, its seed, the two-sided level of the interval,
# the largest number of token gaps a resample's quantiles walk (above it a systematic sample, every
# k-th gap), and the most units resampled (above it, that many fixed groups of prompts).
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_SEED = 20260331
BOOTSTRAP_ALPHA = 0.05
BOOTSTRAP_MAX_GAPS = 50_000
BOOTSTRAP_MAX_UNITS = 400
# Ratios saturate at e^600 (~3.8e260) rather than crossscore's e^700: a mean of 1.28M saturated
# ratios must still sum to a finite float (fsum raises on overflow) and stay valid JSON.
EXP_CAP = 600.0
# |dlogp| above ln 2: the token's ratio is beyond 1/2 or 2 (AReaL's rollout_train_extreme_frac_tau2).
LN2 = math.log(2.0)
# A logprob a little above 0 is float rounding of log(1); far above 0 it is not a logprob at all.
LOGPROB_SLACK = 1e-3
# Gaps sorted at a time (_partial): the figures search sorted runs, so a bucket's gaps need not be
# one sorted array; one run's list of float objects is ~2 MiB.
SORT_RUN = 1 << 16


@dataclass
class PairSample:
    """One prompt's side against the reference. The three sequences are parallel (same length)."""

    prompt_index: int
    identical: bool  # token-identical for the compared length
    first_divergence: int | None  # None when identical; also None in scored mode (not defined)
    length: int  # tokens the side generated (compared)
    verdict: str | None  # parity_ui.analysis.explain's verdict at the first divergence, if any
    logp_side: Sequence[float | None]  # the side's own logprob of each token it generated
    logp_ref: Sequence[float | None]  # the reference's logprob of the same tokens, same context
    positions: Sequence[int]  # generated-token index of each pair (for the position buckets)

    def max_abs_gap(self) -> float | None:
        """The largest |logp_side - logp_ref| over the pairs the figures pool (both scorable), else None.
        Where every pair is scorable (the usual case) found at C speed: the store's prompt table and a
        replay's worst tokens ask it of every row."""
        side, ref = self.logp_side, self.logp_ref
        if all_scorable(side) and all_scorable(ref):
            return max(map(abs, map(sub, side, ref)), default=None)
        gaps = [abs(a - b) for a, b in zip(side, ref) if scorable(a) and scorable(b)]
        return max(gaps) if gaps else None


@dataclass
class Wilson:
    """A 95% Wilson score interval for a share, and the one-sided 95% lower bound (z = 1.645)."""

    low: float
    high: float
    lower_one_sided: float


@dataclass
class Survival:
    """S(k) = share of prompts whose first divergence is > k, as a step function: S(k) = 1 for
    k < at[0], S(k) = share[i] for at[i] <= k < at[i+1]. Identical prompts never leave the curve
    (they count to the end), so its last value is the share identical. `n` counts the prompts with
    a defined first divergence: identical, or diverged at a known index (scored mode has none)."""

    n: int
    at: list[int]
    share: list[float]

    def value(self, k: int) -> float:
        i = bisect_right(self.at, k)
        return 1.0 if i == 0 else self.share[i - 1]


@dataclass
class RatioSummary:
    min: float | None
    median: float | None
    max: float | None


@dataclass
class SequenceStats:
    n: int  # samples (prompts)
    identical: int
    share_identical: float | None
    identical_ci: Wilson | None
    diverged: int  # not identical, first divergence known
    divergence_unknown: int  # not identical, no first divergence (scored mode)
    survival: Survival | None
    median_first_divergence: float | None  # over the diverged prompts (the lower median: an index)
    median_first_divergence_all: float | None  # identical prompts counted at their length (lower median)
    verdicts: dict[str, int]  # explanation verdict -> prompts (samples without one not counted)
    seq_ratio: RatioSummary  # per sequence exp(mean(logp_ref - logp_side)): the geometric mean rho
    without_pairs: int  # samples with no scorable logprob pair (no token figures, no seq ratio)


@dataclass
class BandShare:
    low: float
    high: float
    outside: float | None  # share of pairs with rho outside [low, high]


@dataclass
class TokenStats:
    """Pooled over every scorable (side, reference) logprob pair; None when there is none."""

    pairs: int
    skipped: int  # positions with a missing, non-finite or masked logprob on either side
    abs_dlogp_mean: float | None
    abs_dlogp_p50: float | None
    abs_dlogp_p95: float | None
    abs_dlogp_p99: float | None
    abs_dlogp_max: float | None
    abs_dprob_mean: float | None
    abs_dprob_max: float | None
    k1: float | None  # mean(logp_side - logp_ref): the k1 estimator of KL(side‖ref), can be negative
    k3: float | None  # mean(rho - log rho - 1), >= 0
    pearson: float | None  # of p_side and p_ref; None when either is constant
    token_mult_prob_error: float | None  # mean(exp(|dlogp|)); 1.0 = perfect
    rho_min: float | None
    rho_mean: float | None
    rho_max: float | None
    outside: list[BandShare]
    extreme_share: float | None = None  # share of pairs with |dlogp| > ln 2 (None: stored before it)


@dataclass
class BucketStats:
    start: int
    end: int | None  # exclusive; None: open-ended
    tokens: TokenStats


@dataclass
class WorstPrompt:
    prompt_index: int
    first_divergence: int | None
    max_abs_dlogp: float | None


@dataclass
class WorkloadStats:
    sequences: SequenceStats
    tokens: TokenStats
    by_position: list[BucketStats]
    worst_by_divergence: list[WorstPrompt]  # earliest first divergence first
    worst_by_gap: list[WorstPrompt]  # largest max |dlogp| first (prompts with a nonzero gap)
    # Each floor figure (FLOOR_FIGURE_NAMES) on BOOTSTRAP_RESAMPLES resamples of the prompts (None:
    # undefined in that resample); None with fewer than 2 prompts, or stored before intervals.
    resamples: dict[str, list[float | None]] | None = None
    # Each pooled measure's family of figures, by its key (core.measures POOLED; absent: not recorded):
    # "routing" (MoE, routes=true: over the (token, layer) cells compared, plus "cells" and "tokens"),
    # "distribution" (full_distribution=true: over the positions both sides' full rows met, plus "positions"),
    # "sampling" (shared-seed draws: over the tokens both sides drew, plus "tokens"). Stored flat, each
    # under its key beside the token figures (every key, null when absent), as before measures had a seam.
    families: dict[str, dict[str, Any]] = field(default_factory=dict)

    def family(self, key: str) -> dict[str, Any] | None:
        """A measure's pooled figures (core.measures POOLED), None where not recorded."""
        return self.families.get(key)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every float is finite (ratios saturate at e^EXP_CAP). The token figures' k1 is also
        written as `kl`, its name before schema 3 (an alias for one schema version)."""
        out = asdict(self)
        for t in [out["tokens"], *(b["tokens"] for b in out["by_position"])]:
            t["kl"] = t["k1"]
        out.pop("families")
        out.update({key: self.families.get(key) for key in POOLED})
        out.update({k: v for k, v in self.families.items() if k not in POOLED})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadStats:
        s = d["sequences"]
        seq = SequenceStats(
            **{
                **s,
                "identical_ci": Wilson(**s["identical_ci"]) if s["identical_ci"] else None,
                "survival": Survival(**s["survival"]) if s["survival"] else None,
                "seq_ratio": RatioSummary(**s["seq_ratio"]),
                "verdicts": dict(s["verdicts"]),
            }
        )
        return cls(
            sequences=seq,
            tokens=_tokens_from_dict(d["tokens"]),
            by_position=[
                BucketStats(start=b["start"], end=b["end"], tokens=_tokens_from_dict(b["tokens"]))
                for b in d["by_position"]
            ],
            worst_by_divergence=[WorstPrompt(**w) for w in d["worst_by_divergence"]],
            worst_by_gap=[WorstPrompt(**w) for w in d["worst_by_gap"]],
            resamples={k: list(v) for k, v in d["resamples"].items()} if d.get("resamples") else None,
            families={key: dict(d[key]) for key in POOLED if d.get(key)},
        )


def _tokens_from_dict(t: Mapping[str, Any]) -> TokenStats:
    """The token figures from JSON: k1 stored before schema 3 as `kl` (read either way)."""
    got = {k: v for k, v in t.items() if k != "kl"}
    got.setdefault("k1", t.get("kl"))
    return TokenStats(**{**got, "outside": [BandShare(**b) for b in t["outside"]]})


# ---------------------------------------------------------------------------------------------
# Small exact helpers (the statistics themselves are core.stats')


def routing_against_floor(side: Mapping[str, Any] | None, floor: Mapping[str, Any] | None) -> str | None:
    """The routing family judged against the floor: the side's share of (token, layer) routes differing
    against the floor's, by their 95% Wilson intervals over the cells; None without both."""
    if not side or not floor or not side.get("cells") or not floor.get("cells"):
        return None
    ks, ns = round(side["route_differ"] * side["cells"]), int(side["cells"])
    kf, nf = round(floor["route_differ"] * floor["cells"]), int(floor["cells"])
    (lo_s, hi_s), (lo_f, hi_f) = wilson(ks, ns), wilson(kf, nf)
    where = "above the floor" if lo_s > hi_f else ("below the floor" if hi_s < lo_f else "within the floor")
    return (
        f"routes differing {100 * ks / ns:.1f}% [{100 * lo_s:.1f}-{100 * hi_s:.1f}%] of {ns:,} (token, layer) "
        f"routes, the floor's {100 * kf / nf:.1f}% [{100 * lo_f:.1f}-{100 * hi_f:.1f}%]: {where}"
    )


def wilson_interval(k: int, n: int) -> Wilson:
    low, high = wilson(k, n)
    return Wilson(low=low, high=high, lower_one_sided=wilson_lower(k, n))


def _exp(x: float) -> float:
    return math.exp(min(x, EXP_CAP))


def scorable(x: float | None) -> TypeGuard[float]:
    """A logprob the figures pool: present, finite and not masked (MASKED_LOGPROB)."""
    return x is not None and math.isfinite(x) and x > MASKED_LOGPROB


def all_scorable(xs: Sequence[float | None]) -> TypeGuard[Sequence[float]]:
    """Every logprob present, finite and not masked (scorable, each), checked at C speed."""
    if None in xs:
        return False
    vals = cast("Sequence[float]", xs)  # no None: checked just above
    return all(map(math.isfinite, vals)) and (not len(vals) or min(vals) > MASKED_LOGPROB)


# ---------------------------------------------------------------------------------------------
# Accumulation


class Accumulator:
    """Pools one side's samples against the reference, fed one at a time: `add(sample)`, then
    `result()`. Holds only the scorable logprob pairs (two array('d') per position bucket) and a
    few numbers per sample, so the caller can stream samples from the database. The result does
    not depend on the order samples were added."""

    def __init__(self, buckets: Sequence[int] = DEFAULT_BUCKETS):
        edges = tuple(buckets)
        if (
            not edges
            or edges[0] != 0
            or any(b <= a for a, b in zip(edges, edges[1:]))
            or not all(isinstance(e, int) for e in edges)
        ):
            raise ValueError(
                f"buckets must be increasing integers starting at 0 (each starts a bucket), got {list(edges)}"
            )
        self.buckets = edges
        self._ls = [array("d") for _ in edges]
        self._lr = [array("d") for _ in edges]
        self._skipped = [0] * len(edges)
        self._seen: set[int] = set()
        # Per sample, in arrays rather than objects: 10,000 prompts stay a few hundred kB.
        self._index = array("q")
        self._identical = array("b")
        self._first = array("q")  # -1: none
        self._length = array("q")
        self._max_abs = array("d")  # nan: no pairs
        self._log_ratio = array("d")  # mean(logp_ref - logp_side); nan: no pairs
        self._verdicts: Counter[str] = Counter()
        # Per sample, the additive pieces of its token figures (the bootstrap's units), and per
        # pooled pair the sample's slot (parallel to _ls/_lr) for the resampled quantiles.
        self._sums = [array("d") for _ in _SUMS]
        self._slot = [array("i") for _ in edges]  # 4 B a pair: a sample's slot

    def __len__(self) -> int:
        return len(self._index)

    def add(self, s: PairSample) -> None:
        """Take one sample. Raises ValueError naming the problem: parallel sequences of different
        lengths, a negative position, a logprob above 0, an identical sample with a first
        divergence, a negative index or length, or a prompt added twice (one Accumulator pools ONE
        side against the reference: use one per side)."""
        where = f"prompt {s.prompt_index}"
        if s.prompt_index < 0:
            raise ValueError(f"{where}: a prompt index is 0-based, not negative")
        if s.prompt_index in self._seen:
            raise ValueError(
                f"{where} was added twice; an Accumulator pools one side's samples, one "
                f"per prompt: use one Accumulator per side"
            )
        if s.length < 0:
            raise ValueError(f"{where}: length {s.length} is negative")
        if s.identical and s.first_divergence is not None:
            raise ValueError(f"{where}: identical, yet first_divergence={s.first_divergence}; pass None")
        if s.first_divergence is not None and s.first_divergence < 0:
            raise ValueError(f"{where}: first_divergence {s.first_divergence} is negative")
        ls, lr, pos = s.logp_side, s.logp_ref, s.positions
        if not len(ls) == len(lr) == len(pos):
            raise ValueError(
                f"{where}: logp_side, logp_ref and positions must be parallel, got lengths "
                f"{len(ls)}, {len(lr)}, {len(pos)}"
            )
        vs, vr, vp, skipped = self._scorable_pairs(where, ls, lr, pos)
        # Nothing is kept before every check passed: a refused sample leaves the accumulator as it was.
        self._pool(vs, vr, vp, len(self._index))
        for v, arr in zip(_prompt_sums(vs, vr), self._sums):
            arr.append(v)
        for b, k in skipped.items():
            self._skipped[b] += k
        self._seen.add(s.prompt_index)
        self._index.append(s.prompt_index)
        self._identical.append(1 if s.identical else 0)
        self._first.append(-1 if s.first_divergence is None else s.first_divergence)
        self._length.append(s.length)
        if len(vs):
            self._max_abs.append(max(map(abs, map(sub, vs, vr))))
            self._log_ratio.append(math.fsum(map(sub, vr, vs)) / len(vs))
        else:
            self._max_abs.append(math.nan)
            self._log_ratio.append(math.nan)
        if s.verdict is not None:
            self._verdicts[s.verdict] += 1

    def _scorable_pairs(
        self, where: str, ls: Sequence[float | None], lr: Sequence[float | None], pos: Sequence[int]
    ) -> tuple[Sequence[float], Sequence[float], Sequence[int], Counter[int]]:
        """The scorable pairs in ascending position order, and the skipped ones counted per bucket."""
        # Fast path (the common case): everything scorable and in order, checked at C speed.
        if all_scorable(ls) and all_scorable(lr) and all(map(le, pos, islice(pos, 1, None))):
            if len(pos) and pos[0] < 0:
                raise ValueError(f"{where}: position {pos[0]} is negative")
            if len(ls) and max(max(ls), max(lr)) > LOGPROB_SLACK:
                raise ValueError(
                    f"{where}: a logprob above 0 ({max(max(ls), max(lr))}) is not a log-probability; "
                    f"pass the log-softmax value of the chosen token"
                )
            return ls, lr, pos, Counter()
        kept: list[tuple[int, float, float]] = []
        skipped: Counter[int] = Counter()
        for a, b, p in zip(ls, lr, pos):
            if p < 0:
                raise ValueError(f"{where}: position {p} is negative")
            if not (scorable(a) and scorable(b)):
                skipped[bisect_right(self.buckets, p) - 1] += 1
                continue
            if a > LOGPROB_SLACK or b > LOGPROB_SLACK:
                raise ValueError(
                    f"{where}: a logprob above 0 ({max(a, b)}) is not a "
                    f"log-probability; pass the log-softmax value of the chosen token"
                )
            kept.append((p, a, b))
        kept.sort(key=lambda t: t[0])
        return [t[1] for t in kept], [t[2] for t in kept], [t[0] for t in kept], skipped

    def _pool(self, ls: Sequence[float], lr: Sequence[float], pos: Sequence[int], slot: int) -> None:
        edges = self.buckets
        for b in range(len(edges)):
            lo = bisect_left(pos, edges[b])
            hi = bisect_left(pos, edges[b + 1]) if b + 1 < len(edges) else len(pos)
            if hi > lo:
                self._ls[b].extend(islice(ls, lo, hi))
                self._lr[b].extend(islice(lr, lo, hi))
                self._slot[b].extend(repeat(slot, hi - lo))

    def result(self, top_n: int = 10) -> WorkloadStats:
        """The pooled figures so far (the accumulator stays usable). `top_n` prompts per worst list."""
        if top_n < 0:
            raise ValueError(f"top_n must be >= 0, got {top_n}")
        parts = [_partial(self._ls[b], self._lr[b], self._skipped[b]) for b in range(len(self.buckets))]
        ends = [*self.buckets[1:], None]
        by_position = [
            BucketStats(start=start, end=end, tokens=_figures([part]))
            for start, end, part in zip(self.buckets, ends, parts)
        ]
        by_first, by_gap = self._worst(top_n)
        return WorkloadStats(
            sequences=self._sequence_stats(),
            tokens=_figures(parts),
            by_position=by_position,
            worst_by_divergence=by_first,
            worst_by_gap=by_gap,
            resamples=self._resamples(),
        )

    def _resamples(self, n_resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, list[float | None]] | None:
        """Every floor figure on `n_resamples` bootstrap resamples of the samples (prompts), each
        figure recomputed from the resampled prompts' additive pieces (the quantiles from their
        pooled gaps, weighted by how often each prompt was drawn). The draws are made over the
        prompts in index order from BOOTSTRAP_SEED: the same prompts give the same draws, whatever
        order they were added in, and a side and its floor over the same prompts are resampled
        together (a paired bootstrap). Over BOOTSTRAP_MAX_UNITS prompts the units are that many
        fixed groups of prompts (every G-th in index order): the same variance, at a cost that does
        not grow with the prompts. None below 2 prompts (nothing to resample)."""
        n = len(self._index)
        if n < 2:
            return None
        order = sorted(range(n), key=self._index.__getitem__)
        units = min(n, BOOTSTRAP_MAX_UNITS)
        unit_of = [0] * n
        for k, slot in enumerate(order):
            unit_of[slot] = k % units
        sums: dict[str, list[float]] = {}
        for name, arr in zip(_SUMS, self._sums):
            acc = [0.0] * units
            pick = max if name.startswith("max") else float.__add__
            for slot, v in enumerate(arr):
                u = unit_of[slot]
                acc[u] = pick(acc[u], v)
            sums[name] = acc
        seq_lr: list[float | None] = [None] * units
        for slot, r in enumerate(self._log_ratio):
            if not math.isnan(r):
                v = min(r, EXP_CAP) if r > 0 else min(-r, _LOG_TINY)
                u = unit_of[slot]
                held = seq_lr[u]
                seq_lr[u] = v if held is None else max(held, v)
        # The pooled |dlogp| (every k-th above BOOTSTRAP_MAX_GAPS: a systematic sample), ascending,
        # with each one's unit.
        total = sum(map(len, self._ls))
        step = max(1, -(-total // BOOTSTRAP_MAX_GAPS))
        # Every step-th pair over the buckets in order, as strided slices of each bucket's arrays
        # (C speed: a walk over every pooled pair cost ~0.1 us a pair at the end of a long run).
        ls, lr, sl, offset = array("d"), array("d"), array("i"), 0
        for b in range(len(self._ls)):
            first = -offset % step
            ls.extend(self._ls[b][first::step])
            lr.extend(self._lr[b][first::step])
            sl.extend(self._slot[b][first::step])
            offset += len(self._ls[b])
        pairs = sorted(zip(map(abs, map(sub, ls, lr)), map(unit_of.__getitem__, sl)))
        sorted_gaps = [g for g, _ in pairs]
        ranks = WeightedRanks([u for _, u in pairs], units)
        rng = random.Random(BOOTSTRAP_SEED)
        out: dict[str, list[float | None]] = {name: [] for name in FLOOR_FIGURE_NAMES}
        draw = range(units)
        for _ in range(n_resamples):
            picks = rng.choices(draw, k=units)
            drawn, half = Counter(picks), Counter(picks[: (units + 1) // 2])
            w = list(map(drawn.get, draw, repeat(0)))
            w_half = list(map(half.get, draw, repeat(0)))
            for name, fig in _resampled_figures(w, w_half, sums, sorted_gaps, ranks, seq_lr).items():
                out[name].append(None if fig is None else float(f"{fig:.6g}"))
        return out

    def _sequence_stats(self) -> SequenceStats:
        n = len(self._index)
        identical = sum(self._identical)
        firsts = sorted(f for f, same in zip(self._first, self._identical) if not same and f >= 0)
        unknown = n - identical - len(firsts)
        known = identical + len(firsts)
        survival = None
        if known:
            counts = Counter(firsts)
            at, share, left = [], [], known
            for k in sorted(counts):
                left -= counts[k]
                at.append(k)
                share.append(left / known)
            survival = Survival(n=known, at=at, share=share)
        lengths_identical = [ln for ln, same in zip(self._length, self._identical) if same]
        ratios = sorted(_exp(r) for r in self._log_ratio if not math.isnan(r))
        return SequenceStats(
            n=n,
            identical=identical,
            share_identical=identical / n if n else None,
            identical_ci=wilson_interval(identical, n) if n else None,
            diverged=len(firsts),
            divergence_unknown=unknown,
            survival=survival,
            # The lower median: a token index a prompt really forked at, never "token 0.5".
            median_first_divergence=float(median_low(firsts)) if firsts else None,
            median_first_divergence_all=float(median_low(firsts + lengths_identical)) if known else None,
            verdicts=dict(sorted(self._verdicts.items())),
            seq_ratio=RatioSummary(min=ratios[0], median=float(median(ratios)), max=ratios[-1])
            if ratios
            else RatioSummary(None, None, None),
            without_pairs=sum(1 for r in self._log_ratio if math.isnan(r)),
        )

    def _worst(self, top_n: int) -> tuple[list[WorstPrompt], list[WorstPrompt]]:
        """The `top_n` prompts that diverged earliest, and those with the largest max |dlogp|."""
        rows = [
            WorstPrompt(
                prompt_index=i, first_divergence=None if f < 0 else f, max_abs_dlogp=None if math.isnan(m) else m
            )
            for i, f, m in zip(self._index, self._first, self._max_abs)
        ]
        by_first = sorted(
            (w for w in rows if w.first_divergence is not None), key=lambda w: (w.first_divergence, w.prompt_index)
        )
        # `or 0.0` never applies (the filter keeps a nonzero gap): it tells the type checker so.
        by_gap = sorted((w for w in rows if w.max_abs_dlogp), key=lambda w: (-(w.max_abs_dlogp or 0.0), w.prompt_index))
        return by_first[:top_n], by_gap[:top_n]


def workload_stats(
    samples: Iterable[PairSample], *, buckets: Sequence[int] = DEFAULT_BUCKETS, top_n: int = 10
) -> WorkloadStats:
    """All at once: an Accumulator fed every sample. Raises like Accumulator.add."""
    acc = Accumulator(buckets)
    for s in samples:
        acc.add(s)
    return acc.result(top_n)


def token_stats(ls: Sequence[float], lr: Sequence[float], skipped: int = 0) -> TokenStats:
    """The token figures of parallel scorable logprobs (side, reference). Pure."""
    return _figures([_partial(ls, lr, skipped)])


# -- the bootstrap's per-prompt pieces

# Per sample (prompt): its pairs, the sums its token figures add up from, its largest gaps, its
# probabilities' raw moments (Pearson) and, per band, its pairs with rho outside it.
_SUMS: tuple[str, ...] = (
    "n",
    "abs_d",
    "d",
    "em1",
    "log_rho",
    "exp_abs",
    "dp",
    "max_abs",
    "max_dp",
    "x",
    "y",
    "xx",
    "yy",
    "xy",
    *(f"out{i}" for i in range(len(RHO_BANDS))),
)
# |log| of the smallest positive float: an underflowed sequence ratio reads as a ~744-nat drift.
_LOG_TINY = -math.log(5e-324)


def _prompt_sums(ls: Sequence[float], lr: Sequence[float]) -> tuple[float, ...]:
    """One sample's _SUMS (all 0 without a scorable pair): plain sums of at most a sample's tokens."""
    if not len(ls):
        return (0.0,) * len(_SUMS)
    exp = math.exp
    d = sorted(map(sub, ls, lr))
    log_rho = list(map(min, map(neg, d), repeat(EXP_CAP)))
    px, py = list(map(exp, ls)), list(map(exp, lr))
    dp = list(map(abs, map(sub, px, py)))
    out = []
    for lo, hi in RHO_BANDS:
        # rho = exp(-d) < lo  <=>  d > -log(lo);  rho > hi  <=>  d < -log(hi)
        out.append(float(len(d) - bisect_right(d, -math.log(lo)) + bisect_left(d, -math.log(hi))))
    return (
        float(len(d)),
        sum(map(abs, d)),
        sum(d),
        sum(map(math.expm1, log_rho)),
        sum(log_rho),
        sum(map(exp, map(min, map(abs, d), repeat(EXP_CAP)))),
        sum(dp),
        max(-d[0], d[-1]),
        max(dp),
        sum(px),
        sum(py),
        sum(map(mul, px, px)),
        sum(map(mul, py, py)),
        sum(map(mul, px, py)),
        *out,
    )


def _resampled_figures(
    w: list[int],
    w_half: list[int],
    sums: Mapping[str, Sequence[float]],
    sorted_gaps: Sequence[float],
    ranks: WeightedRanks,
    seq_lr: Sequence[float | None],
) -> dict[str, float | None]:
    """The floor figures of one resample: each unit counted w[unit] times. A largest value (the
    MAX_FIGURES) is taken over half as many draws (w_half, an m-out-of-n bootstrap): resampling all
    n, the maximum is the sample's own maximum in 63% of resamples and its interval is too narrow
    to tell one extreme prompt from a real excess."""

    def tot(name: str) -> float:
        return sum(map(mul, w, sums[name]))

    n = tot("n")
    few = [i for i, k in enumerate(w_half) if k]
    lrs = [r for i in few if (r := seq_lr[i]) is not None]
    out: dict[str, float | None] = {name: None for name in FLOOR_FIGURE_NAMES}
    out["seq_abs_log_ratio_max"] = max(lrs) if lrs else None
    if not n:
        return out
    total = ranks.weigh(w)
    if total:
        for name, q in (("abs_dlogp_p50", 0.50), ("abs_dlogp_p95", 0.95), ("abs_dlogp_p99", 0.99)):
            out[name] = weighted_quantile(sorted_gaps, ranks, total, q)
    has = [i for i in few if sums["n"][i]]
    out["abs_dlogp_mean"] = tot("abs_d") / n
    out["abs_dlogp_max"] = max((sums["max_abs"][i] for i in has), default=None)
    out["abs_dprob_mean"] = tot("dp") / n
    out["abs_dprob_max"] = max((sums["max_dp"][i] for i in has), default=None)
    out["abs_kl"] = abs(tot("d") / n)
    out["k3"] = max(0.0, (tot("em1") - tot("log_rho")) / n)
    out["token_mult_prob_error_minus_1"] = tot("exp_abs") / n - 1.0
    sx, sy = tot("x"), tot("y")
    sxx, syy, sxy = tot("xx") - sx * sx / n, tot("yy") - sy * sy / n, tot("xy") - sx * sy / n
    if sxx > 0.0 and syy > 0.0:
        out["one_minus_pearson"] = 1.0 - max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))
    for i, key in enumerate(BAND_KEYS):
        out[key] = tot(f"out{i}") / n
    return out


@dataclass
class _Partial:
    """The additive pieces of one bucket's token figures: a bucket's figures are made from its own
    partial, the pooled ones from all buckets' (sums add, sorted gaps are searched together), so
    each value is touched by the per-token passes once."""

    n: int
    skipped: int
    sorted_runs: list[array]  # dlogp = logp_side - logp_ref in runs of SORT_RUN, each ascending
    sum_d: float
    sum_abs_d: float
    sum_expm1_log_rho: float  # sum(rho - 1), rho capped at e^EXP_CAP
    sum_log_rho: float
    sum_exp_abs_d: float
    sum_dp: float
    max_dp: float
    # Pearson's pieces: the probabilities' means, centred sums of squares and cross products
    # (two-pass, so a correlation near 1 does not cancel away), and their ranges (a constant vector
    # has no correlation, whatever rounding leaves in its centred sums).
    mean_x: float  # p_side
    mean_y: float  # p_ref
    sxx: float
    syy: float
    sxy: float
    x_range: tuple[float, float]
    y_range: tuple[float, float]


def _partial(ls: Sequence[float], lr: Sequence[float], skipped: int) -> _Partial:
    """A few C-speed passes (map over math functions, fsum for every sum) and a sort in runs.

    Memory: beside the pooled pairs, only the two probability vectors (8 B a pair each, made once:
    exp is the costly pass) and the sorted gaps (8 B a pair) are held; every other per-pair value
    (the gap, log rho, |dprob|, the centred probabilities) is a fresh map over them for each sum
    that needs it. The sort goes SORT_RUN gaps at a time, so its list of float objects (~32 B a
    pair) never holds more than one run. Holding them all as arrays (and sorting the whole bucket
    at once) made 10,000 rows x 2,000 tokens need ~125 B a pair at the end of a replay. The sums
    are the same fsums over the same values in the same order: the figures are bit-identical."""
    fsum, exp = math.fsum, math.exp
    n = len(ls)

    def d() -> Iterator[float]:
        return map(sub, ls, lr)

    def log_rho() -> Iterator[float]:
        return map(min, map(neg, d()), repeat(EXP_CAP))

    sorted_runs = [
        array("d", sorted(map(sub, ls[lo : lo + SORT_RUN], lr[lo : lo + SORT_RUN]))) for lo in range(0, n, SORT_RUN)
    ]
    p_side = array("d", map(exp, ls))
    p_ref = array("d", map(exp, lr))

    def dp() -> Iterator[float]:
        return map(abs, map(sub, p_side, p_ref))

    mx, my = (fsum(p_side) / n, fsum(p_ref) / n) if n else (0.0, 0.0)

    def cx() -> Iterator[float]:
        return map(sub, p_side, repeat(mx))

    def cy() -> Iterator[float]:
        return map(sub, p_ref, repeat(my))

    return _Partial(
        n=n,
        skipped=skipped,
        sorted_runs=sorted_runs,
        sum_d=fsum(d()),
        sum_abs_d=fsum(map(abs, d())),
        # rho - log rho - 1 summed as sum(expm1(log rho)) - sum(log rho): expm1 keeps each small gap's
        # ~dlogp^2/2 instead of losing it to 1 + tiny.
        sum_expm1_log_rho=fsum(map(math.expm1, log_rho())),
        sum_log_rho=fsum(log_rho()),
        sum_exp_abs_d=fsum(map(exp, map(min, map(abs, d()), repeat(EXP_CAP)))),
        sum_dp=fsum(dp()),
        max_dp=max(dp(), default=0.0),
        mean_x=mx,
        mean_y=my,
        sxx=fsum(map(mul, cx(), cx())),
        syy=fsum(map(mul, cy(), cy())),
        sxy=fsum(map(mul, cx(), cy())),
        x_range=(min(p_side, default=0.0), max(p_side, default=0.0)),
        y_range=(min(p_ref, default=0.0), max(p_ref, default=0.0)),
    )


def _figures(parts: list[_Partial]) -> TokenStats:
    """The token figures of the union of the partials' pairs."""
    fsum = math.fsum
    n, skipped = sum(p.n for p in parts), sum(p.skipped for p in parts)
    if n == 0:
        return TokenStats(
            pairs=0,
            skipped=skipped,
            abs_dlogp_mean=None,
            abs_dlogp_p50=None,
            abs_dlogp_p95=None,
            abs_dlogp_p99=None,
            abs_dlogp_max=None,
            abs_dprob_mean=None,
            abs_dprob_max=None,
            k1=None,
            k3=None,
            pearson=None,
            token_mult_prob_error=None,
            rho_min=None,
            rho_mean=None,
            rho_max=None,
            outside=[BandShare(lo, hi, None) for lo, hi in RHO_BANDS],
        )
    runs = [r for p in parts for r in p.sorted_runs]
    d_min, d_max = min(r[0] for r in runs), max(r[-1] for r in runs)
    s_em1 = fsum(p.sum_expm1_log_rho for p in parts)

    def total(name: str) -> float:
        return fsum(getattr(p, name) for p in parts)

    return TokenStats(
        pairs=n,
        skipped=skipped,
        abs_dlogp_mean=total("sum_abs_d") / n,
        abs_dlogp_p50=abs_quantile(runs, n, 0.50),
        abs_dlogp_p95=abs_quantile(runs, n, 0.95),
        abs_dlogp_p99=abs_quantile(runs, n, 0.99),
        abs_dlogp_max=max(-d_min, d_max) + 0.0,  # no -0.0
        abs_dprob_mean=total("sum_dp") / n,
        abs_dprob_max=max(p.max_dp for p in parts),
        k1=total("sum_d") / n,
        k3=max(0.0, (s_em1 - total("sum_log_rho")) / n),
        pearson=_pearson([p for p in parts if p.n], n),
        token_mult_prob_error=total("sum_exp_abs_d") / n,
        # rho = exp(-dlogp) falls as dlogp rises: the smallest ratio belongs to the largest gap.
        rho_min=_exp(-d_max),
        rho_mean=1.0 + s_em1 / n,
        rho_max=_exp(-d_min),
        outside=[BandShare(lo, hi, _count_outside(runs, lo, hi) / n) for lo, hi in RHO_BANDS],
        extreme_share=sum(len(r) - bisect_right(r, LN2) + bisect_left(r, -LN2) for r in runs) / n,
    )


def _count_outside(runs: list[array], lo: float, hi: float) -> int:
    """How many pairs have rho = exp(-dlogp) (saturating) outside [lo, hi], exactly as comparing
    each rho would say, found by bisection: rho is monotonic in dlogp."""
    count = 0
    for r in runs:
        count += len(r) - bisect_left(r, True, key=lambda x: _exp(-x) < lo)  # large gaps: rho < lo
        count += bisect_left(r, True, key=lambda x: _exp(-x) <= hi)  # negative gaps: rho > hi
    return count


def _pearson(parts: list[_Partial], n: int) -> float | None:
    """Pearson r of the union, from each partial's centred sums (Chan et al.'s pairwise update:
    a partial's sums about the pooled mean = its own + n_b * (its mean - the pooled mean)^2).
    None when either probability vector is constant."""
    fsum = math.fsum
    if any(
        min(getattr(p, r)[0] for p in parts) == max(getattr(p, r)[1] for p in parts) for r in ("x_range", "y_range")
    ):
        return None
    if len(parts) == 1:
        sxx, syy, sxy = parts[0].sxx, parts[0].syy, parts[0].sxy
    else:
        mx = fsum(p.n * p.mean_x for p in parts) / n
        my = fsum(p.n * p.mean_y for p in parts) / n
        sxx = fsum([*(p.sxx for p in parts), *(p.n * (p.mean_x - mx) ** 2 for p in parts)])
        syy = fsum([*(p.syy for p in parts), *(p.n * (p.mean_y - my) ** 2 for p in parts)])
        sxy = fsum([*(p.sxy for p in parts), *(p.n * (p.mean_x - mx) * (p.mean_y - my) for p in parts)])
    if sxx <= 0.0 or syy <= 0.0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


# ---------------------------------------------------------------------------------------------
# The noise floor

# Absolute differences below which a side is never "worse" than the floor, whatever the factor:
# over a floor of ~0 (a batch-invariant float32 reference) any rounding would otherwise be an
# infinite factor. Nats: exp(1e-4) is 1e-4 from 1, ten times inside the tightest band's edge
# ([0.999, 1.002]), so a gap this small moves no token across any band; float32 log-softmax
# rounding is ~1e-6..1e-5 nats. |dprob| <= |dlogp| for probabilities, so the same bound.
# k3 ~ dlogp^2 / 2 for small gaps, hence 5e-9. Shares of tokens: one in a thousand.
EPSILON_NATS = 1e-4
EPSILON_K3 = EPSILON_NATS**2 / 2
EPSILON_PEARSON = 1e-6
EPSILON_SHARE = 1e-3
# A side's figure may be this many times the floor's before it "exceeds noise": run-to-run spread
# of tail figures (p99, max) over a few hundred prompts is easily tens of percent, and the floor is
# itself one draw; 1.5 flags a clear excess without flagging the floor's own scatter.
DEFAULT_TOLERANCE = 1.5


def _opt(f, v):  # None-propagating
    return None if v is None else f(v)


def _seq_log_ratio_max(w: WorkloadStats) -> float | None:
    r = w.sequences.seq_ratio
    if r.min is None or r.max is None:
        return None
    # 5e-324: the smallest float, so an underflowed ratio reads as a ~744-nat drift, not log(0).
    return max(abs(math.log(max(r.min, 5e-324))), abs(math.log(max(r.max, 5e-324))))


def _band_figure(i: int):
    return lambda w: w.tokens.outside[i].outside


# Every figure is "larger is worse": (name, its value in a WorkloadStats, default epsilon, power).
# `power` is how the figure grows with the gap: k3 ~ dlogp^2/2 and 1 - r ~ var(dprob) are quadratic,
# so a gap 1.5x the floor's shows as 2.25x there; they exceed at tolerance ** power.
FLOOR_FIGURES: tuple[tuple[str, Any, float, int], ...] = (
    ("abs_dlogp_mean", lambda w: w.tokens.abs_dlogp_mean, EPSILON_NATS, 1),
    ("abs_dlogp_p50", lambda w: w.tokens.abs_dlogp_p50, EPSILON_NATS, 1),
    ("abs_dlogp_p95", lambda w: w.tokens.abs_dlogp_p95, EPSILON_NATS, 1),
    ("abs_dlogp_p99", lambda w: w.tokens.abs_dlogp_p99, EPSILON_NATS, 1),
    ("abs_dlogp_max", lambda w: w.tokens.abs_dlogp_max, EPSILON_NATS, 1),
    ("abs_dprob_mean", lambda w: w.tokens.abs_dprob_mean, EPSILON_NATS, 1),
    ("abs_dprob_max", lambda w: w.tokens.abs_dprob_max, EPSILON_NATS, 1),
    ("abs_kl", lambda w: _opt(abs, w.tokens.k1), EPSILON_NATS, 1),
    ("k3", lambda w: w.tokens.k3, EPSILON_K3, 2),
    (
        "token_mult_prob_error_minus_1",
        lambda w: _opt(lambda v: v - 1.0, w.tokens.token_mult_prob_error),
        EPSILON_NATS,
        1,
    ),
    ("one_minus_pearson", lambda w: _opt(lambda v: 1.0 - v, w.tokens.pearson), EPSILON_PEARSON, 2),
    *((f"outside_{lo:g}_{hi:g}", _band_figure(i), EPSILON_SHARE, 1) for i, (lo, hi) in enumerate(RHO_BANDS)),
    ("seq_abs_log_ratio_max", _seq_log_ratio_max, EPSILON_NATS, 1),
)
FLOOR_FIGURE_NAMES: tuple[str, ...] = tuple(f[0] for f in FLOOR_FIGURES)
# 1 - share identical is a proportion over n prompts: 16/100 against 10/100 is 1.6x, yet well within
# sampling noise. Its check is reported with its factor like the others, but the Wilson intervals
# decide it (see IdenticalCheck), not the factor.
NOT_IDENTICAL = "not_identical"


@dataclass
class FigureCheck:
    name: str  # its key (core.figures); every view shows core.figures.display_name(name)
    side: float | None
    floor: float | None
    factor: float | None  # side / floor; inf over a zero floor; None when both are 0 or either is missing
    limit: float  # the factor beyond which it exceeds: tolerance ** power
    epsilon: float
    exceeds: bool  # beyond the limit, and beyond sampling error (its interval clears the limit)
    floor_is_zero: bool
    note: str  # "within", "within (difference below epsilon)", "within (both zero)", "exceeds",
    #            "exceeds (floor is zero)", "too few prompts to tell", "not comparable";
    #            not_identical: "within (Wilson intervals overlap)", "exceeds (Wilson intervals apart)"
    # The factor's 95% interval over the prompts (paired bootstrap); None without resamples.
    factor_low: float | None = None
    factor_high: float | None = None
    uncertain: bool = False  # the point factor is over the limit, but its interval reaches it


@dataclass
class IdenticalCheck:
    """The share identical, each with its 95% Wilson interval; worse when the side's whole interval
    lies below the floor's (the difference is not sampling noise over this many prompts)."""

    side_share: float | None
    floor_share: float | None
    side_ci: Wilson | None
    floor_ci: Wilson | None
    worse: bool


WITHIN, EXCEEDS, TOO_FEW, NOT_COMPARABLE = "within noise", "exceeds noise", "too few prompts to tell", "not comparable"


@dataclass
class FloorVerdict:
    verdict: str  # WITHIN | EXCEEDS | TOO_FEW (over the limit, not beyond sampling error) | NOT_COMPARABLE
    tolerance: float
    figures: list[FigureCheck]
    exceeded: list[str]  # names of the figures that exceed (beyond sampling error)
    identical: IdenticalCheck
    summary: str
    uncertain: list[str] = field(default_factory=list)  # over the limit, but within sampling error
    prompts: int | None = None  # the side's prompts (what the interval is over)

    @property
    def zero_floor_only(self) -> bool:
        """Every figure that exceeds does so over a zero floor: the reference gave the same numbers bit
        for bit under the floor's change, so any difference at all exceeds it, however small."""
        exceeded = [c for c in self.figures if c.exceeds]
        return bool(exceeded) and all(c.floor_is_zero for c in exceeded)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: an infinite factor (over a zero floor) is written as None; floor_is_zero says so."""
        d = asdict(self)
        for f in d["figures"]:
            for k in ("factor", "factor_low", "factor_high"):
                if f[k] is not None and math.isinf(f[k]):
                    f[k] = None if k == "factor" else "inf"
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FloorVerdict:
        """The inverse of to_dict (an infinite factor comes back as inf where the floor was zero)."""

        def wilson(w: Mapping[str, Any] | None) -> Wilson | None:
            return Wilson(**w) if w else None

        names = {f.name for f in fields(FigureCheck)}
        figures = []
        for f in d["figures"]:
            f = {k: v for k, v in f.items() if k in names}
            if f["factor"] is None and f["floor_is_zero"] and f["side"]:
                f["factor"] = math.inf
            for k in ("factor_low", "factor_high"):
                if f.get(k) == "inf":
                    f[k] = math.inf
            figures.append(FigureCheck(**f))
        i = d["identical"]
        ident = IdenticalCheck(
            side_share=i["side_share"],
            floor_share=i["floor_share"],
            side_ci=wilson(i["side_ci"]),
            floor_ci=wilson(i["floor_ci"]),
            worse=i["worse"],
        )
        return cls(
            verdict=d["verdict"],
            tolerance=d["tolerance"],
            figures=figures,
            exceeded=list(d["exceeded"]),
            identical=ident,
            summary=d["summary"],
            uncertain=list(d.get("uncertain") or []),
            prompts=d.get("prompts"),
        )


def _ratio(side: float, floor: float) -> float:
    if floor == 0.0:
        return math.inf if side > 0 else 0.0
    return side / floor


def _bootstrap(
    check: FigureCheck, side: Sequence[float | None] | None, floor: Sequence[float | None] | None
) -> FigureCheck:
    """The factor's interval from paired resamples, and the excess kept only where it holds in
    1 - alpha/2 of them (over the limit and beyond epsilon): else "too few prompts to tell"."""
    if not side or not floor or len(side) != len(floor) or check.note == "not comparable":
        return check
    pairs = [(s, f) for s, f in zip(side, floor) if s is not None and f is not None]
    if len(pairs) < len(side) / 2:
        return check
    factors = sorted(_ratio(s, f) for s, f in pairs)
    check.factor_low = interval_quantile(factors, BOOTSTRAP_ALPHA / 2)
    check.factor_high = interval_quantile(factors, 1 - BOOTSTRAP_ALPHA / 2)
    if check.exceeds:
        held = sum(1 for s, f in pairs if _ratio(s, f) > check.limit and s - f > check.epsilon)
        if held < (1 - BOOTSTRAP_ALPHA / 2) * len(side):
            check.exceeds, check.uncertain, check.note = False, True, TOO_FEW
    return check


def _check(name: str, side: float | None, floor: float | None, eps: float, limit: float) -> FigureCheck:
    if side is None or floor is None:
        return FigureCheck(name, side, floor, None, limit, eps, False, floor == 0.0, "not comparable")
    zero = floor == 0.0
    factor = (math.inf if side > 0 else None) if zero else side / floor
    beyond = factor is not None and factor > limit
    if side - floor <= eps:
        note = (
            "within (both zero)" if zero and side == 0 else "within (difference below epsilon)" if beyond else "within"
        )
        return FigureCheck(name, side, floor, factor, limit, eps, False, zero, note)
    if beyond:
        return FigureCheck(
            name, side, floor, factor, limit, eps, True, zero, "exceeds (floor is zero)" if zero else "exceeds"
        )
    return FigureCheck(name, side, floor, factor, limit, eps, False, zero, "within")


def _identical_check(ident: IdenticalCheck, tolerance: float) -> FigureCheck:
    """1 - share identical, its factor for the record, decided by the Wilson intervals."""
    side = None if ident.side_share is None else 1.0 - ident.side_share
    floor = None if ident.floor_share is None else 1.0 - ident.floor_share
    check = _check(NOT_IDENTICAL, side, floor, 0.0, tolerance)
    if check.note != "not comparable":
        check.exceeds = ident.worse
        check.note = "exceeds (Wilson intervals apart)" if ident.worse else "within (Wilson intervals overlap)"
    return check


def compare_to_floor(
    side: WorkloadStats,
    floor: WorkloadStats,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    epsilon: Mapping[str, float] | None = None,
) -> FloorVerdict:
    """Judge a side's figures against the noise floor (the reference against itself under a change
    that must not matter). A figure exceeds when the side's value is more than `tolerance` times
    the floor's (tolerance squared for the quadratic k3 and 1 - r) AND more than its epsilon above
    it (over a zero floor: any value above epsilon, factor inf), AND, where both carry resamples
    (WorkloadStats.resamples), the excess holds in 97.5% of the paired bootstrap resamples: a point
    factor over the limit that does not is "too few prompts to tell" (its 95% interval reaches the
    limit). `not_identical` (1 - share identical) exceeds when the side's 95% Wilson interval of the
    share identical lies wholly below the floor's. Verdict "exceeds noise" when any figure exceeds,
    else "too few prompts to tell" when any is uncertain, "within noise" otherwise, "not comparable"
    when no figure is defined on both sides. `epsilon` overrides the defaults by figure name
    (FLOOR_FIGURE_NAMES).
    Pure. Raises ValueError for tolerance < 1, an unknown or negative epsilon."""
    if not tolerance >= 1.0:
        raise ValueError(f"tolerance is a factor >= 1 (1.5: up to 1.5x the floor is noise), got {tolerance}")
    eps = {name: e for name, _, e, _ in FLOOR_FIGURES}
    for name, e in (epsilon or {}).items():
        if name not in eps:
            raise ValueError(f"unknown figure {name!r} in epsilon; known: {', '.join(FLOOR_FIGURE_NAMES)}")
        if not e >= 0:
            raise ValueError(f"epsilon for {name} must be >= 0, got {e}")
        eps[name] = float(e)
    rs, rf = side.resamples or {}, floor.resamples or {}
    checks = [
        _bootstrap(_check(name, get(side), get(floor), eps[name], tolerance**power), rs.get(name), rf.get(name))
        for name, get, _, power in FLOOR_FIGURES
    ]
    s_ci, f_ci = side.sequences.identical_ci, floor.sequences.identical_ci
    ident = IdenticalCheck(
        side_share=side.sequences.share_identical,
        floor_share=floor.sequences.share_identical,
        side_ci=s_ci,
        floor_ci=f_ci,
        worse=bool(s_ci and f_ci and s_ci.high < f_ci.low),
    )
    checks.append(_identical_check(ident, tolerance))
    exceeded = [c.name for c in checks if c.exceeds]
    uncertain = [c.name for c in checks if c.uncertain]
    # "Within noise" needs a token figure measured on both sides: the share identical alone is no
    # evidence of closeness (a replay's rows are identical by construction; a floor with no scorable
    # token has none). It can still show a side worse than its floor.
    token_figures = any(c.note != "not comparable" for c in checks[:-1])
    verdict = EXCEEDS if exceeded else NOT_COMPARABLE if not token_figures else TOO_FEW if uncertain else WITHIN
    return FloorVerdict(
        verdict=verdict,
        tolerance=tolerance,
        figures=checks,
        exceeded=exceeded,
        identical=ident,
        summary=_summary(verdict, tolerance, checks, ident, side.sequences.n),
        uncertain=uncertain,
        prompts=side.sequences.n,
    )


def factor_text(c: FigureCheck) -> str:
    """A check's factor as every view prints it: "1.8x (95% interval 0.7x–3.1x)", "floor is zero"."""
    if c.floor_is_zero:
        how = "floor is zero"
    elif c.factor is None:
        how = "both zero"
    else:
        how = f"{c.factor:.3g}x"
    if (
        c.factor_low is not None
        and c.factor_high is not None
        and c.factor is not None
        and not _x(c.factor_low) == _x(c.factor_high) == _x(c.factor)
    ):
        how += f", 95% interval {_x(c.factor_low)}–{_x(c.factor_high)}"
    return how


def _x(f: float) -> str:
    return "∞" if math.isinf(f) else f"{f:.3g}x"


def _summary(verdict: str, tolerance: float, checks: list[FigureCheck], ident: IdenticalCheck, n: int) -> str:
    if verdict == NOT_COMPARABLE:
        return (
            "not comparable: no token figure is defined for both the side and the floor (no prompts or no "
            "scorable tokens); the share of identical streams alone says nothing of how close they are."
        )
    if verdict == WITHIN:
        return f"within noise: no figure is more than {tolerance:g}x the floor's (beyond its epsilon)."
    if verdict == TOO_FEW:
        shown = "; ".join(
            f"{display_name(c.name)} {c.side:.3g} vs {c.floor:.3g} ({factor_text(c)})" for c in checks if c.uncertain
        )
        return (
            f"too few prompts to tell: over {n} prompts, {shown} — over the {tolerance:g}x limit, but not "
            f"beyond sampling error (the interval, resampling the prompts, reaches the limit); more "
            f"prompts narrow it."
        )
    parts = []
    for c in checks:
        if c.exceeds and c.name == NOT_IDENTICAL and ident.side_ci and ident.floor_ci:
            parts.append(
                f"share identical {ident.side_share:.3g} [{ident.side_ci.low:.3g}, "
                f"{ident.side_ci.high:.3g}] below the floor's {ident.floor_share:.3g} "
                f"[{ident.floor_ci.low:.3g}, {ident.floor_ci.high:.3g}] (95% Wilson)"
            )
        elif c.exceeds:
            parts.append(f"{display_name(c.name)} {c.side:.3g} vs {c.floor:.3g} ({factor_text(c)})")
    return "exceeds noise: " + "; ".join(parts) + "."


# -- the sampling family (core.kept_mass): counts and sums, so pooling is adding --------------------------

# The sampling family's shares judged against the floor: (key, what the share counts).
SAMPLING_FLOOR_SHARES: tuple[str, ...] = ("renorm_outside_0.9_1.1", "kept_sets_differ")


def sampling_against_floor(side: Mapping[str, Any] | None, floor: Mapping[str, Any] | None) -> str | None:
    """The sampling family judged against the floor: the renormalised ratio's share outside [0.9, 1.1]
    and the share of kept sets that differ, each by the 95% Wilson intervals over its own count (as
    routing_against_floor); None without both. The naive ratio is not judged: it carries log S by
    construction (a setup trap named elsewhere), not numerics."""
    from .figures import FIGURES

    if not side or not floor or not side.get("tokens") or not floor.get("tokens"):
        return None
    parts, over = [], []
    for key in SAMPLING_FLOOR_SHARES:
        if side.get(key) is None or floor.get(key) is None:
            continue
        # Each share over its own count: kept sets are compared at every token and at each fork, so
        # kept_sets_differ is over sets_compared (an interval over the tokens alone would be too wide).
        over_key = "sets_compared" if key == "kept_sets_differ" else "tokens"
        ns, nf = int(side.get(over_key) or side["tokens"]), int(floor.get(over_key) or floor["tokens"])
        ks, kf = round(side[key] * ns), round(floor[key] * nf)
        (lo_s, hi_s), (lo_f, hi_f) = wilson(ks, ns), wilson(kf, nf)
        name = FIGURES[key].name
        parts.append(
            f"{name} {100 * ks / ns:.1f}% [{100 * lo_s:.1f}-{100 * hi_s:.1f}%], the floor's "
            f"{100 * kf / nf:.1f}% [{100 * lo_f:.1f}-{100 * hi_f:.1f}%]"
        )
        if lo_s > hi_f:
            over.append(name)
    where = f"above the floor ({', '.join(over)})" if over else "within the floor"
    ts, tf = int(side["tokens"]), int(floor["tokens"])
    drawn = f"{ts:,} drawn on both sides" if ts == tf else f"{ts:,} and the floor's {tf:,} drawn"
    return f"sampled tokens ({drawn}): {where}: " + "; ".join(parts)


def pool_kept_mass(records: Iterable[Any]) -> Any:
    """One KeptMass over many comparisons' (None where a comparison recorded no draws); None if none did."""
    from .kept_mass import KeptMass

    total: KeptMass | None = None
    for r in records:
        if r is None:
            continue
        if total is None:
            total = KeptMass()
        total.add(r)
    return total


# -- the distribution family (core.distribution): judged as the token figures are ----------------------------

# The figures judged against the floor (key, epsilon: a difference below it is rounding, never "exceeds").
FLOOR_CHECKS: tuple[tuple[str, float], ...] = (
    ("kl_mean", 1e-6),
    ("kl_rev_mean", 1e-6),
    ("tv_mean", 1e-4),
    ("kl_p99", 1e-5),
    ("top1_differ", 1e-3),
)


def distribution_against_floor(
    side: Mapping[str, Any] | None, floor: Mapping[str, Any] | None, tolerance: float = 1.5
) -> str | None:
    """The distribution family judged against the floor, as the token figures are (this module's rule,
    over `tolerance` x the floor's value AND more than the figure's epsilon above it); one sentence,
    None without both. The KL figures are quadratic in a logit error, so their limit is tolerance²."""
    from .figures import FIGURES

    if not side or not floor or not side.get("positions") or not floor.get("positions"):
        return None
    parts, over = [], []
    for key, eps in FLOOR_CHECKS:
        power = 2 if key.startswith("kl") else 1
        c = _check(key, side.get(key), floor.get(key), eps, tolerance**power)
        f = FIGURES[key]
        parts.append(f"{f.name} {f.format(c.side)} vs {f.format(c.floor)}")
        if c.exceeds:
            over.append(f.name)
    where = f"exceeds noise ({', '.join(over)})" if over else "within noise"
    return f"full distribution: {where}: " + "; ".join(parts)
