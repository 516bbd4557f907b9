"""Did the weights land? (issue 41) The time of parity-ui's weight check and of its probe, through its own
service, against the bare engine doing the digest the way vLLM's weight checker does.

    python3 bench/weights.py --out $OUT                       # the GPU machine: the demo model, then an 8B-shaped one
    python3 bench/weights.py --models demo --out $OUT         # one of them (demo | 8b)
    python bench/weights.py --small --out /tmp/w              # the CPU: the tiny Llama (tests/tiny_models.py)

Per model, A and B differ in one decoder layer (B: A with every tensor of layer L noised, 0.05 x each
tensor's std); nothing is downloaded:
  demo   $PARITY_DEMO_MODEL (SmolLM2-135M, 30 layers; the GPU bundle converts it), L = 15
  8b     Llama-3-8B's shape (hidden 4096, 32 layers, 32/8 heads, MLP 14336, the demo's vocabulary 49,152)
         with random bf16 weights, built on the GPU in this process (bench/gpu33_build_llama8b.py's
         recipe; --8b-layers for fewer) into --work, L = 16; B shares A's shards but the one holding L
  tiny   --small: tests/tiny_models.build_model (2 layers), L = 1
and it runs, in bf16 on the GPU (float32 on the CPU), through ParityService.weights:
  full   the engine starts from A and B is pushed in (load_weights on a GPU, reload on the CPU), then
         every tensor against B loaded fresh, and the 256-token probe: must land (exit 0). Times:
         tensor_check_s (both engines digest every unit, in parallel, and compare; the goal for 8B
         is <= 60 s), probe_s.
  stale  the same push leaving layer L out (--skip 'layers\\.L\\.'): the engine keeps A's layer L,
         a stale layer. The check must name exactly layer L's units; the probe must leave the floor,
         and `first_token` is the first of its forced tokens over the floor (goal: <= 256).
  full_sleep1, stale_sleep2  (the GPU, the demo model) the same around sleep(1) / sleep(2): level 2
         discards the weights, so a layer left out holds whatever the re-allocated memory holds.
  bare   in this process after the service has closed: vLLM on B, and the per-parameter SHA-256 of its
         raw bytes (vLLM 0.32's weight_checksum formula: what POST /weight_checker computes) timed in
         its worker: the engine doing the digest alone. The ratio tool / bare is printed.
Writes OUT/weights.json and prints it between the markers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models
BEGIN, END = "@@WEIGHTS_BEGIN@@", "@@WEIGHTS_END@@"


def build_8b(folder: Path, layers: int) -> Path:
    """A random-weight model of Llama-3-8B's shape, made on the GPU in bf16 (no download)."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(os.environ["PARITY_DEMO_MODEL"])
    cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=len(tok), max_position_embeddings=8192,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return folder


def build_tiny(folder: Path) -> Path:
    from tiny_models import build_model

    return folder if (folder / "config.json").exists() else build_model(folder, "llama")


def with_layer_noised(a: Path, b: Path, layer: int, scale: float = 0.05) -> Path:
    """B: A's folder with every tensor of decoder layer `layer` noised; shards without it are linked."""
    import torch
    from safetensors.torch import load_file, save_file

    if (b / "config.json").exists():
        return b
    b.mkdir(parents=True)
    mark = f".layers.{layer}."
    gen = torch.Generator().manual_seed(layer)
    for f in a.iterdir():
        if f.suffix != ".safetensors":
            if f.is_file():
                shutil.copy(f, b / f.name)
            continue
        from safetensors import safe_open

        with safe_open(str(f), "pt") as s:
            touched = any(mark in k for k in s.keys())
        if not touched:
            os.symlink(f.resolve(), b / f.name)
            continue
        w = load_file(str(f))
        for k, t in w.items():
            if mark in k:
                x = t.float()
                w[k] = (x + scale * x.std() * torch.randn(x.shape, generator=gen)).to(t.dtype)
        save_file(w, str(b / f.name), metadata={"format": "pt"})
    return b


