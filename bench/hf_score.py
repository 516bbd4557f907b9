"""The HF engine's teacher-forced scoring against bare HF teacher-forcing, in ONE process, back to back.

    python bench/hf_score.py --model demo --dtype float32 --rows 8 --tokens 512     # here (the CPU)
    python bench/hf_score.py --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --rows 200 --tokens 512  # GPU
    python bench/hf_score.py ... --profile                                            # + cProfile of the tool leg
    PARITY_TREE=../main python bench/hf_score.py ...                     # another checkout's parity_ui (before)

What bench/replay.py's trainer side spends beyond the forward pass, without the replay around it: the
tool leg is what a worker does for one `score_batch` verb (HfEngine.score_batch, the steps as columns,
pickled and unpickled as they cross the pipe); the bare legs are one forward pass per row ("bare") and
the rows sorted by length, many a forward, right-padded, at most --bare-tokens tokens a forward
("bare_batched", what a user batching it would write: issue 44), each with log-softmax and the chosen
tokens' logprobs to Python. --vary gives the rows prompts of different lengths (a real replay's); the
tool's engine packs them as its side's score_batch says (--score-batch, default auto). The legs
alternate (--repeat times) so a busy machine slows them alike; the tool's logprobs are asserted equal to
the one-row bare leg's, bit for bit (auto keeps each row's bits), and the batched bare leg's difference
from them is reported (padding may move bits on a device: "bare_batched_vs_one_row").
Prints and writes (--out) the median and least seconds per leg, their ratios, and the CPU seconds (on a
shared CPU the least and the CPU time are steadier than the median).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pickle
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

# PARITY_TREE: measure another checkout's parity_ui with this script (bench/gpu_perf.sh: main's, before).
sys.path.insert(0, os.environ.get("PARITY_TREE") or str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines


def _engine(model: str, dtype: str, score_batch: str = "auto"):
    from parity_ui.core.config import build_config
    from parity_ui.engines.hf_engine import HfEngine
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.pipeline import load_request
    from parity_ui.run.plan import RunRequest
    from parity_ui.run.prepare import prepare

    # A checkout before issue 44 has no score_batch option: leave it out there.
    sb = f",score_batch={score_batch}" if score_batch != "auto" else ""
    cfg = build_config(None, ["logprobs=1"], sides=[f"trainer=hf,dtype={dtype}{sb}", f"other=hf,dtype={dtype}"])
    prep = prepare(RunRequest(model=model, prompts=[PromptSpec(text="x", token_ids=[1, 2, 3])], config=cfg),
                   gpu=on_gpu())
    side = prep.side("trainer")
    os.environ.update(side.worker_env or {})
    engine = HfEngine()
    engine.should_stop = lambda: False
    info = engine.load(load_request(side))
    return engine, info.resolved.get("score_batch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=40, help="prompt tokens a row")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--vary", action="store_true", help="prompts of different lengths (half to 1.5x --prompt)")
    ap.add_argument("--score-batch", default="auto", help="the tool side's score_batch")
    ap.add_argument("--bare-tokens", type=int, default=8192, help="the batched bare leg's tokens a forward")
    ap.add_argument("--profile", action="store_true", help="cProfile one more tool leg and print its top functions")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    from bare_engines import length_batches, padded_logits

    from parity_ui.core.requests import ScoreBatch, ScoreRequest
    from parity_ui.core.types import StepColumns

    engine, resolved = _engine(args.model, args.dtype, args.score_batch)
    model, dev = engine.model, engine.model.device
    vocab = model.get_output_embeddings().out_features
    rnd = random.Random(0)

    def plen() -> int:
        return rnd.randrange(max(1, args.prompt // 2), args.prompt * 3 // 2 + 1) if args.vary else args.prompt

    rows = [([rnd.randrange(16, vocab) for _ in range(plen())], [rnd.randrange(16, vocab) for _ in range(args.tokens)])
            for _ in range(args.rows)]
    batch = ScoreBatch([ScoreRequest(p, c, 1) for p, c in rows])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def tool() -> list[list[float]]:
        got = engine.score_batch(batch)
        wire = pickle.dumps([StepColumns.from_steps(s) for s in got], protocol=pickle.HIGHEST_PROTOCOL)
        return [list(c.column("logprob")) for c in pickle.loads(wire)]

    def bare() -> list[list[float]]:
        out = []
        with torch.inference_mode():
            for p, c in rows:
                ids = torch.tensor([p + c], device=dev)
                lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                idx = torch.arange(len(p) - 1, len(p) - 1 + len(c), device=dev)
                out.append(lp[idx, torch.tensor(c, device=dev)].tolist())
        return out

    def bare_batched() -> list[list[float]]:
        seqs = [p + c for p, c in rows]
        out: list = [None] * len(rows)
        with torch.inference_mode():
            for b in length_batches(seqs, args.bare_tokens):
                logits = padded_logits(model, seqs, b, dev)
                for x, i in enumerate(b):
                    p, c = rows[i]
                    lp = torch.log_softmax(logits[x, len(p) - 1: len(p) - 1 + len(c)].float(), dim=-1)
                    out[i] = lp.gather(1, torch.tensor(c, device=dev)[:, None])[:, 0].tolist()
        return out

    tool(), bare(), bare_batched()  # warm every path (allocator, kernels)
    legs = (("tool", tool), ("bare", bare), ("bare_batched", bare_batched))
    times: dict[str, list[float]] = {name: [] for name, _ in legs}
    cpu: dict[str, list[float]] = {name: [] for name, _ in legs}  # this process's CPU seconds: steadier on a shared CPU
    results = {}
    for _ in range(args.repeat):
        for name, fn in legs:
            sync()
            t, c = time.perf_counter(), time.process_time()
            results[name] = fn()
            sync()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    def diff(a: str, b: str) -> float:
        return max(abs(x - y) for p, r in zip(results[a], results[b]) for x, y in zip(p, r))

    worst = diff("tool", "bare")
    if args.score_batch in ("auto", "same-length", "one-row"):
        assert worst == 0.0, f"the tool's logprobs differ from bare teacher-forcing's by {worst}"
    med = {k: statistics.median(v) for k, v in times.items()}
    figures = {"model": args.model, "dtype": args.dtype, "device": str(dev), "rows": args.rows, "tokens": args.tokens,
               "vary": args.vary, "score_batch": resolved, "load_average": os.getloadavg(),
               "times_s": times, "median_s": med, "tool_over_bare": med["tool"] / med["bare"],
               "tool_over_bare_batched": med["tool"] / med["bare_batched"],
               "min_s": {k: min(v) for k, v in times.items()}, "tool_over_bare_min": min(times["tool"]) / min(times["bare"]),
               "tool_over_bare_batched_min": min(times["tool"]) / min(times["bare_batched"]),
               "cpu_s": cpu, "tool_over_bare_cpu": statistics.median(cpu["tool"]) / statistics.median(cpu["bare"]),
               "max_abs_logprob_diff": worst, "bare_batched_vs_one_row": diff("bare_batched", "bare")}
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        tool()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        print(s.getvalue())
    text = json.dumps(figures, indent=2)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
