"""Cold start: a fresh `parity compare` process to its first answer and to its result, per phase,
against bare engines started fresh with exactly the arguments the tool maps to, in one run.

    python bench/cold_start.py [--model demo] [--dtype bfloat16] [--max-new-tokens 256]
                               [--tool-root DIR --label before] [--no-bare] [--out F.json]

vLLM keeps what it compiles across processes (torch.compile's graphs under VLLM_CACHE_ROOT, with
Inductor's and Triton's kernel caches), so a fresh process is timed twice: "cold", every cache
empty, and "warm", the caches its cold run left. The tool and the bare engine each get caches of
their own: neither profits from the other's compile.

Measured, each in a fresh process:
  tool      `python -m parity_ui.cli compare` (from --tool-root: another checkout, for a before/after):
            wall clock, the moment its first side is done (its "[parity] NAME done" line), phases,
            each side's load and generate time, read back from its run database
  bare vLLM LLM(**the tool's arguments) + one generate (time to the result)
  bare HF   from_pretrained + .to(device) + one generate (likewise)
The bare runs' token ids must equal the tool's (asserted): the same work.

--fresh-tokenizer: the cold tool run also starts with an empty parity-ui cache (PARITY_CACHE_DIR; the
demo model is read where it is, PARITY_DEMO_MODEL), so its tokenizer has never been verified, as on a
newcomer's machine (issue 44: that first prepare took 15.2 s); its prepare phase is reported apart.
--no-warm: the cold runs only (a GPU chain short of time).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines

from bare_engines import in_fresh_process  # noqa: E402

PROMPT = "Give me a brief explanation of gravity in simple terms."


def _overrides(args) -> list[str]:
    return [f"dtype={args.dtype}", f"max_new_tokens={args.max_new_tokens}", "ignore_eos=true", "chat=true",
            "cross_score=false"]


def cache_env(root: Path) -> dict[str, str]:
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton")}


def _prep(args):
    from parity_ui.core.config import build_config
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.prepare import RunRequest, prepare
    from parity_ui.inputs.prompts import PromptSpec

    cfg = build_config(None, _overrides(args))
    return prepare(RunRequest(model=args.model, prompts=[PromptSpec(text=PROMPT)], config=cfg), on_gpu())


def bare_vllm(args, q) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prep = _prep(args)
    v = prep.side("vllm").args
    os.environ.update(v.env)
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter()
    llm = LLM(**v.llm)
    t_load = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prep.prompts[0].token_ids}], SamplingParams(**v.sampling), use_tqdm=False)
    q.put({"first_result_s": time.perf_counter() - t0, "load_s": t_load - t_import,
           "generate_s": time.perf_counter() - t_load, "token_ids": list(out[0].outputs[0].token_ids)})


def bare_hf(args, q) -> None:
    t0 = time.perf_counter()
    import torch

    from bare_engines import load_bare_hf

    prep = _prep(args)
    t_import = time.perf_counter()
    model, ids, gc = load_bare_hf(prep)
    t_load = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    q.put({"first_result_s": time.perf_counter() - t0, "load_s": t_load - t_import,
           "generate_s": time.perf_counter() - t_load, "token_ids": out.sequences[0, ids.shape[1]:].tolist()})


def run_tool(args, caches: Path, workdir: Path, *extra: str, parity_cache: Path | None = None) -> dict:
    """One fresh CLI process; its stderr read line by line as it comes, each line timed. `parity_cache`:
    an empty PARITY_CACHE_DIR for it (no tokenizer verified yet)."""
    root = Path(args.tool_root).resolve()
    db = workdir / f"runs-{time.monotonic_ns()}.db"
    cmd = [sys.executable, "-m", "parity_ui.cli", "--db", str(db), "compare", "--model", args.model, "--prompt", PROMPT]
    for o in [*_overrides(args), *extra]:
        cmd += ["--set", o]
    env = {**os.environ, **cache_env(caches),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    if parity_cache is not None:
        from parity_ui.inputs.models import describe_model

        env["PARITY_DEMO_MODEL"] = describe_model("demo").path  # read where it is, not converted again
        env["PARITY_CACHE_DIR"] = str(parity_cache)
    lines: list[tuple[float, str]] = []
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read() -> None:
        for line in proc.stderr:
            lines.append((time.perf_counter() - t, line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    out = proc.stdout.read()
    proc.wait()
    wall = time.perf_counter() - t
    reader.join()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"the tool failed ({proc.returncode}): {out[-1500:]}\n" + "\n".join(x for _, x in lines[-30:]))
    from parity_ui.store.runs import get_run, list_runs, open_db

    store = open_db(db)
    runs = list_runs(store, limit=1)
    if not runs:
        raise SystemExit(f"the tool stored no run: {out[-1500:]}\n" + "\n".join(x for _, x in lines[-30:]))
    run = get_run(store, runs[0].id)
    done = [(s, m.group(1)) for s, x in lines if (m := re.search(r"\[parity\] (\S+) done$", x))]
    generating = [s for s, x in lines if re.search(r"\[parity\] \S+: generating", x)]
    # A checkout that does not print "done" generated its sides one after the other: the first was
    # done when the second began.
    first_done = done[0][0] if done else (generating[1] if len(generating) > 1 else None)
    results = run.prompts[0].results
    return {"wall_s": round(wall, 2), "first_side_done_s": round(first_done, 2) if first_done else None,
            "prepare_s": run.timings.get("prepare"), "fresh_tokenizer": parity_cache is not None,
            "first_side": done[0][1] if done else run.sides[0].name, "phases_s": run.timings,
            "side_load_s": {s.name: s.load_s for s in run.sides}, "devices": {s.name: s.device for s in run.sides},
            "side_generate_s": {n: r.timings.total_s for n, r in results.items()},
            "warnings": [w.code for w in run.warnings],
            # What else the CLI printed on stderr (a library's warning between the progress lines)
            "stray_lines": [x for _, x in lines if x.strip() and not x.startswith("[parity]")],
            "token_ids": {n: r.token_ids for n, r in results.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tool-root", default=str(ROOT), help="the checkout whose CLI is timed")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--no-bare", action="store_true", help="time the tool only")
    ap.add_argument("--serial", action="store_true",
                    help="also time a warm run with generate_while_loading=never (each side loads, then generates)")
    ap.add_argument("--graphed", action="store_true",
                    help="also time a warm run with the HF side on decode=graphed (its tokens may differ from "
                         "generate's in bf16, so no bare run is held to them)")
    ap.add_argument("--bare-first", action="store_true",
                    help="time the bare engines' cold start before the tool's (on a fresh machine the first "
                         "process also pays for reading the libraries from disk)")
    ap.add_argument("--fresh-tokenizer", action="store_true",
                    help="the cold tool run with an empty parity-ui cache: its tokenizer never verified")
    ap.add_argument("--no-warm", action="store_true", help="the cold runs only")
    ap.add_argument("--out")
    args = ap.parse_args()
    figures: dict = {"model": args.model, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
                     "label": args.label}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        fresh = {"parity_cache": work / "parity-cache"} if args.fresh_tokenizer else {}
        if not args.bare_first:
            figures["tool_cold"] = run_tool(args, work / "tool-caches", work, **fresh)
        if not args.no_bare:
            figures["bare_vllm_cold"] = in_fresh_process(bare_vllm, args, cache_env(work / "bare-caches"))
            figures["bare_hf"] = in_fresh_process(bare_hf, args, cache_env(work / "bare-caches"))
        if args.bare_first:
            figures["tool_cold"] = run_tool(args, work / "tool-caches", work, **fresh)
        if not args.no_warm:
            figures["tool_warm"] = run_tool(args, work / "tool-caches", work)
        if args.serial:
            figures["tool_warm_serial"] = run_tool(args, work / "tool-caches", work, "generate_while_loading=never")
        if args.graphed:
            figures["tool_warm_graphed"] = run_tool(args, work / "tool-caches", work, "hf.decode=graphed")
        if not args.no_bare and not args.no_warm:
            figures["bare_vllm_warm"] = in_fresh_process(bare_vllm, args, cache_env(work / "bare-caches"))
    ids = figures["tool_cold"]["token_ids"]
    caches = ("cold",) if args.no_warm else ("cold", "warm")
    if not args.no_warm:
        assert figures["tool_warm"]["token_ids"] == ids, "the warm run generated other tokens than the cold one"
    if not args.no_bare:
        for cache in caches:
            assert figures[f"bare_vllm_{cache}"]["token_ids"] == ids["vllm"], f"bare vLLM ({cache}) made other tokens"
        assert figures["bare_hf"]["token_ids"] == ids["hf"], "bare HF generated other tokens than the tool"
        for cache in caches:
            tool, bare_v = figures[f"tool_{cache}"], figures[f"bare_vllm_{cache}"]
            figures[f"ratio_{cache}"] = {
                "tool_wall_to_slowest_bare": tool["wall_s"] / max(bare_v["first_result_s"],
                                                                  figures["bare_hf"]["first_result_s"]),
                "tool_wall_to_bare_sum": tool["wall_s"] / (bare_v["first_result_s"] + figures["bare_hf"]["first_result_s"]),
                "vllm_load_tool_to_bare": (tool["side_load_s"].get("vllm") or 0) / bare_v["load_s"],
            }
    if args.serial:
        assert figures["tool_warm_serial"]["token_ids"] == ids, "the serial run generated other tokens"
    for key in ("tool_cold", "tool_warm", "tool_warm_serial", "bare_vllm_cold", "bare_vllm_warm", "bare_hf"):
        if key in figures:
            figures[key].pop("token_ids", None)
    figures["tokens"] = {n: len(v) for n, v in ids.items()}
    print("COLD-START " + json.dumps(figures))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
