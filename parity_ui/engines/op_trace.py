"""The op map inside an engine's own process (parity_ui.core.op_map says what it is; parity_ui.commands.op_map
runs it; parity_ui.engines.op_hooks knows each engine's layers).

Every pass is ONE teacher-forced forward over the ids (a prefill, eager: hooks do not fire inside CUDA
graphs or compiled graphs, and a decode step's dump under graphs is worthless). What a hook sees is
cloned at once: vLLM's fused add+norm and its rotary embedding write their inputs in place, and a
tensor kept by reference would hold what was written later (nnsight#630: 64.62 against 0.07).

- dump (the reference, `dump_to`): every op's output at the window's positions, k and v (and an op
  to swap in) at every position, written as one safetensors file in the reference's own dtype.
- trace (`reference`): per layer, as the layer ends, for every op and window position
    cumulative  this side's own op output against the reference's
    added       this side's op fed the REFERENCE's input at that point, against the reference's output
  as statistics (relative L2, max |diff|, cosine, the top differing dims); the tensors are dropped
  with the layer. The reference's file is read one layer at a time (memory-mapped).
  With `noise_eps` (the reference against its own file): the stream entering every layer, and every
  op's input on the added path, is multiplied by (1 + eps*u), u uniform in [-1, 1]: the floor.
- swap: a trace whose forward takes the reference's output of one op at every position.
"""

from __future__ import annotations

import time
from typing import Any

from ..core.op_map import EMBED, OPS_FINAL, TOP
from ..core.requests import OpTraceRequest
from .base import EngineFault

CELL_STATS = ("cum_rel", "cum_max", "cum_cos", "add_rel", "add_max", "add_cos")


def key(layer: int, op: str) -> str:
    return f"{layer}.{op}"


def cell_stats(ref: Any, x: Any) -> tuple[Any, Any, Any, Any, Any]:
    """Per row of two [n, D] tensors: relative L2 of x against ref, max |x - ref|, cosine, and the TOP
    dims with the largest |x - ref| (their index and signed difference; -1 / nan past D)."""
    import torch

    a, b = ref.float(), x.float()
    d = b - a
    na, nb, nd = a.norm(dim=-1), b.norm(dim=-1), d.norm(dim=-1)
    rel = torch.where(na > 0, nd / na.clamp_min(1e-30), torch.where(nd == 0, 0.0, float("inf")))
    cos = torch.where((na > 0) & (nb > 0), (a * b).sum(-1) / (na * nb).clamp_min(1e-30), (na == nb).float())
    k = min(TOP, d.shape[-1])
    _, idx = d.abs().topk(k, dim=-1)
    val = d.gather(-1, idx)
    if k < TOP:
        pad = TOP - k
        idx = torch.cat([idx, torch.full((idx.shape[0], pad), -1, device=idx.device, dtype=idx.dtype)], -1)
        val = torch.cat([val, torch.full((val.shape[0], pad), float("nan"), device=val.device)], -1)
    return rel, d.abs().amax(-1), cos, idx, val


class Reference:
    """The reference's dump, one tensor at a time, moved to `device` in `dtype` when asked."""

    def __init__(self, path: str, device: Any, dtype: Any):
        from safetensors import safe_open

        self.file = safe_open(path, framework="pt", device="cpu")
        self.keys = set(self.file.keys())
        self.meta = self.file.metadata() or {}
        self.device, self.dtype = device, dtype
        self.cache: dict[str, Any] = {}

    def has(self, k: str) -> bool:
        return k in self.keys

    def get(self, k: str, dtype: Any = None) -> Any:
        if k not in self.cache:
            if k not in self.keys:
                raise EngineFault(
                    f"the reference's op dump has no {k} (the two sides' models differ in their layers or ops)",
                    "map two sides of the same architecture and number of layers",
                )
            self.cache[k] = self.file.get_tensor(k).to(self.device)
        t = self.cache[k]
        want = self.dtype if dtype is None else dtype
        return t if want is False or t.dtype == want else t.to(want)

    def drop(self, prefix: str) -> None:
        for k in [k for k in self.cache if k.startswith(prefix)]:
            del self.cache[k]


