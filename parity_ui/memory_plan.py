"""Which side takes how much of which GPU, decided before anything loads.

vLLM takes a fixed share of a GPU up front (gpu_memory_utilization: weights, activations and its KV
cache all live inside it); an HF side takes its weights, its KV cache and the logits it keeps. When
several sides share a GPU, the vLLM sides whose share is unset split what the HF sides leave; a
plan that cannot fit is refused with the numbers, naming the side, before any weights load.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, SideError
from .hardware import gpus
from .types import Finding

if TYPE_CHECKING:
    from .plan import SidePlan

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
HEADROOM = 0.92  # never plan more than this share of a GPU (CUDA context, fragmentation)
MAX_AUTO_SHARE = 0.5  # an unset vLLM share takes at most half a GPU (v1's default)
VLLM_OVERHEAD_GIB = 1.0  # activations, CUDA graphs, sampler buffers beyond the weights


def side_gpus(plan: "SidePlan") -> list[int]:
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
        width = plan.spec.options.tensor_parallel_size * plan.spec.options.pipeline_parallel_size
    return list(range(width))


def weight_bytes(plan: "SidePlan") -> int:
    n = plan.model.num_parameters or 0
    return n * BYTES.get(plan.dtype, 4)


def hf_bytes(plan: "SidePlan", longest: int, max_new: int, batch: int, logprobs_scored: bool) -> int:
    """An HF side's weights + KV cache + the logits generate keeps (output_logits, one row per step)
    + one full forward's logits when it scores a sequence (teacher forcing)."""
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
    return weight_bytes(plan) + kv + kept + scored


def plan_gpu_memory(plans: list["SidePlan"], gpu: bool, longest: int = 0, max_new: int = 0,
                    batch: int = 1, scored: bool = True) -> list[Finding]:
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
                raise SideError(p.name, "device", f"GPU {i} does not exist (this machine has "
                                                      f"{len(devices)}: 0..{len(devices) - 1})",
                                  "pick one of the GPUs this machine has")
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
                    raise SideError(name, "gpu_memory_utilization",
                                      f"the plan leaves side {name} {b / GIB:.1f} GiB of GPU {i}, but its weights "
                                      f"and working memory need about {need / GIB:.1f} GiB",
                                      "drop a side, move one to another GPU (device=cuda:1), or set the shares "
                                      "yourself (SIDE.gpu_memory_utilization)")
        planned_total = sum(b for _, b in use[i])
        if planned_total > HEADROOM * total:
            parts = ", ".join(f"{n} {b / GIB:.1f} GiB" for n, b in use[i])
            raise ConfigError("sides", f"GPU {i} has {total / GIB:.0f} GiB; the sides on it would take "
                                       f"{planned_total / GIB:.1f} GiB ({parts})",
                              "lower a vLLM side's gpu_memory_utilization, shorten the prompt, or move a side "
                              "to another GPU (device=cuda:N)")
    lines = []
    for i, total in devices.items():
        if use[i]:
            parts = ", ".join(f"{n} {b / GIB:.1f} GiB" for n, b in use[i])
            lines.append(f"GPU {i} ({total / GIB:.0f} GiB): {parts}")
    return [Finding(code="memory-plan", severity="info", message="GPU memory plan: " + "; ".join(lines),
                    fix="set a side's gpu_memory_utilization to change its share")] if lines else []
