"""HF's decode paths at batch 1, greedy, in one process: generate() eager (the reference), generate()
with a static cache, and parity-ui's graphed loop (`decode=graphed`: static cache + the decode step as
one CUDA graph). Per path: ms per token (second call, warm), tokens identical to eager, and
max |Δ logprob| of the chosen tokens against eager up to the first divergence.

It also answers "why is HF's first generate slow in a fresh process": each fresh child loads the model,
does the tool's load-time warm-up (one 8-token forward), then times generate twice (with when each
token arrived); a second kind of child adds a short decode warm-up (generate 8 tokens) first, a third
turns SDPA's cuDNN attention off as a side with sdpa_kernels=no-cudnn does. (H100, bf16: 16.5 / 19.6 / 5.1 s for the first call, ~5.5 s for
the second: cuDNN attention plans each new KV length once per process.)

Needs only torch + transformers (no vLLM), so it runs on the lent GPU without the bundle:
    python bench/hf_decode.py --random-smollm2 --out result.json     # SmolLM2-135M shape, random weights
    python bench/hf_decode.py --model /tmp/models/smollm2-135m-instruct
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = list(range(1000, 1041))  # 41 ids, as long as the gravity chat prompt


def _model(args, dtype_name):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, dtype_name)
    if args.model:
        m = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    else:  # SmolLM2-135M-Instruct's shape (30 layers, 9 heads / 3 KV heads, tied 49152 vocab)
        cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                          max_position_embeddings=8192)
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg).to(dtype)
    m = m.to(args.device).eval()
    m.generation_config = GenerationConfig(pad_token_id=0)
    return m


def _generate(m, n, cache=None, stamps=None):
    import torch
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    class _Stamps(BaseStreamer):  # when each token arrives: is a slow first call slow throughout, or at its start?
        def put(self, value):
            stamps.append(time.perf_counter() - t)

        def end(self):
            pass

    gc = GenerationConfig(max_new_tokens=n, do_sample=False, return_dict_in_generate=True, output_logits=True,
                          pad_token_id=0, cache_implementation=cache, disable_compile=True)
    ids = torch.tensor([PROMPT], device=m.device)
    _sync()
    t = time.perf_counter()
    with torch.inference_mode():
        out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc,
                         streamer=_Stamps() if stamps is not None else None)
    _sync()
    s = time.perf_counter() - t
    tokens = out.sequences[0, len(PROMPT):].tolist()
    lps = [torch.log_softmax(l[0].float(), -1)[tid].item() for l, tid in zip(out.logits, tokens)]
    return s, tokens, lps


def _graphed(m, n):
    from parity_ui.engines.hf_greedy import GreedyDecoder

    d = GreedyDecoder(m, 5)
    d.decode(PROMPT, n, set(), lambda i, t: None, lambda: False)  # first call: builds the cache, captures
    _sync()
    t = time.perf_counter()
    o = d.decode(PROMPT, n, set(), lambda i, t: None, lambda: False)
    _sync()
    return time.perf_counter() - t, o.tokens, o.chosen, d.describe()


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _compare(ref_tokens, ref_lps, tokens, lps):
    first = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), None)
    upto = first if first is not None else len(ref_tokens)
    gap = max((abs(a - b) for a, b in zip(ref_lps[:upto], lps[:upto])), default=0.0)
    return {"identical": first is None and len(tokens) == len(ref_tokens), "first_divergence": first,
            "max_abs_logprob_gap_before": gap}


def paths(args) -> dict:
    out = {}
    for dtype in args.dtypes:
        m = _model(args, dtype)
        _generate(m, 8)
        row = {}
        first_s = _generate(m, args.tokens)[0]  # bf16: cuDNN attention's per-length plans (see fresh_process)
        s, ref, ref_lps = _generate(m, args.tokens)
        row["eager"] = {"s": s, "ms_per_token": 1000 * s / len(ref), "tokens": len(ref), "first_call_s": first_s}
        s, toks, lps = _generate(m, args.tokens, "static")
        s, toks, lps = _generate(m, args.tokens, "static")  # second call: warm
        row["static"] = {"s": s, "ms_per_token": 1000 * s / len(toks), **_compare(ref, ref_lps, toks, lps)}
        s, toks, lps, how = _graphed(m, args.tokens)
        row["graphed"] = {"s": s, "ms_per_token": 1000 * s / len(toks), "cuda_graphs": how,
                          **_compare(ref, ref_lps, toks, lps)}
        static_toks, static_lps = _generate(m, args.tokens, "static")[1:]
        row["graphed_vs_static"] = _compare(static_toks, static_lps, toks, lps)
        row["speedup_graphed_over_eager"] = row["eager"]["s"] / row["graphed"]["s"]
        out[dtype] = row
        del m
    return out


def child(args) -> dict:
    """A fresh process: load, the tool's load warm-up, optionally a decode warm-up, then two generates."""
    import torch

    kernels = None
    if args.child == "no-cudnn-sdpa":  # as a side with sdpa_kernels=no-cudnn: the worker's own switch
        from parity_ui.engines.hf_engine import _enable_sdpa_kernels, _sdpa_kernels_enabled
        from parity_ui.core.kinds import SDPA_ENABLED

        _enable_sdpa_kernels(SDPA_ENABLED["no-cudnn"])
        kernels = _sdpa_kernels_enabled()
    t = time.perf_counter()
    m = _model(args, args.dtypes[0])
    with torch.inference_mode():
        m(input_ids=torch.zeros((1, 8), dtype=torch.long, device=m.device))
    _sync()
    load = time.perf_counter() - t
    t = time.perf_counter()
    if args.child == "decode-warmup":
        _generate(m, 8)
    warm = time.perf_counter() - t
    stamps1, stamps2 = [], []
    first = _generate(m, args.tokens, stamps=stamps1)[0]
    second = _generate(m, args.tokens, stamps=stamps2)[0]
    marks = [n for n in (1, 2, 8, 32, 64, 128, 256) if n < len(stamps1)]  # stamps[0] is the prompt
    return {"sdpa_kernels": kernels or "torch's choice", "load_s": load, "decode_warmup_s": warm, "first_generate_s": first, "second_generate_s": second,
            "first_call_s_at_token": {n: round(stamps1[n], 3) for n in marks},
            "second_call_s_at_token": {n: round(stamps2[n], 3) for n in marks}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--random-smollm2", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--child", choices=["plain", "decode-warmup", "no-cudnn-sdpa"])
    ap.add_argument("--fresh-only", action="store_true", help="only the fresh-process children")
    ap.add_argument("--no-fresh", action="store_true", help="only the in-process paths")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.model and not args.random_smollm2:
        ap.error("give --model PATH or --random-smollm2")
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    result = {"paths": {} if args.fresh_only else paths(args), "fresh_process": {}}
    base = [sys.executable, __file__, "--device", args.device, "--tokens", str(args.tokens), "--dtypes", args.dtypes[0]]
    base += ["--model", args.model] if args.model else ["--random-smollm2"]
    for kind in () if args.no_fresh else ("plain", "decode-warmup", "no-cudnn-sdpa"):
        t = time.perf_counter()
        p = subprocess.run([*base, "--child", kind], capture_output=True, text=True, check=True)
        line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
        result["fresh_process"][kind] = {**json.loads(line[7:]), "process_s": time.perf_counter() - t}
    import torch
    import transformers

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