class Pass:
    """One forward pass's bookkeeping: what the hooks keep, and (trace) the figures per cell."""

    def __init__(self, req: OpTraceRequest, ops: Any, device: Any, dtype: Any):
        import torch

        self.req, self.ops, self.device, self.dtype = req, ops, device, dtype
        self.n = len(req.ids)
        self.win = torch.tensor(req.window, dtype=torch.long, device=device)
        self.rows = ops.rows()
        self.row_index = {r: i for i, r in enumerate(self.rows)}
        self.T = len(req.window)
        self.trace = req.reference is not None
        self.ref = Reference(req.reference, device, dtype) if req.reference is not None else None
        self.full = {"k", "v", *req.full_ops}
        self.swap = (int(req.swap[0]), str(req.swap[1])) if req.swap else None
        self.noise_eps = req.noise_eps or 0.0
        self.gen = torch.Generator(device=device).manual_seed(req.seed) if self.noise_eps else None
        self.quiet = False  # True while this side's ops are run on the reference's inputs: hooks stand by
        self.own: dict[str, Any] = {}  # the current layer's own op outputs, every row
        self.dumped: dict[str, Any] = {}
        self.stats = {k: torch.full((len(self.rows), self.T), float("nan")) for k in CELL_STATS}
        self.tops = {
            "cum_idx": torch.full((len(self.rows), self.T, TOP), -1, dtype=torch.int32),
            "cum_val": torch.full((len(self.rows), self.T, TOP), float("nan")),
            "add_idx": torch.full((len(self.rows), self.T, TOP), -1, dtype=torch.int32),
            "add_val": torch.full((len(self.rows), self.T, TOP), float("nan")),
        }
        self.routers: dict[int, dict[str, list[float]]] = {}
        self.layer: int | None = None
        self.swapped = False
        self.padded: int | None = None  # rows of the forward when the engine padded the ids' batch

    # -- what the hooks call ------------------------------------------------------------------------

    def noisy(self, t: Any) -> Any:
        """t with rounding-level noise (the floor run), else t."""
        if not self.noise_eps or t is None:
            return t
        import torch

        u = torch.rand(t.shape, generator=self.gen, device=t.device, dtype=torch.float32) * 2 - 1
        return (t.float() * (1 + self.noise_eps * u)).to(t.dtype)

    def keep(self, op: str, t: Any, layer: int | None = None) -> None:
        """This side's own output of `op` in the current layer, [rows, dim], cloned."""
        if self.quiet:
            return
        layer = self.layer if layer is None else layer
        t = t.detach()
        t = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
        if self.padded and t.shape[0] == self.padded:  # the engine padded the batch: the ids' rows come first
            t = t[: self.n]
        if t.shape[0] != self.n:
            raise EngineFault(
                f"the forward pass ran {t.shape[0]} rows at {op}, not the {self.n} ids asked for (the prefill was "
                "split into chunks, or the engine padded the batch)",
                "map with enable_chunked_prefill=false on vLLM sides, or pick a shorter --window",
            )
        self.own[key(layer, op)] = t.clone()  # type: ignore[arg-type]

    def swap_in(self, layer: int | None, op: str, t: Any) -> Any:
        """The reference's `op` output in place of `t` (same shape and dtype) when it is the op to swap."""
        if self.quiet or self.swap is None or self.swap != ((self.layer if layer is None else layer), op):
            return t
        assert self.ref is not None
        ref = self.ref.get(key(*self.swap), t.dtype)
        self.swapped = True
        return self.fill(t, ref)

    def fill(self, t: Any, rows: Any) -> Any:
        """t with its first rows (the ids') replaced by `rows` (a padded batch keeps its padding rows)."""
        if t.shape[0] == rows.shape[0] or t.dim() != 2:
            return rows.reshape(t.shape)
        out = t.clone()
        out[: rows.shape[0]] = rows.reshape(rows.shape[0], -1)
        return out

    def swapping(self, layer: int | None, op: str) -> bool:
        return not self.quiet and self.swap == ((self.layer if layer is None else layer), op)

    def ref_rows(self, layer: int, op: str, full: bool = False, dtype: Any = None) -> Any:
        """The reference's output of op at the window's positions ([window, dim]), or with `full` at every
        position (where it was dumped so). `dtype`: False keeps the file's (expert ids)."""
        assert self.ref is not None
        t = self.ref.get(key(layer, op), dtype)
        if full:
            if t.shape[0] != self.n:
                raise EngineFault(
                    f"the reference's dump holds {layer}.{op} at the window's positions only",
                    "dump it at every position (full_ops) to swap it or feed attention with it",
                )
            return t
        return t[self.win] if t.shape[0] == self.n and self.T != self.n else t

    # -- a layer ends ---------------------------------------------------------------------------------

    def stream_in(self, layer: int) -> str:
        return key(EMBED, "embed") if layer == 0 else key(layer - 1, "out")

    def finish(self, layer: int, added: dict[str, Any]) -> None:
        """The layer is done: dump its outputs, or measure them (cumulative from `own`, added from
        `added`: this side's ops on the reference's inputs)."""
        mine = {k.split(".", 1)[1]: v for k, v in self.own.items() if k.startswith(f"{layer}.")}
        if not self.trace:
            for op, t in mine.items():
                rows = t if (op in self.full or op in ("ids", "weights") and "router" in self.full) else t[self.win]
                self.dumped[key(layer, op)] = rows.to("cpu").contiguous()
        else:
            assert self.ref is not None
            for op, t in mine.items():
                if (layer, op) not in self.row_index:
                    continue
                self._put(layer, op, "cum", self.ref_rows(layer, op), t[self.win])
            for op, t in added.items():
                self._put(layer, op, "add", self.ref_rows(layer, op), t)
            self.ref.drop(f"{layer - 1}.")  # the layer before is no one's input any more
        for k in [k for k in self.own if k.startswith(f"{layer}.")]:
            del self.own[k]

    def _put(self, layer: int, op: str, kind: str, ref: Any, x: Any) -> None:
        r = self.row_index[(layer, op)]
        rel, mx, cos, idx, val = cell_stats(ref, x.reshape(ref.shape))
        self.stats[f"{kind}_rel"][r] = rel.cpu()
        self.stats[f"{kind}_max"][r] = mx.cpu()
        self.stats[f"{kind}_cos"][r] = cos.cpu()
        self.tops[f"{kind}_idx"][r] = idx.to("cpu", dtype=self.tops[f"{kind}_idx"].dtype)
        self.tops[f"{kind}_val"][r] = val.cpu()

    def result(self) -> dict[str, Any]:
        def raw(t: Any) -> bytes:
            return t.contiguous().numpy().tobytes()

        return {
            "rows": [list(r) for r in self.rows],
            "T": self.T,
            "stats": {k: raw(v.float()) for k, v in self.stats.items()},
            "tops": {k: raw(v) for k, v in self.tops.items()},
            "routers": self.routers,
        }


