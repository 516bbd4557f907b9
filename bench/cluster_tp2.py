"""A TP=2 replica group on Ray against TP=1 (issue 46 item 19), on a machine with 2 GPUs, through the CLI.

The demo model (SmolLM2-135M-Instruct) has 9 attention heads and 3 KV heads: vLLM refuses TP=2 on it.
So this first writes a copy whose attention is padded to 12 heads and 4 KV heads with zero weights
(the new heads' queries, keys and values are zero and o_proj's columns for them are zero: the same
function as the trained model, up to the summation order of a wider o_proj), which TP=2 splits into
6 heads and 2 KV heads a rank. `--model FOLDER` takes another model instead (its heads must divide by 2).

Then one free-running workload (16 chat prompts, greedy, 64 tokens, bf16, sides ref=hf and b=vllm
eager (--graphs: with CUDA graphs), floor off), run by `python3 -m parity_ui.cli compare` in its own process with its own database:
  tp1          --side b=vllm                          --cluster local --replicas 1  (1 group of 1 GPU)
  tp2          --side b=vllm,tensor_parallel_size=2   --cluster local --replicas 1  (1 group of 2 GPUs:
               b on both, ref on the first)
  tp2-process  the same as tp2 without --cluster (the in-process layout the cluster's should match)
Written to OUT/cluster_tp2.json (lines starting "[bench-tp2]" printed): each run's exit code, wall (the
command, Ray and engines started) and phases, its cluster record and sides (what each engine resolved);
every run's tokens against tp1's per side (prompts with other tokens, where each first differs); b
against ref in each run (prompts identical, first divergences); the worker logs' lines on vLLM's executor.
The JSON is written again after each run, so a call cut short keeps the runs that finished. The exit
code is 0 when every run finished (ok or diverged), whatever the tokens.

    PARITY_GPU_EXTRA="ray==2.60.0" bash ../shared/gpu/build-bundle.sh   # here: Ray travels in the bundle
    python3 bench/cluster_tp2.py --out $OUT                              # there, device-env.sh sourced
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPICS = ["gravity", "photosynthesis", "black holes", "compound interest", "DNA", "volcanoes", "jazz", "chess"]
ASKS = ["Give me a brief explanation of {t} in simple terms.", "Write three facts about {t}."]
EXECUTOR = re.compile(r"executor|multiproc|distributed|world.size|tensor.parallel|nccl", re.I)


def say(msg: str) -> None:
    print(f"[bench-tp2] {msg}", flush=True)


def pad_heads(src: Path, dst: Path, heads: int = 12, kv_heads: int = 4) -> Path:
    """A Llama folder's copy with its attention padded to `heads` query heads and `kv_heads` KV heads of
    zero weights. The new query heads follow the old ones and fall in the new KV groups (query head h
    reads KV head h // (heads / kv_heads), as before for the old ones), so the old heads are untouched."""
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    old_h, old_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // old_h
    if heads // kv_heads != old_h // old_kv or heads < old_h or kv_heads < old_kv:
        raise SystemExit(f"cannot pad {old_h}/{old_kv} heads to {heads}/{kv_heads} keeping the groups")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy2(f, dst / f.name)
    for f in sorted(src.glob("*.safetensors")):
        out = {}
        for name, t in load_file(str(f)).items():
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                n = heads if "q_proj" in name else kv_heads
                t = torch.cat([t, t.new_zeros(n * hd - t.shape[0], t.shape[1])], dim=0)
            elif name.endswith("o_proj.weight"):
                t = torch.cat([t, t.new_zeros(t.shape[0], heads * hd - t.shape[1])], dim=1)
            out[name] = t.contiguous()
        save_file(out, str(dst / f.name), metadata={"format": "pt"})
    cfg.update(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hd)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def run_cli(name: str, args, model: str, prompt_file: Path, b_side: str, cluster: bool) -> dict:
    """One `parity compare` in its own process and database; its run read back from the database."""
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    db = work / "runs.db"
    cmd = [
        sys.executable,
        "-m",
        "parity_ui.cli",
        "--db",
        str(db),
        "compare",
        "--model",
        model,
        "--prompt-file",
        str(prompt_file),
        "--side",
        "ref=hf",
        "--side",
        b_side,
        "--set",
        f"dtype={args.dtype}",
        "--set",
        f"max_new_tokens={args.tokens}",
        "--set",
        "ignore_eos=true",
        "--set",
        "chat=true",
        "--mode",
        "free",
        "--floor",
        "none",
        "--chunk",
        str(args.chunk),
    ]
    if cluster:
        cmd += ["--cluster", "local", "--replicas", "1"]
    say(f"{name}: {' '.join(cmd[1:])}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0, since = time.perf_counter(), time.time()
    rc: int | str
    with (
        open(Path(args.out) / f"{name}.stdout.txt", "w") as out,
        open(Path(args.out) / f"{name}.stderr.txt", "w") as err,
    ):
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = round(time.perf_counter() - t0, 2)
    res: dict = {
        "name": name,
        "b_side": b_side,
        "cluster": cluster,
        "rc": rc,
        "wall_s": wall,
        "executor_log": executor_lines(since),
    }
    row = (
        sqlite3.connect(db).execute("SELECT id FROM runs ORDER BY datetime_utc DESC LIMIT 1").fetchone()
        if db.exists()
        else None
    )
    if row is None:
        say(f"{name}: rc {rc}, no run stored (see {name}.stderr.txt)")
        return res
    from parity_ui.core.types import to_dict
    from parity_ui.service import ParityService

    svc = ParityService(db_path=str(db))
    try:
        run = svc.get_run(row[0])
    finally:
        svc.close()
    if run is None:
        return res
    res.update(
        run_id=run.id,
        status=run.status,
        error=run.error,
        timings=run.timings,
        cluster_record=run.workload.cluster if run.workload else None,
        sides=[
            {
                k: v
                for k, v in to_dict(s).items()
                if k in ("name", "kind", "device", "dtype", "resolved", "load_s", "options")
            }
            for s in run.sides
        ],
        tokens={
            side: {p.index: list(p.results[side].token_ids) for p in run.prompts if side in p.results}
            for side in ("ref", "b")
        },
    )
    say(
        f"{name}: rc {rc}, status {run.status}, wall {wall} s, {len(run.prompts)} prompts"
        + (f", error: {run.error}" if run.error else "")
    )
    return res


def executor_lines(since: float) -> list[str]:
    """The worker logs' lines (written since `since`) on vLLM's distributed executor: which it chose."""
    logs = Path.home() / ".cache" / "parity-ui" / "logs"
    out: list[str] = []
    for f in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        if f.stat().st_mtime >= since:
            out += [
                f"{f.name}: {ln.strip()[:300]}"
                for ln in f.read_text(errors="replace").splitlines()
                if EXECUTOR.search(ln)
            ]
    return out[:40]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def against(tokens: dict, base: dict) -> dict:
    """Prompts whose tokens differ from `base`'s, and where each first differs."""
    where = {i: first_difference(base[i], tokens.get(i, [])) for i in base}
    where = {i: d for i, d in where.items() if d is not None}
    return {"prompts": len(base), "with_other_tokens": len(where), "first_difference_at": where}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a folder whose heads divide by 2 (default: the demo model, padded)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--graphs", action="store_true", help="vLLM with CUDA graphs (default eager: no cold compile)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds a run may take")
    ap.add_argument("--runs", default="tp1,tp2,tp2-process", help="which runs, in order")
    ap.add_argument("--work", default="/tmp/bench-tp2")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.model:
        model = args.model
    else:
        t = time.perf_counter()
        model = str(pad_heads(Path(os.environ["PARITY_DEMO_MODEL"]), Path(args.work) / "smollm2-135m-12h"))
        say(f"padded the demo model to 12 heads / 4 KV heads in {time.perf_counter() - t:.1f} s: {model}")
    texts = [a.format(t=t) for a in ASKS for t in TOPICS]
    prompt_file = Path(args.work) / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": texts[i % len(texts)]}) + "\n" for i in range(args.prompts)))

    b = "b=vllm" + ("" if args.graphs else ",enforce_eager=true")
    plan = {
        "tp1": (b, True),
        "tp2": (f"{b},tensor_parallel_size=2", True),
        "tp2-process": (f"{b},tensor_parallel_size=2", False),
    }
    runs: dict = {}
    for name in args.runs.split(","):
        b_side, cluster = plan[name]
        runs[name] = run_cli(name, args, model, prompt_file, b_side, cluster)
        write(args, model, runs)  # after each run: a call cut short keeps what finished
    return 0 if all(r.get("status") in ("ok", "diverged") for r in runs.values()) else 1


def write(args, model: str, runs: dict) -> None:
    base = runs.get("tp1", {}).get("tokens")
    for name, r in runs.items():
        tok = r.get("tokens")
        if not tok:
            continue
        r["b_vs_ref"] = against(tok["b"], tok["ref"])
        if base and name != "tp1":
            r["against_tp1"] = {side: against(tok[side], base[side]) for side in ("ref", "b")}
            say(
                f"{name} against tp1: prompts with other tokens: ref {r['against_tp1']['ref']['with_other_tokens']}, "
                f"b {r['against_tp1']['b']['with_other_tokens']} (of {len(base['b'])})"
            )
        if "tp2" in runs and "tp2-process" in runs and name == "tp2-process" and runs["tp2"].get("tokens"):
            r["against_tp2_on_ray"] = {side: against(tok[side], runs["tp2"]["tokens"][side]) for side in ("ref", "b")}
        say(
            f"{name}: b vs ref: {r['b_vs_ref']['with_other_tokens']} of {r['b_vs_ref']['prompts']} prompts differ; "
            f"cluster: {json.dumps(r.get('cluster_record'))[:600]}"
        )
    result = {
        "model": model,
        "prompts": args.prompts,
        "max_new_tokens": args.tokens,
        "dtype": args.dtype,
        "chunk": args.chunk,
        "runs": {n: {k: v for k, v in r.items() if k != "tokens"} for n, r in runs.items()},
        "streams": {n: r.get("tokens") for n, r in runs.items()},
    }  # each run's token ids, per side and prompt
    (Path(args.out) / "cluster_tp2.json").write_text(json.dumps(result, indent=1, default=str))
    say(f"written {Path(args.out) / 'cluster_tp2.json'} ({', '.join(runs)})")


if __name__ == "__main__":
    raise SystemExit(main())
