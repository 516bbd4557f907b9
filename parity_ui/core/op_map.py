"""The op map: for every decoder layer, every op inside it and every token of a window, how far side b is
from side a, as the error b's op ADDS (fed a's input at that point) beside the error b has piled up by
then (cumulative), each against a measured noise floor (parity_ui.commands.op_map runs it,
parity_ui.engines.op_trace captures it).

Rows, in forward order: the embeddings (layer -1), then per decoder layer its ops (OPS_DENSE or
OPS_MOE), then the final norm and the logits (layer = the number of layers, "final"):

  in_norm     the input RMSNorm                       input: the stream entering the layer
  q, k, v     the projections, q/k after q/k-norm (Qwen3) and RoPE   input: in_norm
  attn        attention before o_proj                 input: q, k, v (k and v at every earlier position)
  o_proj      attention after o_proj                  input: attn
  attn_resid  the stream after the attention add      input: the stream in, o_proj
  post_norm   the post-attention RMSNorm              input: attn_resid
  gate, up    the MLP's two projections               input: post_norm
  act         act(gate) * up                          input: gate, up
  down        the MLP's output                        input: act
  router      MoE: the router's logits                input: post_norm
  experts     MoE: the experts' combined output, routed as a routed   input: post_norm, a's routing
  out         the stream after the layer              input: attn_resid, down (or experts)

Per cell (row, token) eight float32 figures and the top differing dims (STATS, TOP): BYTES_PER_CELL
bytes. No tensor is stored. Arrays are packed little-endian and base64'd where they are stored in a
localisation's JSON (`to_dict` / `op_map_from_dict`); `readable` gives the `--json` form.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

from .types import FLOOR_MULTIPLE, MIN_REL

OPS_DENSE = ("in_norm", "q", "k", "v", "attn", "o_proj", "attn_resid", "post_norm", "gate", "up", "act", "down", "out")
OPS_MOE = ("in_norm", "q", "k", "v", "attn", "o_proj", "attn_resid", "post_norm", "router", "experts", "out")
OPS_FINAL = ("norm", "logits")
EMBED = -1  # the row before layer 0

OP_LABELS = {
    "embed": "embeddings",
    "in_norm": "input norm",
    "q": "q (after RoPE)",
    "k": "k (after RoPE)",
    "v": "v",
    "attn": "attention (before o_proj)",
    "o_proj": "attention output (o_proj)",
    "attn_resid": "post-attention residual",
    "post_norm": "post-attention norm",
    "gate": "MLP gate_proj",
    "up": "MLP up_proj",
    "act": "MLP act(gate)*up",
    "down": "MLP output (down_proj)",
    "router": "MoE router logits",
    "experts": "MoE experts' combined output",
    "out": "layer output (stream)",
    "norm": "final norm",
    "logits": "logits (lm_head)",
}
# Sums with no module of their own: nothing to swap in (swap the op before them instead).
NOT_SWAPPABLE = ("embed", "attn_resid")

# Architectures whose decoder layers the capture knows (config.json "architectures" -> name).
SUPPORTED = {
    "LlamaForCausalLM": "Llama",
    "MistralForCausalLM": "Mistral",
    "Qwen2ForCausalLM": "Qwen2",
    "Qwen3ForCausalLM": "Qwen3",
    "Qwen3MoeForCausalLM": "Qwen3-MoE",
}

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")  # transformers 5 names it num_local_experts

STATS = ("cum_rel", "cum_max", "cum_cos", "add_rel", "add_max", "add_cos", "floor_cum", "floor_add")
TOP = 3  # top differing dims kept per cell, for the cumulative and the added error each
TOPS = ("cum_idx", "cum_val", "add_idx", "add_val")
BYTES_PER_CELL = 4 * len(STATS) + 2 * TOP * (4 + 4)  # 80: eight float32, 2 x 3 (int32 dim, float32 diff)
THREE_WAY_MULTIPLE = 2.0  # the side's error against fp32 within 2x the reference's own: dtype-only


def supported_text() -> str:
    return ", ".join(dict.fromkeys(SUPPORTED.values()))


class UnknownArchitecture(ValueError):
    """A model whose decoder layers the op capture does not know."""


@dataclass(frozen=True)
class OpShape:
    """What sizes the op map's tensors: read from a model's config.json (no weights)."""

    arch: str  # SUPPORTED's name
    layers: int
    hidden: int
    q: int  # heads x head_dim
    kv: int  # kv heads x head_dim
    intermediate: int
    vocab: int
    experts: int = 0  # > 0: every layer is MoE (Qwen3-MoE with decoder_sparse_step 1, no mlp_only_layers)
    top_k: int = 0
    moe_intermediate: int = 0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def ops(self) -> tuple[str, ...]:
        return OPS_MOE if self.moe else OPS_DENSE

    def rows(self) -> list[tuple[int, str]]:
        """(layer, op) for every row of the map, in forward order."""
        out = [(EMBED, "embed")]
        for layer in range(self.layers):
            out += [(layer, op) for op in self.ops()]
        return out + [(self.layers, op) for op in OPS_FINAL]

    def dim(self, op: str) -> int:
        return {
            "q": self.q,
            "attn": self.q,
            "k": self.kv,
            "v": self.kv,
            "gate": self.intermediate,
            "up": self.intermediate,
            "act": self.intermediate,
            "router": self.experts,
            "logits": self.vocab,
        }.get(op, self.hidden)

    def dump_bytes(self, window: int, total: int, itemsize: int, full_ops: tuple[str, ...] = ()) -> int:
        """The reference's tensors the map ships to the other side: every op's output at the window's
        positions, k and v (and any op to swap in) at every position up to the window's end."""
        whole = {"k", "v", *full_ops}
        per_layer = sum(self.dim(op) for op in self.ops() if op not in whole)
        full = sum(self.dim(op) for op in whole if op in self.ops())
        routing = self.top_k * 2 if self.moe else 0  # ids and weights
        elements = window * (self.hidden + self.layers * (per_layer + routing) + self.hidden + self.vocab)
        elements += total * self.layers * full
        return elements * itemsize


