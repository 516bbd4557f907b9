"""A weight-sync check's comparisons (issue 41), pure: two sides' digests in, named differences out;
three sides' teacher-forced logprobs in, the probe's verdicts against the noise floor out.

- `compare_digests`: every unit of the updated engine against the fresh load, by key (rank, engine
  name, slice): equal, differs, missing on one side, or not readable; a digest per rank.
- `with_diffs`: the sizes of the differences measured in the engine (weight_units.diff_in_worker).
- `compare_param_digests`: a server's per-parameter digests (vLLM's POST /weight_checker) against the
  fresh load's, for the parameters both can read.
- `probe_comparison`: one pairing of the probe judged against its floor with core.pooled's
  machinery (workload_stats, compare_to_floor), the same verdict a workload gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.pooled import (
    DEFAULT_TOLERANCE,
    EPSILON_NATS,
    EXCEEDS,
    PairSample,
    compare_to_floor,
    scorable,
    workload_stats,
)
from ..core.weights import (
    DIFFERS,
    EQUAL,
    MISSING,
    READ_KERNEL,
    TOLERATED,
    UNREADABLE,
    DiffFigure,
    ProbeComparison,
    SideWeights,
    TensorDigest,
    TensorFigure,
    ordered,
)


def _figure(key: str, live: TensorDigest | None, ref: TensorDigest | None) -> TensorFigure:
    one = live or ref
    assert one is not None
    if live is None or ref is None:
        status = MISSING
        note = "only in the fresh load" if live is None else "only in the updated engine"
    elif live.shape != ref.shape or live.dtype != ref.dtype:
        status = DIFFERS
        note = f"shape/dtype {live.shape} {live.dtype} against {ref.shape} {ref.dtype}"
    else:
        status = EQUAL if live.digest == ref.digest else DIFFERS
        note = ""
    if status != MISSING and one.read == READ_KERNEL:
        note = (note + "; " if note else "") + "read back through the layer's kernel (vLLM-CPU packs it)"
    return TensorFigure(
        key=key,
        rank=one.rank,
        name=one.name,
        part=one.part,
        sources=list(one.sources),
        shape=list(one.shape),
        dtype=one.dtype,
        status=status,
        live_digest=live.digest if live else None,
        ref_digest=ref.digest if ref else None,
        read=one.read,
        live_zero=bool(live and ref and live.zero and not ref.zero),
        norm_live=live.norm if live else None,
        norm_ref=ref.norm if ref else None,
        note=note,
    )


def compare_digests(live: SideWeights, ref: SideWeights) -> tuple[list[TensorFigure], list[dict[str, Any]]]:
    """Every unit, differing first (core.weights.ordered), and each rank's digest on both sides."""
    if not live.readable or not ref.readable:
        why = live.why if not live.readable else ref.why
        return [], [{"rank": "", "live": None, "ref": None, "equal": False, "why": why}]
    mine = {u.key: u for u in live.units}
    theirs = {u.key: u for u in ref.units}
    keys = list(theirs) + [k for k in mine if k not in theirs]
    figures = [_figure(k, mine.get(k), theirs.get(k)) for k in keys]
    ranks = [
        {"rank": r, "live": live.ranks.get(r), "ref": ref.ranks.get(r), "equal": live.ranks.get(r) == ref.ranks.get(r)}
        for r in sorted(set(live.ranks) | set(ref.ranks))
    ]
    return ordered(figures), ranks


def with_diffs(figures: list[TensorFigure], diffs: Sequence[DiffFigure], over_budget: set[str]) -> list[TensorFigure]:
    """The differing units with their measured sizes; a quantised unit within its format's tolerance
    becomes TOLERATED. Units over the transfer budget keep their norms and say so."""
    by_key = {d.key: d for d in diffs}
    for f in figures:
        d = by_key.get(f.key)
        if d is not None:
            f.max_abs, f.rel_l2, f.n_differ, f.numel = d.max_abs, d.rel_l2, d.n_differ, d.numel
            f.nonfinite = d.nonfinite
            if d.nonfinite:
                f.note = (f.note + "; " if f.note else "") + (
                    f"{d.nonfinite} live values are not finite (uninitialised memory: what a tensor left out of "
                    "vLLM's layerwise reload holds)"
                )
            if d.tolerance:
                f.note = (f.note + "; " if f.note else "") + f"compared dequantised: {d.tolerance}"
            if d.within_tolerance and f.status == DIFFERS:
                f.status = TOLERATED
        elif f.key in over_budget:
            f.note = (f.note + "; " if f.note else "") + "size not measured: over the transfer budget (norms shown)"
    return ordered(figures)


