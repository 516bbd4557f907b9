"""A workload through parity-ui against the bare engines doing exactly the same work, in one run.

    python bench/workload.py --mode scored --prompts 1000 --tokens 128 [--model demo] [--dtype bfloat16]
    python bench/workload.py --mode free --prompts 64 --tokens 128
    python bench/workload.py --mode both --prompts 64 --tokens 128     # free and scored at one size
    python bench/workload.py --memory --prompts 10000 --tokens 4 --model TINY_MODEL_FOLDER   # CPU: peak RSS

The tool: `run_workload` on a fresh ParityService (its workers start, load, generate, score, store
and pool the figures; the floor is off: the bare engines measure no floor either). Sides: ref=hf at
batch 1 (the reference), b=vllm at --batch (production-style batching).
The bare engines, each in a fresh process with the arguments the tool maps to:
- free: vLLM generates every prompt (LLM.generate with the same SamplingParams, in the same
  batches); HF generates every prompt alone (model.generate, plain);
- scored: vLLM generates as above; HF teacher-forces every vLLM sequence as a user would batch it
  (sorted by length, right-padded, at most --bare-tokens tokens a forward), then once more one
  sequence a forward (what this bench compared with before issue 44; "padded_vs_one_row" says whether
  padding moves a row's bits on this device).
Like for like (asserted): the bare engines make exactly the tool's token ids, and in scored mode the
bare HF's logprobs of those tokens equal the tool's stored reference logprobs (the same bits as one
sequence a forward; within 1e-3 against the batched ones where padding moves bits).
`--routes-ab` (a mixture-of-experts --model): the scored workload with routes=false and routes=true,
each on a fresh service, in one run (vLLM's compile caches warmed for both first): the generate
phase's and the whole run's ratio (issue 44: goal <= 1.15x; it was 1.84x / 1.53x).
Prints and writes (--out) the wall times and the ratios: tool / (bare vLLM + bare HF), for the whole
process (import, load, work) and for the work alone (the tool's generate+pool phases against the
engines' own generate/score time).
`--memory` measures the parent process's peak RSS over a scored workload of --prompts prompts.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines

from bare_engines import in_fresh_process  # noqa: E402

TOPICS = ["gravity", "photosynthesis", "the French revolution", "black holes", "compound interest", "DNA",
          "the stock market", "volcanoes", "machine learning", "the Roman empire", "vaccines", "electricity",
          "climate change", "the internet", "jazz", "chess", "the moon landing", "antibiotics", "rainbows",
          "coffee", "Shakespeare", "bridges", "tides", "bees", "the printing press"]
ASKS = ["Give me a brief explanation of {t} in simple terms.", "What should a beginner know about {t}?",
        "Write three facts about {t}.", "Explain {t} to a ten-year-old.", "Why does {t} matter?",
        "Summarise the history of {t} in a paragraph.", "What are common misconceptions about {t}?",
        "Describe {t} in one paragraph.", "List the key ideas behind {t}.", "How would you teach {t}?"]


def prompts(n: int) -> list[str]:
    base = [a.format(t=t) for a in ASKS for t in TOPICS]  # 250 distinct
    return [base[i % len(base)] + ("" if i < len(base) else f" (variant {i // len(base)})") for i in range(n)]


def _config(args, mode: str):
    from parity_ui.core.config import build_config

    extra = ["routes=true"] if getattr(args, "routes", False) else []
    return build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.tokens}", "ignore_eos=true", "chat=true",
                               "logprobs=5", *extra], sides=["ref=hf", f"b=vllm,batch_size={args.batch}"])


def _prepare(args, mode: str):
    from parity_ui.run.plan import RunRequest
    from parity_ui.run.prepare import prepare
    from parity_ui.inputs.prompts import PromptSpec

    req = RunRequest(model=args.model, prompts=[PromptSpec(text=p) for p in prompts(args.prompts)],
                     config=_config(args, mode))
    return prepare(req, gpu=_gpu())


def _gpu() -> bool:
    from parity_ui.run.hardware import on_gpu

    return on_gpu()


# -- the bare engines ------------------------------------------------------------------------------

def bare_vllm(args, q) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prep = _prepare(args, args.mode)
    v = prep.side("b").args
    os.environ.update(v.env)
    from vllm import LLM, SamplingParams

    llm = LLM(**v.llm)
    sp = SamplingParams(**v.sampling)
    t = time.perf_counter()
    outs = []
    ids = [e.token_ids for e in prep.prompts]
    for start in range(0, len(ids), args.batch):  # the tool sends the same batches
        outs += llm.generate([{"prompt_token_ids": x} for x in ids[start:start + args.batch]], sp, use_tqdm=False)
    work = time.perf_counter() - t
    q.put({"token_ids": [list(o.outputs[0].token_ids) for o in outs], "work_s": work,
           "wall_s": time.perf_counter() - t0})


def bare_hf(args, q) -> None:
    t0 = time.perf_counter()
    import torch

    from bare_engines import length_batches, load_bare_hf, padded_logits

    prep = _prepare(args, args.mode)
    model, _, gc = load_bare_hf(_as_hf(prep))
    dev = prep.side("ref").args.device
    t = time.perf_counter()
    out: dict = {}
    with torch.inference_mode():
        if args.mode == "free":
            out["token_ids"] = []
            for e in prep.prompts:
                ids = torch.tensor([e.token_ids], device=dev)
                seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
                out["token_ids"].append(seq.sequences[0, ids.shape[1]:].tolist())
        else:
            seqs = [e.token_ids + cont for e, cont in zip(prep.prompts, args.continuations)]

            def lp_of(logits, j):
                base, cont = len(prep.prompts[j].token_ids), args.continuations[j]
                lp = torch.log_softmax(logits[base - 1: base - 1 + len(cont)].float(), dim=-1)
                return lp.gather(1, torch.tensor(cont, device=dev)[:, None])[:, 0].tolist()

            batches = length_batches(seqs, args.bare_tokens)  # longest first, as many as fit --bare-tokens
            out["logprobs"] = [None] * len(seqs)
            for b in batches:
                logits = padded_logits(model, seqs, b, dev)
                for x, i in enumerate(b):
                    out["logprobs"][i] = lp_of(logits[x], i)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            out["forwards"] = len(batches)
            t1 = time.perf_counter()
            out["logprobs_one_row"] = [lp_of(model(input_ids=torch.tensor([s_], device=dev)).logits[0], j)
                                       for j, s_ in enumerate(seqs)]
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            out["one_row_s"] = time.perf_counter() - t1
            out["padded_vs_one_row"] = _worst(out["logprobs"], out["logprobs_one_row"])
            t = t + (time.perf_counter() - t1)  # the work is the batched pass; the one-row pass is timed apart
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    out["work_s"] = time.perf_counter() - t
    out["wall_s"] = time.perf_counter() - t0 - out.get("one_row_s", 0.0)
    q.put(out)


def _worst(a, b) -> float:
    assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)), "the sequences do not line up"
    return max((abs(x - y) for p, r in zip(a, b) for x, y in zip(p, r)), default=0.0)


def _as_hf(prep):
    """load_bare_hf reads the side named "hf"; here the reference is named "ref"."""
    class View:
        def __init__(self, p):
            self.model, self.prompts = p.model, p.prompts

        def side(self, name):
            return prep.side("ref" if name == "hf" else name)

    return View(prep)


# -- the tool ---------------------------------------------------------------------------------------

def tool(args, mode: str, db: str) -> dict:
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.service import ParityService
    from parity_ui.store.runs import get_run, pair_samples
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload

    if os.environ.get("PARITY_BENCH_ONE_PIECE"):  # A/B: the reference scores the chunk in one call, no overlap
        import parity_ui.commands.workload.run as workload_run

        workload_run.pieces = lambda n, per_item, piece=0: [range(0, n)] if n else []
    t0 = time.perf_counter()
    svc = ParityService(db_path=db)
    req = WorkloadRequest(model=args.model, prompts=[PromptSpec(text=p) for p in prompts(args.prompts)],
                          config=_config(args, mode),
                          options=WorkloadOptions(mode=mode, floor="none", chunk=args.chunk))
    run = run_workload(svc, req, emit=lambda e: e.kind == "progress" and print(f"  tool {mode}: {e.message}",
                                                                               flush=True))
    wall = time.perf_counter() - t0
    assert run.status in ("ok", "diverged"), run.error
    got = get_run(svc.db, run.id)
    tokens = {s: [p.results[s].token_ids for p in got.prompts] for s in ("ref", "b") if s in got.prompts[0].results}
    ref_lp = [s.logp_ref for s in pair_samples(svc.db, run.id, "b")]
    sources = sorted({r.routes.source for p in got.prompts for r in p.results.values() if getattr(r, "routes", None)})
    svc.close()
    return {"run_id": run.id, "wall_s": wall, "work_s": run.timings.get("generate", 0) + run.timings.get("pool", 0),
            "timings": run.timings, "tokens": tokens, "ref_logprobs": ref_lp, "headline": run.workload.headline,
            "score_batch": next((s.resolved.get("score_batch") for s in run.sides if s.name == "ref"), None),
            "warnings": [w.code for w in run.warnings], "routes_source": sources}


def warm_vllm(args, q) -> None:
    """Load the vLLM side once with the tool's arguments: its torch.compile and Triton caches are then
    warm for the tool and the bare engine alike (whichever ran first would otherwise pay the compile)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prep = _prepare(args, args.mode)
    os.environ.update(prep.side("b").args.env)
    from vllm import LLM

    t = time.perf_counter()
    LLM(**prep.side("b").args.llm)
    q.put({"load_s": time.perf_counter() - t})


