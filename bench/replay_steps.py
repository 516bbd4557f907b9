"""A whole RL run's trend without an engine, timed: recorded-only pooling of every step of a run, and
follow mode's delay from a step's completion marker to its figures.

    python bench/replay_steps.py                                   # 10 steps x 1,000 rows x 512 tokens (prime-rl)
    python bench/replay_steps.py --format nemo-rl                  # the same run as NeMo-RL writes it
    python bench/replay_steps.py --small                           # 3 steps x 50 rows x 64 tokens, here

(a) The tool: `parity replay DIR --model M` as a user runs it (ParityService.trend, recorded-only: the
dump's own pair, rollout against trainer logprobs), in a fresh process, over a synthetic run written
first in the framework's own layout (tests/rl_dumps.py: --steps steps of --rows rows, a 64-token prompt
and --tokens response tokens, the rollout's logprobs drawn with a fixed seed, the trainer's = rollout +
float noise, 0.3 nats lower on every other token from the middle step on). It reads every step,
stores each as a replay (both token streams for the token view, the pair's samples, the pooled
figures with their bootstrap intervals) and the trend. Goal: <= 60 s on the CPU; the process's peak
RSS (ru_maxrss) says how bounded its memory is (one step's rows at a time: it must not grow with the
steps).

The bare baseline: what a user writes by hand for the run's headline figure, in a fresh process: each
rank file's json.loads, numpy over the trained tokens, k3 = mean(ρ − log ρ − 1) per step. Like for like
(asserted): its k3 per step equals the tool's to 1e-6 relative. The ratio tool / bare says what the
rest costs (the store, the token streams, the quantiles, the bootstrap).

(b) Follow mode: `--follow` on a directory where another process (the training run's side) writes
--follow-steps steps, one every --follow-gap seconds (the rank files, then the STABLE marker, as
prime-rl does); the delay per step from the marker to the step's figures (the follow's own `landed_s`:
the marker's mtime to the moment the step's figures are stored).

Writes the figures as JSON to --out (or $OUT/replay_steps.json when $OUT is set) and prints them.
Run it under the engine lock: it loads no engine, but it takes both cores for its length.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # rl_dumps (the frameworks' layouts), tiny_models
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines

from bare_engines import in_fresh_process  # noqa: E402


def peak_rss_mib() -> float:
    """This process's peak resident memory since its exec (VmHWM): ru_maxrss would carry the spawning
    parent's peak across exec (Linux keeps it), which here holds the dump it wrote."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rows_of(step: int, n: int, tokens: int, vocab: int, fault_from: int, seed: int = 0) -> list[dict]:
    rnd = random.Random(seed * 100_003 + step)
    out = []
    for k in range(n):
        roll = [-rnd.uniform(0.01, 4.0) for _ in range(tokens)]
        shift = 0.3 if step >= fault_from else 0.0
        trainer = [min(0.0, x + rnd.gauss(0, 1e-4) - shift * (t % 2)) for t, x in enumerate(roll)]
        out.append({"prompt": [1] + [rnd.randrange(8, vocab) for _ in range(63)],
                    "response": [rnd.randrange(8, vocab) for _ in range(tokens)],
                    "rollout": roll, "trainer": trainer, "index": k, "version": step})
    return out


def write_run(root: Path, fmt: str, steps: range, rows: int, tokens: int, vocab: int, fault_from: int) -> float:
    from rl_dumps import WRITERS

    t0 = time.perf_counter()
    for s in steps:
        WRITERS[fmt](root, s, rows_of(s, rows, tokens, vocab, fault_from))
    old = time.time() - 60  # a finished run: its files long unchanged
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (old, old))
    return time.perf_counter() - t0


def tool(args, q) -> None:
    """`parity replay DIR` (recorded-only) in this fresh process: seconds, peak RSS, each step's k3."""
    from parity_ui.core.config import build_config
    from parity_ui.service import ParityService, TrendRequest

    svc = ParityService(db_path=args.db)
    t0 = time.perf_counter()
    run = svc.trend(TrendRequest(root=args.root, model=args.model, config=build_config(None, [])))
    wall = time.perf_counter() - t0
    report = svc.store.trend(run.id)
    svc.close()
    q.put({
        "wall_s": wall,
        "peak_rss_mib": peak_rss_mib(),
        "status": run.status,
        "k3": {s.step: s.figures.figures.get("k3") for s in report.steps},
        "tokens": sum(s.figures.tokens for s in report.steps),
        "step_s": [round(s.seconds or 0, 2) for s in report.steps],
        "jump": report.changes[0].sentence() if report.changes else None,
        "headline": report.headline,
    })


