"""Mixture-of-experts routes: which experts each MoE layer chose, per position, and how two sides' routes agree.

`Routes` is one side's routes for one prompt, one row per step of its result (the route of step j is
the routing of the forward pass that predicted token j: input position len(prompt) - 1 + j, the
position whose logits give step j's logprob). Per row and per MoE layer: the top-k expert ids in
the side's slot order, their routing weights, and the router margin at the top-k boundary (the k-th
minus the (k+1)-th router score, in the router's own score: softmax probability or sigmoid score
plus correction bias). A side that could not record weights or margins leaves them empty: "not
recorded", never 0.

Stored compactly (never JSON lists of floats per token): ids as uint8 (<= 256 experts) or int16,
weights and margins as float16, little-endian, packed into one blob by `pack` / `unpack`. Bytes per
token = L*k*(1 or 2) + L*k*2 + L*2 (`bytes_per_token`): Qwen3-30B-A3B (48 layers, 128 experts,
top-8) = 384 + 768 + 96 = 1,248 bytes a token.

`RouteAgreement` is what parity_ui.analysis.routes makes of two sides' routes: a layer x step grid
of codes, per-layer agreement rates and the first (step, layer) where the routes differ. Plain
data: it pickles and is stored in the comparison's JSON.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Any

_MAGIC = b"PUR1"  # parity-ui routes, format 1
_HEADER = struct.Struct("<4sIHHHBB")  # magic, rows, layers, top_k, experts, id bytes, flags (1 weights, 2 margins)

# The grid's codes, one character per (step, layer): the routes are
SAME_ORDER = "="  # the same experts in the same slot order
SAME_SET = "~"  # the same experts, another slot order
NOT_COMPARED = "."  # not comparable: after the token fork (the sides' inputs differ) or not recorded
# otherwise a digit: how many of the k experts the two sides share (0..k; "a".. for k > 9)


def overlap_code(n: int) -> str:
    return str(n) if n < 10 else chr(ord("a") + n - 10)


def code_overlap(code: str, top_k: int) -> int | None:
    """The number of shared experts a grid code stands for; None when not compared."""
    if code in (SAME_ORDER, SAME_SET):
        return top_k
    if code == NOT_COMPARED:
        return None
    return int(code) if code.isdigit() else ord(code) - ord("a") + 10


@dataclass
class Routes:
    """One side's routes for one prompt's steps (see the module docstring). Arrays are flat and
    row-major: ids[(row * layers + layer) * top_k + slot]."""

    layers: list[int]  # the decoder layer index of each MoE layer recorded
    top_k: int
    num_experts: int
    ids: list[int] = field(default_factory=list)
    weights: list[float] | None = None  # None: not recorded (an engine's built-in capture gives ids only)
    margins: list[float] | None = None  # per (row, layer)
    source: str = ""  # how they were recorded: "hooks", "vllm built-in", "rollout dump", ...

    @property
    def rows(self) -> int:
        per = len(self.layers) * self.top_k
        return len(self.ids) // per if per else 0

    def experts(self, row: int, layer: int) -> list[int]:
        """The experts at (row, the layer-th recorded MoE layer), in slot order."""
        o = (row * len(self.layers) + layer) * self.top_k
        return self.ids[o : o + self.top_k]

    def weights_at(self, row: int, layer: int) -> list[float] | None:
        if self.weights is None:
            return None
        o = (row * len(self.layers) + layer) * self.top_k
        return self.weights[o : o + self.top_k]

    def margin(self, row: int, layer: int) -> float | None:
        return None if self.margins is None else self.margins[row * len(self.layers) + layer]

    def rows_between(self, start: int, stop: int | None = None) -> Routes:
        """Rows start..stop-1 (stop None: to the end)."""
        per, n_layers = len(self.layers) * self.top_k, len(self.layers)
        stop = self.rows if stop is None else stop
        return dataclasses.replace(
            self,
            ids=self.ids[start * per : stop * per],
            weights=None if self.weights is None else self.weights[start * per : stop * per],
            margins=None if self.margins is None else self.margins[start * n_layers : stop * n_layers],
        )

    def bytes_per_token(self) -> int:
        lk = len(self.layers) * self.top_k
        return (
            lk * (1 if self.num_experts <= 256 else 2)
            + (2 * lk if self.weights is not None else 0)
            + (2 * len(self.layers) if self.margins is not None else 0)
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the arrays as one base64 blob (`pack`), never a list of floats per token."""
        import base64

        return {
            "layers": list(self.layers),
            "top_k": self.top_k,
            "num_experts": self.num_experts,
            "source": self.source,
            "packed": base64.b64encode(pack(self)).decode("ascii"),
        }


def routes_from_json(data: dict[str, Any] | Routes | None) -> Routes | None:
    if data is None or isinstance(data, Routes):
        return data
    import base64

    out = unpack(base64.b64decode(data["packed"]))
    out.layers, out.source = list(data.get("layers") or out.layers), data.get("source", "")
    return out


