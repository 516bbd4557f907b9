"""The whole next-token distribution, compared per position: what is recorded, how it is pooled,
how it is judged against the noise floor, and what it may cost.

The sampled token is not the distribution (SkyRL#2201): two sides can agree on every token they
chose and still differ elsewhere in the vocabulary. With `full_distribution: true` each position a
side and the reference both computed (the same context: a scored workload's teacher forcing, a
replay's forced tokens, a comparison's cross-scores) gets five per-position columns on the side's
steps (TokenStep, all optional: absent = not recorded), computed from the two FULL rows:

- `kl`: KL(ref ‖ side) = Σ p_ref (log p_ref − log p_side), nats;
- `kl_rev`: KL(side ‖ ref);
- `tv`: total variation ½ Σ |p_ref − p_side|;
- `top1`: 1 when both sides' argmax is the same token, else 0;
- `topk`: 1 when the reference's argmax is among the side's k best (k = the config's `logprobs`).

The rows never cross the worker pipe or the store (parity_ui.engines.full_distribution: the side
that makes its rows first writes them to a scratch file; the scorer that meets them computes the
five scalars where its own rows already are, on its device, and deletes nothing but returns scalars).

Pooled as llama.cpp's `--kl-divergence` reports them (mean / p90 / p95 / p99 / max, top-1 agreement,
top-k containment): the `distribution` family of core.figures. Pure: standard library only.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

DISTRIBUTION_COLUMNS = ("kl", "kl_rev", "tv", "top1", "topk")  # TokenStep's optional columns (this order)
ROW_BYTES = 4  # a full row at most: float32 (exact for float32 logits, so an fp32 pair sits at the floor);
# the writer keeps bfloat16 logits as their 2-byte bits (engines.full_distribution.narrowed): the budget
# and the scratch space count the wider case
QUANTILES = (("p90", 0.90), ("p95", 0.95), ("p99", 0.99))
# Which kinds can hand over full rows, and when, is theirs to say (core.kinds: Kind.rows_when_generating,
# rows_when_scoring): hf generating and scoring, vllm generating (a logits-processor hook; its scoring goes
# through prompt logprobs, a top-k only), servers never.


@dataclass(frozen=True)
class Budget:
    """What `full_distribution` may hold: one sequence's rows of the other side, as float32, on the
    scorer's device (and in the scratch file), must fit `mib`."""

    mib: int

    def sequence_bytes(self, vocab: int, tokens: int) -> int:
        return vocab * tokens * ROW_BYTES

    def check(self, vocab: int | None, tokens: int) -> None:
        """Raises ConfigError naming the budget when a sequence's rows do not fit it."""
        if vocab is None:
            return
        need = self.sequence_bytes(vocab, tokens)
        if need > self.mib * 2**20:
            raise ConfigError(
                "full_distribution",
                f"needs {need / 2**20:,.0f} MiB per sequence (vocabulary "
                f"{vocab:,} x {tokens:,} tokens x {ROW_BYTES} bytes), over the "
                f"memory budget of {self.mib:,} MiB (full_distribution_budget_mb)",
                "raise full_distribution_budget_mb if the scorer's device holds it, lower "
                "max_new_tokens, or set full_distribution=false",
            )


def scratch_bytes(vocab: int, tokens: int, sequences: int) -> int:
    """The scratch files one chunk leaves on disk at most (one side's rows of every sequence)."""
    return vocab * tokens * sequences * ROW_BYTES


def clamp_kl(x: float) -> float:
    """KL of two distributions is >= 0 (Gibbs); summed in float64 over a vocabulary, two equal rows can
    give -1e-17. That is rounding, not information: it is clamped to 0 so no view shows a negative KL."""
    return 0.0 if x < 0.0 else x


