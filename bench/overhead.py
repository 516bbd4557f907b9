"""Overhead of parity-ui over the bare engines, measured in one run.

1. bare vLLM: LLM(...).generate in its own process, with exactly the arguments parity-ui maps to;
2. bare HF: model.generate(..., output_logits=True) in its own process, likewise;
3. the same prompt through ParityService.run with warm workers (tokenize, both engines, compare,
   decode, store).
Prints medians and overhead = parity / (bare vLLM + bare HF): the engines run one after the
other inside a parity run, so their sum is the fair reference. Like for like: each bare engine must
generate exactly the token ids the tool's side generated (asserted), with the same arguments.
`--contention N` keeps N busy processes running meanwhile (shared cores: CI, a laptop in a demo).
    python bench/overhead.py [--model demo] [--dtype bfloat16] [--max-new-tokens 128] [--repeats 5] [--contention 1]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines

from bare_engines import in_fresh_process  # noqa: E402

PROMPT = "Give me a brief explanation of gravity in simple terms."


def _prepare(args):
    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.service import ParityService, RunRequest

    # cross_score off: the bare engines do no teacher forcing either.
    cfg = build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.max_new_tokens}", "ignore_eos=true",
                              "chat=true", "cross_score=false"])
    svc = ParityService(db_path=":memory:")
    req = RunRequest(model=args.model, prompts=[PromptSpec(text=PROMPT)], config=cfg)
    return svc, req, svc.prepare(req)


def bare_vllm(args, q) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _, _, prep = _prepare(args)
    v = prep.side("vllm").args
    os.environ.update(v.env)
    from vllm import LLM, SamplingParams

    llm = LLM(**v.llm)
    sp = SamplingParams(**v.sampling)
    ids = prep.prompts[0].token_ids
    times = []
    for i in range(args.repeats + 1):
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
        dt = time.perf_counter() - t
        if i:
            times.append(dt)
    q.put({"times": times, "token_ids": list(out[0].outputs[0].token_ids)})


def bare_hf(args, q) -> None:
    import torch

    from bare_engines import load_bare_hf

    _, _, prep = _prepare(args)
    h = prep.side("hf").args
    model, ids, gc = load_bare_hf(prep)
    times = []
    for i in range(args.repeats + 1):
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        if h.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if i:
            times.append(dt)
    q.put({"times": times, "token_ids": out.sequences[0, ids.shape[1]:].tolist()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the figures as JSON here too")
    ap.add_argument("--contention", type=int, default=0, help="busy processes sharing the cores meanwhile")
    ap.add_argument("--bare-env", choices=["tool", "default"], default="tool",
                    help="tool: the bare engines start with the environment the tool gives each side's worker "
                         "(e.g. GOMP_SPINCOUNT on a CPU): the tool's own overhead; default: with this shell's")
    args = ap.parse_args()

    hogs = [mp.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(args.contention)]
    for h_ in hogs:
        h_.start()
    try:
        figures = _measure(args)
    finally:
        for h_ in hogs:
            h_.terminate()
    print(json.dumps(figures, indent=2))
    print(f"overhead: parity run {figures['median_s']['parity_run']:.3f}s / (bare vLLM "
          f"{figures['median_s']['bare_vllm']:.3f}s + bare HF {figures['median_s']['bare_hf']:.3f}s) = "
          f"{figures['overhead_ratio']:.3f} (contention: {args.contention} busy process(es); bare engines' "
          f"environment: {args.bare_env})")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


def _busy() -> None:
    while True:
        pass


def _measure(args) -> dict:
    svc, req, prep = _prepare(args)
    envs = {name: (prep.side(name).worker_env if args.bare_env == "tool" else {}) for name in ("vllm", "hf")}
    v = in_fresh_process(bare_vllm, args, envs["vllm"])
    h = in_fresh_process(bare_hf, args, envs["hf"])
    with tempfile.TemporaryDirectory() as d:
        svc.db_path = str(Path(d) / "runs.db")
        from parity_ui.store.runs import open_db

        svc.db = open_db(svc.db_path)
        walls, engine_sums = [], []
        for i in range(args.repeats + 1):
            t = time.perf_counter()
            run = svc.run(req)
            dt = time.perf_counter() - t
            assert run.status in ("ok", "diverged"), run.error
            if i:  # the first run loads the workers
                walls.append(dt)
                p = run.prompts[0]
                engine_sums.append(p.results["vllm"].timings.total_s + p.results["hf"].timings.total_s)
                # Like for like: the bare engines made exactly the tokens the tool's sides made.
                assert p.results["vllm"].token_ids == v["token_ids"], "bare vLLM generated other tokens than the tool"
                assert p.results["hf"].token_ids == h["token_ids"], "bare HF generated other tokens than the tool"
        svc.close()
    mv, mh, mp_ = statistics.median(v["times"]), statistics.median(h["times"]), statistics.median(walls)
    return {
        "model": args.model, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "contention": args.contention, "device": run.device, "bare_env": {args.bare_env: envs},
        "tokens": {"vllm": len(v["token_ids"]), "hf": len(h["token_ids"])},
        "median_s": {"bare_vllm": mv, "bare_hf": mh, "parity_run": mp_,
                     "parity_engine_time": statistics.median(engine_sums)},
        "overhead_ratio": mp_ / (mv + mh),
    }


if __name__ == "__main__":
    main()
