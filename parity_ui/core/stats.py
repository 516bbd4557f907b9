"""The exact statistics the pooled figures are made of (core.pooled): Wilson intervals for a share, exact
quantiles (of ascending values, of values each repeated by a bootstrap weight, of |values| over ascending
runs never merged), and the percentile of a bootstrap's sorted factors.

Pure, deterministic, standard library only: the parent process never imports numpy for them. Every
quantile is numpy's default (linear interpolation between order statistics), found exactly.
"""

from __future__ import annotations

import math
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import mul
from statistics import NormalDist

# The design notes' z for the two-sided 95% interval, and vLLM's accuracy gate's one-sided bound.
WILSON_Z = 1.96
ONE_SIDED_CONFIDENCE = 0.95
# Values per block of WeightedRanks: a rank search costs ~log2(values / block) sums over the units and
# one walk of a block.
RANK_BLOCK = 512


def wilson(k: int, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval for k successes in n trials (the design notes' formula), clamped
    to [0, 1]. Raises ValueError when n < 1 or k is outside 0..n."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p = k / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_lower(k: int, n: int, confidence: float = ONE_SIDED_CONFIDENCE) -> float:
    """The one-sided Wilson lower bound at `confidence` (z = Phi^-1(confidence), 1.645 at 95%),
    as vLLM's accuracy gate computes it. Raises ValueError like `wilson`."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return wilson(k, n, NormalDist().inv_cdf(confidence))[0]


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The exact q-quantile of ascending values, interpolating linearly between order statistics
    (numpy's default). Raises ValueError on no values or q outside [0, 1]."""
    n = len(sorted_values)
    if n == 0 or not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile needs values and 0 <= q <= 1, got {n} values, q={q}")
    h = (n - 1) * q
    lo = math.floor(h)
    frac = h - lo
    if frac == 0.0:
        return float(sorted_values[lo])
    a, b = sorted_values[lo], sorted_values[lo + 1]
    return a + (b - a) * frac


def interval_quantile(sorted_values: Sequence[float], q: float) -> float:
    """`quantile` of a bootstrap's sorted factors, which may hold inf (a zero floor): two equal
    neighbours give their value as it is (inf - inf would be nan)."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    a = sorted_values[lo]
    if h == lo or a == sorted_values[lo + 1]:
        return a
    return a + (sorted_values[lo + 1] - a) * (h - lo)


class WeightedRanks:
    """Where rank k falls among sorted values, each repeated by its unit's weight in a resample:
    bisect_right(cum, k), cum being the running total of the weights over the values, without making
    cum (one entry a value) in every resample. Each unit's value count before every block's start is
    counted once; a resample's weight before a block is then one sum over the units, a binary search
    over the blocks finds the one holding rank k, and only that block is walked. The same index as
    bisect_right over cum (integer weights: exact), at ~1/10 of the cost."""

    def __init__(self, value_units: Sequence[int], units: int, block: int = RANK_BLOCK):
        self.value_units, self.block = value_units, block
        counts = [0] * units
        self.before: list[list[int]] = []  # before[b][u]: unit u's values before index b * block
        for start in range(0, len(value_units), block):
            self.before.append(counts.copy())
            for u in value_units[start : start + block]:
                counts[u] += 1
        self.before.append(counts)  # past the last value
        self.w: Sequence[int] = []
        self._at: dict[int, int] = {}

    def weigh(self, w: Sequence[int]) -> int:
        """Start a resample (its units' weights); returns the total weight (cum[-1], 0 without values)."""
        self.w, self._at = w, {}
        return self._weight_before(len(self.before) - 1)

    def _weight_before(self, b: int) -> int:
        t = self._at.get(b)
        if t is None:
            t = self._at[b] = sum(map(mul, self.w, self.before[b]))
        return t

    def index(self, k: int) -> int:
        """bisect_right(cum, k) for 0 <= k < the total weight: the first value whose running total exceeds k."""
        lo, hi = 0, len(self.before) - 1  # weight before lo <= k < weight before hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._weight_before(mid) <= k:
                lo = mid
            else:
                hi = mid
        start = lo * self.block
        run = list(
            accumulate(
                map(self.w.__getitem__, self.value_units[start : start + self.block]), initial=self._weight_before(lo)
            )
        )
        return start + bisect_right(run, k) - 1


def weighted_quantile(sorted_values: Sequence[float], ranks: WeightedRanks, total: int, q: float) -> float:
    """`quantile` of the values each repeated by its weight (`ranks` weighed for this resample; total:
    the weights' sum)."""
    h = (total - 1) * q
    k = math.floor(h)
    a = sorted_values[ranks.index(k)]
    frac = h - k
    return a if frac == 0.0 else a + (sorted_values[ranks.index(k + 1)] - a) * frac


def _float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


_INF_BITS = struct.unpack("<q", struct.pack("<d", math.inf))[0]


def kth_abs(runs: list[array], k: int) -> float:
    """The k-th smallest (0-based) |value| over ascending runs, without merging them: the bit
    patterns of non-negative floats are ordered like the floats, so a binary search over them
    (64 steps, each counting |value| <= t by bisection in every run) lands on an element."""
    lo, hi = 0, _INF_BITS
    while lo < hi:
        mid = (lo + hi) // 2
        t = _float(mid)
        if sum(bisect_right(r, t) - bisect_left(r, -t) for r in runs) > k:
            hi = mid
        else:
            lo = mid + 1
    return _float(lo)


def abs_quantile(runs: list[array], n: int, q: float) -> float:
    """`quantile` of |value| over the ascending runs (n values in all)."""
    h = (n - 1) * q
    k = math.floor(h)
    frac = h - k
    a = kth_abs(runs, k)
    return a if frac == 0.0 else a + (kth_abs(runs, k + 1) - a) * frac