def shape_from_config(cfg: dict[str, Any]) -> OpShape:
    """An OpShape from a config.json dict; UnknownArchitecture for one the capture does not know."""
    cfg = cfg.get("text_config") or cfg
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    known = next((SUPPORTED[a] for a in archs if a in SUPPORTED), None)
    if known is None:
        named = ", ".join(archs) or f"model_type {cfg.get('model_type')!r}"
        raise UnknownArchitecture(named)
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    experts = next((int(cfg[k]) for k in EXPERT_KEYS if cfg.get(k)), 0) if known == "Qwen3-MoE" else 0
    if experts and (cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1):
        raise UnknownArchitecture(
            f"{known} with dense layers among the MoE ones (mlp_only_layers / decoder_sparse_step)"
        )
    return OpShape(
        arch=known,
        layers=int(cfg["num_hidden_layers"]),
        hidden=hidden,
        q=heads * head_dim,
        kv=int(cfg.get("num_key_value_heads") or heads) * head_dim,
        intermediate=int(cfg.get("intermediate_size") or 0),
        vocab=int(cfg["vocab_size"]),
        experts=experts,
        top_k=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate=int(cfg.get("moe_intermediate_size") or 0) if experts else 0,
    )


def row_label(layer: int, op: str, layers: int) -> str:
    if layer == EMBED:
        return "embeddings"
    if layer >= layers:
        return f"final {op}"
    return f"L{layer} {op}"


def parse_cell(text: str, layers: int, ops: tuple[str, ...]) -> tuple[int, str]:
    """ "LAYER.OP" (e.g. 3.q, final.norm) -> (layer, op); ValueError naming what is accepted."""
    head, _, op = text.strip().partition(".")
    layer = layers if head.lower() == "final" else (int(head) if head.lstrip("-").isdigit() else None)
    allowed = OPS_FINAL if layer == layers else ops
    if layer is None or not 0 <= layer <= layers or op not in allowed:
        raise ValueError(
            f"{text!r} is not a LAYER.OP of this model (layers 0..{layers - 1} with ops {', '.join(ops)}; "
            f"final.norm, final.logits)"
        )
    return layer, op


