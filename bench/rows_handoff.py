"""Where vLLM's full rows cost its generation (issue 31): one vLLM side, loaded once with exactly the
arguments the tool maps full_distribution=true to (the rows processor listed, no async scheduling),
generating the same prompts in the tool's chunks under four modes, in turns:

  off    no request asks for rows (the processor is listed but idle): the baseline
  apply  the processor follows the batch and selects each step's rows; nothing leaves the GPU
  copy   + narrowing to bfloat16 bits on the GPU and the copy to pinned host memory on a side stream;
         the writer thread waits for the copy and writes nothing
  log    + the writes: each step's rows one block of the batch's step log, the indices at the batch's
         end (what the tool does)

The modes change what the processor does after the point they name (the writer's methods replaced
in this process: vLLM runs in process, VLLM_ENABLE_V1_MULTIPROCESSING=0, as in the tool), so the
differences between them are the cost of each stage. Asserted: every mode generates the same tokens
(greedy), and in `log` every sequence's rows read back whole with each generated token the argmax of
its row. Printed and written (--out): each mode's generate seconds per round, their medians and the
ratios against `off`.

GPU (the demo model; 1,000 prompts x 128 tokens as the full-distribution bench):
    python bench/rows_handoff.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 \\
        --chunk 250 --dtype bfloat16 --out "$OUT/rows_handoff.json"
CPU (a tiny model; only off and log: the copy modes are the GPU writer's):
    python bench/rows_handoff.py --small
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_models (--small)

WORDS = ["parse", "the", "path", "class", "import", "value", "return", "list", "json", "format", "gravity", "tides"]


def prompts(n: int) -> list[str]:
    return [f"Explain {WORDS[i % 12]} and {WORDS[(5 * i + 3) % 12]} to a {WORDS[(7 * i + 1) % 12]} reader, part {i}."
            for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model folder (the demo model on the GPU: $PARITY_DEMO_MODEL)")
    ap.add_argument("--small", action="store_true", help="the CPU size: a tiny model, 8 prompts x 16 tokens")
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=250)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows-dir", help="where the rows go (default: /dev/shm, as the tool where it holds them)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.small:
        from tiny_models import build_model

        args.prompts, args.tokens, args.batch, args.chunk, args.dtype = 8, 16, 4, 4, "float32"
        args.model = args.model or str(build_model(Path(tempfile.mkdtemp()) / "llama", "llama"))
    if not args.model:
        ap.error("give --model FOLDER (or --small for a tiny model on the CPU)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from parity_ui.core.config import build_config
    from parity_ui.core.requests import GenerateRequest, LoadRequest, Rows
    from parity_ui.engines.full_distribution import read_rows, widened
    from parity_ui.engines.vllm_engine import VllmEngine
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.prepare import RunRequest, prepare

    cfg = build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.tokens}", "ignore_eos=true",
                              f"batch_size={args.batch}", "logprobs=1", "full_distribution=true"],
                       sides=["hf=hf", "vllm=vllm"])
    prep = prepare(RunRequest(model=args.model, prompts=[PromptSpec(text=p) for p in prompts(args.prompts)],
                              config=cfg), on_gpu())
    plan = prep.side("vllm")
    os.environ.update(plan.args.env)
    engine = VllmEngine()
    t = time.perf_counter()
    engine.load(LoadRequest(kind="vllm", model_path=prep.model.path, args=plan.load_args()))
    load_s = time.perf_counter() - t
    from parity_ui.engines import vllm_full_rows as vfr

    writer = vfr.WRITER
    modes = ["off", "apply", "copy", "log"] if writer is not None else ["off", "log"]
    ids = [p.token_ids for p in prep.prompts]
    base = args.rows_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    scratch = tempfile.mkdtemp(prefix="rows-handoff-", dir=base)

    def patch(mode: str) -> None:
        if writer is None:
            return
        for name in ("step", "_write"):  # back to the class's own methods
            writer.__dict__.pop(name, None)
        if mode == "apply":
            writer.step = lambda rows, log, puts: None
        elif mode == "copy":
            writer._write = lambda event, slot, log, kind, first, puts, held: event.synchronize()

    off_argmax = [0, 0]  # generated tokens that are not their row's argmax, of all checked

    def run(mode: str) -> tuple[float, list[list[int]]]:
        patch(mode)
        tokens: list[list[int]] = []
        took = 0.0
        for start in range(0, len(ids), args.chunk):
            chunk = ids[start:start + args.chunk]
            paths = [os.path.join(scratch, f"b-{start + j}.npy") for j in range(len(chunk))]
            rows = [Rows(write=p) for p in paths] if mode != "off" else None
            req = GenerateRequest(prompts=chunk, sampling=plan.args.sampling, batch_size=args.batch, logprobs=1,
                                  stream=False, rows=rows)
            t0 = time.perf_counter()
            results = engine.generate(req, lambda i, s: None, lambda: False)
            took += time.perf_counter() - t0
            tokens += [r.token_ids for r in results]
            if mode == "log":  # every sequence's rows whole, each greedy token its row's argmax
                for p, r in zip(paths, results):
                    got = read_rows(p).numpy()
                    got = widened(got) if got.dtype.kind == "i" else got
                    assert got.shape[0] == len(r.token_ids), (p, got.shape, len(r.token_ids))
                    off_argmax[0] += sum(a != b for a, b in zip(got.argmax(-1).tolist(), r.token_ids))
                    off_argmax[1] += len(r.token_ids)
            for f in os.listdir(scratch):
                os.remove(os.path.join(scratch, f))
        patch("log")
        return took, tokens

    run("log" if writer is None else "copy")  # warm-up: first-call costs (buffers, CUDA graphs) are nobody's
    times: dict[str, list[float]] = {m: [] for m in modes}
    want: list[list[int]] | None = None
    try:
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]  # each mode in a different place each round
            for mode in order:
                took, tokens = run(mode)
                if want is None:
                    want = tokens
                assert tokens == want, f"{mode}: other tokens than the first mode's"
                times[mode].append(round(took, 3))
                print(f"round {r + 1} {mode:5s} generate {took:8.3f}s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    out = {"model": args.model, "prompts": args.prompts, "tokens": args.tokens, "batch": args.batch,
           "chunk": args.chunk, "dtype": args.dtype, "rows_dir": base, "load_s": round(load_s, 2),
           "generate_s": times, "median_s": med, "vs_off": {m: round(med[m] / med["off"], 3) for m in modes},
           "tokens_not_their_rows_argmax": off_argmax}
    for m in modes:
        print(f"{m:5s} median {med[m]:8.3f}s  {out['vs_off'][m]:.3f}x off", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"rows read back: {off_argmax[1]:,} tokens, {off_argmax[0]:,} not their row's argmax")
    assert off_argmax[1] > 0 and off_argmax[0] == 0, "the rows written are not the rows vLLM chose from"


if __name__ == "__main__":
    main()
