"""Where vLLM's load goes, from vLLM's own log, and what parity-ui can take of it (issue 44 item 4).

    python bench/vllm_load.py [--model demo] [--dtype bfloat16] [--variants cold,warm,other-batch,default-capture,v1-runner,eager]
                              [--out $OUT/vllm_load.json]

Each variant is `LLM(**the tool's arguments for a vllm side)` in a fresh process, timed as a whole, with
every line vLLM logs while it loads kept with its time (a handler on the "vllm" logger: the engine core
runs in the process, VLLM_ENABLE_V1_MULTIPROCESSING=0, as in parity-ui's worker). The variants share
one compile cache (VLLM_CACHE_ROOT, fresh for this bench), in this order:

  cold             the tool's arguments, every cache empty (a fresh machine)
  warm             the same again: what vLLM's caches (torch.compile's graphs, Inductor's and Triton's
                   kernels under VLLM_CACHE_ROOT) give a second process
  other-batch      the tool's arguments for another batch size (--batch2): another CUDA-graph capture
                   size, so another compile-cache key, unless the size falls in the same bucket
  default-capture  the tool's arguments without max_cudagraph_capture_size: vLLM's own default (graphs
                   for every batch size up to 512), what the tool's sizing saves
  v1-runner        VLLM_USE_V2_MODEL_RUNNER=0 and async_scheduling=False: the synchronous runner that
                   full_distribution runs (it loaded in 16-30 s where the default took 48-54 s)
  eager            enforce_eager=True: no torch.compile and no CUDA graphs (another runtime: only to
                   bound what compile and capture cost)

vLLM's log lines are read from the process's own stdout and stderr (a pipe in front of both, each line
timed as it comes and passed on): vLLM sets up its loggers again while it starts, so a handler added
to them does not stay. For each: the wall time of LLM(...), the phases vLLM reports (weights, Dynamo transform, Inductor
compile or cache load, torch.compile in total, graph capture, the engine's init), the number of graph
sizes captured, and the seconds between the first and the last of its log lines. Writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines

from bare_engines import in_fresh_process  # noqa: E402

PROMPT = "Give me a brief explanation of gravity in simple terms."
VARIANTS = ("cold", "warm", "other-batch", "default-capture", "v1-runner", "eager")

# vLLM's own log lines (0.26 / 0.32), each giving seconds.
PATTERNS = {
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took [\d.]+ ?GiB(?: memory)? and ([\d.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "inductor_compile_s": r"Compiling a graph for .*? takes ([\d.]+) s",
    "compile_cache_load_s": r"load the compiled graph\(s\).*? took ([\d.]+) s",
    "torch_compile_total_s": r"torch\.compile takes ([\d.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
# Between these two lines vLLM inspects the model's class, in a subprocess that imports vLLM again
# (cached under VLLM_CACHE_ROOT/modelinfos once done).
INSPECT = (r"non-default args", r"Resolved architecture")


def _prep(args, batch: int):
    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.prepare import RunRequest, prepare

    cfg = build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.max_new_tokens}", "chat=true",
                              f"batch_size={batch}"], sides=["hf=hf", "vllm=vllm"])
    return prepare(RunRequest(model=args.model, prompts=[PromptSpec(text=PROMPT)], config=cfg), on_gpu())


def _tee(lines: list, t0: float) -> None:
    """Every line this process writes to fd 1 and 2 from now on, timed into `lines` and passed on."""
    import threading

    r, w = os.pipe()
    out = os.dup(2)
    os.dup2(w, 1)
    os.dup2(w, 2)

    def read() -> None:
        with os.fdopen(r, "rb") as f:
            for raw in f:
                lines.append((time.perf_counter() - t0, raw.decode(errors="replace").rstrip()))
                os.write(out, raw)

    threading.Thread(target=read, daemon=True).start()


def load_once(args, q) -> None:
    """One LLM(...) of the variant args.variant, timed, with vLLM's log lines kept."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    batch = args.batch2 if args.variant == "other-batch" else args.batch
    v = _prep(args, batch).side("vllm").args
    llm_args, env = dict(v.llm), dict(v.env)
    if args.variant == "default-capture":
        llm_args.pop("max_cudagraph_capture_size", None)
    elif args.variant == "v1-runner":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        llm_args["async_scheduling"] = False
    elif args.variant == "eager":
        llm_args["enforce_eager"] = True
        llm_args.pop("max_cudagraph_capture_size", None)
    os.environ.update(env)
    lines: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    _tee(lines, t0)
    from vllm import LLM

    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    llm = LLM(**llm_args)
    load_s = time.perf_counter() - t
    cfg = llm.llm_engine.vllm_config.compilation_config
    sizes = list(getattr(cfg, "cudagraph_capture_sizes", None) or [])
    del llm
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)  # the reader's last lines
    lines = [(t, x) for t, x in lines if " INFO " in x or " WARNING " in x or "took" in x or "Capturing" in x]
    q.put({"variant": args.variant, "batch": batch, "import_s": t_import, "load_s": load_s,
           "capture_sizes": len(sizes), "max_capture_size": max(sizes) if sizes else None,
           "llm_args": {k: llm_args.get(k) for k in ("enforce_eager", "max_cudagraph_capture_size", "max_model_len",
                                                     "async_scheduling")},
           "env": {k: env[k] for k in env if k.startswith("VLLM")}, "lines": lines})


def phases(lines: list[tuple[float, str]]) -> dict:
    out: dict = {}
    for key, pat in PATTERNS.items():
        found = [float(m.group(1)) for _, text in lines if (m := re.search(pat, text))]
        if found:
            out[key] = round(sum(found), 2) if key == "inductor_compile_s" else found[-1]
    if lines:
        out["log_span_s"] = round(lines[-1][0] - lines[0][0], 2)
    at = [next((t for t, text in lines if re.search(pat, text)), None) for pat in INSPECT]
    if None not in at:
        out["inspect_model_s"] = round(at[1] - at[0], 2)  # type: ignore[operator]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1, help="the run's batch size (the tool sizes graph capture to it)")
    ap.add_argument("--batch2", type=int, default=100, help="another run's batch size (other-batch)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cache-root", help="VLLM_CACHE_ROOT for every variant (default: a fresh folder)")
    ap.add_argument("--out", help="write the figures as JSON here (default $OUT/vllm_load.json when $OUT is set)")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    figures: dict = {"model": args.model, "dtype": args.dtype, "batch": args.batch, "variants": {}}
    with tempfile.TemporaryDirectory(prefix="parity-vllm-load-") as d:
        root = Path(args.cache_root or d)
        env = {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
               "TRITON_CACHE_DIR": str(root / "triton")}
        for name in variants:
            args.variant = name
            print(f"vllm load: {name}", flush=True)
            got = in_fresh_process(load_once, args, env)
            lines = got.pop("lines")
            got["phases"] = phases(lines)
            got["log"] = [f"{t:7.2f} {text[:200]}" for t, text in lines]
            figures["variants"][name] = got
    text = json.dumps(figures, indent=2)
    summary = {n: {"load_s": round(v["load_s"], 2), **v["phases"], "capture_sizes": v["capture_sizes"]}
               for n, v in figures["variants"].items()}
    print("VLLM-LOAD " + json.dumps(summary), flush=True)
    out = args.out or (str(Path(os.environ["OUT"]) / "vllm_load.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