def bare_digest_s(model: Path, dtype: str) -> dict[str, Any]:
    """vLLM on `model` and the SHA-256 of every parameter's raw bytes in its worker: the digest alone."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import hashlib

    import torch
    from vllm import LLM

    def digest(worker: Any) -> float:
        m = worker.model_runner.model
        t0 = time.perf_counter()
        n = 0
        for _, p in m.named_parameters():
            flat = p.detach().contiguous().reshape(-1)
            hashlib.sha256(flat.view(torch.uint8).cpu().numpy() if flat.numel() else b"").hexdigest()
            n += 1
        return time.perf_counter() - t0

    kw: dict[str, Any] = {"gpu_memory_utilization": 0.5} if torch.cuda.is_available() else {
        "kv_cache_memory_bytes": 256 * 2**20}
    llm = LLM(model=str(model), dtype=dtype, enforce_eager=True, max_model_len=1024, seed=0, **kw)
    seconds = llm.collective_rpc(digest)
    del llm
    return {"bare_digest_s": round(max(seconds), 3)}


def one(service: Any, a: Path, b: Path, layer: int, dtype: str, **kw: Any) -> dict[str, Any]:
    from parity_ui.commands.weights import WeightsCheckRequest

    t0 = time.perf_counter()
    r = service.weights(WeightsCheckRequest(model=str(b), start_from=str(a), dtype=dtype, **kw))
    wall = time.perf_counter() - t0
    comps = r.probe.comparisons if r.probe else []
    return {
        "exit_code": r.exit_code, "headline": r.headline(), "error": r.error, "wall_s": round(wall, 2),
        "tensor_check_s": r.timings.get("tensor_check_s"), "probe_s": r.timings.get("probe_s"),
        "units": len(r.tensors), "differing": [t.key.split("|", 1)[1] for t in r.differing],
        "only_layer_named": bool(r.differing) and all(f".layers.{layer}." in t.name for t in r.differing),
        "push_s": round(r.update.seconds, 3) if r.update else None, "path": r.update.path if r.update else None,
        "probe": [{"against": c.against, "verdict": c.verdict, "abs_dlogp_max": c.abs_dlogp_max,
                   "floor_abs_dlogp_max": c.floor_abs_dlogp_max, "first_token": c.first_token} for c in comps],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/weights-bench"))
    ap.add_argument("--work", default="/tmp/weights-models", help="where the models are built (not brought back)")
    ap.add_argument("--small", action="store_true", help="the CPU: the tiny Llama only")
    ap.add_argument("--models", default="demo,8b")
    ap.add_argument("--8b-layers", dest="layers_8b", type=int, default=32)
    ap.add_argument("--no-bare", action="store_true", help="skip the bare engine's digest")
    ap.add_argument("--build-only", action="store_true", help="build the models (A and B) and stop")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from parity_ui.service import ParityService

    gpu = torch.cuda.is_available()
    dtype = "bfloat16" if gpu else "float32"
    kinds = ["tiny"] if args.small else args.models.split(",")
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0) if gpu else None, "dtype": dtype, "models": {}}
    for kind in kinds:
        if kind == "tiny":
            a, layer = build_tiny(work / "tiny-A"), 1
        elif kind == "demo":
            a, layer = Path(os.environ["PARITY_DEMO_MODEL"]), 15
        else:
            t0 = time.perf_counter()
            a, layer = build_8b(work / f"llama8b-{args.layers_8b}l-A", args.layers_8b), args.layers_8b // 2
            result.setdefault("build_s", {})[kind] = round(time.perf_counter() - t0, 1)
        b = with_layer_noised(a, work / f"{kind}-B", layer)
        if args.build_only:
            print(f"built {a} and {b}")
            continue
        service = ParityService(db_path=str(out / "runs.db"))
        fig: dict[str, Any] = {"layer": layer}
        try:
            fig["full"] = one(service, a, b, layer, dtype)
            fig["stale"] = one(service, a, b, layer, dtype, skip=rf"layers\.{layer}\.")
            if gpu and kind == "demo":  # the sleep cycle, where vLLM has it (the CPU build has none)
                fig["full_sleep1"] = one(service, a, b, layer, dtype, sleep=1)
                fig["stale_sleep2"] = one(service, a, b, layer, dtype, sleep=2, skip=rf"layers\.{layer}\.")
        finally:
            service.close()
        if not args.no_bare:
            fig.update(bare_digest_s(b, dtype))
            if fig["full"]["tensor_check_s"]:
                fig["tool_over_bare"] = round(fig["full"]["tensor_check_s"] / max(fig["bare_digest_s"], 1e-9), 2)
        result["models"][kind] = fig
        (out / "weights.json").write_text(json.dumps(result, indent=1))
    print(BEGIN)
    print(json.dumps(result, indent=1))
    print(END)


if __name__ == "__main__":
    main()
