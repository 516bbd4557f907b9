"""What one flush of a run being made costs at 10 and at 1,000 prompts, before and after the flush
wrote only what changed (issue 20).

Before: every flush (each FLUSH_S while a side streamed, after each side, at start and at the end)
called store.save_run, which deletes and re-inserts every prompt, side-result and comparison row of
the run. After: parity_ui.run.recorder.RunRecorder.flush writes the run's row and the rows of the
prompts that streamed since the last flush. Both are timed here in one process, on the same run (two
sides x 128 tokens x top-5 a prompt, the last side mid-stream), on a database file with WAL, as the
service opens it. Prints a table and, with --out, writes the figures as JSON.

    python bench/flush.py [--prompts 10 1000] [--flushes 20] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parity_ui.analysis.compare import compare  # noqa: E402
from parity_ui.run.recorder import RunRecorder  # noqa: E402
from parity_ui.core.runlog import new_run  # noqa: E402
from parity_ui.store.runs import new_run_id, open_db, save_run  # noqa: E402
from parity_ui.core.types import SideInfo, SideResult, TokenStep, TopLogprob  # noqa: E402

TOKENS, TOP = 128, 5


def _result(side: str, i: int, n: int) -> SideResult:
    steps = [TokenStep(p, 100 + (p * 7 + i) % 900, f"t{p}", -0.1 - p / 1000, 1,
                       [TopLogprob(100 + (p * 7 + i + k) % 900, -0.1 - k, f"t{k}") for k in range(TOP)])
             for p in range(n)]
    return SideResult(side=side, prompt_index=i, token_ids=[s.token_id for s in steps], steps=steps,
                      finish_reason="length" if n == TOKENS else None)


def _run_in_progress(n_prompts: int):
    """A run whose reference is done and whose second side is half way through its last prompt."""
    run = new_run(new_run_id(), "bench", {}, [None] * n_prompts)
    run.sides = [SideInfo(name="ref", kind="hf", reference=True), SideInfo(name="b", kind="vllm")]
    for i, pr in enumerate(run.prompts):
        pr.prompt_text, pr.prompt_token_ids = f"prompt {i}", list(range(1, 40))
        pr.results["ref"] = _result("ref", i, TOKENS)
        pr.results["b"] = _result("b", i, TOKENS if i < n_prompts - 1 else TOKENS // 2)
        pr.comparisons = [compare(pr.results["ref"], pr.results["b"])] if i < n_prompts - 1 else []
    return run


def measure(n_prompts: int, flushes: int, folder: Path) -> dict[str, float]:
    run = _run_in_progress(n_prompts)
    db = open_db(folder / f"before-{n_prompts}.db")
    save_run(db, run)
    before = []
    for _ in range(flushes):
        t = time.perf_counter()
        save_run(db, run)
        before.append(time.perf_counter() - t)
    db.close()

    db = open_db(folder / f"after-{n_prompts}.db")
    save_run(db, run)
    rec = RunRecorder(db, run)
    rec.stream("b", None, lambda e: None)  # type: ignore[arg-type]  # no decoding: steps come decoded
    last = n_prompts - 1
    after = []
    for k in range(flushes):
        step = run.prompts[last].results["b"].steps[k % len(run.prompts[last].results["b"].steps)]
        rec._partial["b"].setdefault(last, []).append(step)  # a token streamed since the last flush
        rec._dirty.add(("b", last))
        t = time.perf_counter()
        rec.flush()
        after.append(time.perf_counter() - t)
    db.close()
    return {"prompts": n_prompts, "before_ms": 1000 * statistics.median(before),
            "after_ms": 1000 * statistics.median(after), "flushes": flushes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--flushes", type=int, default=20)
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(n, args.flushes, Path(tmp)) for n in args.prompts]
    print(f"median time per flush, {TOKENS} tokens x 2 sides a prompt, top-{TOP}, {args.flushes} flushes each")
    print(f"{'prompts':>8} {'before (save_run)':>18} {'after (flush)':>14}")
    for r in rows:
        print(f"{r['prompts']:>8} {r['before_ms']:>15.1f} ms {r['after_ms']:>11.2f} ms")
    lo, hi = rows[0], rows[-1]
    growth = {"before": hi["before_ms"] / lo["before_ms"], "after": hi["after_ms"] / lo["after_ms"]}
    print(f"{hi['prompts']} / {lo['prompts']} prompts: before {growth['before']:.0f}x, after {growth['after']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "growth": growth}, indent=2))


if __name__ == "__main__":
    main()