# -- packing ---------------------------------------------------------------------------------------


def pack(values: Any, dtype: str = "<f4") -> str:
    import numpy as np

    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def unpack(text: str, dtype: str = "<f4") -> Any:
    import numpy as np

    return np.frombuffer(base64.b64decode(text), dtype=dtype).copy()


@dataclass
class OpMap:
    """One op map (see the module docstring). Arrays are numpy: stats[name] [R, T] float32,
    tops[name] [R, T, TOP] (idx int32, val float32); R = len(rows), T = len(positions)."""

    arch: str
    layers: int
    rows: list[tuple[int, str]]
    positions: list[int]  # indices into the teacher-forced ids: the map's tokens
    prompt_len: int  # positions >= prompt_len hold generated tokens
    examined: int  # the position whose logits predict the examined (divergent) token
    token_text: list[str]  # each position's input token, as text
    stats: dict[str, Any]
    tops: dict[str, Any]
    routers: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # MoE layer -> margins, same set
    three_way: dict[str, Any] | None = None  # fp32 side: {"side", "a_add", "a_cum", "b_add", "b_cum"} [R, T]
    swap: dict[str, Any] | None = None  # the causal check (commands.op_map.swap_record)
    notes: list[str] = field(default_factory=list)

    def threshold(self, kind: str) -> Any:
        """[R, T]: where a cell leaves the floor, per kind ("add" or "cum"): FLOOR_MULTIPLE x the larger of
        its own floor and its row's median floor (one noise draw can land near zero at one cell), at least
        MIN_REL."""
        import numpy as np

        f = self.stats[f"floor_{kind}"]
        row_median = np.nanmedian(np.where(np.isfinite(f), f, np.nan), axis=1, keepdims=True)
        row_median = np.nan_to_num(row_median, nan=0.0)
        return np.maximum(FLOOR_MULTIPLE * np.maximum(np.nan_to_num(f, nan=0.0), row_median), MIN_REL)

    def over(self, kind: str) -> Any:
        """[R, T] bool: the cells whose `kind` error leaves the floor."""
        import numpy as np

        x = self.stats[f"{kind}_rel"]
        return np.nan_to_num(x, nan=0.0) > self.threshold(kind)

    def first_over(self, kind: str = "add") -> tuple[int, int] | None:
        """(row, token index) of the first cell in forward order (row first, then token) that leaves the
        floor, or None."""
        import numpy as np

        over = self.over(kind)
        rows = np.flatnonzero(over.any(axis=1))
        if not len(rows):
            return None
        r = int(rows[0])
        return r, int(np.flatnonzero(over[r])[0])

    def beyond_fp32(self, kind: str = "add") -> Any:
        """[R, T] bool (three-way maps): b's error against the fp32 side is more than THREE_WAY_MULTIPLE x a's
        own there (and over MIN_REL): more than the rounding of the reference's dtype. None without one."""
        import numpy as np

        if self.three_way is None:
            return None
        b, a = np.nan_to_num(self.three_way[f"b_{kind}"]), np.nan_to_num(self.three_way[f"a_{kind}"])
        return (b > THREE_WAY_MULTIPLE * a) & (b > MIN_REL)

    def row_of(self, layer: int, op: str) -> int:
        return self.rows.index((layer, op))

    def label(self, r: int) -> str:
        layer, op = self.rows[r]
        return row_label(layer, op, self.layers)

    def cell(self, r: int, t: int) -> dict[str, Any]:
        """Every figure of one cell, for the app's click and the CLI."""
        layer, op = self.rows[r]
        out: dict[str, Any] = {
            "layer": layer,
            "op": op,
            "label": self.label(r),
            "what": OP_LABELS.get(op, op),
            "position": self.positions[t],
            "token": self.token_text[t] if t < len(self.token_text) else "",
            "generated": self.positions[t] >= self.prompt_len,
        }
        for k in STATS:
            out[k] = _num(self.stats[k][r, t])
        for kind in ("add", "cum"):
            out[f"{kind}_threshold"] = _num(self.threshold(kind)[r, t])
            out[f"{kind}_over"] = bool(self.over(kind)[r, t])
            idx, val = self.tops[f"{kind}_idx"][r, t], self.tops[f"{kind}_val"][r, t]
            out[f"{kind}_top"] = [[int(i), _num(v)] for i, v in zip(idx, val) if i >= 0]
        if self.three_way is not None:
            for k in ("a_add", "a_cum", "b_add", "b_cum"):
                out[f"fp32_{k}"] = _num(self.three_way[k][r, t])
        if op == "router" and layer in self.routers:
            rt = self.routers[layer]
            out["router"] = {k: rt[k][t] for k in rt}
        return out

    def to_dict(self) -> dict[str, Any]:
        """The stored form: arrays packed (see the module docstring)."""
        return {
            "format": 1,
            "arch": self.arch,
            "layers": self.layers,
            "rows": [list(r) for r in self.rows],
            "positions": list(self.positions),
            "prompt_len": self.prompt_len,
            "examined": self.examined,
            "token_text": list(self.token_text),
            "stats": {k: pack(v) for k, v in self.stats.items()},
            "tops": {k: pack(v, "<i4" if k.endswith("idx") else "<f4") for k, v in self.tops.items()},
            "routers": {str(k): v for k, v in self.routers.items()},
            "three_way": None
            if self.three_way is None
            else {k: (pack(v) if k != "side" else v) for k, v in self.three_way.items()},
            "swap": self.swap,
            "notes": list(self.notes),
            "bytes_per_cell": BYTES_PER_CELL,
        }

    def readable(self) -> dict[str, Any]:
        """The `--json` form: every array as nested lists, row by row (NaN as null)."""
        d = self.to_dict()
        d["stats"] = {k: _lists(v) for k, v in self.stats.items()}
        d["tops"] = {k: _lists(v) for k, v in self.tops.items()}
        if self.three_way is not None:
            d["three_way"] = {k: (_lists(v) if k != "side" else v) for k, v in self.three_way.items()}
        d["row_labels"] = [self.label(r) for r in range(len(self.rows))]
        first = self.first_over("add")
        d["first_over_floor"] = None if first is None else self.cell(*first)
        return d


