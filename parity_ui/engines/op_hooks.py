"""Each engine's decoder layers, op by op, for the op map (parity_ui.engines.op_trace runs the passes).

An adapter does three things on its engine's own modules: hooks that keep every op's output as the
forward makes it (and put the reference's in its place for a swap), this side's ops run on given inputs
(the added error), and the forward itself. Supported: Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE
decoder layers (parity_ui.core.op_map.SUPPORTED), found by their module names; a model built otherwise
is refused by name.

transformers: q, k (after q/k-norm and RoPE) and v are read where the attention kernel receives them
(the attention interface is wrapped for the pass: the exact call, with its mask and arguments, is what
the added attention repeats on the reference's q, k and v); RoPE on the reference's input uses the
model module's own apply_rotary_pos_emb with the cos/sin the layer was given.

vLLM: the projections are fused (qkv_proj, gate_up_proj) and are split here by their sizes (q_size,
kv_size; gate and up halves); q and k after RoPE are what `attn` receives; the residual is split (each
layer returns (hidden, residual) and the next norm adds them, fused): the stream after a layer is
rebuilt as hidden + residual in the model's dtype (what the fused kernel stores: one fp32 add, rounded
once), the post-attention residual is the fused norm's second output. The added attention runs inside
the forward (it needs the step's attention metadata), just before the real call: it writes the
reference's k and v into this layer's cache slots and the real call then writes its own over them.
MoE routing is read and forced at the router's select_experts (parity_ui.engines.routes).
"""

from __future__ import annotations

import sys
from typing import Any

from ..core.op_map import EMBED, OPS_FINAL, SUPPORTED, supported_text
from .base import EngineFault
from .capture import find_blocks
from .op_trace import Pass, added_ops, key, quiet, router_view


def _unsupported(what: str) -> EngineFault:
    return EngineFault(
        f"the op map does not know this model's layers ({what})",
        f"the op map supports {supported_text()} decoder layers; for this model use `parity layers` without "
        "--ops (the block-level localisation)",
    )


def _need(mod: Any, *names: str) -> None:
    for n in names:
        if not hasattr(mod, n):
            raise _unsupported(f"{type(mod).__name__} has no {n}")


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, (tuple, list)) else x


