"""How many trials and how much time `parity bisect` takes for 3, 6 and 10 differing settings: ddmin
against flipping one setting at a time (issue 22).

Two tables:
1. ddmin alone (parity_ui.analysis.ddmin, a synthetic oracle, no engine): the trials for a single cause at every
   position and for every pair, mean and most, next to one at a time (n trials, and no pair ever
   found) and ddmin's bounds.
2. Whole searches on the tests' fake engine kind, in real worker processes (a trial is a stored run,
   its side's worker started unless a warm one serves it): a planted single cause (shift) and a planted
   pair (shift and noise, needed together) among harmless differences, each searched by ddmin and by
   one at a time; trials, wall time, time a trial, warm trials, what was found.

    python bench/bisect_trials.py [--settings 3 6 10] [--prompts 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the fake engine kind

from parity_ui.analysis.ddmin import best_case_trials, ddmin, worst_case_trials  # noqa: E402

# Differences the fake computes nothing from (several change its load key, as real options do).
HARMLESS = ["flag=x", "ignored_flag=y", "delay_ms=1", "load_s=0.001", "dtype=bfloat16", "fp32_logits=true",
            "device=cpu", "batch_size=2", "generation_config=model", "image_min_pixels=4096"]
CAUSES = {"single cause": ["shift=0.3"], "pair needed together": ["shift=0.2", "noise=0.2"]}


def pure_counts(n: int) -> dict[str, float]:
    """ddmin's trials (after the side as it ran and every setting flipped) on a synthetic oracle."""
    items = list(range(n))
    known = {frozenset(): False, frozenset(items): True}

    def trials(cause: set[int]) -> int:
        return ddmin(items, lambda s: cause <= s, known=known).trials

    singles = [trials({k}) for k in items]
    pairs = [trials(set(p)) for p in itertools.combinations(items, 2)]
    return {"settings": n, "single_mean": statistics.mean(singles), "single_max": max(singles),
            "pair_mean": statistics.mean(pairs), "pair_max": max(pairs), "one_at_a_time": n,
            "best": best_case_trials(n), "worst": worst_case_trials(n)}


def engine_rows(sizes: list[int], prompts: int, folder: Path) -> list[dict]:
    from fake_engine import fake_model, registered
    from parity_ui.commands.setting_bisect import BisectRequest, bisect_run
    from parity_ui.core.config import build_config
    from parity_ui.run.prepare import RunRequest
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.service import ParityService

    specs = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(prompts)]
    rows = []
    with registered():
        model = str(fake_model(folder / "model", max_position_embeddings=256))
        for n in sizes:
            for scenario, cause in CAUSES.items():
                side = ",".join(["b=fake", *cause, *HARMLESS[:n - len(cause)]])
                for strategy in ("ddmin", "one-at-a-time"):
                    # A fresh service each time: every search starts with the same cold workers.
                    svc = ParityService(db_path=str(folder / f"runs-{n}-{len(cause)}-{strategy}.db"))
                    try:
                        cfg = build_config(None, ["max_new_tokens=8"], sides=["ref=fake", side])
                        run = svc.run(RunRequest(model=model, prompts=specs, config=cfg))
                        t0 = time.perf_counter()
                        b = bisect_run(svc, BisectRequest(run.id, prompts=prompts, strategy=strategy))
                        wall = time.perf_counter() - t0
                    finally:
                        svc.close()
                    r = b.bisect
                    assert len(r.factors) == n, (n, [f.key for f in r.factors])
                    trials = r.trials
                    rows.append({"settings": n, "scenario": scenario, "strategy": strategy, "trials": len(trials),
                                 "cache_hits": r.cache_hits, "wall_s": round(wall, 2),
                                 "per_trial_s": round(statistics.mean(t.seconds for t in trials), 3),
                                 "warm_trials": sum(bool(t.warm) for t in trials), "status": b.status,
                                 "found": ", ".join(r.culprit) if r.outcome == "found" else r.outcome or b.error})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=[3, 6, 10])
    ap.add_argument("--prompts", type=int, default=2, help="prompts each trial runs (default 2)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    if max(args.settings) > len(HARMLESS) or min(args.settings) < 2:
        ap.error(f"--settings from 2 to {len(HARMLESS)}")
    pure = [pure_counts(n) for n in args.settings]
    print("ddmin alone (synthetic oracle): trials after the first two (as it ran, every setting flipped)")
    print(f"{'settings':>8} {'single mean':>12} {'single max':>11} {'pair mean':>10} {'pair max':>9} "
          f"{'one at a time':>14} {'bound best..worst':>18}")
    for p in pure:
        print(f"{p['settings']:>8} {p['single_mean']:>12.2f} {p['single_max']:>11} {p['pair_mean']:>10.2f} "
              f"{p['pair_max']:>9} {p['one_at_a_time']:>8} (no pair) {p['best']:>8}..{p['worst']}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = engine_rows(args.settings, args.prompts, Path(tmp))
    print(f"\nwhole searches on the fake engine kind ({args.prompts} prompts, 8 tokens; every count includes "
          "the first two trials)")
    print(f"{'settings':>8}  {'scenario':22} {'strategy':14} {'trials':>6} {'cached':>6} {'warm':>5} "
          f"{'wall s':>7} {'s/trial':>8}  found")
    for r in rows:
        print(f"{r['settings']:>8}  {r['scenario']:22} {r['strategy']:14} {r['trials']:>6} {r['cache_hits']:>6} "
              f"{r['warm_trials']:>5} {r['wall_s']:>7.2f} {r['per_trial_s']:>8.3f}  {r['found']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"pure": pure, "engine": rows}, indent=2))


if __name__ == "__main__":
    main()
