"""A replay through parity-ui against bare HF teacher-forcing the same rows, and the parent's memory
while a large dump streams through.

    python bench/replay.py --rows 1000 --tokens 512 [--model demo] [--dtype bfloat16]      # (a) GPU: time
    python bench/replay.py --memory --rows 10000 --tokens 2000 --model TINY_MODEL_FOLDER    # (b) CPU: memory
    python bench/replay.py --small                                                          # both, tiny, here
    python bench/replay.py --breakdown --rows 1000 --tokens 512 [--breakdown-chunks 16,64]  # (c) where it goes
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

(c) Where each side's scoring time goes: each side's engine alone in a fresh process (no pipe, no other
side on the device), scoring the dump's rows chunk by chunk as the replay's worker does, with the
engine's score_batch, the worker's from_steps, the pipe's pickling and the parent's unpickling timed
apart (HF: the forwards the packing makes, those of one row), for each of --breakdown-chunks; then the
bare engine's batched work on the same loaded model, its logprobs met with the tool's. Against (a): what
the full replay spends beyond these is the pipe, the parent and the two sides sharing one device.

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

    from bare_engines import length_batches, load_bare_hf, padded_logits

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

    batches = length_batches(seqs, args.bare_tokens)
    with torch.inference_mode():
        model(input_ids=torch.tensor([seqs[0][:8]], device=dev))  # the first call's one-time costs
        sync()
        t = time.perf_counter()
        batched: list = [None] * len(rows)
        for b in batches:
            logits = padded_logits(model, seqs, b, dev)
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


def breakdown_side(args, q) -> None:
    """(c) One side's engine (args.side: trainer or rollout) loaded in this process with the tool's own
    arguments, scoring the dump's rows a chunk at a time as the replay's worker does, each part timed:
    the engine's score_batch, the worker's from_steps, the pipe's pickling and the parent's unpickling
    (no pipe, no other side on the device); then the bare engine's batched work on the same loaded
    model (as bare_hf and bare_vllm), its logprobs met with the tool's."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prep = _prep(args)
    plan = prep.side(args.side)
    from parity_ui.core.requests import ScoreBatch, ScoreRequest
    from parity_ui.engines import load_engine
    from parity_ui.run.pipeline import load_request

    eng = load_engine(plan.kind.engine)
    eng.should_stop, eng.progress = (lambda: False), (lambda message: None)
    eng.load(load_request(plan))
    rows = [json.loads(line) for line in open(args.dump_path)]
    items = [ScoreRequest(r["prompt_ids"], r["response_ids"], 1) for r in rows]
    eng.score_batch(ScoreBatch(items[:2]))  # the first calls' one-time costs
    out: dict = {"side": args.side, "tokens": sum(len(r["response_ids"]) for r in rows), "chunks": {}, "bare_s": None}
    tool_lps = None
    # Each repeat: every chunk size, then the bare work; each figure the fastest of the repeats (a shared
    # machine's noise only ever adds time).
    for _ in range(args.repeats):
        for chunk in args.breakdown_chunks:
            tool_lps = _tool_pass(eng, items, chunk, out)
        bare, bare_s, out["bare_forwards"] = _bare_pass(args, eng, rows)
        out["bare_s"] = bare_s if out["bare_s"] is None else min(out["bare_s"], bare_s)
    out["tool_vs_bare_max_abs_diff"] = _worst(tool_lps, bare)
    for parts in out["chunks"].values():
        parts["over_bare"] = parts["total_s"] / out["bare_s"]
    q.put(out)