def measure(args, mode: str) -> dict:
    args.mode = mode
    if not args.cold:
        print(f"[{mode}] warming vLLM's compile caches", flush=True)
        in_fresh_process(warm_vllm, args, _prepare(args, mode).side("b").worker_env)
    print(f"[{mode}] tool: {args.prompts} prompts x {args.tokens} tokens", flush=True)
    t = tool(args, mode, str(Path(args.work) / f"{mode}.db"))
    prep = _prepare(args, mode)
    print(f"[{mode}] bare vLLM", flush=True)
    v = in_fresh_process(bare_vllm, args, prep.side("b").worker_env)
    assert v["token_ids"] == t["tokens"]["b"], "bare vLLM generated other tokens than the tool"
    if mode == "scored":
        args.continuations = v["token_ids"]
    print(f"[{mode}] bare HF", flush=True)
    h = in_fresh_process(bare_hf, args, prep.side("ref").worker_env)
    if mode == "free":
        assert h["token_ids"] == t["tokens"]["ref"], "bare HF generated other tokens than the tool"
    else:
        one_row, batched = _worst(h["logprobs_one_row"], t["ref_logprobs"]), _worst(h["logprobs"], t["ref_logprobs"])
        assert min(one_row, batched) <= 1e-3, f"bare HF's teacher-forced logprobs differ from the tool's by {one_row}"
        h["tool_vs_one_row"], h["tool_vs_batched"] = one_row, batched
    bare_wall, bare_work = v["wall_s"] + h["wall_s"], v["work_s"] + h["work_s"]
    return {"mode": mode, "prompts": args.prompts, "tokens": args.tokens, "batch": args.batch, "dtype": args.dtype,
            "tool": {k: t[k] for k in ("run_id", "wall_s", "work_s", "timings", "headline", "score_batch")},
            "bare": {"vllm": {"wall_s": v["wall_s"], "work_s": v["work_s"]},
                     "hf": {k: h[k] for k in ("wall_s", "work_s", "one_row_s", "forwards", "padded_vs_one_row",
                                              "tool_vs_one_row", "tool_vs_batched") if k in h}},
            "ratio_wall": t["wall_s"] / bare_wall, "ratio_work": t["work_s"] / bare_work}


