"""The bare engines the benches compare parity-ui with: loaded with exactly the arguments the tool
maps to, so they generate exactly the tokens the tool's sides generate (the benches assert it)."""
from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any


def load_bare_hf(prep: Any) -> tuple[Any, Any, Any]:
    """(model, prompt ids tensor, GenerationConfig) for the prepared run's `hf` side."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    h = prep.side("hf").args
    config = AutoConfig.from_pretrained(prep.model.path)
    for key, value in h.config_overrides.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_pretrained(prep.model.path, config=config,
                                                 **{**h.load, "dtype": getattr(torch, h.load["dtype"])})
    model.to(h.device).eval()
    # What the tool's HF engine does too: a neutral generation_config, so the model's file cannot
    # add EOS ids (with ignore_eos) or sampling values behind the mapper's back.
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id)
    ids = torch.tensor([prep.prompts[0].token_ids], device=h.device)
    return model, ids, GenerationConfig(**h.sampling, return_dict_in_generate=True, output_logits=True)


def in_fresh_process(fn: Any, args: Any, env: dict[str, str] | None = None) -> dict:
    """Run `fn(args, queue)` in a spawned process and return what it put on the queue. `env` goes on
    top of this process's environment from the child's start: settings read when a library loads
    (libgomp's GOMP_SPINCOUNT when torch loads, vLLM's cache directories) must be there by then."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(args, q))
    saved = dict(os.environ)
    os.environ.update(env or {})  # a spawned process starts with this process's environment
    try:
        p.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    res = q.get()
    p.join()
    return res


def length_batches(seqs: list[list[int]], budget: int) -> list[list[int]]:
    """Row indices the way a user batches teacher-forcing: longest first, as many rows a forward as fit
    `budget` tokens (rows x the batch's longest, its padded size)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        if cur and (len(cur) + 1) * len(seqs[cur[0]]) > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    return batches


def padded_logits(model: Any, seqs: list[list[int]], batch: list[int], device: str) -> Any:
    """One forward of `batch` (from length_batches: its first row the longest), right-padded with an
    attention mask: the logits, [rows, longest, vocab]."""
    import torch

    w = len(seqs[batch[0]])
    ids = torch.tensor([seqs[i] + [0] * (w - len(seqs[i])) for i in batch], device=device)
    mask = torch.tensor([[1] * len(seqs[i]) + [0] * (w - len(seqs[i])) for i in batch], device=device)
    return model(input_ids=ids, attention_mask=mask).logits