def _tool_pass(eng, items: list, chunk: int, out: dict) -> list:
    """The replay's scoring of every row, `chunk` rows a call, as the worker and the parent do it; each
    part's time kept in out["chunks"] (the fastest pass so far). Returns the logprobs."""
    import pickle

    from parity_ui.core.requests import ScoreBatch
    from parity_ui.core.types import StepColumns

    parts = dict.fromkeys(("score_batch_s", "from_steps_s", "pickle_s", "unpickle_s"), 0.0)
    got_all: list = []
    for s in range(0, len(items), chunk):
        t = time.perf_counter()
        got = eng.score_batch(ScoreBatch(items[s: s + chunk]))
        parts["score_batch_s"] += time.perf_counter() - t
        t = time.perf_counter()
        got = [StepColumns.from_steps(steps) for steps in got]  # the worker's handler
        parts["from_steps_s"] += time.perf_counter() - t
        t = time.perf_counter()
        blob = pickle.dumps(("result", got))
        parts["pickle_s"] += time.perf_counter() - t
        t = time.perf_counter()
        got_all += pickle.loads(blob)[1]
        parts["unpickle_s"] += time.perf_counter() - t
    parts["total_s"] = sum(parts.values())
    scorer = getattr(eng, "_scorer", None)
    if scorer is not None:  # HF: its forwards as packed (hf_score.pack), chunk by chunk
        from parity_ui.engines.hf_score import pack

        lengths = [len(it.prompt) + len(it.continuation) for it in items]
        packs = [g for s in range(0, len(items), chunk) for g in pack(lengths[s: s + chunk], scorer.budget,
                                                                       scorer.mode == "same-length")]
        parts["forwards"], parts["one_row_forwards"] = len(packs), sum(len(g) == 1 for g in packs)
    best = out["chunks"].get(str(chunk))
    if best is None or parts["total_s"] < best["total_s"]:
        out["chunks"][str(chunk)] = parts
    return [list(c.logprob) for c in got_all]


def _bare_pass(args, eng, rows: list) -> tuple[list, float, int | None]:
    """The bare engine's batched work on the tool's loaded model (as bare_hf and bare_vllm): (logprobs,
    seconds, HF's forwards)."""
    if args.side == "trainer":
        import torch

        model, dev = eng.model, str(eng.model.device)
        from bare_engines import length_batches, padded_logits

        seqs = [r["prompt_ids"] + r["response_ids"] for r in rows]
        batches = length_batches(seqs, args.bare_tokens)
        bare: list = [None] * len(rows)
        t = time.perf_counter()
        with torch.inference_mode():
            for b in batches:
                logits = padded_logits(model, seqs, b, dev)
                for x, i in enumerate(b):
                    base, resp = len(rows[i]["prompt_ids"]), rows[i]["response_ids"]
                    lp = torch.log_softmax(logits[x][base - 1: base - 1 + len(resp)].float(), dim=-1)
                    bare[i] = lp.gather(1, torch.tensor(resp, device=dev)[:, None])[:, 0].tolist()
        return bare, time.perf_counter() - t, len(batches)
    else:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
        t = time.perf_counter()
        outs = eng.llm.generate([{"prompt_token_ids": r["prompt_ids"] + r["response_ids"]} for r in rows], sp,
                                use_tqdm=False)
        bare = [[o.prompt_logprobs[len(r["prompt_ids"]) + j][tid].logprob for j, tid in enumerate(r["response_ids"])]
                for r, o in zip(rows, outs)]
    return bare, time.perf_counter() - t, None


def breakdown(args, work: Path) -> dict:
    dump = work / "dump.jsonl"
    write_dump(dump, args.model, args.rows, args.tokens)
    args.dump_path = str(dump)
    prep = _prep(args)
    out = {"rows": args.rows, "tokens": args.tokens, "dtype": args.dtype, "model": args.model}
    for side in ("trainer", "rollout"):
        print(f"breakdown: {side}, chunks of {args.breakdown_chunks} rows, then bare", flush=True)
        args.side = side
        out[side] = in_fresh_process(breakdown_side, args, prep.side(side).worker_env)
    return out


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
    ap.add_argument("--breakdown", action="store_true",
                    help="(c): each side's engine in its own process, the replay's scoring part by part, chunk by chunk")
    ap.add_argument("--breakdown-chunks", default="16,64", help="with --breakdown: the chunk sizes to time, comma-separated")
    ap.add_argument("--repeats", type=int, default=1, help="with --breakdown: passes (each figure the fastest)")
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
    elif args.breakdown:
        args.breakdown_chunks = [int(c) for c in args.breakdown_chunks.split(",")]
        figures = {"breakdown": breakdown(args, work)}
    else:
        figures = {"speed": speed(args, work)}
    text = json.dumps(figures, indent=2)
    print(text, flush=True)
    out = args.out or (str(Path(os.environ["OUT"]) / "replay.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
