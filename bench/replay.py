"""A replay through parity-ui against bare HF teacher-forcing the same rows, and the parent's memory
while a large dump streams through.

    python bench/replay.py --rows 1000 --tokens 512 [--model demo] [--dtype bfloat16]      # (a) GPU: time
    python bench/replay.py --memory --rows 10000 --tokens 2000 --model TINY_MODEL_FOLDER    # (b) CPU: memory
    python bench/replay.py --small                                                          # both, tiny, here
    python bench/replay.py --model TINY --dtype float32 --rows 512 --tokens 256 --score-batch padded \
        --bare-tokens 4096                                     # (a) on the CPU: the per-token costs show

(a) The tool: `run_replay` on a fresh ParityService over a synthetic dump in parity-ui's rollout
format (--rows rows: a prompt of the bench's chat prompts, --tokens response ids drawn from the
vocabulary with a fixed seed, recorded logprobs made up), sides trainer=hf (--dtype) and
rollout=vllm, no floor, the replay's default chunk unless --chunk. Its sides' times are what the
replay spent in each side's score_batch calls (the run records them: replay.score_s).
The bare engines, each in a fresh process with exactly the arguments the tool maps to, written as a
user would write them (issue 44):
- bare HF: the rows sorted by length and teacher-forced many a forward (right-padded, an attention
  mask, at most --bare-tokens tokens a forward), float32 log-softmax of the logits; then the same rows
  one a forward (what bench/replay.py compared with before), to tell whether padding moves a row's
  bits on this device ("padded_vs_one_row").
- bare vLLM: every row in ONE generate call (prompt + response as the prompt, max_tokens=1,
  prompt_logprobs), the tool's SamplingParams otherwise.
Like for like: the tool's trainer logprobs against bare HF's (same bits, or the difference named) and
its rollout side's against bare vLLM's. Goals: the trainer's time <= 1.2x bare batched HF's work; the
whole replay (a fresh process: start, load, score, compare, store) <= 1.5x the two bare processes'
wall times together.

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
    # --score-batch: the trainer's packing as asked (on the CPU, padded is what auto resolves to on a GPU
    # where padding keeps the bits, and what bare HF does: like for like; auto there is same-length).
    packing = f",score_batch={args.score_batch}" if getattr(args, "score_batch", None) else ""
    return [f"trainer=hf,dtype={args.dtype}{packing}", f"rollout=vllm,dtype={args.dtype}"]


def tool(args, dump: Path, db: str) -> dict:
    from parity_ui.core.config import build_config
    from parity_ui.service import ParityService, ReplayRequest
    from parity_ui.store.runs import pair_samples

    cfg = build_config(None, ["logprobs=1"], sides=_sides(args))
    t0 = time.perf_counter()
    svc = ParityService(db_path=db)
    chunk = {"chunk": args.chunk} if args.chunk else {}  # unset: the replay's own default
    run = svc.replay(ReplayRequest(dump=str(dump), model=args.model, config=cfg, floor="none", **chunk),
                     on_event=lambda e: e.kind == "progress" and print(f"  tool: {e.message}", flush=True))
    wall = time.perf_counter() - t0
    assert run.status in ("ok", "diverged"), run.error
    rep = run.workload.replay
    other = "again" if args.memory else "rollout"
    out = {"run_id": run.id, "wall_s": wall, "timings": run.timings, "score_s": rep.score_s,
           "forced": rep.forced, "tokens": rep.tokens, "headline": run.workload.headline}
    if not args.memory:
        rows: dict[int, list[float]] = {}
        side: dict[int, list[float]] = {}
        pair = next(p for p in rep.pairs if p.b == other and p.a == run.reference)  # "<other> vs <trainer>"
        for s in pair_samples(svc.db, run.id, pair.stored):
            rows[s.prompt_index] = list(s.logp_ref)  # the pair's a: the trainer
            side[s.prompt_index] = list(s.logp_side)  # its b: the rollout side
        out["trainer_logprobs"] = [rows[i] for i in sorted(rows)]
        out["rollout_logprobs"] = [side[i] for i in sorted(side)]
        out["score_batch"] = next((s.resolved.get("score_batch") for s in run.sides if s.name == "trainer"), None)
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
    """Teacher-force every row of the dump with the tool's own HF arguments: sorted by length, many rows
    a forward (right-padded), as a user would batch it; then one row a forward."""
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
    seqs = [r["prompt_ids"] + r["response_ids"] for r in rows]

    def logprobs_of(logits, r):  # [len, vocab] -> the response tokens' logprobs
        base, resp = len(r["prompt_ids"]), r["response_ids"]
        lp = torch.log_softmax(logits[base - 1: base - 1 + len(resp)].float(), dim=-1)
        return lp.gather(1, torch.tensor(resp, device=dev)[:, None])[:, 0].tolist()

    def sync():
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    order = sorted(range(len(rows)), key=lambda i: -len(seqs[i]))
    batches, cur = [], []
    for i in order:  # longest first, as many rows as fit --bare-tokens (rows x the longest)
        if cur and (len(cur) + 1) * len(seqs[cur[0]]) > args.bare_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    with torch.inference_mode():
        model(input_ids=torch.tensor([seqs[0][:8]], device=dev))  # the first call's one-time costs
        sync()
        t = time.perf_counter()
        batched: list = [None] * len(rows)
        for b in batches:
            w = len(seqs[b[0]])
            ids = torch.tensor([seqs[i] + [0] * (w - len(seqs[i])) for i in b], device=dev)
            mask = torch.tensor([[1] * len(seqs[i]) + [0] * (w - len(seqs[i])) for i in b], device=dev)
            logits = model(input_ids=ids, attention_mask=mask).logits
            for x, i in enumerate(b):
                batched[i] = logprobs_of(logits[x], rows[i])
        sync()
        batched_s = time.perf_counter() - t
        t = time.perf_counter()
        alone = [logprobs_of(model(input_ids=torch.tensor([s], device=dev)).logits[0], r) for s, r in zip(seqs, rows)]
        sync()
        alone_s = time.perf_counter() - t
    diff = max(abs(a - b) for x, y in zip(batched, alone) for a, b in zip(x, y))
    q.put({"logprobs": batched, "logprobs_one_row": alone, "work_s": batched_s, "one_row_s": alone_s,
           "forwards": len(batches), "padded_vs_one_row": diff, "wall_s": time.perf_counter() - t0})


def bare_vllm(args, q) -> None:
    """Every row of the dump in one vLLM generate call: prompt logprobs over prompt + response."""
    t0 = time.perf_counter()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prep = _prep(args)
    v = prep.side("rollout").args
    os.environ.update(v.env)
    from vllm import LLM, SamplingParams

    rows = [json.loads(line) for line in open(args.dump_path)]
    llm = LLM(**v.llm)
    t = time.perf_counter()
    sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": r["prompt_ids"] + r["response_ids"]} for r in rows], sp, use_tqdm=False)
    lps = []
    for r, o in zip(rows, outs):
        base = len(r["prompt_ids"])
        lps.append([o.prompt_logprobs[base + j][tid].logprob for j, tid in enumerate(r["response_ids"])])
    q.put({"logprobs": lps, "work_s": time.perf_counter() - t, "wall_s": time.perf_counter() - t0})


def _worst(a: list, b: list) -> float:
    assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)), "the rows do not line up"
    return max((abs(x - y) for p, r in zip(a, b) for x, y in zip(p, r)), default=0.0)


def speed(args, work: Path) -> dict:
    dump = work / "dump.jsonl"
    write_dump(dump, args.model, args.rows, args.tokens)
    args.dump_path = str(dump)
    print(f"tool: replay of {args.rows} rows x {args.tokens} tokens", flush=True)
    t = tool(args, dump, str(work / "speed.db"))
    prep = _prep(args)
    print("bare HF: teacher-forcing the same rows, batched, then one a forward", flush=True)
    h = in_fresh_process(bare_hf, args, prep.side("trainer").worker_env)
    print("bare vLLM: every row in one generate call, prompt logprobs", flush=True)
    v = in_fresh_process(bare_vllm, args, prep.side("rollout").worker_env)
    trainer = t["trainer_logprobs"]
    vs_one_row, vs_batched = _worst(trainer, h["logprobs_one_row"]), _worst(trainer, h["logprobs"])
    # Not a misaligned row or another row's context: those move logprobs by whole nats.
    assert min(vs_one_row, vs_batched) <= 1e-3, f"the tool's trainer logprobs differ from bare HF's by {vs_one_row}"
    rollout_diff = _worst(t["rollout_logprobs"], v["logprobs"])
    assert rollout_diff <= 1e-2 or args.dtype != "float32", f"bare vLLM's logprobs differ by {rollout_diff}"
    trainer_s, rollout_s = t["score_s"]["trainer"], t["score_s"]["rollout"]
    bare_sum = h["wall_s"] + v["wall_s"]
    return {"rows": args.rows, "tokens": args.tokens, "dtype": args.dtype, "model": args.model,
            "tool": {k: t[k] for k in ("run_id", "wall_s", "timings", "score_s", "forced", "headline", "score_batch")},
            "bare_hf": {k: h[k] for k in ("work_s", "one_row_s", "forwards", "wall_s", "padded_vs_one_row")},
            "bare_vllm": {k: v[k] for k in ("work_s", "wall_s")},
            "trainer_vs_bare_one_row_max_abs_diff": vs_one_row, "trainer_vs_bare_batched_max_abs_diff": vs_batched,
            "rollout_vs_bare_vllm_max_abs_diff": rollout_diff,
            "trainer_over_bare_batched": trainer_s / h["work_s"], "trainer_over_bare_one_row": trainer_s / h["one_row_s"],
            "rollout_over_bare_vllm": rollout_s / v["work_s"], "whole_over_bare_sum": t["wall_s"] / bare_sum,
            "goals": {"trainer_over_bare_batched": 1.2, "whole_over_bare_sum": 1.5},
            "meets_goals": {"trainer": trainer_s / h["work_s"] <= 1.2, "whole": t["wall_s"] / bare_sum <= 1.5}}


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
    ap.add_argument("--chunk", type=int, default=0, help="rows replayed and stored together (0: the replay's default)")
    ap.add_argument("--score-batch", choices=["auto", "padded", "same-length", "one-row"],
                    help="the trainer side's score_batch (unset: the side's default, auto)")
    ap.add_argument("--bare-tokens", type=int, default=8192,
                    help="the bare HF's tokens a forward (rows x the longest, padding included)")
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
        args.rows, args.tokens, args.chunk = 40, 64, 0
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