class _Layers:
    """What both adapters share: the layers, their names, the rows of the map."""

    def __init__(self, model: Any, num_layers: int | None):
        name = type(model).__name__
        if name not in SUPPORTED and not any(c.__name__ in SUPPORTED for c in type(model).__mro__):
            raise _unsupported(name)
        self.model = model
        self.parent, self.layers, attn, mlp = find_blocks(model, num_layers)
        if (attn, mlp) != ("self_attn", "mlp"):
            raise _unsupported(f"{name}'s layers hold {attn} and {mlp}")
        self.layers_n = len(self.layers)
        self.moe = hasattr(self.layers[0].mlp, "experts")
        self.norm: Any = getattr(self.parent, "norm", None)
        if self.norm is None:
            raise _unsupported(f"{name} has no final norm")
        w = next(model.parameters())
        self.device, self.dtype = w.device, w.dtype
        self.pass_: Pass | None = None

    def ops(self) -> tuple[str, ...]:
        from ..core.op_map import OPS_DENSE, OPS_MOE

        return OPS_MOE if self.moe else OPS_DENSE

    def rows(self) -> list[tuple[int, str]]:
        out = [(EMBED, "embed")]
        for layer in range(self.layers_n):
            out += [(layer, op) for op in self.ops()]
        return out + [(self.layers_n, op) for op in OPS_FINAL]

    def _check(self, layer: Any) -> None:
        _need(layer, "input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
        if self.moe:
            _need(layer.mlp, "gate", "experts")
        else:
            _need(layer.mlp, "down_proj", "act_fn")

    def uninstall(self) -> None:
        self.pass_ = None

    def _embed_done(self, p: Pass, hidden: Any) -> None:
        p.keep("embed", hidden, layer=EMBED)
        own = p.own.get(key(EMBED, "embed"))
        p.finish(EMBED, {"embed": own[p.win]} if p.trace and p.req.added and own is not None else {})

    def _layer_done(self, p: Pass, layer: int, spec: Any = None) -> None:
        added = added_ops(self, p, layer)
        if self.moe and spec is not None:
            router_view(p, layer, spec)
        p.finish(layer, added)

    def final_norm(self, x: Any) -> Any:
        return _first(self.norm(x.clone()))


# ---- transformers --------------------------------------------------------------------------------


class HFOps(_Layers):
    def __init__(self, model: Any):
        super().__init__(model, getattr(model.config, "num_hidden_layers", None))
        for layer in self.layers:
            self._check(layer)
            _need(layer.self_attn, "q_proj", "k_proj", "v_proj", "o_proj", "head_dim")
            if not self.moe:
                _need(layer.mlp, "gate_proj", "up_proj")
        self.head = model.get_output_embeddings()
        self.module = sys.modules[type(self.layers[0].self_attn).__module__]
        _need(self.module, "apply_rotary_pos_emb")
        self.pos_emb: Any = None
        self.mask: dict[int, Any] = {}
        self.calls: dict[int, Any] = {}  # layer -> (attention function, module, kwargs) of its real call
        self._restore: Any = None

    def forward(self, ids: list[int]) -> None:
        import torch

        self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=False, logits_to_keep=1)

    def logits(self, x: Any) -> Any:
        w = self.head.weight
        return self.head(x.to(w.device, w.dtype))

    # -- this side's ops on given inputs ([n, dim] rows) --

    def in_norm(self, layer: int, x: Any) -> Any:
        return self.layers[layer].input_layernorm(x)

    def qkv(self, layer: int, x: Any, rows: Any) -> tuple[Any, Any, Any]:
        attn = self.layers[layer].self_attn
        n, d = x.shape[0], attn.head_dim
        xs = x[None]
        q = attn.q_proj(xs).view(1, n, -1, d)
        k = attn.k_proj(xs).view(1, n, -1, d)
        v = attn.v_proj(xs)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = self.pos_emb
        q, k = self.module.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[:, rows], sin[:, rows])
        return q.transpose(1, 2).reshape(n, -1), k.transpose(1, 2).reshape(n, -1), v.reshape(n, -1)

    def attn_added(self, layer: int, p: Pass) -> Any:
        fn, module, args, kwargs = self.calls.pop(layer)
        d = module.head_dim
        q = p.own[key(layer, "q")].clone()
        q[p.win] = p.noisy(p.ref_rows(layer, "q"))
        k, v = (p.noisy(p.ref_rows(layer, op, full=True)) for op in ("k", "v"))
        n = q.shape[0]
        q4, k4, v4 = (t.view(1, n, -1, d).transpose(1, 2) for t in (q, k, v))
        out = _first(fn(module, q4, k4, v4, *args, **kwargs))
        return out.reshape(n, -1)[p.win]

    def o_proj(self, layer: int, x: Any) -> Any:
        return self.layers[layer].self_attn.o_proj(x)

    def post_norm(self, layer: int, x: Any) -> Any:
        return self.layers[layer].post_attention_layernorm(x)

    def gate_up(self, layer: int, x: Any) -> tuple[Any, Any]:
        mlp = self.layers[layer].mlp
        return mlp.gate_proj(x), mlp.up_proj(x)

    def act(self, layer: int, g: Any, u: Any) -> Any:
        return self.layers[layer].mlp.act_fn(g) * u

    def down(self, layer: int, a: Any) -> Any:
        return self.layers[layer].mlp.down_proj(a)

    def router(self, layer: int, x: Any) -> Any:
        return _first(self.layers[layer].mlp.gate(x))

    def experts(self, layer: int, x: Any, logits: Any, ids: Any, weights: Any) -> Any:
        """The MoE block on x, its router's answer forced to the reference's (logits, weights, ids)."""
        mlp = self.layers[layer].mlp
        gate = mlp.gate
        gate.forward = lambda h, *a, **k: (logits, weights.to(logits.dtype), ids)
        try:
            return _first(mlp(x[None])).reshape(x.shape[0], -1)
        finally:
            del gate.forward

    # -- the hooks --

    def install(self, p: Pass) -> list[Any]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.pass_ = p
        impl = self.model.config._attn_implementation
        local = ALL_ATTENTION_FUNCTIONS._local_mapping
        had = impl in local
        previous = local.get(impl)
        original = ALL_ATTENTION_FUNCTIONS.get(impl) if impl != "eager" else None
        eager = getattr(self.module, "eager_attention_forward", None)
        layer_of = {id(layer.self_attn): i for i, layer in enumerate(self.layers)}

        def attention(module: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
            fn: Any = original or eager
            i = layer_of.get(id(module))
            if i is None or p.quiet:
                return fn(module, q, k, v, *args, **kwargs)
            flat = {op: t.transpose(1, 2).reshape(t.shape[2], -1) for op, t in (("q", q), ("k", k), ("v", v))}
            for op, t in flat.items():
                p.keep(op, t, layer=i)
            if any(p.swapping(i, op) for op in flat):
                d = q.shape[-1]
                q, k, v = (
                    p.swap_in(i, op, flat[op]).view(1, t.shape[2], t.shape[1], d).transpose(1, 2)
                    for op, t in zip("qkv", (q, k, v))
                )
            self.calls[i] = (fn, module, args, kwargs)
            out, weights = fn(module, q, k, v, *args, **kwargs)
            p.keep("attn", out.reshape(out.shape[1], -1), layer=i)
            if p.swapping(i, "attn"):
                out = p.swap_in(i, "attn", out.reshape(out.shape[1], -1)).view(out.shape)
            return out, weights

        ALL_ATTENTION_FUNCTIONS[impl] = attention

        def restore() -> None:
            if had:
                local[impl] = previous
            else:
                local.pop(impl, None)

        self._restore = restore
        handles: list[Any] = []
        add = handles.append
        for i, layer in enumerate(self.layers):
            add(layer.register_forward_pre_hook(self._layer_pre(p, i), with_kwargs=True))
            add(layer.input_layernorm.register_forward_hook(_out_hook(p, "in_norm")))
            attn = layer.self_attn
            add(attn.o_proj.register_forward_hook(_out_hook(p, "o_proj")))
            add(layer.post_attention_layernorm.register_forward_pre_hook(_in_hook(p, "attn_resid")))
            add(layer.post_attention_layernorm.register_forward_hook(_out_hook(p, "post_norm")))
            mlp = layer.mlp
            if self.moe:
                add(mlp.gate.register_forward_hook(self._gate_hook(p, i)))
                add(mlp.register_forward_hook(_out_hook(p, "experts")))
            else:
                add(mlp.gate_proj.register_forward_hook(_out_hook(p, "gate")))
                add(mlp.up_proj.register_forward_hook(_out_hook(p, "up")))
                add(mlp.down_proj.register_forward_pre_hook(_in_hook(p, "act", swap=True)))
                add(mlp.down_proj.register_forward_hook(_out_hook(p, "down")))
            add(layer.register_forward_hook(self._layer_post(p, i), with_kwargs=True))
        add(self.norm.register_forward_pre_hook(lambda m, a: setattr(p, "layer", self.layers_n)))
        add(self.norm.register_forward_hook(_out_hook(p, "norm")))
        return handles

    def uninstall(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None
        self.calls.clear()
        super().uninstall()

    def _layer_pre(self, p: Pass, i: int) -> Any:
        def hook(mod: Any, args: Any, kwargs: Any) -> Any:
            if p.quiet:
                return None
            p.layer = i
            self.pos_emb = kwargs.get("position_embeddings")
            hidden = args[0] if args else kwargs["hidden_states"]
            if i == 0:
                self._embed_done(p, hidden[0])
                p.layer = i
            if not p.noise_eps:
                return None
            noisy = p.noisy(hidden)
            return ((noisy, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": noisy})

        return hook

    def _layer_post(self, p: Pass, i: int) -> Any:
        def hook(mod: Any, args: Any, kwargs: Any, out: Any) -> Any:
            if p.quiet:
                return None
            h = _first(out)
            p.keep("out", h[0], layer=i)
            spec = None
            if self.moe:
                from .routes import _hf_spec

                spec = _hf_spec(self.layers[i].mlp.gate, self.model.config)
            self._layer_done(p, i, spec)
            if p.swapping(i, "out"):
                new = p.swap_in(i, "out", h[0]).view(h.shape)
                return (new, *out[1:]) if isinstance(out, tuple) else new
            return None

        return hook

    def _gate_hook(self, p: Pass, i: int) -> Any:
        def hook(mod: Any, args: Any, out: Any) -> Any:
            if p.quiet:
                return None
            logits, weights, ids = out[0], out[1], out[2]
            p.keep("router", logits, layer=i)
            p.keep("ids", ids, layer=i)
            p.keep("weights", weights.float(), layer=i)
            if p.swapping(i, "router"):
                assert p.ref is not None
                return (
                    p.swap_in(i, "router", logits),
                    p.ref_rows(i, "weights", full=True).to(weights.dtype),
                    p.ref_rows(i, "ids", full=True, dtype=False).to(ids.dtype),
                )
            return None

        return hook


def _out_hook(p: Pass, op: str) -> Any:
    """Keep a module's output as `op` (the first of a tuple), swapping the reference's in where asked."""

    def hook(mod: Any, args: Any, out: Any) -> Any:
        if p.quiet:
            return None
        t = _first(out)
        flat = t.reshape(-1, t.shape[-1])
        p.keep(op, flat)
        if not p.swapping(None, op):
            return None
        new = p.swap_in(None, op, flat).view(t.shape)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return hook


def _in_hook(p: Pass, op: str, swap: bool = False) -> Any:
    """Keep a module's first input as `op` (the MLP's act: down_proj's input), swapping where asked."""

    def hook(mod: Any, args: Any) -> Any:
        if p.quiet:
            return None
        t = args[0]
        flat = t.reshape(-1, t.shape[-1])
        p.keep(op, flat)
        if swap and p.swapping(None, op):
            return (p.swap_in(None, op, flat).view(t.shape), *args[1:])
        return None

    return hook


# ---- vLLM ----------------------------------------------------------------------------------------


class VllmOps(_Layers):
    def __init__(self, llm: Any, num_layers: int | None):
        cfg = llm.llm_engine.vllm_config.parallel_config
        if cfg.tensor_parallel_size > 1 or cfg.pipeline_parallel_size > 1:
            raise EngineFault(
                "the op map is not supported yet for tensor- or pipeline-parallel vLLM sides (the layers live in "
                "other processes)",
                "map with tensor_parallel_size=1 and pipeline_parallel_size=1 on this side",
            )
        self.llm = llm
        model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        super().__init__(model, num_layers)
        for layer in self.layers:
            self._check(layer)
            _need(layer.self_attn, "qkv_proj", "o_proj", "rotary_emb", "attn", "q_size", "kv_size")
            if not self.moe:
                _need(layer.mlp, "gate_up_proj")
        self.positions: Any = None
        self.calls_made = 0
        self.pending: dict[int, Any] = {}
        self.force: Any = None  # (weights, ids) the routers return while this side's MoE block runs on given rows
        self.routers: dict[int, Any] = {}
        self._originals: list[Any] = []
        if self.moe:
            from .routes import _vllm_routers

            self.routers = dict(_vllm_routers(model))
            if sorted(self.routers) != list(range(self.layers_n)):
                raise _unsupported("its MoE routers (select_experts) were not found on every layer")

    def forward(self, ids: list[int]) -> None:
        from vllm import SamplingParams

        from .vllm_support import engine_input

        engine = self.llm.llm_engine
        self.llm.reset_prefix_cache()  # cached blocks would skip positions
        self.calls_made += 1
        rid = f"opmap-{id(self)}-{self.calls_made}"
        engine.add_request(rid, engine_input(engine, ids), SamplingParams(max_tokens=1, temperature=0.0))
        while engine.has_unfinished_requests():
            engine.step()

    def logits(self, x: Any) -> Any:
        head = getattr(self.model, "lm_head", None)
        w = getattr(head, "weight", None)
        return self.model.compute_logits(x.to(self.device, w.dtype if w is not None else self.dtype))

    # -- this side's ops on given inputs --

    def in_norm(self, layer: int, x: Any) -> Any:
        return _first(self.layers[layer].input_layernorm(x.clone()))

    def qkv(self, layer: int, x: Any, rows: Any) -> tuple[Any, Any, Any]:
        attn = self.layers[layer].self_attn
        qkv = _first(attn.qkv_proj(x))
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = q.contiguous(), k.contiguous()
        if hasattr(attn, "q_norm"):
            d = attn.head_dim
            q = attn.q_norm(q.view(q.shape[0], -1, d)).view(q.shape)
            k = attn.k_norm(k.view(k.shape[0], -1, d)).view(k.shape)
        q, k = attn.rotary_emb(self.positions[rows], q.clone(), k.clone())
        return q, k, v.contiguous()

    def attn_added(self, layer: int, p: Pass) -> Any:
        return self.pending.pop(layer, None)

    def o_proj(self, layer: int, x: Any) -> Any:
        return _first(self.layers[layer].self_attn.o_proj(x))

    def post_norm(self, layer: int, x: Any) -> Any:
        return _first(self.layers[layer].post_attention_layernorm(x.clone()))

    def gate_up(self, layer: int, x: Any) -> tuple[Any, Any]:
        gu = _first(self.layers[layer].mlp.gate_up_proj(x))
        g, u = gu.chunk(2, dim=-1)
        return g, u

    def act(self, layer: int, g: Any, u: Any) -> Any:
        import torch

        return self.layers[layer].mlp.act_fn(torch.cat([g, u], dim=-1))

    def down(self, layer: int, a: Any) -> Any:
        return _first(self.layers[layer].mlp.down_proj(a.contiguous()))

    def router(self, layer: int, x: Any) -> Any:
        return _first(self.layers[layer].mlp.gate(x))

    def experts(self, layer: int, x: Any, logits: Any, ids: Any, weights: Any) -> Any:
        self.force = (weights.float(), ids)
        try:
            return _first(self.layers[layer].mlp(x.contiguous()))
        finally:
            self.force = None

    # -- the hooks --

    def install(self, p: Pass) -> list[Any]:
        self.pass_ = p
        handles: list[Any] = []
        add = handles.append
        for i, layer in enumerate(self.layers):
            add(layer.register_forward_pre_hook(self._layer_pre(p, i), with_kwargs=True))
            add(layer.input_layernorm.register_forward_hook(_out_hook(p, "in_norm")))
            attn = layer.self_attn
            add(attn.attn.register_forward_pre_hook(self._attn_pre(p, i)))
            add(attn.attn.register_forward_hook(_out_hook(p, "attn")))
            add(attn.o_proj.register_forward_hook(_out_hook(p, "o_proj")))
            add(layer.post_attention_layernorm.register_forward_hook(self._post_norm_hook(p)))
            mlp = layer.mlp
            if self.moe:
                add(mlp.register_forward_hook(_out_hook(p, "experts")))
            else:
                add(mlp.gate_up_proj.register_forward_hook(self._gate_up_hook(p)))
                add(mlp.act_fn.register_forward_hook(_out_hook(p, "act")))
                add(mlp.down_proj.register_forward_hook(_out_hook(p, "down")))
            add(layer.register_forward_hook(self._layer_post(p, i), with_kwargs=True))
        add(self.norm.register_forward_pre_hook(lambda m, a: setattr(p, "layer", self.layers_n)))
        add(self.norm.register_forward_hook(_out_hook(p, "norm")))
        for i, router in self.routers.items():
            orig = router.select_experts
            self._originals.append((router, orig))
            router.select_experts = self._select(p, i, orig)
        return handles

    def uninstall(self) -> None:
        for router, orig in self._originals:
            router.select_experts = orig
        self._originals = []
        self.pending.clear()
        self.force = None
        super().uninstall()

    def _select(self, p: Pass, i: int, orig: Any) -> Any:
        def select(hidden_states: Any, router_logits: Any, *a: Any, **kw: Any) -> Any:
            weights, ids = orig(hidden_states, router_logits, *a, **kw)
            if self.force is not None:  # this side's MoE block on the reference's input, routed as it routed
                w, fids = self.force
                return w.to(weights.device, weights.dtype), fids.to(ids.device, ids.dtype)
            if p.quiet:
                return weights, ids
            p.keep("router", router_logits, layer=i)
            p.keep("ids", ids, layer=i)
            p.keep("weights", weights.float(), layer=i)
            if p.swapping(i, "router"):
                assert p.ref is not None
                p.swapped = True
                return (
                    p.ref_rows(i, "weights", full=True).to(weights.dtype),
                    p.ref_rows(i, "ids", full=True, dtype=False).to(ids.dtype),
                )
            return weights, ids

        return select

    def _layer_pre(self, p: Pass, i: int) -> Any:
        def hook(mod: Any, args: Any, kwargs: Any) -> Any:
            if p.quiet:
                return None
            import torch

            p.layer = i
            args = list(args)
            names = ("positions", "hidden_states", "residual")
            vals = [args[j] if len(args) > j else kwargs.get(n) for j, n in enumerate(names)]
            positions, hidden, residual = vals
            if i == 0:
                n = p.n
                if positions.shape[0] < n or not torch.equal(
                    positions.reshape(-1)[:n].long(), torch.arange(n, device=positions.device)
                ):
                    raise EngineFault(
                        f"vLLM ran the {n} ids as {positions.shape[0]} rows at positions other than 0..{n - 1} (the "
                        "prefill was split into chunks or batched with another request)",
                        "map with enable_chunked_prefill=false on this side, or pick a shorter --window",
                    )
                self.positions = positions.reshape(-1)
                p.padded = positions.shape[0] if positions.shape[0] > n else None
                self._embed_done(p, hidden)
                p.layer = i
            if not p.noise_eps:
                return None
            # The floor: perturb the stream entering the layer at rounding level (hidden + residual).
            if residual is None:
                hidden = p.noisy(hidden)
            else:
                residual = p.noisy(hidden + residual) - hidden
            for j, (n_, v) in enumerate(zip(names, (positions, hidden, residual))):
                if len(args) > j:
                    args[j] = v
                elif n_ in kwargs:
                    kwargs[n_] = v
            return tuple(args), kwargs

        return hook

    def _attn_pre(self, p: Pass, i: int) -> Any:
        def hook(mod: Any, args: Any) -> Any:
            if p.quiet:
                return None
            q, k, v = args[0], args[1], args[2]
            for op, t in (("q", q), ("k", k), ("v", v)):
                p.keep(op, t, layer=i)
            if p.trace and p.req.added:
                # This side's attention on the reference's q (at the window; its own elsewhere), k and v, run
                # before the real call so that the real call's own k and v end in the cache.
                qa = q.clone()
                qa[p.win] = p.noisy(p.ref_rows(i, "q")).to(q.dtype)
                ka = p.fill(k, p.noisy(p.ref_rows(i, "k", full=True)).to(k.dtype))
                va = p.fill(v, p.noisy(p.ref_rows(i, "v", full=True)).to(v.dtype))
                with quiet(p):
                    out = mod.forward(qa, ka.contiguous(), va.contiguous(), *args[3:])
                self.pending[i] = _first(out).reshape(q.shape[0], -1)[p.win].clone()
            if any(p.swapping(i, op) for op in ("q", "k", "v")):
                new = [p.swap_in(i, op, t) for op, t in (("q", q), ("k", k), ("v", v))]
                return (*[t.contiguous() for t in new], *args[3:])
            return None

        return hook

    def _post_norm_hook(self, p: Pass) -> Any:
        def hook(mod: Any, args: Any, out: Any) -> Any:
            if p.quiet:
                return None
            normed, resid = (out[0], out[1]) if isinstance(out, tuple) else (out, None)
            p.keep("post_norm", normed)
            if resid is not None:
                p.keep("attn_resid", resid)
            if p.swapping(None, "post_norm"):
                new = p.swap_in(None, "post_norm", normed)
                return (new, *out[1:]) if isinstance(out, tuple) else new
            return None

        return hook

    def _gate_up_hook(self, p: Pass) -> Any:
        def hook(mod: Any, args: Any, out: Any) -> Any:
            if p.quiet:
                return None
            import torch

            gu = _first(out)
            g, u = gu.chunk(2, dim=-1)
            p.keep("gate", g)
            p.keep("up", u)
            if p.swapping(None, "gate") or p.swapping(None, "up"):
                new = torch.cat([p.swap_in(None, "gate", g), p.swap_in(None, "up", u)], dim=-1)
                return (new, *out[1:]) if isinstance(out, tuple) else new
            return None

        return hook

    def _layer_post(self, p: Pass, i: int) -> Any:
        def hook(mod: Any, args: Any, kwargs: Any, out: Any) -> Any:
            if p.quiet:
                return None
            hidden, residual = out
            stream = hidden + residual  # vLLM's split residual, added as its next fused norm adds it
            p.keep("out", stream, layer=i)
            spec = None
            if self.moe:
                from .routes import _vllm_spec

                spec = _vllm_spec(self.routers[i])
            self._layer_done(p, i, spec)
            if p.swapping(i, "out"):
                import torch

                return p.swap_in(i, "out", stream), torch.zeros_like(residual)
            return None

        return hook


def hf_ops(model: Any) -> HFOps:
    return HFOps(model)


def vllm_ops(llm: Any, num_layers: int | None) -> VllmOps:
    return VllmOps(llm, num_layers)
