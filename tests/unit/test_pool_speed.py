"""The pooled report of a fixed stored run is the same, bit for bit, as before the pooling was made
faster (bench/pool.py; docs/performance.md "pooling"): every figure, interval, resample, histogram
bin and verdict of every side and the floor, against a fingerprint recorded with the code before
the change (tests/fixtures/pooled-golden.json). The run covers every path the pooling takes: more
prompts than the bootstrap's units (grouped units), more gaps than it walks (a systematic sample),
masked and missing logprobs (the slow path, skipped counts), exact zeros and gaps beyond the
histogram's range, a prompt with no scorable pair, out-of-order positions, every position bucket.

The fingerprint is a flat map of paths to values (a long list as its sha256), and only the paths it
holds are compared: a figure added to the report later does not break it.

    PYTHONPATH=$PWD python tests/unit/test_pool_speed.py --write    # re-record (only on purpose)
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from parity_ui.commands.workload.report import pooled
from parity_ui.core import pooled as pooled_mod
from parity_ui.core.pooled import PairSample, scorable
from parity_ui.core.types import ModelInfo, Run, SideInfo
from parity_ui.core.workload_record import DlogpHistogram, FloorSpec, WorkloadOptions, WorkloadReport
from parity_ui.store import Store
from parity_ui.store.runs import open_db, save_pair_samples, save_run

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "pooled-golden.json"
SIDES = ("b", "c")


def fixed_samples(side: str, n: int = 450, seed: int = 29) -> list[PairSample]:
    """The same samples on every run (a seeded generator; nothing depends on the platform's libm
    but exp/log of the figures themselves)."""
    rng = random.Random(f"{seed}-{side}")
    spread = {"floor": 1e-4, "b": 2e-2, "c": 3.0}[side]
    out = []
    for i in range(n):
        length = rng.randrange(1, 330)
        positions = [t for t in range(length) if not (i % 5 == 0 and t % 7 == 6)]  # a loss mask
        ref = [-rng.expovariate(0.7) for _ in positions]
        logp = [min(0.0, r + rng.gauss(0, spread)) for r in ref]
        if i % 11 == 0:
            logp[rng.randrange(len(logp))] = math.nan  # missing (stored as NaN)
        if i % 13 == 0:
            logp[rng.randrange(len(logp))] = -1e30  # masked by a logits processor
        if i % 17 == 0:
            logp[:5] = ref[:5]  # exact zeros
        if i % 19 == 0:
            logp[0], ref[0] = -300.0, -1e-9  # beyond the histogram's range
        if i % 23 == 0:
            logp[0], ref[0] = -0.5, -0.5 - 1e-9  # below it
        if i == 7:
            logp = [math.nan] * len(ref)  # no scorable pair
        if i % 29 == 0 and len(positions) > 3:  # positions out of order
            positions[1], positions[2] = positions[2], positions[1]
        identical = i % 3 == 0
        first = None if identical or i % 31 == 0 else rng.randrange(length)
        verdict = None if identical else rng.choice(["numerical near-tie", "real disagreement", None])
        out.append(PairSample(prompt_index=(i * 7) % n, identical=identical, first_divergence=first, length=length,
                              verdict=verdict, logp_side=logp, logp_ref=ref, positions=positions))
    return out


def pooled_report() -> WorkloadReport:
    store = Store(open_db(":memory:"))
    run = Run(id="01POOLGOLDEN", created_utc="2026-11-26T00:00:00.000+00:00", kind="replay",
              model=ModelInfo(name="golden", path="/nowhere"), config={}, status="running",
              sides=[SideInfo(name="ref", kind="hf", reference=True), *(SideInfo(name=s, kind="hf") for s in SIDES),
                     SideInfo(name="floor", kind="hf")])
    save_run(store.db, run)
    for side in (*SIDES, "floor"):
        save_pair_samples(store.db, run.id, side, fixed_samples(side))
    report = WorkloadReport(options=WorkloadOptions(mode="replay"), floor=FloorSpec("kernel", "floor", "the floor"),
                            n_prompts=450, done=450)
    return pooled(store, run.id, report, list(SIDES))


def fingerprint(value: Any, path: str = "") -> dict[str, Any]:
    """Path -> value; a list longer than 12 as the sha256 of its exact JSON (floats as repr)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(fingerprint(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list) and len(value) > 12:
        return {path: "sha256:" + hashlib.sha256(json.dumps(value).encode()).hexdigest()}
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(fingerprint(v, f"{path}[{i}]"))
        return out or {path: []}
    return {path: value}


def report_fingerprint() -> dict[str, Any]:
    d = pooled_report().to_json()
    return fingerprint({"sides": d["sides"], "floor_figures": d["floor_figures"], "headline": d["headline"]})


# The gaps are sorted in runs of SORT_RUN (bounded memory): one run per bucket, or a bucket cut into many.
@pytest.mark.parametrize("sort_run", [None, 997])
def test_the_pooled_report_is_bit_identical_to_before(sort_run, monkeypatch):
    if sort_run is not None:
        monkeypatch.setattr(pooled_mod, "SORT_RUN", sort_run)
    golden = json.loads(GOLDEN.read_text())
    got = report_fingerprint()
    missing = sorted(set(golden) - set(got))
    assert not missing, f"paths no longer in the report: {missing[:10]}"
    differ = [(p, golden[p], got[p]) for p in golden if got[p] != golden[p]
              or (isinstance(golden[p], float) and math.copysign(1, golden[p]) != math.copysign(1, got[p]))]
    assert not differ, f"{len(differ)} values differ, e.g. {differ[:5]}"
    # The fingerprint covers what matters: resamples, histogram bins, verdicts of both sides and the floor.
    for key in ("sides.b.stats.resamples.abs_dlogp_p99", "floor_figures.hist.counts", "sides.c.verdict.verdict",
                "sides.b.stats.tokens.abs_dlogp_p50", "floor_figures.stats.tokens.skipped"):
        assert key in golden, key
    assert golden["sides.c.verdict.verdict"] == "exceeds noise" and golden["floor_figures.hist.zero"] > 0
    assert golden["sides.b.hist.above"] > 0 and golden["sides.b.hist.below"] > 0


def _histogram_one_pair_at_a_time(pairs: list[tuple[Any, Any]]) -> DlogpHistogram:
    """The histogram as it was counted before (one pair at a time): the reference for add."""
    h = DlogpHistogram()
    for a, b in pairs:
        if not (scorable(a) and scorable(b)):
            continue
        d = abs(a - b)
        if d == 0.0:
            h.zero += 1
            continue
        i = math.floor((math.log10(d) - h.low) / h.width)
        if i < 0:
            h.below += 1
        elif i >= len(h.counts):
            h.above += 1
        else:
            h.counts[i] += 1
    return h


@pytest.mark.parametrize("seed", range(6))
def test_the_histogram_counts_as_one_pair_at_a_time(seed):
    rng = random.Random(seed)
    specials = [None, math.nan, math.inf, -math.inf, -1e30, -1e31, 0.0, -0.0, -5e-324, -1e-8, -250.0]
    pairs = []
    for _ in range(3000):
        a = -rng.expovariate(1.0)
        b = a + rng.choice([0.0, rng.gauss(0, 1e-6), rng.gauss(0, 1e-3), rng.gauss(0, 1.0), -200.0])
        if rng.random() < 0.05:
            a = rng.choice(specials)
        if rng.random() < 0.05:
            b = rng.choice(specials)
        pairs.append((a, min(b, 0.0) if isinstance(b, float) and not math.isnan(b) else b))
    # Bin edges exactly: |dlogp| = 10**(low + k*width) and its float neighbours.
    for k in range(0, 37):
        e = 10 ** (-7.0 + 0.25 * k)
        for d in (e, math.nextafter(e, 0), math.nextafter(e, math.inf)):
            pairs.append((-1.0, -1.0 - d))
    got, start, clean = DlogpHistogram(), 0, 0
    while start < len(pairs):  # samples of 1 to 40 pairs: many all scorable (the fast path), many not
        chunk = pairs[start:start + rng.randrange(1, 41)]
        start += len(chunk)
        clean += all(scorable(a) and scorable(b) for a, b in chunk)
        got.add([a for a, _ in chunk], [b for _, b in chunk])
    want = _histogram_one_pair_at_a_time(pairs)
    assert got == want and got.total > 2500 and clean > 20



@pytest.mark.parametrize("block", [1, 3, 512])
def test_weighted_ranks_find_what_bisect_over_the_running_total_finds(block):
    """The bootstrap's rank search (core.stats.WeightedRanks) against the running total it replaces,
    every rank of resamples with zero weights, on blocks of 1, 3 and 512 gaps."""
    from bisect import bisect_right
    from itertools import accumulate

    from parity_ui.core.stats import WeightedRanks

    rng = random.Random(block)
    units = 37
    gap_units = [rng.randrange(units) for _ in range(700)]
    ranks = WeightedRanks(gap_units, units, block)
    for _ in range(20):
        w = [rng.choice([0, 0, 1, 1, 2, 5]) for _ in range(units)]
        cum = list(accumulate(w[u] for u in gap_units))
        assert ranks.weigh(w) == cum[-1]
        assert [ranks.index(k) for k in range(cum[-1])] == [bisect_right(cum, k) for k in range(cum[-1])]
    assert WeightedRanks([], units).weigh([1] * units) == 0


# The resamples of 120 prompts of side "c" with the bootstrap walking every 21st / 4th gap (a cap of
# 997 / 5000 gaps: the strided slices start mid-bucket), recorded with the code before the change.
RESAMPLES_BEFORE = {997: "7e41af8f79fa870c04b174df01c27b407ee82be917614c5e3b0ec974d7ecdc1b",
                    5000: "5bd6d599dc37b57e8418bd06451dc068eb7d130f0df1644c4c7b7e82d2457dcf"}


@pytest.mark.parametrize("cap", sorted(RESAMPLES_BEFORE))
def test_the_systematic_sample_of_gaps_is_the_same_at_any_step(cap, monkeypatch):
    import parity_ui.core.pooled as pooled_module

    monkeypatch.setattr(pooled_module, "BOOTSTRAP_MAX_GAPS", cap)
    acc = pooled_module.Accumulator()
    for s in fixed_samples("c", n=120):
        acc.add(s)
    got = hashlib.sha256(json.dumps(acc.result().resamples).encode()).hexdigest()
    assert got == RESAMPLES_BEFORE[cap]

if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps(report_fingerprint(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
