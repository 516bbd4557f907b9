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
