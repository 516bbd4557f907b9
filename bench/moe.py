"""Mixture-of-experts routes on the engines (issue 30), through parity-ui's own service.

    python bench/moe.py --out $OUT             # the GPU machine: bf16, a tiny MoE and a Qwen3-30B-A3B-shaped one
    python bench/moe.py --small --out /tmp/m   # the CPU: the tiny MoE only, few tokens

For each model (random weights, built here; nothing is downloaded):
  tiny      Qwen3-MoE, hidden 64, 2 layers, 8 experts, top-2 (tests/tiny_models.py)
  a3b-4l    Qwen3-30B-A3B's per-layer shape (hidden 2048, 128 experts, top-8, expert width 768,
            32 heads / 4 KV heads of 128) with 4 layers instead of 48 and its vocabulary (151,936)
it runs, in bf16, ref=vllm (the rollout engine) against b=hf (the trainer) with b replaying the
reference's routes (replay_routes=ids), and reports:
  - route agreement by layer (same set, same slot order, overlap@k) and the share of tokens with any
    layer's experts differing, up to each prompt's first token fork;
  - the replay's before / after (first divergence, max |Δlogprob|);
  - the cost of route capture: the same comparison with routes=false and routes=true in this one
    process (per phase seconds; vLLM's generate with its built-in capture on vs off, as a ratio);
  - on the GPU, whether vLLM's built-in capture (enable_return_routed_experts) and the router hooks
    chose the same experts, when the vLLM side runs eager (a third side).
Writes OUT/moe.json and prints a summary between the markers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models
BEGIN, END = "@@MOE_BEGIN@@", "@@MOE_END@@"
PROMPTS = ["def main(args):", "import os\nclass Path", "The quick brown fox", "for i in range(10):",
           "Once upon a time", "SELECT * FROM users WHERE", "x = [1, 2, 3]\nprint(", "# A function that sorts"]


def build(kind: str, folder: Path) -> Path:
    from tiny_models import build_moe_model

    if (folder / "config.json").exists():
        return folder
    if kind == "tiny":
        return build_moe_model(folder, "qwen3_moe", num_hidden_layers=2, dtype="bfloat16")
    # Qwen3-30B-A3B per layer, 4 layers; the tiny BPE tokenizer's ids are a subset of its vocabulary
    return build_moe_model(folder, "qwen3_moe", num_hidden_layers=4, hidden_size=2048, num_experts=128, top_k=8,
                           init_range=0.02, dtype="bfloat16", shape="qwen3-30b-a3b")


def _prompts() -> list[Any]:
    from parity_ui.inputs.prompts import PromptSpec

    return [PromptSpec(text=t) for t in PROMPTS]


def one(service: Any, model: Path, routes: bool, max_new: int, n_prompts: int, extra_sides: list[str]) -> Any:
    from parity_ui.core.config import build_config
    from parity_ui.run.prepare import RunRequest

    # b's options are the same in both settings (the same warm worker); with routes=false it replays nothing
    sides = ["ref=vllm", "b=hf,replay_routes=ids", *extra_sides]
    cfg = build_config(overrides=["dtype=bfloat16", f"max_new_tokens={max_new}", "ignore_eos=true",
                                  f"routes={'true' if routes else 'false'}", "cross_score=false"], sides=sides)
    t0 = time.perf_counter()
    run = service.run(RunRequest(model=str(model), prompts=_prompts()[:n_prompts], config=cfg))
    return run, time.perf_counter() - t0


def figures(run: Any, side: str = "b") -> dict[str, Any]:
    from parity_ui.analysis.routes import route_figures

    comps = [c for p in run.prompts for c in p.comparisons if c.b == side]
    out: dict[str, Any] = {"status": run.status, "error": run.error, "prompts": len(comps),
                           "identical": sum(c.identical for c in comps),
                           "first_divergence": [c.first_divergence for c in comps]}
    ag = [c.measures["routes"] for c in comps if c.measures.get("routes") is not None]
    out["routing"] = route_figures(ag)
    if ag and ag[0].layers:
        n_layers = len(ag[0].layers)
        by = {"same_set": [0.0] * n_layers, "same_order": [0.0] * n_layers, "overlap": [0.0] * n_layers}
        total = sum(a.compared for a in ag) or 1
        for a in ag:
            for j in range(min(n_layers, len(a.same_set_by_layer))):
                by["same_set"][j] += a.same_set_by_layer[j] * a.compared / total
                by["same_order"][j] += a.same_order_by_layer[j] * a.compared / total
                by["overlap"][j] += a.mean_overlap_by_layer[j] * a.compared / total
        out["by_layer"] = {"layers": ag[0].layers, **{k: [round(x, 4) for x in v] for k, v in by.items()}}
        flips = [a.first_flip for a in ag if a.first_flip is not None]
        out["first_flips"] = [{"step": f.step, "layer": f.layer, "margins": f.margins} for f in flips[:8]]
    reps = [c.route_replay for c in comps if c.route_replay is not None]
    out["replay"] = [{"before_fork": r.before_first_divergence, "after_fork": r.after_first_divergence,
                      "before_max_gap": r.before_max_abs_gap, "after_max_gap": r.after_max_abs_gap,
                      "error": r.error} for r in reps]
    out["replay_identical_after"] = sum(r.after_identical for r in reps)
    out["replay_identical_before"] = sum(r.before_identical for r in reps)
    out["verdicts"] = [c.explanation.verdict for c in comps if c.explanation]
    res = [p.results.get("ref") for p in run.prompts]
    out["route_source"] = sorted({r.routes.source for r in res if r is not None and r.routes is not None})
    out["bytes_per_token"] = next((r.routes.bytes_per_token() for r in res if r is not None and r.routes), None)
    out["timings"] = {k: round(v, 3) for k, v in (run.timings or {}).items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-bench"))
    ap.add_argument("--small", action="store_true", help="the CPU: the tiny model, 2 prompts, 12 tokens")
    ap.add_argument("--models", default="tiny,a3b-4l")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PARITY_DB", str(out / "runs.db"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from parity_ui.service import ParityService

    import torch

    gpu = torch.cuda.is_available()
    kinds = ["tiny"] if args.small else args.models.split(",")
    max_new, n_prompts = (12, 2) if args.small else (64, 8)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0) if gpu else None, "models": {}}
    service = ParityService(db_path=str(out / "runs.db"))
    try:
        for kind in kinds:
            model = build(kind, out / f"model-{kind}")
            fig: dict[str, Any] = {}
            # warm both settings first (on a GPU routes=true loads vLLM with its built-in capture: another
            # worker), then time off and on: the first call after a load compiles and picks kernels
            one(service, model, False, 4, 1, [])
            one(service, model, True, 4, 1, [])
            off, off_s = one(service, model, False, max_new, n_prompts, [])
            on, on_s = one(service, model, True, max_new, n_prompts, [])
            fig["routes_off"] = figures(off)
            fig["routes_on"] = figures(on)
            t_off, t_on = off.timings or {}, on.timings or {}

            def side_s(run: Any, side: str) -> float:
                return round(sum((p.results[side].timings.total_s or 0) for p in run.prompts if side in p.results), 3)
            v_off, v_on = side_s(off, "ref"), side_s(on, "ref")
            fig["capture_cost"] = {
                "vllm_generate_s_off": v_off, "vllm_generate_s_on": v_on,
                "vllm_generate_ratio_on_off": round(v_on / v_off, 3) if v_off else None,
                "routes_phase_s": t_on.get("routes"), "replay_s_included_in_routes_phase": True,
                "generate_phase_s_off": t_off.get("generate"), "generate_phase_s_on": t_on.get("generate"),
                "wall_s_off": round(off_s, 2), "wall_s_on": round(on_s, 2),
                "wall_ratio_on_off": round(on_s / off_s, 3) if off_s else None}
            if gpu:  # built-in capture vs hooks: an eager vLLM side has both
                eager, _ = one(service, model, True, max_new, min(n_prompts, 4), ["e=vllm,enforce_eager=true"])
                fig["eager_side"] = figures(eager, "e")
            result["models"][kind] = fig
            (out / "moe.json").write_text(json.dumps(result, indent=1))
    finally:
        service.close()
    print(BEGIN)
    print(json.dumps(result, indent=1))
    print(END)


if __name__ == "__main__":
    main()
