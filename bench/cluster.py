"""A workload on a local Ray instance: 2 replicas a side against 1, in one run (and the in-process path
beside them), the same tokens asserted, the wall-time ratio printed and written.

    # the GPU machine with 2 GPUs (the goal: 2 replicas take <= 0.6x the time of 1 in the scored workload)
    python3 bench/cluster.py --out $OUT
    # the CPU (this proves it runs; 2 cores give no speed-up): a tiny model, a few prompts
    python bench/cluster.py --small

Two workloads, sides ref=hf (batch 1, the reference) and b=vllm (batched), floor off:
- scored (--prompts, default 1000): vLLM generates, the HF reference teacher-forces each sequence;
- free (--free-prompts, default 64): both generate; the reference's batch-1 decode is the long part.
Each runs in process (unless --no-in-process), then on the cluster with 1 replica a side, then with --replicas
(default 2) a side, one service (one Ray instance) for all. Asserted (after the figures are written): every
run made the same tokens on every side. Printed
(lines starting "[bench-cluster]") and written to OUT/cluster.json: each run's wall time (replicas
started or loaded, then the work) and its work alone (the generate phase), and the ratios N:1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from workload import prompts  # noqa: E402  (bench/workload.py: the same 250 chat prompts, varied)


def say(msg: str) -> None:
    print(f"[bench-cluster] {msg}", flush=True)


def config(args):
    from parity_ui.core.config import build_config

    return build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.tokens}", "ignore_eos=true",
                               f"chat={'false' if args.small else 'true'}", "logprobs=5"],
                        sides=["ref=hf", f"b=vllm,batch_size={args.batch}"])


def one(svc, args, mode: str, n: int, cluster: str | None, replicas: int) -> dict:
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.inputs.prompts import PromptSpec

    opts = WorkloadOptions(mode=mode, floor="none", chunk=args.chunk, cluster=cluster,
                           replicas={"*": replicas} if cluster else {})
    req = WorkloadRequest(model=args.model, prompts=[PromptSpec(text=p) for p in prompts(n)], config=config(args),
                          options=opts)
    where = f"{replicas} replica(s)" if cluster else "in process"
    t = time.perf_counter()
    last = [0.0]

    def emit(e) -> None:
        if e.kind == "progress" and time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            say(f"  {mode} {where}: {e.message}")

    run = run_workload(svc, req, emit)
    wall = time.perf_counter() - t
    assert run.status in ("ok", "diverged"), f"{mode} {where}: {run.status}: {run.error}"
    assert run.workload.done == n, f"{mode} {where}: {run.workload.done} of {n} prompts done"
    got = svc.get_run(run.id)
    tokens = {s: [list(p.results[s].token_ids) for p in got.prompts] for s in ("ref", "b")}
    out = {"mode": mode, "where": where, "prompts": n, "run_id": run.id, "wall_s": round(wall, 2),
           "work_s": round(run.timings.get("generate", 0.0), 2), "timings": run.timings,
           "headline": run.workload.headline, "cluster": run.workload.cluster, "tokens": tokens}
    say(f"{mode} {where}: wall {wall:.1f} s, work {out['work_s']:.1f} s; {run.workload.headline}")
    return out


def measure(svc, args, mode: str, n: int) -> dict:
    runs = ([] if args.no_in_process else [one(svc, args, mode, n, None, 1)]) + [
        one(svc, args, mode, n, "local", 1), one(svc, args, mode, n, "local", args.replicas)]
    base = runs[0]["tokens"]
    differ = []  # asserted after the figures are written
    for r in runs[1:]:
        for side in ("ref", "b"):
            same = sum(a == b for a, b in zip(r["tokens"][side], base[side]))
            if same != n:
                differ.append(f"{mode} {r['where']}: side {side} made other tokens than {runs[0]['where']} on "
                              f"{n - same} of {n} prompts")
    one_, many = runs[-2], runs[-1]
    res = {"mode": mode, "prompts": n, "tokens_same": not differ, "differ": differ,
           "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
           "ratio_work": round(many["work_s"] / max(one_["work_s"], 1e-9), 3),
           "ratio_wall": round(many["wall_s"] / max(one_["wall_s"], 1e-9), 3)}
    same = "same tokens on every side in every run" if not differ else "OTHER TOKENS: " + "; ".join(differ)
    say(f"{mode}: {same}; {args.replicas}:1 replicas: work {res['ratio_work']}x, wall {res['ratio_wall']}x"
        + ("" if args.no_in_process else f" (in process: work {runs[0]['work_s']} s)"))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("PARITY_DEMO_MODEL", "demo"))
    ap.add_argument("--prompts", type=int, default=1000, help="the scored workload's prompts")
    ap.add_argument("--free-prompts", type=int, default=64, help="the free-running workload's prompts")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=64, help="the vLLM side's batch size")
    ap.add_argument("--chunk", type=int, default=64, help="prompts a block (a replica's unit of work)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--modes", default="scored,free")
    ap.add_argument("--small", action="store_true", help="the CPU: a tiny model, 6 prompts of 8 tokens, float32")
    ap.add_argument("--no-in-process", action="store_true", help="only the cluster runs (1 and N replicas)")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    if args.small:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_models import build_model

        args.model = str(build_model(work / "tiny", "llama"))
        args.prompts = args.free_prompts = 6
        args.tokens, args.dtype, args.batch, args.chunk = 8, "float32", 4, 3
    from parity_ui.service import ParityService

    svc = ParityService(db_path=str(work / "runs.db"))
    results = {"model": args.model, "dtype": args.dtype, "tokens": args.tokens, "replicas": args.replicas}
    try:
        for mode in args.modes.split(","):
            results[mode] = measure(svc, args, mode, args.prompts if mode == "scored" else args.free_prompts)
    finally:
        svc.close()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "cluster.json").write_text(json.dumps(results, indent=1, default=str))
    say(f"written {Path(args.out) / 'cluster.json'}")
    differ = [d for m in args.modes.split(",") for d in results[m]["differ"]]
    assert not differ, "; ".join(differ)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
