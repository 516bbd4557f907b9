"""Mixture-of-experts routes inside an engine's own process: recorded, and forced (route replay).

One teacher-forced forward pass over `ids` (the prompt and a side's tokens); every MoE layer's
router is watched and, per input position asked for, the chosen experts in slot order, their
routing weights and the router margin at the top-k boundary are kept (parity_ui.core.routes).

- transformers: a forward hook on each MoE layer's gate. HF's routers return (router_logits,
  routing weights, expert ids) for the rows of the call: one sequence, row i is position i.
- vLLM (in process, VLLM_ENABLE_V1_MULTIPROCESSING=0): each MoE layer's router object is wrapped
  (`select_experts`, what the fused-MoE runner calls with the router logits and which returns the
  weights and ids its kernel then uses). The CPU build's own capture (`enable_return_routed_experts`)
  refuses there ("AuxOutput Connector requires Model Runner V2", which "requires Triton"); hooks
  do not fire inside CUDA graphs or compiled graphs, so on a GPU the built-in capture gives the ids
  (the V1 model runner) and the hooks, when the side runs eager, the weights and margins. Not eager,
  a side's generate keeps the ids its own tokens were routed with, and the routes of those tokens
  are answered from them (VllmEngine.routes): no prefill again, one sequence at a time.

Hooks keep what they see on the device and copy it to the host once per request (_Keeper): a copy
per layer made the forward wait for the host at every MoE layer.

Route forcing (replay): the gate's forward is patched so that the rows of recorded positions take
the recorded experts: "ids" keeps this side's own weights for them (its router's scores at the
forced ids, normalised as the router normalises), "ids+weights" takes the recorded weights and
slot order too. Positions are counted per layer across the calls of one generate (prefill rows,
then one per decoding step; one sequence at a time).

The margin is taken in the router's own choice score: softmax probability (Qwen3-MoE, Mixtral,
OLMoE) or sigmoid score plus correction bias with the groups not kept masked out (DeepSeek-V3,
GLM-4-MoE); where fewer than k + 1 experts remain after the group mask, the (k+1)-th is taken
before the mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.routes import Routes, moe_layer_indices
from .base import EngineFault

MOE_UNSUPPORTED = (
    "this model has no mixture-of-experts layer parity-ui can watch (no router found)",
    "record routes on an MoE model (Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V2/V3, GLM-4-MoE), or set routes=false",
)


@dataclass
class RouterSpec:
    """How a router turns its logits into a choice (read from either engine's router module)."""

    top_k: int
    num_experts: int
    scoring: str = "softmax"  # or "sigmoid"
    n_group: int | None = None
    topk_group: int | None = None
    bias: Any = None  # e_score_correction_bias (a tensor) or None
    renormalize: bool = True
    scaling: float = 1.0


def choice_scores(spec: RouterSpec, logits: Any) -> tuple[Any, Any]:
    """(the router's choice scores with unkept groups at -inf, the same before the group mask), float32."""
    import torch

    x = logits.float()
    scores = torch.softmax(x, dim=-1) if spec.scoring == "softmax" else x.sigmoid()
    if spec.bias is not None:
        scores = scores + spec.bias.float().to(scores.device)
    plain = scores
    if spec.n_group and spec.topk_group and spec.n_group > 1 and spec.topk_group < spec.n_group:
        n, e = scores.shape
        grouped = scores.view(n, spec.n_group, e // spec.n_group)
        group_scores = grouped.topk(min(2, e // spec.n_group), dim=-1)[0].sum(dim=-1)
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(spec.topk_group, dim=-1)[1], 1)
        mask = keep.unsqueeze(-1).expand(n, spec.n_group, e // spec.n_group).reshape(n, e).bool()
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores, plain


def margins_of(spec: RouterSpec, logits: Any) -> Any:
    """Per row: the k-th minus the (k+1)-th choice score (inf with no (k+1)-th expert), float32, on
    the logits' device (no copy to the host: see _Keeper)."""
    import torch

    scores, plain = choice_scores(spec, logits)
    k = spec.top_k
    if scores.shape[-1] <= k:
        return torch.full((scores.shape[0],), float("inf"), device=scores.device)
    top = scores.topk(k + 1, dim=-1)[0]
    beyond = top[:, k]
    fallback = plain.topk(k + 1, dim=-1)[0][:, k]
    beyond = torch.where(torch.isfinite(beyond), beyond, torch.minimum(fallback, top[:, k - 1]))
    return (top[:, k - 1] - beyond).float()


def weights_for(spec: RouterSpec, logits: Any, ids: Any) -> Any:
    """The weights this router gives experts `ids` [n, k] (its scores there, normalised as it does)."""
    x = logits.float()
    import torch

    scores = torch.softmax(x, dim=-1) if spec.scoring == "softmax" else x.sigmoid()
    w = scores.gather(1, ids.long().to(scores.device))
    if spec.renormalize:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * spec.scaling


# ---- transformers ----


def _hf_spec(gate: Any, config: Any) -> RouterSpec:
    bias = getattr(gate, "e_score_correction_bias", None)
    return RouterSpec(
        top_k=int(gate.top_k),
        num_experts=int(gate.weight.shape[0]),
        scoring="sigmoid" if bias is not None or getattr(config, "scoring_func", "") == "sigmoid" else "softmax",
        n_group=getattr(gate, "num_group", None),
        topk_group=getattr(gate, "topk_group", None),
        bias=bias,
        renormalize=bool(getattr(gate, "norm_topk_prob", True)),
        scaling=float(getattr(gate, "routed_scaling_factor", 1.0) or 1.0),
    )


def hf_gates(model: Any) -> list[tuple[int, Any]]:
    """(decoder layer index, router module) of every MoE layer of an HF model: a layer's `mlp.gate`
    that routes (has top_k and an [experts, hidden] weight)."""
    from .capture import find_blocks

    _, layers, _, mlp = find_blocks(model, getattr(getattr(model, "config", None), "num_hidden_layers", None))
    out = []
    for i, layer in enumerate(layers):
        gate = getattr(getattr(layer, mlp, None), "gate", None)
        if (
            gate is not None
            and hasattr(gate, "top_k")
            and getattr(gate, "weight", None) is not None
            and gate.weight.dim() == 2
        ):
            out.append((i, gate))
    return out


class _Keeper:
    """Rows of every MoE layer, in call order: concatenated, row i is position i (one sequence).

    Kept on the device where the router ran: a copy to the host inside a hook waits for the forward
    to reach that layer, so a copy per layer (ids, weights and margins: three per layer) serialised
    the forward against the host (issue 44: routes=true took a scored workload's generate phase
    1.84x). The rows are gathered on the device at the end and cross to the host in one copy per
    request (`routes`)."""

    def __init__(self, n_layers: int):
        self.ids: list[list[Any]] = [[] for _ in range(n_layers)]
        self.weights: list[list[Any]] = [[] for _ in range(n_layers)]
        self.margins: list[list[Any]] = [[] for _ in range(n_layers)]

    def keep(self, j: int, spec: RouterSpec, logits: Any, weights: Any, ids: Any) -> None:
        # Copies on the device (no wait): the router's tensors may be buffers the next layer reuses.
        self.ids[j].append(ids.detach().clone())
        self.weights[j].append(weights.detach().clone() if weights is not None else None)
        self.margins[j].append(margins_of(spec, logits.detach()) if logits is not None else None)

    def routes(self, layer_ids: list[int], spec: RouterSpec, positions: list[int], source: str) -> Routes:
        import torch

        if any(not rows for rows in self.ids):
            raise EngineFault(
                "an MoE layer's router was not called during the forward pass (hooks do not fire "
                "inside CUDA graphs or compiled graphs)",
                "record routes with enforce_eager=true",
            )
        dev = self.ids[0][0].device
        at = torch.tensor(positions, dtype=torch.long, device=dev)

        def gathered(rows: list[list[Any]], dtype: Any) -> Any:  # [n, layers, k] (or [n, layers]), one device op
            return torch.stack([torch.cat([x.to(dev, dtype) for x in r]).index_select(0, at) for r in rows], dim=1)

        has_w = all(w is not None for rows in self.weights for w in rows)
        has_m = all(m is not None for rows in self.margins for m in rows)
        parts = [gathered(self.ids, torch.float64)]  # float64 holds any expert id exactly
        if has_w:
            parts.append(gathered(self.weights, torch.float64))
        if has_m:
            parts.append(gathered(self.margins, torch.float64)[..., None])
        n = len(positions)
        host = torch.cat([p.reshape(n, -1) for p in parts], dim=1).cpu()  # the one copy to the host
        k, layers = spec.top_k, len(self.ids)
        ids = host[:, : layers * k]
        weights = host[:, layers * k : 2 * layers * k] if has_w else None
        margins = host[:, host.shape[1] - layers :] if has_m else None
        return Routes(
            layers=layer_ids,
            top_k=spec.top_k,
            num_experts=spec.num_experts,
            ids=ids.to(torch.int64).reshape(-1).tolist(),
            weights=None if weights is None else weights.to(torch.float32).reshape(-1).tolist(),
            margins=None if margins is None else margins.to(torch.float32).reshape(-1).tolist(),
            source=source,
        )


def routes_hf(model: Any, ids: list[int], positions: list[int]) -> Routes:
    """One forward pass over `ids` with every MoE gate hooked; the routes at `positions`."""
    import torch

    gates = hf_gates(model)
    if not gates:
        raise EngineFault(*MOE_UNSUPPORTED)
    keeper = _Keeper(len(gates))
    specs = [_hf_spec(g, model.config) for _, g in gates]
    handles = []
    for j, (_, gate) in enumerate(gates):

        def hook(mod: Any, args: Any, out: Any, j: int = j) -> None:
            logits, weights, idx = out[0], out[1], out[2]
            keeper.keep(j, specs[j], logits, weights, idx)

        handles.append(gate.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    return keeper.routes([i for i, _ in gates], specs[0], positions, "hooks")


class ForcedRoutes:
    """A context in which every MoE gate of an HF model routes the recorded positions with the
    recorded experts (`routes` holds rows for positions start, start+1, ...; other positions route
    as the model would). mode: "ids" or "ids+weights"."""

    def __init__(self, model: Any, routes: Routes, start: int, mode: str):
        gates = hf_gates(model)
        if [i for i, _ in gates] != list(routes.layers):
            raise EngineFault(
                f"the routes to replay were recorded for MoE layers {_span(routes.layers)}, and this "
                f"model's are {_span([i for i, _ in gates])}",
                "replay routes recorded with the same model (the same number of layers)",
            )
        spec = _hf_spec(gates[0][1], model.config)
        if spec.top_k != routes.top_k or spec.num_experts != routes.num_experts:
            raise EngineFault(
                f"the routes to replay choose {routes.top_k} of {routes.num_experts} experts, and "
                f"this model {spec.top_k} of {spec.num_experts}",
                "replay routes recorded with the same model",
            )
        if mode == "ids+weights" and routes.weights is None:
            raise EngineFault(
                "replay with ids+weights asked for, but the recorded routes carry no weights "
                "(that engine's capture gives expert ids only)",
                "replay with ids only",
            )
        self.gates, self.routes, self.start, self.mode = gates, routes, start, mode
        self.seen = [0] * len(gates)
        self.forced = 0
        self.originals: list[Any] = []

    def __enter__(self) -> ForcedRoutes:
        for j, (_, gate) in enumerate(self.gates):
            self.originals.append(gate.forward)
            gate.forward = self._forward(j, gate, gate.forward)
        return self

    def __exit__(self, *exc: Any) -> None:
        for (_, gate), orig in zip(self.gates, self.originals):
            gate.forward = orig
        self.originals = []

    def _forward(self, j: int, gate: Any, orig: Any) -> Any:
        import torch

        spec = _hf_spec(gate, None)
        r, k, n_layers = self.routes, self.routes.top_k, len(self.routes.layers)

        def forward(hidden_states: Any, *a: Any, **kw: Any) -> Any:
            logits, weights, idx = orig(hidden_states, *a, **kw)
            rows = idx.shape[0]
            first = self.seen[j]
            self.seen[j] += rows
            # The call's recorded rows replaced at once: one host-to-device copy of their ids (and
            # weights), not one per row.
            sel = [(row, rec) for row in range(rows) if 0 <= (rec := first + row - self.start) < r.rows]
            if not sel:
                return logits, weights, idx
            at = torch.tensor([row for row, _ in sel], device=idx.device)
            offsets = [(rec * n_layers + j) * k for _, rec in sel]
            ids = torch.tensor([r.ids[o + t] for o in offsets for t in range(k)], device=idx.device, dtype=idx.dtype)
            ids = ids.view(len(sel), k)
            new_idx, new_w = idx.clone(), weights.clone()
            new_idx[at] = ids
            if self.mode == "ids+weights":
                rw = r.weights
                assert rw is not None, "ids+weights is refused for routes without weights (__init__)"
                w = [rw[o + t] for o in offsets for t in range(k)]
                new_w[at] = torch.tensor(w, device=weights.device, dtype=weights.dtype).view(len(sel), k)
            else:
                new_w[at] = weights_for(spec, logits[at], ids).to(weights.dtype)
            if j == 0:
                self.forced += len(sel)
            return logits, new_w, new_idx

        return forward


def _span(layers: list[int]) -> str:
    return f"{len(layers)} ({layers[0]}..{layers[-1]})" if layers else "none"


# ---- vLLM ----


def _vllm_routers(model: Any) -> list[tuple[int, Any]]:
    """(decoder layer index, router object) of every fused-MoE layer of a vLLM model (0.32: the
    runner's `router`, whose select_experts returns (weights, ids))."""
    out = []
    for mod in model.modules():
        router = getattr(mod, "router", None)
        if router is not None and hasattr(router, "select_experts") and hasattr(mod, "layer_name"):
            try:
                layer = int(mod.layer_id)
            except Exception:  # noqa: BLE001 - a runner without a parsable layer name
                continue
            out.append((layer, router))
    out.sort(key=lambda t: t[0])
    return list({layer: (layer, r) for layer, r in out}.values())


def _vllm_spec(router: Any) -> RouterSpec:
    return RouterSpec(
        top_k=int(router.top_k),
        num_experts=int(router.global_num_experts),
        scoring=str(getattr(router, "scoring_func", "softmax") or "softmax"),
        n_group=getattr(router, "num_expert_group", None) if getattr(router, "use_grouped_topk", False) else None,
        topk_group=getattr(router, "topk_group", None),
        bias=getattr(router, "e_score_correction_bias", None),
        renormalize=bool(getattr(router, "renormalize", True)),
        scaling=float(getattr(router, "routed_scaling_factor", 1.0) or 1.0),
    )


def routes_vllm(llm: Any, ids: list[int], positions: list[int]) -> Routes:
    """One prefill of `ids` (max_tokens=1, prefix cache reset) with every router wrapped, or, where the
    engine was loaded with its built-in capture, the ids it returns (no weights, no margins)."""
    from vllm import SamplingParams

    from .vllm_support import engine_input

    engine = llm.llm_engine
    par = engine.vllm_config.parallel_config
    if par.tensor_parallel_size > 1 or par.pipeline_parallel_size > 1:
        raise EngineFault(
            "route capture by hooks needs the model in this process (tensor_parallel_size=1)",
            "record routes with one GPU a side, or load with enable_return_routed_experts",
        )
    model = engine.model_executor.driver_worker.worker.model_runner.model
    routers = _vllm_routers(model)  # none found: another vLLM's layout, or no MoE; the built-in capture may answer
    keeper = _Keeper(len(routers))
    specs = [_vllm_spec(r) for _, r in routers]
    originals = []
    for j, (_, router) in enumerate(routers):
        orig = router.select_experts
        originals.append((router, orig))

        def select(hidden_states: Any, router_logits: Any, *a: Any, _o: Any = orig, _j: int = j, **kw: Any) -> Any:
            weights, idx = _o(hidden_states, router_logits, *a, **kw)
            keeper.keep(_j, specs[_j], router_logits, weights, idx)
            return weights, idx

        router.select_experts = select
    try:
        llm.reset_prefix_cache()  # cached blocks would skip the positions asked for
        rid = f"routes-{id(keeper)}"
        engine.add_request(rid, engine_input(engine, ids), SamplingParams(max_tokens=1, temperature=0.0))
        got = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == rid and out.finished:
                    got = out
    finally:
        for router, orig in originals:
            router.select_experts = orig
    hooked = bool(routers) and all(keeper.ids)
    routed = getattr(got.outputs[0], "routed_experts", None) if got is not None else None
    if hooked:
        out = keeper.routes([i for i, _ in routers], specs[0], positions, "hooks")
        if routed is not None:  # both: say whether vLLM's own capture chose the same experts
            out.source = f"hooks; vLLM built-in {_agree(out, routed, positions)}"
        return out
    if routed is None:
        if not routers and not builtin_on(engine):
            raise EngineFault(*MOE_UNSUPPORTED)
        raise EngineFault(
            "vLLM returned no routed experts and its routers' hooks did not fire (a compiled model or CUDA graphs)",
            "record routes with enforce_eager=true on this side",
        )
    return routes_generated(engine, routed, positions, "vllm built-in")


def routes_generated(
    engine: Any, routed: Any, positions: list[int], source: str = "vllm built-in (as generated)"
) -> Routes:
    """Routes from vLLM's built-in capture, `routed` [positions fed, layers, k] (prompt + output - 1
    rows): the ids only (no weights, no margins). From a generate, these are the experts the side
    routed its own tokens with, in the batches it decoded them in."""
    import numpy as np

    arr = np.asarray(routed)[positions]  # [n, layers, k]
    # vLLM's capture has a row for every decoder layer (indexed by layer_id), the dense ones left zero:
    # keep the MoE layers, as the hooks and a dump's routes do, or dense rows would compare as agreeing.
    cfg = getattr(engine.model_config, "hf_text_config", None) or getattr(engine.model_config, "hf_config", None)
    layers = moe_layer_indices(
        int(arr.shape[1]),
        getattr(cfg, "first_k_dense_replace", 0) or 0,
        getattr(cfg, "mlp_only_layers", None) or [],
        getattr(cfg, "decoder_sparse_step", 1) or 1,
    )
    if len(layers) != arr.shape[1]:
        arr = arr[:, layers, :]
    return Routes(
        layers=layers,
        top_k=int(arr.shape[2]),
        num_experts=_num_experts(engine),
        ids=arr.reshape(-1).astype(int).tolist(),
        source=source,
    )


def _num_experts(engine: Any) -> int:
    get = getattr(engine.model_config, "get_num_experts", None)
    if get is not None:
        return int(get())
    cfg = engine.model_config.hf_text_config
    return int(
        next(getattr(cfg, k) for k in ("num_experts", "n_routed_experts", "num_local_experts") if getattr(cfg, k, None))
    )


def _agree(hooked: Routes, routed: Any, positions: list[int]) -> str:
    """How vLLM's built-in ids compare with the hooks' (as sets: its slot order may be another)."""
    import numpy as np

    arr = np.asarray(routed)
    usable = [p for p in positions if p < arr.shape[0]]
    differ = 0
    for r, p in enumerate(usable):
        for j, layer in enumerate(hooked.layers):
            if layer < arr.shape[1] and sorted(arr[p, layer].tolist()) != sorted(hooked.experts(r, j)):
                differ += 1
    return (
        "agrees" if not differ else f"differs in {differ} of {len(usable) * len(hooked.layers)} (token, layer) routes"
    )


def builtin_on(engine: Any) -> bool:
    for where in ("aux_output_config", "model_config"):
        cfg = getattr(engine.vllm_config, where, None)
        if cfg is not None and getattr(cfg, "enable_return_routed_experts", False):
            return True
    return False