def pack(r: Routes) -> bytes:
    """The routes as bytes: a header, ids (uint8 or int16), weights and margins (float16)."""
    import numpy as np

    small = r.num_experts <= 256
    flags = (1 if r.weights is not None else 0) | (2 if r.margins is not None else 0)
    parts = [
        _HEADER.pack(_MAGIC, r.rows, len(r.layers), r.top_k, r.num_experts, 1 if small else 2, flags),
        struct.pack(f"<{len(r.layers)}H", *r.layers),
        np.asarray(r.ids, dtype="<u1" if small else "<i2").tobytes(),
    ]
    if r.weights is not None:
        parts.append(np.asarray(r.weights, dtype="<f2").tobytes())
    if r.margins is not None:
        # inf (nothing beyond the k-th: fewer experts than k + 1) stays inf in float16
        parts.append(np.asarray(r.margins, dtype="<f2").tobytes())
    return b"".join(parts)


def unpack(blob: bytes) -> Routes:
    """The Routes `pack` made; ValueError on anything else."""
    import numpy as np

    if len(blob) < _HEADER.size or blob[:4] != _MAGIC:
        raise ValueError("not a parity-ui routes blob (bad header)")
    _, rows, n_layers, top_k, experts, id_bytes, flags = _HEADER.unpack_from(blob)
    o = _HEADER.size
    layers = list(struct.unpack_from(f"<{n_layers}H", blob, o))
    o += 2 * n_layers
    n = rows * n_layers * top_k
    ids = np.frombuffer(blob, dtype="<u1" if id_bytes == 1 else "<i2", count=n, offset=o).tolist()
    o += n * id_bytes
    weights = margins = None
    if flags & 1:
        weights = np.frombuffer(blob, dtype="<f2", count=n, offset=o).astype(float).tolist()
        o += 2 * n
    if flags & 2:
        margins = np.frombuffer(blob, dtype="<f2", count=rows * n_layers, offset=o).astype(float).tolist()
    return Routes(layers=layers, top_k=top_k, num_experts=experts, ids=ids, weights=weights, margins=margins)


@dataclass
class RouteFlip:
    """The first (step, layer) where two sides' routes differ, with both routers' view of it."""

    step: int
    layer: int  # the decoder layer index
    experts: list[list[int]]  # [a's, b's] in slot order
    margins: list[float | None]  # [a's, b's] router margin at the top-k boundary (None: not recorded)
    overlap: int  # experts shared


@dataclass
class RouteAgreement:
    """Two sides' routes for one prompt, compared step by step and layer by layer."""

    layers: list[int]
    top_k: int
    compared: int  # steps compared: up to and including the first token fork (after it the inputs differ)
    grid: list[str] = field(default_factory=list)  # one string per step, one code per layer (see the codes)
    same_set_by_layer: list[float] = field(default_factory=list)  # share of compared steps, per layer
    same_order_by_layer: list[float] = field(default_factory=list)
    mean_overlap_by_layer: list[float] = field(default_factory=list)  # mean shared experts / k
    same_set: float | None = None  # share of compared (step, layer) cells with the same set
    same_order: float | None = None
    mean_overlap: float | None = None  # mean over compared cells of shared experts / k
    steps_any_differ: float | None = None  # share of compared steps where any layer's set differs
    first_flip: RouteFlip | None = None
    note: str = ""  # why something was not compared (weights not recorded, layers differ...)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def agreement_from_json(data: dict[str, Any] | RouteAgreement | None) -> RouteAgreement | None:
    if data is None or isinstance(data, RouteAgreement):
        return data
    names = {f.name for f in dataclasses.fields(RouteAgreement)}
    flip = data.get("first_flip")
    return RouteAgreement(
        **{
            **{k: v for k, v in data.items() if k in names},
            "first_flip": RouteFlip(**flip) if isinstance(flip, dict) else flip,
        }
    )


@dataclass
class RouteReplay:
    """Attribution by replay: side b run again routing with a's recorded experts ("ids": the
    expert ids only, b's own weights; "ids+weights": ids, weights and slot order), and the pair's
    figures before (natural routing) and after."""

    mode: str
    source: str  # whose routes were forced
    before_first_divergence: int | None
    after_first_divergence: int | None
    before_identical: bool
    after_identical: bool
    before_max_abs_gap: float | None
    after_max_abs_gap: float | None
    compared: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def replay_from_json(data: dict[str, Any] | RouteReplay | None) -> RouteReplay | None:
    if data is None or isinstance(data, RouteReplay):
        return data
    names = {f.name for f in dataclasses.fields(RouteReplay)}
    return RouteReplay(**{k: v for k, v in data.items() if k in names})


def moe_layer_indices(
    n: int, first_k_dense_replace: int = 0, mlp_only_layers: Any = (), sparse_step: int = 1
) -> list[int]:
    """The decoder layers of `n` that route to experts: all but the first `first_k_dense_replace` (DeepSeek,
    GLM-4-MoE), the `mlp_only_layers` and those off the `decoder_sparse_step` (Qwen-MoE). One rule for a
    config.json (measures.routes.route_shape) and for vLLM's built-in capture, which has a row for every
    decoder layer (dense ones left zero) where hooks record the MoE layers only."""
    dense = set(mlp_only_layers or ())
    step = max(int(sparse_step or 1), 1)
    return [i for i in range(n) if i >= int(first_k_dense_replace or 0) and i not in dense and (i + 1) % step == 0]
