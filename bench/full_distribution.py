"""What the whole-distribution figures cost (issue 31 item 3): the same scored workload with and without
`full_distribution`, in one run. Goal: with / without <= 1.3x.

Both runs go through the tool (`run_workload` on a fresh ParityService each: workers start, load,
generate, score, store, pool; the floor is off), sides ref=hf (the reference, teacher-forcing) and
b=vllm at --batch. With full_distribution the vLLM side writes its full rows as it generates
(its rows logits processor), the HF reference meets them while scoring and computes KL both ways, TV,
top-1 and top-k per position on its device. Asserted like for like: both runs make the same tokens
(vLLM is greedy), and the second has a figure at every position. Prints and writes (--out) each run's
wall and work time (the generate + pool phases), the ratios, the pooled distribution figures and the
bytes the rows took (vocabulary x tokens x 4 B per sequence, a chunk's worth on disk at a time).

Runs where gradio and plotly are absent (the GPU machine). Which run goes first alternates with
--order (the first pays the page cache's and vLLM's compile warm-up; --warm runs a small workload first).

CPU (tiny model, a minute or two; measured 0.92x wall / 0.85x work on a shared 2-core machine, noise):
    python bench/full_distribution.py --small
GPU (the demo model; results in $OUT):
    python bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 \
        --chunk 250 --dtype bfloat16 --out "$OUT/full_distribution.json"
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/workload.py's prompts
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_models (--small)

from workload import prompts  # noqa: E402  (bench/workload.py's 250 distinct prompts)


def run(args, full: bool, db: str, n_prompts: int | None = None, sync: bool = False) -> dict:
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.config import build_config
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.service import ParityService
    from parity_ui.store.runs import get_run

    n = n_prompts or args.prompts
    cfg = build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.tokens}", "ignore_eos=true",
                              "logprobs=5", f"full_distribution={'true' if full else 'false'}",
                              f"full_distribution_budget_mb={args.budget_mb}"],
                       sides=["ref=hf", f"b=vllm,batch_size={args.batch}" + (",async_scheduling=false" if sync else "")])
    if sync:  # what full_distribution sets for vLLM on a GPU (core.mapping._vllm_full_rows), here without the rows
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    t0 = time.perf_counter()
    svc = ParityService(db_path=db)
    req = WorkloadRequest(model=args.model, prompts=[PromptSpec(text=p) for p in prompts(n)], config=cfg,
                          options=WorkloadOptions(mode="scored", floor="none", chunk=args.chunk))
    label = "with" if full else "without, synchronous vLLM" if sync else "without"
    r = run_workload(svc, req, emit=lambda e: e.kind == "progress" and print(f"  {label}: {e.message}", flush=True))
    wall = time.perf_counter() - t0
    assert r.status in ("ok", "diverged"), r.error
    got = get_run(svc.db, r.id)
    tokens = [p.results["b"].token_ids for p in got.prompts]
    kl = [s.kl for p in got.prompts for s in p.results["b"].steps]
    svc.close()
    if sync:
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    w = got.workload.sides["b"]
    return {"run_id": r.id, "wall_s": wall, "work_s": r.timings.get("generate", 0) + r.timings.get("pool", 0),
            "timings": r.timings, "tokens": tokens, "positions_with_kl": sum(x is not None for x in kl),
            "positions": sum(len(t) for t in tokens), "distribution": w.stats.family("distribution"),
            "verdict": w.verdicts.get("distribution"), "warnings": [x.message for x in got.warnings]}


def _where(need: int) -> str:
    """Where the tool kept a chunk's rows (measures.scratch's choice for this size)."""
    from parity_ui.measures import scratch as rows_scratch

    if os.environ.get("PARITY_ROWS_DIR"):
        return f"{os.environ['PARITY_ROWS_DIR']} (named)"
    return "/dev/shm (memory)" if rows_scratch._shm_holds(need) else "the temp dir (disk)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256, help="the vLLM side's batch size")
    ap.add_argument("--chunk", type=int, default=250, help="the workload's chunk (a chunk's rows sit on disk)")
    ap.add_argument("--budget-mb", type=int, default=1024)
    ap.add_argument("--order", choices=["without-first", "with-first"], default="without-first")
    ap.add_argument("--warm", action="store_true", help="a small workload first (page cache, compile caches)")
    ap.add_argument("--small", action="store_true", help="CPU: the tiny test model, 8 prompts x 16 tokens")
    ap.add_argument("--work", default=None, help="a folder for the databases (default: a temp dir)")
    ap.add_argument("--out", help="write the figures as JSON here too")
    ap.add_argument("--like-for-like", action="store_true",
                    help="a third run: without the rows but with vLLM as full_distribution runs it on a GPU (no async "
                         "scheduling, the V1 runner): separates the rows' own cost from that setting's")
    ap.add_argument("--rows-dir", help="keep the rows here (PARITY_ROWS_DIR; default: in memory, /dev/shm, where "
                                       "it holds a chunk, else the temp dir)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.rows_dir:
        os.environ["PARITY_ROWS_DIR"] = args.rows_dir
    work = Path(args.work or tempfile.mkdtemp(prefix="parity-bench-full-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.small:
        from tiny_models import build_model

        args.model = str(build_model(work / "tiny-llama", "llama"))
        args.prompts, args.tokens, args.batch, args.chunk, args.dtype = 8, 16, 8, 8, "float32"
    if args.warm:
        run(args, True, str(work / "warm.db"), n_prompts=min(args.prompts, 16))
    order = [False, True] if args.order == "without-first" else [True, False]
    runs = {}
    for full in order:
        runs[full] = run(args, full, str(work / f"{'with' if full else 'without'}.db"))
    with_, without = runs[True], runs[False]
    sync = run(args, False, str(work / "without-sync.db"), sync=True) if args.like_for_like else None
    if sync is not None:
        assert sync["tokens"] == with_["tokens"], "the synchronous run made other tokens: not like for like"
    assert with_["tokens"] == without["tokens"], "the two runs made different tokens: not like for like"
    assert with_["positions_with_kl"] == with_["positions"], (with_["positions_with_kl"], with_["positions"])
    assert without["positions_with_kl"] == 0
    vocab = None
    try:
        from parity_ui.inputs.models import describe_model

        vocab = describe_model(args.model).vocab_size
    except Exception:  # noqa: BLE001 - a figure for the report, not the measurement
        pass
    per_seq = vocab * args.tokens * 4 if vocab else None
    figures = {
        "model": args.model, "dtype": args.dtype, "prompts": args.prompts, "tokens": args.tokens, "batch": args.batch,
        "chunk": args.chunk, "order": args.order, "vocab": vocab,
        "rows_bytes_per_sequence": per_seq, "rows_bytes_per_chunk_on_disk": per_seq * args.chunk if per_seq else None,
        "rows_bytes_total_written": per_seq * args.prompts if per_seq else None,
        "without": {k: v for k, v in without.items() if k != "tokens"},
        "with": {k: v for k, v in with_.items() if k != "tokens"},
        "ratio_wall": with_["wall_s"] / without["wall_s"], "ratio_work": with_["work_s"] / without["work_s"],
        "same_tokens": True, "goal": "ratio <= 1.3",
        "rows_scratch": _where(per_seq * args.chunk if per_seq else 0),
    }
    if sync is not None:
        figures["without_sync"] = {k: v for k, v in sync.items() if k != "tokens"}
        figures["ratio_wall_rows_only"] = with_["wall_s"] / sync["wall_s"]
        figures["ratio_work_rows_only"] = with_["work_s"] / sync["work_s"]
        figures["ratio_work_sync_setting"] = sync["work_s"] / without["work_s"]
    print(json.dumps(figures, indent=2), flush=True)
    print(f"full_distribution: with / without = {figures['ratio_wall']:.2f}x wall, {figures['ratio_work']:.2f}x work "
          f"({args.prompts} prompts x {args.tokens} tokens, {args.dtype}); KL(ref||side) mean "
          f"{(with_['distribution'] or {}).get('kl_mean')}", flush=True)
    if sync is not None:
        print(f"  the rows alone (against the same synchronous vLLM without them): {figures['ratio_wall_rows_only']:.2f}x "
              f"wall, {figures['ratio_work_rows_only']:.2f}x work; synchronous vLLM against its default: "
              f"{figures['ratio_work_sync_setting']:.2f}x work", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
