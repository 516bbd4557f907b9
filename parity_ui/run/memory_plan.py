"""Which side takes how much of which GPU, decided before anything loads.

vLLM takes a fixed share of a GPU up front (gpu_memory_utilization: weights, activations and its KV
cache all live inside it); an HF side takes its weights, its KV cache and the logits it keeps. When
several sides share a GPU, the vLLM sides whose share is unset split what the HF sides leave; a
plan that cannot fit is refused with the numbers, naming the side, before any weights load.

Then each vLLM side's context (max_model_len) is checked against the KV cache it will have
(`fit_contexts`): vLLM itself checks it only after loading the weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..core.context import KvPerToken, kv_bytes, kv_per_token, pool_bytes, tokens_that_fit
from ..core.errors import ConfigError, SideError
from ..core.mapping import option
from ..core.types import Finding
from .hardware import gpus

if TYPE_CHECKING:
    from .plan import SidePlan

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
HEADROOM = 0.92  # never plan more than this share of a GPU (CUDA context, fragmentation)
MAX_AUTO_SHARE = 0.5  # an unset vLLM share takes at most half a GPU (v1's default)
VLLM_OVERHEAD_GIB = 1.0  # activations, CUDA graphs, sampler buffers beyond the weights
# An HF side's CUDA context and PyTorch's allocator beyond its tensors: on an H100 each HF process of an
# 8B-shaped scored workload peaked 0.8 GiB over weights + KV + logits (bench/figures/gpu-2026-11-26).
HF_OVERHEAD_GIB = 1.0


def side_gpus(plan: SidePlan) -> list[int]:
    """The GPU indices a side uses."""
    if plan.kind.gpu_memory == "none":
        return []  # a remote server: not on this machine's GPUs
    device = plan.spec.options.device
    if device == "cpu":
        return []
    if device.startswith("cuda:"):
        return [int(x) for x in device.split(":", 1)[1].split(",")]
    width = 1
    if plan.kind.gpu_memory == "share":
        width = int(option(plan.spec, "tensor_parallel_size", 1)) * int(option(plan.spec, "pipeline_parallel_size", 1))
    return list(range(width))


def weight_bytes(plan: SidePlan) -> int:
    n = plan.model.num_parameters or 0
    return n * BYTES.get(plan.dtype, 4)


def hf_bytes(plan: SidePlan, longest: int, max_new: int, batch: int, logprobs_scored: bool) -> int:
    """An HF side's weights + KV cache + the logits generate keeps (output_logits, one row per step)
    + one full forward's logits when it scores a sequence (teacher forcing) + its process's CUDA
    context and allocator (HF_OVERHEAD_GIB)."""
    m = plan.model
    elt = BYTES.get(plan.dtype, 4)
    layers = m.num_hidden_layers or 0
    kv_heads = m.num_key_value_heads or m.num_attention_heads or 0
    head_dim = m.head_dim or 0
    tokens = longest + max_new
    kv = 2 * layers * kv_heads * head_dim * tokens * batch * elt
    vocab = m.vocab_size or 0
    kept = max_new * batch * vocab * elt
    scored = tokens * vocab * (elt + 4) if logprobs_scored else 0  # the logits and their float32 copy
    return (
        weight_bytes(plan)
        + kv
        + kept
        + scored
        + attention_scores_bytes(plan, tokens, batch)
        + int(HF_OVERHEAD_GIB * GIB)
    )


def attention_scores_bytes(plan: SidePlan, tokens: int, batch: int) -> int:
    """What an HF side's attention materialises when its kernel keeps the whole score matrix (SDPA
    'math', eager attention): one layer's scores and their softmax at a time, [batch, heads, tokens,
    tokens] in float32 (the noise floor of a scored workload runs SDPA 'math'). Fused kernels keep
    none: 0."""
    o = plan.spec.options
    if getattr(o, "sdpa_kernels", None) != "math" and getattr(o, "attn_implementation", None) != "eager":
        return 0
    heads = plan.model.num_attention_heads or 0
    return 2 * batch * heads * tokens * tokens * 4


def plan_gpu_memory(
    plans: list[SidePlan], gpu: bool, longest: int = 0, max_new: int = 0, batch: int = 1, scored: bool = True
) -> list[Finding]:
    """Fill each vLLM side's unset gpu_memory_utilization and check that every GPU's plan fits.
    Returns one info finding with the plan; raises ConfigError when it cannot fit."""
    if not gpu:
        return []
    devices = {int(g["index"]): int(g["memory_mib"]) * 2**20 for g in gpus()}
    if not devices:
        return []
    use: dict[int, list[tuple[str, float]]] = {i: [] for i in devices}  # gpu -> (side, bytes)
    unset: dict[int, list[Any]] = {i: [] for i in devices}
    for p in plans:
        idx = side_gpus(p)
        for i in idx:
            if i not in devices:
                raise SideError(
                    p.name,
                    "device",
                    f"GPU {i} does not exist (this machine has {len(devices)}: 0..{len(devices) - 1})",
                    "pick one of the GPUs this machine has",
                )
        if not idx:
            continue
        if p.kind.gpu_memory == "share":
            share = p.args.llm.get("gpu_memory_utilization")
            for i in idx:
                if share is None:
                    unset[i].append(p)
                else:
                    use[i].append((p.name, share * devices[i]))
        else:
            need = hf_bytes(p, longest, max_new, batch, scored) / len(idx)
            for i in idx:
                use[i].append((p.name, need))
    for i, total in devices.items():
        free = HEADROOM * total - sum(b for _, b in use[i])
        if unset[i]:
            share = min(MAX_AUTO_SHARE, free / total / len(unset[i]))
            share = math.floor(share * 100) / 100
            for p in unset[i]:
                planned = p.args.llm.get("gpu_memory_utilization")
                share_i = share if planned is None else min(planned, share)
                p.args.llm["gpu_memory_utilization"] = share_i
                use[i].append((p.name, share_i * total))
        for name, b in use[i]:
            plan = next(p for p in plans if p.name == name)
            if plan.kind.gpu_memory == "share":
                tp = max(len(side_gpus(plan)), 1)
                need = weight_bytes(plan) / tp + VLLM_OVERHEAD_GIB * GIB
                if b < need:
                    raise SideError(
                        name,
                        "gpu_memory_utilization",
                        f"the plan leaves side {name} {b / GIB:.1f} GiB of GPU {i}, but its weights "
                        f"and working memory need about {need / GIB:.1f} GiB",
                        "drop a side, move one to another GPU (device=cuda:1), or set the shares "
                        "yourself (SIDE.gpu_memory_utilization)",
                    )
        planned_total = sum(b for _, b in use[i])
        if planned_total > HEADROOM * total:
            parts = ", ".join(f"{n} {b / GIB:.1f} GiB" for n, b in use[i])
            raise ConfigError(
                "sides",
                f"GPU {i} has {total / GIB:.0f} GiB; the sides on it would take "
                f"{planned_total / GIB:.1f} GiB ({parts})",
                "lower a vLLM side's gpu_memory_utilization, shorten the prompt, or move a side "
                "to another GPU (device=cuda:N)",
            )
    lines = []
    for i, total in devices.items():
        if use[i]:
            parts = ", ".join(f"{n} {b / GIB:.1f} GiB" for n, b in use[i])
            lines.append(f"GPU {i} ({total / GIB:.0f} GiB): {parts}")
    return (
        [
            Finding(
                code="memory-plan",
                severity="info",
                message="GPU memory plan: " + "; ".join(lines),
                fix="set a side's gpu_memory_utilization to change its share",
            )
        ]
        if lines
        else []
    )


# vLLM allocates the KV cache in blocks: 128 tokens on its CPU backend (vllm/platforms/cpu.py), 16 by
# default on a GPU. A request holds whole blocks.
CPU_BLOCK = 128
GPU_BLOCK = 16


def _kv_budget(plan: SidePlan, devices: dict[int, int]) -> tuple[float, str, str] | None:
    """(bytes of KV cache one rank of the side has, how that figure comes, the setting that raises it),
    or None when it cannot be known here."""
    llm = plan.args.llm
    if "kv_cache_memory_bytes" in llm:  # the CPU: exactly what vLLM gets
        gib = llm["kv_cache_memory_bytes"] / GIB
        return llm["kv_cache_memory_bytes"], f"this side's kv_cache_gib={gib:g}", "kv_cache_gib"
    share, idx = llm.get("gpu_memory_utilization"), side_gpus(plan)
    if share is None or not idx or any(i not in devices for i in idx):
        return None
    total = min(devices[i] for i in idx)
    weights = weight_bytes(plan) / len(idx)
    budget = share * total - weights - VLLM_OVERHEAD_GIB * GIB
    return (
        budget,
        (
            f"about {budget / GIB:.1f} GiB: gpu_memory_utilization={share:g} of {total / GIB:.0f} GiB, less "
            f"{weights / GIB:.1f} GiB of weights and ~{VLLM_OVERHEAD_GIB:g} GiB of working memory"
        ),
        "gpu_memory_utilization",
    )


def _raise_target(plan: SidePlan, need_bytes: int, setting: str, devices: dict[int, int]) -> str:
    """The value of `setting` that would hold `need_bytes` of KV, as a --set the user can type."""
    if setting == "kv_cache_gib":
        value = math.ceil(need_bytes / GIB * 100) / 100
        return f"raise this side's kv_cache_gib to {value:g} (--set {plan.name}.kv_cache_gib={value:g})"
    idx = side_gpus(plan)
    total = min(devices[i] for i in idx)
    share = math.ceil((need_bytes + weight_bytes(plan) / len(idx) + VLLM_OVERHEAD_GIB * GIB) / total * 100) / 100
    if share > 0.98:
        return "give the side more GPUs (tensor_parallel_size) or a larger GPU"
    return f"raise this side's gpu_memory_utilization to {share:g} (--set {plan.name}.gpu_memory_utilization={share:g})"


def fit_contexts(plans: list[SidePlan], gpu: bool, needs: dict[str, int], explicit: bool) -> None:
    """Check that one request of each vLLM side's max_model_len fits the KV cache the side will have
    (vLLM's own check, made before loading). A context sized by parity-ui (`explicit` False) that its
    bucket makes too long is trimmed to what fits, never below the run's need (`needs`). Raises
    SideError with the figures and the fix otherwise. Sides whose KV is not plain attention, and a GPU
    whose memory is unknown, are left to vLLM."""
    devices = {int(g["index"]): int(g["memory_mib"]) * 2**20 for g in gpus()} if gpu else {}
    for plan in plans:
        llm = getattr(plan.args, "llm", None)
        if plan.kind.gpu_memory != "share" or not llm or llm.get("max_model_len") is None:
            continue
        per_token = kv_per_token(
            plan.model,
            BYTES.get(plan.dtype, 4),
            int(llm.get("tensor_parallel_size", 1)),
            int(llm.get("pipeline_parallel_size", 1)),
        )
        budget = _kv_budget(plan, devices)
        # A sliding window caches min(window + a batch's tokens, max_model_len) tokens: all of them
        # unless chunked prefill makes the batch smaller than the context.
        windowed = plan.model.sliding_window and llm.get("enable_chunked_prefill")
        if per_token is None or budget is None or windowed:
            continue
        block = GPU_BLOCK if gpu else CPU_BLOCK
        context, fits = llm["max_model_len"], tokens_that_fit(budget[0], per_token, block)
        if context <= fits:
            continue
        need = needs.get(plan.name, context)
        if not explicit and need <= fits:
            llm["max_model_len"] = fits
            continue
        _refuse(plan, context, need, explicit, per_token, block, fits, budget, devices)


def _refuse(
    plan: SidePlan,
    context: int,
    need: int,
    explicit: bool,
    per_token: KvPerToken,
    block: int,
    fits: int,
    budget: tuple[float, str, str],
    devices: dict[int, int],
) -> None:
    tokens = context if explicit else need
    need_bytes, pool = kv_bytes(tokens, per_token, block), pool_bytes(tokens, per_token, block)
    what = (
        f"max_model_len={tokens:,}"
        if explicit
        else f"this run needs {tokens:,} positions (its longest prompt plus max_new_tokens), and one request of that "
        "length"
    )
    message = (
        f"{what} needs {need_bytes / GIB:.2f} GiB of KV cache ({per_token}), over {budget[1]}; vLLM would "
        "refuse to start after loading the weights"
    )
    if explicit and need <= fits:
        fix = (
            f"lower max_model_len to {fits:,} or less (this run needs {need:,}; or unset it: each vLLM side then "
            f"gets what the run needs), or {_raise_target(plan, pool, budget[2], devices)}"
        )
    elif explicit:
        fix = (
            f"{_raise_target(plan, pool, budget[2], devices)}; lowering max_model_len cannot help: the "
            f"run itself needs {need:,} positions ({kv_bytes(need, per_token, block) / GIB:.2f} GiB)"
        )
    else:
        fix = f"{_raise_target(plan, pool, budget[2], devices)}, or shorten the prompt or lower max_new_tokens"
    raise SideError(plan.name, budget[2], message, fix)