def run_pass(ops: Any, req: OpTraceRequest) -> dict[str, Any]:
    """One pass (see the module docstring) on an engine's layers (`ops`, an op_hooks adapter)."""
    import torch

    t0 = time.perf_counter()
    if not req.window or min(req.window) < 0 or max(req.window) >= len(req.ids):
        raise EngineFault(
            f"the op map's window must be positions 0..{len(req.ids) - 1} of the ids",
            "pick the window inside the prompt and tokens",
        )
    p = Pass(req, ops, ops.device, ops.dtype)
    handles = ops.install(p)
    try:
        with torch.no_grad():
            ops.forward(req.ids)
            final = ops.layers_n
            # The final norm and the logits, at the window's positions (vLLM and HF compute the last row's only).
            own_norm = p.own.get(key(final, "norm"))
            if own_norm is None:
                raise EngineFault(
                    "the forward pass did not reach the final norm (hooks did not fire: the model ran compiled or "
                    "as a CUDA graph)",
                    "map with enforce_eager=true on this side",
                )
            # The logits the forward computed: with the final norm swapped, from the reference's rows (the
            # norm hook kept this side's own output before swapping; logits from that would show the
            # swapped-out error still there, and the swap as doing nothing).
            swapped_norm = p.swap == (final, "norm")
            own_logits = ops.logits(p.ref_rows(final, "norm") if swapped_norm else own_norm[p.win])
            p.own[key(final, "logits")] = _spread(own_logits, p)
            added: dict[str, Any] = {}
            if p.trace and req.added:
                with quiet(p):
                    x = p.noisy(p.ref_rows(final - 1, "out"))
                    added["norm"] = ops.final_norm(x)
                    added["logits"] = ops.logits(p.noisy(p.ref_rows(final, "norm")))
            argmax = own_logits.float().argmax(-1).cpu().tolist()
            p.finish(final, added)
    finally:
        for h in handles:
            h.remove()
        ops.uninstall()
    if req.swap and not p.swapped:
        raise EngineFault(
            f"the swap of {req.swap[0]}.{req.swap[1]} never happened (the op did not run in this engine's forward)",
            "swap another op of the map",
        )
    out: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 3), "argmax": argmax}
    if not p.trace:
        from safetensors.torch import save_file

        assert req.dump_to is not None
        save_file(p.dumped, req.dump_to, metadata={"n": str(p.n), "window": ",".join(map(str, req.window))})
        out["bytes"] = sum(t.numel() * t.element_size() for t in p.dumped.values())
        return out
    assert p.ref is not None
    ref_logits = p.ref_rows(final, "logits")
    out["ref_argmax"] = ref_logits.float().argmax(-1).cpu().tolist()
    return {**out, **p.result()}