@dataclass
class DistributionPool:
    """One side's per-position figures against the reference, pooled (values kept as float64 arrays:
    40 bytes a position, 5 MiB for 128k positions; the quantiles need them)."""

    kl: array = field(default_factory=lambda: array("d"))
    kl_rev: array = field(default_factory=lambda: array("d"))
    tv: array = field(default_factory=lambda: array("d"))
    top1: int = 0
    topk: int = 0

    def __len__(self) -> int:
        return len(self.kl)

    def add_columns(self, columns: Mapping[str, Sequence[Any]]) -> None:
        """Positions where every column is recorded (None elsewhere: not computed there)."""
        kl, kr, tv, t1, tk = (columns.get(c) for c in DISTRIBUTION_COLUMNS)
        if kl is None or kr is None or tv is None or t1 is None or tk is None:
            return
        for a, b, c, d, e in zip(kl, kr, tv, t1, tk):
            if None in (a, b, c, d, e):
                continue
            self.kl.append(clamp_kl(a))
            self.kl_rev.append(clamp_kl(b))
            self.tv.append(c)
            self.top1 += int(d)
            self.topk += int(e)

    def add(self, other: DistributionPool) -> None:
        self.kl.extend(other.kl)
        self.kl_rev.extend(other.kl_rev)
        self.tv.extend(other.tv)
        self.top1 += other.top1
        self.topk += other.topk

    def figures(self) -> dict[str, float | None]:
        """The distribution family's figures (keys as core.figures registers them), None without positions."""
        n = len(self)
        out: dict[str, float | None] = {"positions": float(n)}
        for name, values in (("kl", self.kl), ("kl_rev", self.kl_rev), ("tv", self.tv)):
            s = sorted(values)
            out[f"{name}_mean"] = math.fsum(s) / n if n else None
            for label, q in QUANTILES:
                out[f"{name}_{label}"] = _quantile(s, q) if n else None
            out[f"{name}_max"] = s[-1] if n else None
        out["kl_decades"] = kl_decades(self.kl)  # type: ignore[assignment]  # the KL distribution, for the views
        out["top1_agree"] = self.top1 / n if n else None
        out["topk_contained"] = self.topk / n if n else None
        out["top1_differ"] = 1.0 - self.top1 / n if n else None
        return out


KL_DECADES = (-16, 2)  # the histogram's range: 1e-16 (float64 rounding) .. 1e2 nats; 0 and beyond kept apart


def kl_decades(values: Sequence[float]) -> dict[str, int]:
    """KL(ref‖side) per position as counts per decade: {"0": exact zeros, "-12": positions in [1e-12,
    1e-11), ...}; below 1e-16 counts with -16, from 1e2 up with 2. The views draw the KL distribution
    from it (the quantiles alone hide whether a side is at the floor everywhere or far off in a few places)."""
    lo, hi = KL_DECADES
    out: dict[str, int] = {}
    for v in values:
        k = "0" if v <= 0 else str(min(hi, max(lo, math.floor(math.log10(v)))))
        out[k] = out.get(k, 0) + 1
    return out


def _quantile(s: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    h = (len(s) - 1) * q
    lo = math.floor(h)
    return s[lo] if lo + 1 >= len(s) else s[lo] + (s[lo + 1] - s[lo]) * (h - lo)


def pool(columns: Iterable[Mapping[str, Sequence[Any]]]) -> DistributionPool:
    out = DistributionPool()
    for c in columns:
        out.add_columns(c)
    return out


@dataclass
class DistributionRecord:
    """One comparison's distribution family (full_distribution=true), over the cross-scored sequence
    where both sides' full rows met: whose tokens (`generator`), whose scoring met the rows (`scorer`)
    and the pooled figures (DistributionPool.figures). Stored flat, as {"generator", "scorer", ...figures}."""

    generator: str
    scorer: str
    figures: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        return self.figures.get(key)

    def __getitem__(self, key: str) -> Any:  # read as its stored JSON reads: d["generator"], d["kl_mean"]
        return self.to_json()[key]

    @property
    def positions(self) -> int:
        return int(self.figures.get("positions") or 0)

    def to_json(self) -> dict[str, Any]:
        return {"generator": self.generator, "scorer": self.scorer, **self.figures}


def distribution_from_json(d: Mapping[str, Any] | DistributionRecord | None) -> DistributionRecord | None:
    if d is None or isinstance(d, DistributionRecord):
        return d
    rest = {k: v for k, v in d.items() if k not in ("generator", "scorer")}
    return DistributionRecord(str(d.get("generator", "")), str(d.get("scorer", "")), rest)


@dataclass(frozen=True)
class RowsUnavailable:
    """A side that cannot give full rows where the run needs them, named (the run goes on without
    the distribution figures for that pair)."""

    side: str
    kind: str
    why: str

    def message(self) -> str:
        return f"full_distribution: side {self.side} ({self.kind}) {self.why}; its pair has no distribution figures"
