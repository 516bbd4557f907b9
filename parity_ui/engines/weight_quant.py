"""Quantised weights compared after dequantisation, with a tolerance stated by their format (issue 41).

Two engines that quantise the same checkpoint the same way hold the same bytes: the digest says so.
Where the bytes differ (an update path that quantises online with another scale, a re-quantisation
that rounds the other way), the values are compared dequantised, within one step of the format:

  fp8 e4m3 (float8_e4m3fn)  |d| <= 2^-3 x max(|a|, |b|) + 2^-9 x scale   (3 mantissa bits: one ULP;
                                                                          the smallest subnormal)
  fp8 e5m2 (float8_e5m2)    |d| <= 2^-2 x max(|a|, |b|) + 2^-16 x scale
  int8 (w8a8, w8a16)        |d| <= 1 x scale                             (one quantisation step)

with the layer's `weight_scale` per tensor, per output channel, or per block (`weight_scale_inv`,
[rows/block, cols/block], DeepSeek-style). Other formats (int4 packed in int32: GPTQ, AWQ, Marlin)
are compared as stored bytes only: their digests say equal or not, no tolerance is applied.
Pure torch on tensors; runs inside the engines' workers.
"""

from __future__ import annotations

from typing import Any

from ..core.weights import DiffFigure

# dtype name -> (label, relative tolerance, smallest step as a multiple of the scale)
FORMATS: dict[str, tuple[str, float, float]] = {
    "float8_e4m3fn": ("fp8 e4m3: 1 ULP (2^-3 relative) + 2^-9 x scale", 2.0**-3, 2.0**-9),
    "float8_e4m3fnuz": ("fp8 e4m3 (fnuz): 1 ULP (2^-3 relative) + 2^-10 x scale", 2.0**-3, 2.0**-10),
    "float8_e5m2": ("fp8 e5m2: 1 ULP (2^-2 relative) + 2^-16 x scale", 2.0**-2, 2.0**-16),
    "int8": ("int8: one quantisation step (1 x scale)", 0.0, 1.0),
}


def _scale(module: Any) -> Any:
    for name in ("weight_scale", "weight_scale_inv"):
        s = getattr(module, name, None)
        if s is not None and hasattr(s, "numel") and s.numel() > 0:
            return s
    return None


def _broadcast(scale: Any, w: Any) -> Any:
    """The scale shaped to multiply `w` [rows, cols]: per tensor, per row, per column, or per block."""
    s = scale.float().to(w.device)
    if s.numel() == 1:
        return s.reshape(())
    rows, cols = w.shape[0], w.shape[-1]
    flat = s.reshape(-1)
    if s.dim() <= 2 and flat.numel() == rows and (s.dim() == 1 or s.shape[-1] == 1):
        return flat.reshape(rows, *([1] * (w.dim() - 1)))
    if s.dim() <= 2 and flat.numel() == cols and (s.dim() == 1 or s.shape[0] == 1):
        return flat.reshape(*([1] * (w.dim() - 1)), cols)
    if s.dim() == 2 and w.dim() == 2:  # blocks: each scale covers a [rows/br, cols/bc] tile
        br, bc = -(-rows // s.shape[0]), -(-cols // s.shape[1])
        return s.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    raise ValueError(f"a scale of shape {tuple(s.shape)} does not fit a weight of shape {tuple(w.shape)}")


def dequantised(module: Any, pname: str, t: Any) -> tuple[Any, str | None, float | None]:
    """(values, format, largest scale) of a whole parameter: a quantised weight times its layer's scale,
    as float32, with the format's name; anything else as it is, None, None."""
    dtype = str(t.dtype).replace("torch.", "")
    if pname != "weight" or dtype not in FORMATS or t.dim() < 1:
        return t, None, None
    scale = _scale(module)
    if scale is None:
        return t, None, None
    try:
        return t.float() * _broadcast(scale, t), dtype, float(scale.float().abs().max())
    except ValueError:
        return t, None, None


def compare_values(key: str, live: Any, ref: Any, fmt: str | None, scale_max: float | None = None) -> DiffFigure:
    """The size of a difference. Exact (fmt None): elements that differ bit for bit. Quantised: the
    dequantised values against the format's tolerance (FORMATS)."""
    import torch

    ref = ref.to(live.device)
    numel = live.numel()
    if tuple(live.shape) != tuple(ref.shape):
        return DiffFigure(
            key, None, None, numel, numel, tolerance=f"shapes differ: {tuple(live.shape)} vs {tuple(ref.shape)}"
        )
    a, b = live.float(), ref.float()
    nonfinite = int((~torch.isfinite(a)).sum())
    d = (a - b).abs()
    max_abs = float(d.max()) if numel else 0.0
    ref_norm = float(torch.linalg.vector_norm(b))
    diff_norm = float(torch.linalg.vector_norm(a - b))
    rel = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else float("inf"))
    if fmt is None:
        same_dtype = live.dtype == ref.dtype and live.element_size() in (1, 2, 4, 8)
        if same_dtype:
            ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[live.element_size()]
            n = int((live.contiguous().view(ints) != ref.contiguous().view(ints)).sum())
        else:
            n = int((a != b).sum())
        return DiffFigure(key, max_abs, rel, n, numel, nonfinite=nonfinite)
    label, rel_tol, step = FORMATS[fmt]
    floor = step * (scale_max if scale_max is not None else float(b.abs().max()) or 1.0)
    tol = rel_tol * torch.maximum(a.abs(), b.abs()) + floor
    n = int((d > tol).sum())
    return DiffFigure(key, max_abs, rel, n, numel, tolerance=label, within_tolerance=n == 0, nonfinite=nonfinite)
