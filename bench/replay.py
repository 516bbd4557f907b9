"""A replay through parity-ui against bare HF teacher-forcing the same rows, and the parent's memory
while a large dump streams through.

    python bench/replay.py --rows 1000 --tokens 512 [--model demo] [--dtype bfloat16]      # (a) GPU: time
    python bench/replay.py --memory --rows 10000 --tokens 2000 --model TINY_MODEL_FOLDER    # (b) CPU: memory
    python bench/replay.py --small                                                          # both, tiny, here

(a) The tool: `run_replay` on a fresh ParityService over a synthetic dump in parity-ui's rollout
format (--rows rows: a prompt of the bench's chat prompts, --tokens response ids drawn from the
vocabulary with a fixed seed, recorded logprobs made up), sides trainer=hf (--dtype) and
rollout=vllm, no floor. Its trainer side's time is the time the replay spent in that side's
score_batch calls (the run records it: replay.score_s). The bare engine: HF loaded in a fresh
process with exactly the arguments the tool maps to, one teacher-forced forward pass per row, as
the tool's HF engine does. Like for like (asserted): the bare logprobs equal the tool's stored
trainer logprobs. Goal: tool trainer time / bare time <= 1.2.

(b) The parent process's peak memory (ru_maxrss, and tracemalloc's peak of Python allocations) while
a dump of --rows x --tokens streams through a replay (sides: two HF sides on the CPU, float32, no
floor; the dump is written first, streamed, so writing it costs the parent nothing).

Writes the figures as JSON to --out (or $OUT/replay.json when $OUT is set) and prints them.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines, workload

from bare_engines import in_fresh_process  # noqa: E402


def write_dump(path: Path, model: str, rows: int, tokens: int, seed: int = 0) -> int:
    """A synthetic dump in parity-ui's rollout format, written one row at a time. Returns the vocab size."""
    from parity_ui.inputs.models import describe_model
    from parity_ui.inputs.prompts import tokenizer_for

    from workload import prompts

    tok = tokenizer_for(describe_model(model).path, False).tok
    vocab = len(tok)
    rnd = random.Random(seed)
    asks = prompts(min(rows, 250))
    encoded = [list(tok(a, add_special_tokens=True)["input_ids"]) for a in asks]
    with open(path, "w") as f:
        for i in range(rows):
            resp = [rnd.randrange(16, vocab) for _ in range(tokens)]
            f.write(json.dumps({"prompt_ids": encoded[i % len(encoded)], "response_ids": resp,
                                "rollout_logprobs": [round(-rnd.random() * 8, 4) for _ in range(tokens)],
                                "sampling": {"temperature": 1.0, "logprobs_mode": "raw_logprobs"}}) + "\n")
    return vocab


def _sides(args) -> list[str]:
    if args.memory:
        return [f"trainer=hf,dtype={args.dtype}", f"again=hf,dtype={args.dtype},attn_implementation=eager"]
    return [f"trainer=hf,dtype={args.dtype}", f"rollout=vllm,dtype={args.dtype}"]


def tool(args, dump: Path, db: str) -> dict:
    from parity_ui.core.config import build_config
    from parity_ui.service import ParityService, ReplayRequest
    from parity_ui.store.runs import pair_samples

    cfg = build_config(None, ["logprobs=1"], sides=_sides(args))
    t0 = time.perf_counter()
    svc = ParityService(db_path=db)
    run = svc.replay(ReplayRequest(dump=str(dump), model=args.model, config=cfg, floor="none", chunk=args.chunk),
                     on_event=lambda e: e.kind == "progress" and print(f"  tool: {e.message}", flush=True))
    wall = time.perf_counter() - t0
    assert run.status in ("ok", "diverged"), run.error
    rep = run.workload.replay
    other = "again" if args.memory else "rollout"
    out = {"run_id": run.id, "wall_s": wall, "timings": run.timings, "score_s": rep.score_s,
           "forced": rep.forced, "tokens": rep.tokens, "headline": run.workload.headline}
    if not args.memory:
        rows: dict[int, list[float]] = {}
        pair = next(p for p in rep.pairs if p.b == other and p.a == run.reference)  # "<other> vs <trainer>"
        for s in pair_samples(svc.db, run.id, pair.stored):
            rows[s.prompt_index] = list(s.logp_ref)  # the pair's a: the trainer
        out["trainer_logprobs"] = [rows[i] for i in sorted(rows)]
    svc.close()
    return out


def _prep(args):
    """The tool's plan of the sides (the mapped HF arguments and the worker's environment)."""
    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.plan import RunRequest
    from parity_ui.run.prepare import prepare

    with open(args.dump_path) as f:
        first = json.loads(f.readline())
    cfg = build_config(None, ["logprobs=1", f"max_new_tokens={args.tokens + 1}"], sides=_sides(args))
    return prepare(RunRequest(model=args.model, prompts=[PromptSpec(text="x", token_ids=first["prompt_ids"])],
                              config=cfg), gpu=on_gpu())


