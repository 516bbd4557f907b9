"""What shared-seed sampling costs against plain sampling, on each engine (issue 31), in one run.

For each engine (hf, vllm) and each mode (sampling=native: the engine's own sampler; sampling=shared-seed:
parity-ui's one Gumbel-max sampler as a logits processor), a fresh process loads the engine with exactly
the arguments the tool maps to (parity_ui.run.prepare + the engines' own classes), generates once to
warm up, then times `generate` over --prompts prompts x --tokens tokens at T=1 (top_p from --top-p) in
batches of --batch. Prints and writes (--out) seconds, tokens per second and the ratio shared-seed /
native per engine; it also checks that the two engines' shared-seed tokens agree (the share of prompts
whose streams are identical: 1.0 in float32 on the CPU).

The full-distribution figures (issue 31 item 3: per-position KL, TV, top-1 agreement on a scored
workload) have their own bench: bench/full_distribution.py.

CPU (tiny model, seconds):
    python bench/sampling.py --small
GPU (the demo model; results in $OUT):
    python bench/sampling.py --model "$PARITY_DEMO_MODEL" --prompts 256 --tokens 128 --batch 64 \
        --dtype bfloat16 --out "$OUT/sampling.json"
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_models (--small)

from bare_engines import in_fresh_process  # noqa: E402

WORDS = ["parse", "the", "path", "class", "import", "value", "return", "list", "json", "format", "gravity", "tides"]


def prompts(n: int) -> list[str]:
    return [f"Explain {WORDS[i % 12]} and {WORDS[(5 * i + 3) % 12]} to a {WORDS[(7 * i + 1) % 12]} reader, part {i}."
            for i in range(n)]


def _child(a: dict, q) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from parity_ui.core.config import build_config
    from parity_ui.core.requests import GenerateRequest, LoadRequest
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.prepare import RunRequest, prepare

    cfg = build_config(None, [f"sampling={a['mode']}", "temperature=1", f"top_p={a['top_p']}", f"dtype={a['dtype']}",
                              f"max_new_tokens={a['tokens']}", "ignore_eos=true", f"batch_size={a['batch']}",
                              "logprobs=1"], sides=["hf=hf", "vllm=vllm"])
    prep = prepare(RunRequest(model=a["model"], prompts=[PromptSpec(text=p) for p in prompts(a["prompts"])],
                              config=cfg), on_gpu())
    plan = prep.side(a["engine"])
    if a["engine"] == "hf":
        from parity_ui.engines.hf_engine import HfEngine as Engine
    else:
        from parity_ui.engines.vllm_engine import VllmEngine as Engine
    os.environ.update(plan.args.env)
    engine = Engine()
    t = time.perf_counter()
    engine.load(LoadRequest(kind=a["engine"], model_path=prep.model.path, args=plan.load_args()))
    load_s = time.perf_counter() - t
    ids = [p.token_ids for p in prep.prompts]
    sampling = plan.args.sampling

    def run(batch_ids):
        req = GenerateRequest(prompts=batch_ids, sampling=sampling, batch_size=a["batch"], logprobs=1, stream=False)
        return engine.generate(req, lambda i, s: None, lambda: False)

    run(ids[: min(2, len(ids))])  # warm-up: first-call costs are not the sampler's
    times = []
    for _ in range(a["repeat"]):  # the fastest of a few: a shared machine's other load only ever adds
        t = time.perf_counter()
        results = run(ids)
        times.append(time.perf_counter() - t)
    gen_s = min(times)
    tokens = sum(len(r.token_ids) for r in results)
    q.put({"engine": a["engine"], "mode": a["mode"], "load_s": round(load_s, 2), "generate_s": round(gen_s, 3),
           "tokens": tokens, "tokens_per_s": round(tokens / gen_s, 1),
           "streams": [r.token_ids for r in results] if a["mode"] == "shared-seed" else None})


def _cpu_env() -> dict[str, str]:
    from parity_ui.core.mapping import CPU_SPINCOUNT
    from parity_ui.run.hardware import on_gpu

    if on_gpu() or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return {}
    return {"GOMP_SPINCOUNT": CPU_SPINCOUNT}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model folder (the demo model on the GPU: $PARITY_DEMO_MODEL)")
    ap.add_argument("--small", action="store_true", help="the CPU size: a tiny model, 8 prompts x 32 tokens")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--repeat", type=int, default=2, help="timed generates per process (the fastest counts)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.small:
        from tiny_models import build_model

        args.prompts, args.tokens, args.batch = 8, 32, 8
        args.model = args.model or str(build_model(Path(tempfile.mkdtemp()) / "llama", "llama"))
    if not args.model:
        ap.error("give --model FOLDER (or --small for a tiny model on the CPU)")
    rows = []
    for engine in args.engines.split(","):
        for mode in ("native", "shared-seed"):
            a = {"engine": engine, "mode": mode, "model": args.model, "prompts": args.prompts, "tokens": args.tokens,
                 "batch": args.batch, "top_p": args.top_p, "dtype": args.dtype, "repeat": args.repeat}
            # libgomp reads its spin count when torch loads, before the child knows its side's env: the
            # tool's CPU setting (parity_ui.core.mapping.CPU_SPINCOUNT) goes in from the start.
            rows.append(in_fresh_process(_child, a, env=_cpu_env()))
            r = rows[-1]
            print(f"{engine:5s} {mode:12s} load {r['load_s']:6.2f}s  generate {r['generate_s']:8.3f}s  "
                  f"{r['tokens']} tokens  {r['tokens_per_s']:9.1f} tok/s", flush=True)
    out = {"prompts": args.prompts, "tokens": args.tokens, "batch": args.batch, "top_p": args.top_p,
           "dtype": args.dtype, "model": args.model, "runs": [{k: v for k, v in r.items() if k != "streams"}
                                                             for r in rows], "ratios": {}}
    for engine in args.engines.split(","):
        nat = next(r for r in rows if r["engine"] == engine and r["mode"] == "native")
        ss = next(r for r in rows if r["engine"] == engine and r["mode"] == "shared-seed")
        out["ratios"][engine] = round(ss["generate_s"] / nat["generate_s"], 3)
        print(f"{engine}: shared-seed / native generate time = {out['ratios'][engine]:.3f}x")
    shared = [r["streams"] for r in rows if r["mode"] == "shared-seed"]
    if len(shared) == 2:
        same = sum(a == b for a, b in zip(*shared)) / len(shared[0])
        out["shared_seed_identical_share"] = same
        print(f"shared-seed streams identical on both engines: {same:.0%} of prompts")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