def bare(args, q) -> None:
    """By hand: each step's files parsed, k3 over the trained tokens with numpy."""
    import numpy as np

    from parity_ui.inputs.run_steps import scan_run

    t0 = time.perf_counter()
    k3 = {}
    for src in scan_run(args.root).steps:
        roll, train = [], []
        for f in sorted(src.path.glob("rank_*.jsonl")) if src.path.is_dir() else [src.path]:
            with f.open() as fh:
                for line in fh:
                    rec = json.loads(line)
                    if args.format == "nemo-rl":
                        m = np.array(rec["token_loss_mask"][0], bool)
                        roll.append(np.array(rec["generation_logprobs"][0])[m])
                        train.append(np.array(rec["prev_logprobs"][0])[m])
                    else:
                        m = np.array(rec["loss_mask"], bool)
                        roll.append(np.array(rec["inference_logprobs"], float)[m])
                        train.append(np.array(rec["trainer_logprobs"], float)[m])
        d = np.concatenate(train) - np.concatenate(roll)
        k3[src.step] = float(np.mean(np.expm1(d) - d))  # expm1: exp(d) - 1 - d cancels at small d
    q.put({"wall_s": time.perf_counter() - t0, "peak_rss_mib": peak_rss_mib(), "k3": k3})


def _write_steps(args, root: Path, gap_s: float) -> None:
    """The training run's side of follow mode, in its own process (as a trainer is): each step's rank
    files, then its STABLE marker, one step every `gap_s`."""
    from rl_dumps import write_prime_step

    for s in range(1, args.follow_steps + 1):
        time.sleep(gap_s)
        write_prime_step(root, s, rows_of(s, args.rows, args.tokens, args.vocab, 99), stable=False)
        (root / "token_exports" / f"step_{s}" / "STABLE").touch()


def follow(args, work: Path) -> dict:
    """Follow a run while its steps land (written by another process): the delay from each step's
    STABLE marker to its figures (the follow's own `landed_s`: the marker's mtime to the step's figures)."""
    import multiprocessing as mp

    from parity_ui.core.config import build_config
    from parity_ui.service import ParityService, TrendRequest

    root = work / "follow"
    root.mkdir()
    writer = mp.get_context("spawn").Process(target=_write_steps, args=(args, root, args.follow_gap))
    writer.start()
    svc = ParityService(db_path=str(work / "follow.db"))
    req = TrendRequest(root=str(root), model=args.model, config=build_config(None, []), follow=True, poll_s=0.2,
                       until_step=args.follow_steps, idle_exit_s=600)
    run = svc.trend(req)
    report = svc.store.trend(run.id)
    svc.close()
    writer.join()
    delays = {s.step: s.landed_s for s in report.steps if s.landed_s is not None}
    return {"steps": args.follow_steps, "rows": args.rows, "tokens": args.tokens, "gap_s": args.follow_gap,
            "marker_to_figures_s": {s: round(d, 2) for s, d in delays.items()},
            "replay_s": {s.step: round(s.seconds or 0, 2) for s in report.steps},
            "max_s": round(max(delays.values()), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--format", default="prime-rl", choices=["prime-rl", "nemo-rl"])
    ap.add_argument("--model", help="a model folder (its tokenizer; default: the tests' tiny Llama, built here)")
    ap.add_argument("--follow-steps", type=int, default=3)
    ap.add_argument("--follow-gap", type=float, default=20.0, help="seconds between two steps landing")
    ap.add_argument("--small", action="store_true", help="3 steps x 50 rows x 64 tokens")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.small:
        args.steps, args.rows, args.tokens, args.follow_steps, args.follow_gap = 3, 50, 64, 2, 1.0
    work = Path(tempfile.mkdtemp(prefix="parity-steps-"))
    try:
        if args.model is None:
            from tiny_models import build_model

            args.model = str(build_model(work / "tiny"))
        from parity_ui.inputs.models import describe_model
        from parity_ui.inputs.prompts import tokenizer_for

        args.vocab = len(tokenizer_for(describe_model(args.model).path, False).tok)
        args.root, args.db = str(work / "run"), str(work / "runs.db")
        written_s = write_run(Path(args.root), args.format, range(1, args.steps + 1), args.rows, args.tokens,
                              args.vocab, fault_from=args.steps // 2 + 1)
        size = sum(p.stat().st_size for p in Path(args.root).rglob("*") if p.is_file())
        got = in_fresh_process(tool, args)
        base = in_fresh_process(bare, args)
        for s, k in base["k3"].items():
            assert abs(got["k3"][s] - k) <= 1e-6 * max(abs(k), 1e-12), (s, got["k3"][s], k)
        out = {
            "run": {"format": args.format, "steps": args.steps, "rows": args.rows, "tokens": args.tokens,
                    "dump_mib": round(size / 2**20, 1), "written_s": round(written_s, 1)},
            "recorded_only": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in got.items() if k != "k3"},
            "bare": {"wall_s": round(base["wall_s"], 2), "peak_rss_mib": round(base["peak_rss_mib"], 1)},
            "ratio": round(got["wall_s"] / base["wall_s"], 2),
            "goal_60s": got["wall_s"] <= 60.0,
            "db_mib": round(os.path.getsize(args.db) / 2**20, 1),
        }
        if args.follow_steps:
            out["follow"] = follow(args, work)
        text = json.dumps(out, indent=2, default=str)
        print(text)
        dest = args.out or (os.path.join(os.environ["OUT"], "replay_steps.json") if os.environ.get("OUT") else None)
        if dest:
            Path(dest).write_text(text)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