def bare_hf(args, q) -> None:
    """Teacher-force every row of the dump, one forward pass each, with the tool's own HF arguments."""
    t0 = time.perf_counter()
    import torch

    from bare_engines import load_bare_hf

    rows = [json.loads(line) for line in open(args.dump_path)]
    prep = _prep(args)

    class View:  # load_bare_hf reads the side named "hf"
        model, prompts = prep.model, prep.prompts

        def side(self, name):
            return prep.side("trainer" if name == "hf" else name)

    model, _, _ = load_bare_hf(View())
    dev = prep.side("trainer").args.device
    t = time.perf_counter()
    out = []
    with torch.inference_mode():
        for r in rows:
            ids = torch.tensor([r["prompt_ids"] + r["response_ids"]], device=dev)
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            base = len(r["prompt_ids"])
            idx = torch.arange(base - 1, base - 1 + len(r["response_ids"]), device=dev)
            out.append(lp[idx, torch.tensor(r["response_ids"], device=dev)].tolist())
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    q.put({"logprobs": out, "work_s": time.perf_counter() - t, "wall_s": time.perf_counter() - t0})


def speed(args, work: Path) -> dict:
    dump = work / "dump.jsonl"
    write_dump(dump, args.model, args.rows, args.tokens)
    args.dump_path = str(dump)
    print(f"tool: replay of {args.rows} rows x {args.tokens} tokens", flush=True)
    t = tool(args, dump, str(work / "speed.db"))
    print("bare HF: teacher-forcing the same rows", flush=True)
    h = in_fresh_process(bare_hf, args, _prep(args).side("trainer").worker_env)
    worst = max(abs(a - b) for x, y in zip(h["logprobs"], t["trainer_logprobs"]) for a, b in zip(x, y))
    assert len(h["logprobs"]) == len(t["trainer_logprobs"]) == args.rows
    assert worst <= 1e-5, f"bare HF's teacher-forced logprobs differ from the tool's trainer side by {worst}"
    trainer_s = t["score_s"]["trainer"]
    return {"rows": args.rows, "tokens": args.tokens, "dtype": args.dtype, "model": args.model,
            "tool": {k: t[k] for k in ("run_id", "wall_s", "timings", "score_s", "forced", "headline")},
            "bare_hf": {"work_s": h["work_s"], "wall_s": h["wall_s"]}, "max_abs_logprob_diff": worst,
            "trainer_over_bare": trainer_s / h["work_s"], "goal": 1.2, "meets_goal": trainer_s / h["work_s"] <= 1.2}


def memory(args, work: Path) -> dict:
    dump = work / "memory.jsonl"
    t0 = time.perf_counter()
    write_dump(dump, args.model, args.rows, args.tokens)
    written = time.perf_counter() - t0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.tracemalloc:  # Python's allocations too, at a price: every allocation traced (pooling ~20x slower)
        tracemalloc.start()
    t = tool(args, dump, str(work / "memory.db"))
    py_peak = tracemalloc.get_traced_memory()[1] if args.tracemalloc else None
    tracemalloc.stop()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": args.rows, "tokens": args.tokens, "dump_mib": dump.stat().st_size / 2**20,
            "dump_written_s": written, "peak_rss_mib": after / 1024, "rss_before_mib": before / 1024,
            "python_alloc_peak_mib": py_peak / 2**20 if py_peak is not None else None, "wall_s": t["wall_s"], "score_s": t["score_s"],
            "tokens_replayed": t["tokens"], "headline": t["headline"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=64, help="rows replayed and stored together")
    ap.add_argument("--memory", action="store_true", help="(b): the parent's peak memory only (HF sides, no bare run)")
    ap.add_argument("--no-tracemalloc", dest="tracemalloc", action="store_false",
                    help="with --memory: peak RSS only, without tracing Python's allocations (which slows the run)")
    ap.add_argument("--small", action="store_true", help="a tiny model built here, both parts at a few rows (the CPU)")
    ap.add_argument("--work", default="/tmp/parity-bench-replay", help="a folder for the dumps and databases")
    ap.add_argument("--out", help="write the figures as JSON here (default $OUT/replay.json when $OUT is set)")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.small:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tiny_models import build_model

        folder = work / "tiny-llama"
        if not (folder / "config.json").exists():
            build_model(folder, "llama")
        args.model, args.dtype = str(folder), "float32"
        args.rows, args.tokens, args.chunk = 40, 64, 16
        figures = {"speed": speed(args, work)}
        args.memory, args.rows, args.tokens = True, 300, 256
        figures["memory"] = memory(args, work)
    elif args.memory:
        figures = {"memory": memory(args, work)}
    else:
        figures = {"speed": speed(args, work)}
    text = json.dumps(figures, indent=2)
    print(text, flush=True)
    out = args.out or (str(Path(os.environ["OUT"]) / "replay.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
