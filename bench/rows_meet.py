"""Where meeting vLLM's full rows costs the HF reference's scoring (issue 31): one HF side, loaded with
exactly the arguments the tool maps it to, scoring the same sequences (`score_batch`, as a scored
workload's reference does) under three modes, in turns:

  none   no rows: the baseline
  read   each item's rows read (ahead, on a thread, into pinned memory) but not met
  meet   + the meeting: the rows to the GPU, KL both ways, TV, top-1, top-k per position (the tool)

The rows are laid out as vLLM's processor writes them (engines/step_rows.py: one block per decode step
of the whole batch, an index per sequence), bfloat16 bits of random logits, in /dev/shm. Also timed
alone, on the scorer's thread with nothing to hide behind: one item's read and one item's meeting.
Printed and written (--out): seconds per mode and round, medians, ratios against `none`.

GPU (the demo model, one chunk of the full-distribution bench):
    python bench/rows_meet.py --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --sequences 250 --tokens 128 \\
        --out "$OUT/rows_meet.json"
CPU (seconds):
    python bench/rows_meet.py --model demo --dtype float32 --sequences 8 --tokens 16
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_score's engine loader

from hf_score import _engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--sequences", type=int, default=250)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=24, help="prompt tokens per sequence")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()

    import numpy as np
    import torch

    from parity_ui.core.requests import Rows, ScoreBatch, ScoreRequest
    from parity_ui.engines import full_distribution as fd
    from parity_ui.engines.step_rows import BITS, StepLog

    engine = _engine(args.model, args.dtype)
    vocab = engine.model.get_output_embeddings().weight.shape[0]
    g = np.random.default_rng(0)
    seqs = [(g.integers(10, vocab, args.prompt).tolist(), g.integers(10, vocab, args.tokens).tolist())
            for _ in range(args.sequences)]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    scratch = tempfile.mkdtemp(prefix="rows-meet-", dir=base)
    paths = [os.path.join(scratch, f"b-{j}.npy") for j in range(args.sequences)]
    t = time.perf_counter()
    log = StepLog(paths[0], vocab)
    for p in paths:
        log.add(p, args.tokens)
    gen = torch.Generator().manual_seed(1)
    for step in range(args.tokens):  # as vLLM's processor: one block a step, every sequence's row
        rows = (4 * torch.randn(args.sequences, vocab, generator=gen)).to(torch.bfloat16)
        log.write(BITS, log.reserve(BITS, [(p, step) for p in paths]), rows.view(torch.int16).numpy())
    assert log.finish(paths) == []
    write_s = time.perf_counter() - t

    def batch(mode: str) -> ScoreBatch:
        return ScoreBatch(items=[ScoreRequest(prompt=a, continuation=b, logprobs=5,
                                              rows=Rows(read=p, read_is="side", k=5) if mode != "none" else None)
                                 for (a, b), p in zip(seqs, paths)])

    real_meet = fd.meet

    def run(mode: str) -> float:
        fd.meet = (lambda own, rows, n, host=None: {}) if mode == "read" else real_meet
        try:
            req = batch(mode)
            if engine.model.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = engine.score_batch(req)
            took = time.perf_counter() - t0
        finally:
            fd.meet = real_meet
        if mode == "meet":
            assert all(s.kl is not None for c in out for s in c) and len(out) == args.sequences, "a position without figures"
        return took

    modes = ["none", "read", "meet"]
    try:
        run("meet")  # warm-up
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes[r % 3:] + modes[:r % 3]:
                times[mode].append(round(run(mode), 3))
                print(f"round {r + 1} {mode:4s} score_batch {times[mode][-1]:8.3f}s", flush=True)
        # One item's read and meeting alone, on this thread (nothing to overlap with).
        pin = engine.model.device.type == "cuda"
        n = min(32, args.sequences)
        t0 = time.perf_counter()
        hosts = [fd.read_rows(p, pin) for p in paths[:n]]
        read_one = (time.perf_counter() - t0) / n
        own = torch.randn(args.tokens, vocab, device=engine.model.device, dtype=engine.model.dtype)
        fd.meet(own, Rows(read=paths[0], read_is="side", k=5), args.tokens, hosts[0])  # warm-up
        t0 = time.perf_counter()
        for p, h in zip(paths[:n], hosts):
            fd.meet(own, Rows(read=p, read_is="side", k=5), args.tokens, h)
        meet_one = (time.perf_counter() - t0) / n
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    out = {"model": args.model, "dtype": args.dtype, "sequences": args.sequences, "tokens": args.tokens,
           "vocab": vocab, "log_write_s": round(write_s, 2), "score_batch_s": times, "median_s": med,
           "vs_none": {m: round(med[m] / med["none"], 3) for m in modes},
           "alone_per_sequence_ms": {"read": round(1000 * read_one, 2), "meet": round(1000 * meet_one, 2)}}
    for m in modes:
        print(f"{m:4s} median {med[m]:8.3f}s  {out['vs_none'][m]:.3f}x none", flush=True)
    print(f"alone, per sequence: read {1000 * read_one:.2f} ms, meet {1000 * meet_one:.2f} ms "
          f"(rows written in {write_s:.1f}s)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
