"""Tiny real models built by the tests: random Llama / Qwen2 with a BPE tokenizer trained here.

Small enough to build in seconds and run on 2 CPU cores, real enough for both engines to load
them through their normal code paths (config.json + safetensors + tokenizer.json + chat template).
Weights are scaled up (initializer_range) so the logits are peaked: greedy near-ties are rare in
float32, which is what makes "identical in fp32" a meaningful test.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def _corpus() -> list[str]:
    import inspect
    import json as j
    import textwrap

    import argparse, dataclasses, pathlib  # noqa: E401 - only their sources are used
    return [inspect.getsource(m) for m in (argparse, dataclasses, pathlib, j, textwrap)]


def build_tokenizer(folder: Path, vocab_size: int = 1024) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def build_model(folder: Path, arch: str = "llama", *, seed: int = 0, max_position_embeddings: int = 2048,
                generation_config: dict[str, Any] | None = None, dtype: str = "float32",
                init_range: float = 0.15, vocab_size: int = 1024, hidden_size: int = 128,
                num_attention_heads: int = 4, num_key_value_heads: int = 2, num_hidden_layers: int = 2,
                head_dim: int | None = None) -> Path:
    """Build a tiny random model of `arch` ("llama" or "qwen2") into `folder` and return it."""
    import torch
    from transformers import (AutoModelForCausalLM, LlamaConfig, Qwen2Config)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder, vocab_size)
    common = dict(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                  num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  initializer_range=init_range, tie_word_embeddings=False)
    if head_dim is not None:
        common["head_dim"] = head_dim
    cfg = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    gen_path = folder / "generation_config.json"
    if generation_config is not None:
        gen = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
               "pad_token_id": tok.pad_token_id, **generation_config}
        gen_path.write_text(json.dumps(gen, indent=2))
    return folder


def copy_model(src: Path, dst: Path) -> Path:
    """A byte-for-byte copy of a model folder (a second checkpoint of the same weights)."""
    import shutil

    shutil.copytree(src, dst)
    return Path(dst)


def perturb_weights(folder: Path, tensor: str, *, scale: float = 0.05, seed: int = 1) -> Path:
    """Add Gaussian noise of `scale` x the tensor's std to one named weight, in place: a checkpoint
    that differs from the original in exactly one module."""
    import torch
    from safetensors.torch import load_file, save_file

    path = next(Path(folder).glob("*.safetensors"))
    weights = load_file(path)
    if tensor not in weights:
        raise KeyError(f"{tensor} is not in {path.name}: {sorted(weights)[:8]} ...")
    w = weights[tensor]
    gen = torch.Generator().manual_seed(seed)
    weights[tensor] = (w.float() + scale * w.float().std() * torch.randn(w.shape, generator=gen)).to(w.dtype)
    save_file(weights, path, metadata={"format": "pt"})
    return Path(folder)