def _spread(rows: Any, p: Pass) -> Any:
    """Window rows as a tensor of every row (the rest zero), so `finish` slices them like any op's."""
    import torch

    full = torch.zeros((p.n, rows.shape[-1]), dtype=rows.dtype, device=rows.device)
    full[p.win] = rows
    return full


class quiet:
    """Hooks stand by while this side's ops run on the reference's inputs."""

    def __init__(self, p: Pass):
        self.p = p

    def __enter__(self) -> Pass:
        self.p.quiet = True
        return self.p

    def __exit__(self, *exc: Any) -> None:
        self.p.quiet = False


def added_ops(ops: Any, p: Pass, layer: int) -> dict[str, Any]:
    """This side's ops of `layer` fed the reference's inputs (noisy in the floor run): {op: [window, dim]}.
    The attention is vLLM's own business (it must run inside the forward: op_hooks does it there)."""
    if not p.trace or not p.req.added:
        return {}
    ref, nz = p.ref_rows, p.noisy
    s_in = ref(*_split(p.stream_in(layer)))
    out: dict[str, Any] = {}
    with quiet(p):
        out["in_norm"] = ops.in_norm(layer, nz(s_in))
        positions = p.win
        out["q"], out["k"], out["v"] = ops.qkv(layer, nz(ref(layer, "in_norm")), positions)
        attn = ops.attn_added(layer, p)
        if attn is not None:
            out["attn"] = attn
        out["o_proj"] = ops.o_proj(layer, nz(ref(layer, "attn")))
        out["attn_resid"] = nz(s_in) + nz(ref(layer, "o_proj"))
        out["post_norm"] = ops.post_norm(layer, nz(ref(layer, "attn_resid")))
        x = nz(ref(layer, "post_norm"))
        if ops.moe:
            out["router"] = ops.router(layer, x)
            out["experts"] = ops.experts(
                layer, x, ref(layer, "router"), ref(layer, "ids", dtype=False), ref(layer, "weights")
            )
            mlp_out = ref(layer, "experts")
        else:
            out["gate"], out["up"] = ops.gate_up(layer, x)
            out["act"] = ops.act(layer, nz(ref(layer, "gate")), nz(ref(layer, "up")))
            out["down"] = ops.down(layer, nz(ref(layer, "act")))
            mlp_out = ref(layer, "down")
        out["out"] = nz(ref(layer, "attn_resid")) + nz(mlp_out)
    return out


def _split(k: str) -> tuple[int, str]:
    layer, op = k.split(".", 1)
    return int(layer), op


def router_view(p: Pass, layer: int, spec: Any) -> None:
    """MoE: per window position, the reference's and this side's router margin at the top-k boundary
    and whether they chose the same experts (parity_ui.engines.routes' margin)."""
    from .routes import margins_of

    if not p.trace or p.quiet:
        return
    own_logits = p.own.get(key(layer, "router"))
    own_ids = p.own.get(key(layer, "ids"))
    if own_logits is None or own_ids is None:
        return
    ref_logits = p.ref_rows(layer, "router")
    ref_ids = p.ref_rows(layer, "ids", dtype=False)
    mine = own_ids[p.win].long()
    same = [float(set(a.tolist()) == set(b.tolist())) for a, b in zip(mine.cpu(), ref_ids.long().cpu())]
    p.routers[layer] = {
        "margin_ref": margins_of(spec, ref_logits).tolist(),
        "margin_side": margins_of(spec, own_logits[p.win]).tolist(),
        "same": same,
    }


__all__ = ["OPS_FINAL", "Pass", "added_ops", "run_pass", "router_view", "quiet"]