def routes_ab(args) -> dict:
    """The scored workload with routes=false and routes=true, each on a fresh service, in one run."""
    figures: dict = {"prompts": args.prompts, "tokens": args.tokens, "batch": args.batch, "model": args.model,
                     "dtype": args.dtype}
    runs = {}
    for routes in (False, True):
        args.routes = routes
        if not args.cold:
            print(f"[routes={routes}] warming vLLM's compile caches", flush=True)
            in_fresh_process(warm_vllm, args, _prepare(args, "scored").side("b").worker_env)
    for routes in (False, True):
        args.routes = routes
        print(f"[routes={routes}] tool: {args.prompts} prompts x {args.tokens} tokens, scored", flush=True)
        t = tool(args, "scored", str(Path(args.work) / f"routes-{routes}.db"))
        runs[routes] = {k: t[k] for k in ("run_id", "wall_s", "work_s", "timings", "headline", "warnings",
                                          "routes_source")}
    figures["off"], figures["on"] = runs[False], runs[True]
    gen = runs[True]["timings"].get("generate", 0) / max(runs[False]["timings"].get("generate", 0), 1e-9)
    figures["ratio_generate"], figures["ratio_wall"] = gen, runs[True]["wall_s"] / runs[False]["wall_s"]
    figures["ratio_work"] = runs[True]["work_s"] / runs[False]["work_s"]
    figures["goal"], figures["meets_goal"] = 1.15, gen <= 1.15
    return figures


def memory(args) -> dict:
    """Peak RSS of this (the parent) process over a scored workload of --prompts prompts."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = tool(args, "scored", str(Path(args.work) / "memory.db"))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"prompts": args.prompts, "tokens": args.tokens, "peak_rss_mib": after / 1024,
            "rss_before_mib": before / 1024, "wall_s": t["wall_s"], "headline": t["headline"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", choices=["free", "scored", "both"], default="scored")
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256, help="the vLLM side's batch size")
    ap.add_argument("--chunk", type=int, default=1000, help="the workload's chunk")
    ap.add_argument("--memory", action="store_true", help="the parent's peak RSS only (no bare engines)")
    ap.add_argument("--routes-ab", action="store_true",
                    help="the scored workload with routes off and on (an MoE --model), no bare engines")
    ap.add_argument("--bare-tokens", type=int, default=8192,
                    help="the bare HF's tokens a forward in scored mode (rows x the longest, padding included)")
    ap.add_argument("--cold", action="store_true", help="no warm-up load (whoever runs first pays vLLM's compile)")
    ap.add_argument("--work", default="/tmp/parity-bench-workload", help="a folder for the databases")
    ap.add_argument("--out", help="write the figures as JSON here too")
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.memory:
        figures = memory(args)
    elif args.routes_ab:
        figures = routes_ab(args)
    else:
        modes = ["free", "scored"] if args.mode == "both" else [args.mode]
        figures = {"runs": [measure(args, m) for m in modes]}
        if len(modes) == 2:
            runs = {r["mode"]: r for r in figures["runs"]}
            figures["scored_over_free"] = {"wall": runs["scored"]["tool"]["wall_s"] / runs["free"]["tool"]["wall_s"],
                                           "work": runs["scored"]["tool"]["work_s"] / runs["free"]["tool"]["work_s"]}
    print(json.dumps(figures, indent=2), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