def op_map_from_dict(d: dict[str, Any]) -> OpMap:
    """The stored form (to_dict) back to an OpMap."""
    rows = [(int(a), str(b)) for a, b in d["rows"]]
    shape = (len(rows), len(d["positions"]))
    stats = {k: unpack(v).reshape(shape) for k, v in d["stats"].items()}
    tops = {k: unpack(v, "<i4" if k.endswith("idx") else "<f4").reshape(*shape, TOP) for k, v in d["tops"].items()}
    tw = d.get("three_way")
    return OpMap(
        arch=d["arch"],
        layers=int(d["layers"]),
        rows=rows,
        positions=[int(p) for p in d["positions"]],
        prompt_len=int(d["prompt_len"]),
        examined=int(d["examined"]),
        token_text=list(d.get("token_text") or []),
        stats=stats,
        tops=tops,
        routers={int(k): v for k, v in (d.get("routers") or {}).items()},
        three_way=None if tw is None else {k: (unpack(v).reshape(shape) if k != "side" else v) for k, v in tw.items()},
        swap=d.get("swap"),
        notes=list(d.get("notes") or []),
    )


def _num(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def _lists(a: Any) -> Any:
    """Nested lists; non-finite floats as None (JSON has no NaN or infinity)."""
    import numpy as np

    if a.dtype.kind != "f":
        return a.tolist()
    out = a.astype(object)
    out[~np.isfinite(a)] = None
    return out.tolist()
