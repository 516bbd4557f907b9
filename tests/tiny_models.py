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


def perturb_relative(folder: Path, tensor: str, *, scale: float = 1e-3, row: int | None = None,
                     seed: int = 1) -> Path:
    """Multiply one named weight (or one `row` of it) by (1 + scale * N(0, 1)) elementwise, in place: a
    checkpoint whose one op differs by ~`scale` relative (norm weights too, whose std is 0 at init)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = next(Path(folder).glob("*.safetensors"))
    weights = load_file(path)
    if tensor not in weights:
        raise KeyError(f"{tensor} is not in {path.name}: {sorted(weights)[:8]} ...")
    w = weights[tensor].float().clone()
    gen = torch.Generator().manual_seed(seed)
    target = w if row is None else w[row]
    target.mul_(1 + scale * torch.randn(target.shape, generator=gen))
    weights[tensor] = w.to(weights[tensor].dtype).contiguous()
    save_file(weights, path, metadata={"format": "pt"})
    return Path(folder)


# Mixture-of-experts models: two router families.
#   qwen3_moe     softmax over the experts, top-k (Qwen3-MoE; Mixtral/OLMoE route the same way)
#   deepseek_v3   sigmoid scores, experts in n_group groups of which topk_group are kept, then top-k,
#                 plus a shared expert (DeepSeek-V3; the tie-prone kind: sigmoid saturates)
MOE_ARCHS = ("qwen3_moe", "glm4_moe", "deepseek_v3")


def moe_config(arch: str, tok: Any, *, hidden_size: int = 64, num_hidden_layers: int = 2, num_experts: int = 8,
               top_k: int = 2, init_range: float = 0.15, max_position_embeddings: int = 2048) -> Any:
    """The transformers config of a tiny MoE of `arch` (one of MOE_ARCHS) for tokenizer `tok`."""
    from transformers import DeepseekV3Config, Glm4MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  initializer_range=init_range, tie_word_embeddings=False, num_experts_per_tok=top_k,
                  moe_intermediate_size=hidden_size, intermediate_size=2 * hidden_size)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**common, num_experts=num_experts, head_dim=32, norm_topk_prob=True,
                              decoder_sparse_step=1, mlp_only_layers=[])
    if arch == "deepseek_v3":
        # MLA: vLLM's MLA takes kv_lora_rank + qk_rope_head_dim in {320, 512, 576}, and its CPU decode kernel takes 576 only.
        # No dense first layers, so every layer routes.
        common["num_key_value_heads"] = 4  # MLA: every head has its own keys
        return DeepseekV3Config(**common, n_routed_experts=num_experts, n_group=4, topk_group=2,
                                n_shared_experts=1, first_k_dense_replace=0, routed_scaling_factor=1.0,
                                norm_topk_prob=True, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                                qk_nope_head_dim=16, v_head_dim=32, rope_interleave=True,
                                # vLLM reads these (HF implies them): sigmoid scores with the bias
                                topk_method="noaux_tc", scoring_func="sigmoid")
    if arch == "glm4_moe":
        # DeepSeek-V3's router (sigmoid + correction bias, n_group/topk_group, shared expert) behind
        # plain grouped-query attention: the grouped family both engines run alike on the CPU.
        return Glm4MoeConfig(**common, n_routed_experts=num_experts, n_group=4, topk_group=2, n_shared_experts=1,
                             first_k_dense_replace=0, routed_scaling_factor=1.0, norm_topk_prob=True,
                             head_dim=32, partial_rotary_factor=0.5, use_qk_norm=False,
                             topk_method="noaux_tc", scoring_func="sigmoid")
    raise ValueError(f"unknown MoE arch {arch!r}; one of {MOE_ARCHS}")


# A real model's per-layer shape (attention and experts), for random-weight models of few layers.
SHAPES = {"qwen3-30b-a3b": dict(num_attention_heads=32, num_key_value_heads=4, head_dim=128, moe_intermediate_size=768,
                                intermediate_size=6144, vocab_size=151936, rope_theta=1_000_000.0)}


def build_moe_model(folder: Path, arch: str = "qwen3_moe", *, seed: int = 0, dtype: str = "float32",
                    vocab_size: int = 1024, shape: str | None = None, **config: Any) -> Path:
    """Build a random MoE model of `arch` (one of MOE_ARCHS) into `folder`: tiny, or with a real
    model's per-layer `shape` (SHAPES; the tokenizer stays the tiny one, its ids a subset of the
    shape's vocabulary). A shaped model is made in `dtype` directly (billions of parameters)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder, vocab_size)
    cfg = moe_config(arch, tok, **config)
    for key, value in SHAPES.get(shape or "", {}).items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype) if shape else torch.float32)
    with torch.no_grad():  # routers start at zero in some versions: give them the scale of the rest
        for name, p in model.named_parameters():
            if name.endswith("gate.weight") and float(p.abs().max()) == 0.0:
                p.normal_(0.0, cfg.initializer_range)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    return folder


