"""The pooling at the end of a workload or replay: `pooled` over a stored run of --rows x --tokens
with --sides compared sides and a floor, timed (no engines: the pair samples are written straight
into a fresh SQLite file with the store's own save_pair_samples, as a replay stores them).

    python bench/pool.py --rows 300 --tokens 400 --sides 2          # here (2-core CPU)
    python bench/pool.py --rows 10000 --tokens 2000 --sides 2       # issue 29's size (~3 GB of samples)
    python bench/pool.py --small                                    # a quick check (40 x 64)
    python bench/pool.py --rows 300 --tokens 400 --profile          # cProfile's top functions too

The samples look like a replay's (bench/replay.py's dump): each side's logprobs are the reference's
plus a per-token gap (--gap: "replay", recorded logprobs drawn uniformly in [-8, 0] as the bench's
dump makes them, so almost every token is far apart; "engine", a gap of ~1e-3 nats, two engines
that agree; every --mask-th token of each row masked out of the positions, as a replay's loss mask
does). The floor is one more side ("floor", gap ~1e-4). Times: writing the samples (not part of
the pooling), then `pooled` (read every side's samples back, pool them, bootstrap, judge against
the floor) as a whole and per side, and the process's peak RSS (the pooling holds one side's
pairs at a time: its peak). --tracemalloc pools under tracemalloc, as bench/replay.py --memory
runs a whole replay: every allocation traced, the pooling ~14x slower.

Writes the figures as JSON to --out (or $OUT/pool.json when $OUT is set) and prints them.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def store_run(path: Path, rows: int, tokens: int, sides: int, gap: str, mask: int, seed: int = 0):
    """A stored run of kind "replay" with its pair samples (sides s1..sN and "floor" against the
    reference), written row by row in chunks of 64 as a replay stores them. Returns (store, run id,
    side names, seconds spent writing)."""
    from parity_ui.core.pooled import PairSample
    from parity_ui.core.types import ModelInfo, Run, SideInfo
    from parity_ui.store import Store
    from parity_ui.store.runs import new_run_id, save_pair_samples, save_run

    store = Store.open(path)
    names = [f"s{k + 1}" for k in range(sides)]
    run = Run(id=new_run_id(), created_utc="2026-11-26T00:00:00.000+00:00", kind="replay",
              model=ModelInfo(name="synthetic-pool", path="/nowhere"), config={}, status="running",
              sides=[SideInfo(name="trainer", kind="hf", reference=True),
                     *(SideInfo(name=n, kind="hf") for n in names), SideInfo(name="floor", kind="hf")])
    save_run(store.db, run)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    for start in range(0, rows, 64):
        chunk: dict[str, list[PairSample]] = {n: [] for n in [*names, "floor"]}
        for i in range(start, min(rows, start + 64)):
            keep = [t for t in range(tokens) if not (mask and t % mask == mask - 1)]
            ref = [-rng.expovariate(0.5) for _ in keep]
            for n in chunk:
                if n == "floor":
                    side = [min(0.0, r + rng.gauss(0, 1e-4)) for r in ref]
                elif gap == "replay":
                    side = [round(-rng.random() * 8, 4) for _ in ref]
                else:
                    side = [min(0.0, r + rng.gauss(0, 1e-3)) for r in ref]
                chunk[n].append(PairSample(prompt_index=i, identical=True, first_divergence=None, length=tokens,
                                           verdict=None, logp_side=side, logp_ref=ref, positions=keep))
        with store.db.atomic():
            for n, got in chunk.items():
                save_pair_samples(store.db, run.id, n, got)
    return store, run.id, names, time.perf_counter() - t0


def time_pooled(store, run_id: str, names: list[str], rows: int, profile: bool) -> dict:
    """`pooled` as the replay calls it at the end, timed as a whole and each side's figures alone."""
    from parity_ui.commands.workload import report as report_mod
    from parity_ui.core.workload_record import FloorSpec, WorkloadOptions, WorkloadReport

    report = WorkloadReport(options=WorkloadOptions(mode="replay"), floor=FloorSpec("kernel", "floor", "the floor"),
                            n_prompts=rows, done=rows)
    per_side: dict[str, float] = {}
    real = report_mod.side_figures

    def timed(store_, run_id_, side):
        t = time.perf_counter()
        out = real(store_, run_id_, side)
        per_side[side] = round(time.perf_counter() - t, 3)
        return out

    prof = cProfile.Profile() if profile else None
    report_mod.side_figures = timed
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        report_mod.pooled(store, run_id, report, names)
        if prof:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        report_mod.side_figures = real
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    # CPU time too: on a shared machine the wall clock also counts other processes' turns.
    return {"pooled_s": round(wall, 3), "pooled_cpu_s": round(cpu, 3), "side_figures_s": per_side, "headline": report.headline,
            "verdicts": {n: f.verdict.verdict if f.verdict else None for n, f in report.sides.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--sides", type=int, default=2, help="compared sides, besides the floor")
    ap.add_argument("--gap", choices=("replay", "engine"), default="replay")
    ap.add_argument("--mask", type=int, default=0, help="mask every MASK-th token (0: none)")
    ap.add_argument("--small", action="store_true", help="40 rows x 64 tokens")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of the pooling")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="pool with tracemalloc tracing (what bench/replay.py --memory measures under)")
    ap.add_argument("--db", help="the SQLite file (default: a temporary one, removed after)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.small:
        a.rows, a.tokens = 40, 64
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.db) if a.db else Path(tmp) / "pool.db"
        store, run_id, names, write_s = store_run(path, a.rows, a.tokens, a.sides, a.gap, a.mask)
        figures = {"rows": a.rows, "tokens": a.tokens, "sides": a.sides, "pairs_pooled": a.sides + 1,
                   "gap": a.gap, "mask": a.mask, "write_s": round(write_s, 3),
                   "db_mib": round(path.stat().st_size / 2**20, 1),
                   "tracemalloc": a.tracemalloc}
        if a.tracemalloc:  # as bench/replay.py --memory runs the whole replay, its pooling included
            tracemalloc.start()
        figures.update(time_pooled(store, run_id, names, a.rows, a.profile))
        figures["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    text = json.dumps(figures, indent=2)
    print(text)
    out = a.out or (os.path.join(os.environ["OUT"], "pool.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
