"""A random-weight model with Llama-3-8B's shape, built on the GPU in bf16 and saved (issue 33 item 2).

hidden 4096, 32 layers (--layers), 32 heads, 8 KV heads, intermediate 14336. The vocabulary is the demo
tokenizer's (SmolLM2: 49,152), not Llama-3's 128,256, so that the demo tokenizer serves it; the tokenizer
files are copied from $PARITY_DEMO_MODEL.

    python3 bench/gpu33_build_llama8b.py --out /tmp/llama8b [--layers 32]
"""
import argparse
import os
import time

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="/tmp/llama8b")
ap.add_argument("--layers", type=int, default=32)
a = ap.parse_args()
t0 = time.perf_counter()
tok = AutoTokenizer.from_pretrained(os.environ["PARITY_DEMO_MODEL"])
cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=len(tok), max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, dtype="bfloat16")
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg)
torch.set_default_dtype(torch.float32)
torch.cuda.synchronize()
t1 = time.perf_counter()
n = sum(p.numel() for p in model.parameters())
model.save_pretrained(a.out)
tok.save_pretrained(a.out)
t2 = time.perf_counter()
print(f"BUILD params={n} vocab={len(tok)} layers={a.layers} init_s={t1 - t0:.1f} save_s={t2 - t1:.1f} "
      f"peak_alloc_gib={torch.cuda.max_memory_allocated() / 2**30:.1f}")