def _gate_inputs(model: Any, ids: list[int], layer: int) -> Any:
    """The rows entering MoE layer `layer`'s gate for one forward pass over ids: [len(ids), hidden]."""
    import torch

    got = []
    gate = model.model.layers[layer].mlp.gate
    h = gate.register_forward_hook(lambda m, args, out: got.append(args[0].detach().reshape(-1, args[0].shape[-1])))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        h.remove()
    return got[0].double()


def plant_router_tie(src: Path, near: Path, flipped: Path, prompt_ids: list[int], *, max_new_tokens: int = 12,
                     margin: float = 5e-7, first_step: int = 2, candidates: int = 8) -> dict[str, Any]:
    """Two checkpoints of the qwen3_moe model in `src` with a planted router near-tie.

    At a (layer, step) found here, `near` has the k-th and (k+1)-th experts' router probabilities
    `margin` apart (the k-th ahead) on the greedy run of `prompt_ids`; `flipped` is the same model
    with that gap reversed (a nudge of ~2 x margin to one gate row): the (k+1)-th expert wins there
    and only there. Only that gate row of that layer changes, so everything before it (the gate's
    input at that position) is the same in both. A (layer, step) is kept where the swap changes
    the greedy token at that very step, so the flip is what makes the streams fork.
    Returns {"layer", "step", "position", "experts": [k-th, (k+1)-th], "margin"}."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    base = len(prompt_ids)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    tokens = out[0, base:].tolist()
    k = model.config.num_experts_per_tok
    layers = model.config.num_hidden_layers
    for step in range(first_step, min(first_step + candidates, len(tokens))):
        for layer in reversed(range(layers)):
            pos = base - 1 + step
            seq = prompt_ids + tokens[:step]
            h = _gate_inputs(model, seq, layer)[pos]
            W = model.model.layers[layer].mlp.gate.weight.detach().double()
            logits = W @ h
            order = torch.argsort(logits, descending=True).tolist()
            kth, nxt = order[k - 1], order[k]
            p = torch.softmax(logits, dim=-1)
            # softmax: dp_nxt ~ p_nxt * dlogit; aim the (k+1)-th's probability `margin` below the k-th's
            want = [float(torch.log(p[kth] - margin) - torch.log(p[nxt])),
                    float(torch.log(p[kth] + margin) - torch.log(p[nxt]))]
            rows = []
            for dl in want:
                Wn = W.clone()
                Wn[nxt] += dl * h / float(h @ h)
                rows.append(Wn.float())
            # the flipped model must fork at this step
            trial = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
            with torch.no_grad():
                trial.model.layers[layer].mlp.gate.weight.copy_(rows[1])
                t_out = trial.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False)
                trial.model.layers[layer].mlp.gate.weight.copy_(rows[0])
                n_out = trial.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False)
            if int(t_out[0, -1]) == tokens[step] or int(n_out[0, -1]) != tokens[step]:
                continue
            name = f"model.layers.{layer}.mlp.gate.weight"
            for folder, row in ((near, rows[0]), (flipped, rows[1])):
                if Path(folder).exists():
                    shutil.rmtree(folder)
                shutil.copytree(src, folder)
                path = next(Path(folder).glob("*.safetensors"))
                weights = load_file(path)
                weights[name] = row.contiguous()
                save_file(weights, path, metadata={"format": "pt"})
            return {"layer": layer, "step": step, "position": pos, "experts": [kth, nxt], "margin": margin,
                    "tokens": tokens}
    raise RuntimeError("no (layer, step) where swapping the k-th and (k+1)-th expert changes the token")