def compare_param_digests(live: dict[str, str], ref: dict[str, str], empty: str) -> list[TensorFigure]:
    """A server's per-parameter digests ("<rank>:<name>" -> SHA-256, vLLM's weight_checker) against the
    fresh load's. A parameter either side holds empty (vLLM-CPU's packed linear weights: their bytes
    live in the kernel) cannot be compared that way: not readable."""
    out = []
    for key in list(ref) + [k for k in live if k not in ref]:
        rank, _, name = key.rpartition(":")
        a, b = live.get(key), ref.get(key)
        if a is None or b is None:
            status = MISSING
        elif empty in (a, b):
            status = UNREADABLE
        else:
            status = EQUAL if a == b else DIFFERS
        out.append(
            TensorFigure(
                key=key,
                rank=rank,
                name=name,
                part=None,
                sources=[name],
                shape=[],
                dtype="",
                status=status,
                live_digest=a,
                ref_digest=b,
                note="empty parameter (its weight is packed into the kernel)" if status == UNREADABLE else "",
            )
        )
    return ordered(out)


# -- the probe -----------------------------------------------------------------------------------------


def _samples(side: Sequence[Sequence[float | None]], ref: Sequence[Sequence[float | None]]) -> list[PairSample]:
    return [
        PairSample(
            prompt_index=i,
            identical=True,  # forced tokens: the same ids on every side, nothing forks
            first_divergence=None,
            length=len(s),
            verdict=None,
            logp_side=list(s),
            logp_ref=list(r),
            positions=list(range(len(s))),
        )
        for i, (s, r) in enumerate(zip(side, ref))
    ]


def _lost(side: Sequence[Sequence[float | None]], against: Sequence[Sequence[float | None]]) -> int:
    """Forced tokens the other side scores and this one cannot (no logprob, not finite, or masked:
    an engine computing on NaN weights gives no probability at all)."""
    return sum(1 for s, r in zip(side, against) for a, b in zip(s, r) if scorable(b) and not scorable(a))


def _first_over(
    side: Sequence[Sequence[float | None]], ref: Sequence[Sequence[float | None]], limit: float
) -> int | None:
    """The first forced token, counting through the sequences in order, whose |gap| exceeds `limit`."""
    n = 0
    for s, r in zip(side, ref):
        for a, b in zip(s, r):
            if scorable(b) and (not scorable(a) or abs(a - b) > limit):
                return n
            n += 1
    return None


def probe_comparison(
    side: str,
    against: str,
    floor_label: str,
    logp_side: Sequence[Sequence[float | None]],
    logp_against: Sequence[Sequence[float | None]],
    floor_a: Sequence[Sequence[float | None]],
    floor_b: Sequence[Sequence[float | None]],
) -> ProbeComparison:
    """`side` against `against` on the probe's forced tokens, judged against the floor (`floor_a`
    against `floor_b`: the same pairing with the fresh load in the updated side's place)."""
    stats = workload_stats(_samples(logp_side, logp_against))
    floor = workload_stats(_samples(floor_a, floor_b))
    verdict = compare_to_floor(stats, floor)
    fmax = floor.tokens.abs_dlogp_max
    limit = max((fmax or 0.0) * DEFAULT_TOLERANCE, (fmax or 0.0) + EPSILON_NATS)
    lost, floor_lost = _lost(logp_side, logp_against), _lost(floor_a, floor_b)
    if lost > floor_lost:  # tokens with no logprob at all are beyond any floor, not "not comparable"
        verdict.verdict = EXCEEDS
        verdict.exceeded = ["unscorable_tokens", *verdict.exceeded]
        verdict.summary = (
            f"{lost} of {sum(len(s) for s in logp_side)} forced tokens have no finite logprob on {side} "
            f"({floor_lost} on the floor's pairing): " + verdict.summary
        )
    return ProbeComparison(
        side=side,
        against=against,
        floor=floor_label,
        tokens=stats.tokens.pairs,
        abs_dlogp_max=stats.tokens.abs_dlogp_max,
        abs_dlogp_mean=stats.tokens.abs_dlogp_mean,
        floor_abs_dlogp_max=fmax,
        floor_abs_dlogp_mean=floor.tokens.abs_dlogp_mean,
        verdict=verdict.verdict,
        summary=verdict.summary,
        exceeded=list(verdict.exceeded),
        first_token=_first_over(logp_side, logp_against, limit),
    )
