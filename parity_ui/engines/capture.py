"""Layer-by-layer capture inside an engine's own process (parity_ui.commands.layers compares two captures).

One teacher-forced forward pass over the given ids; forward hooks keep, at the asked positions
only (so a 9k-token prompt costs a few vectors per layer, not 9k), for every decoder layer:
  residual  the residual stream after the layer
  attn      the attention block's output (before it is added to the stream)
  mlp       the MLP block's output (before it is added)
and the final norm's output and the logits. Values leave as float32 bytes (plain data: the worker
may run under another environment).

Engine details: vLLM's decoder layers return (hidden, residual) with the residual add fused into
the next norm, so its stream after a layer is hidden + residual; HF's layers return the stream.
Hooks do not fire inside captured CUDA graphs or compiled graphs, so vLLM captures on an eager model.
An optional rounding-level noise (`noise_eps`) multiplies the stream entering every layer by
(1 + eps*u), u uniform in [-1, 1]: a run that agrees with the plain one only up to rounding, which
is how the noise floor is measured.
"""

from __future__ import annotations

from typing import Any

from .base import CaptureRequest, EngineFault

ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn")
NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm")


def find_blocks(model: Any, num_layers: int | None) -> tuple[Any, Any, str, str]:
    """(the decoder's module holding `layers`, the layers, attention attribute, MLP attribute),
    found by name for the Llama / Qwen2 / Qwen3 / Mistral family, else by structure: the ModuleList
    with one entry per decoder layer, whose entries hold an attention-like and an MLP-like child."""
    import torch

    candidates = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0 and (num_layers is None or len(mod) == num_layers):
            candidates.append((name, mod))
    for name, layers in candidates:
        first = layers[0]
        attn = next((a for a in ATTN_NAMES if hasattr(first, a)), None)
        mlp = next((m for m in MLP_NAMES if hasattr(first, m)), None)
        if attn and mlp:
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            return parent, layers, attn, mlp
    raise EngineFault(
        f"cannot find the decoder layers of {type(model).__name__} (no list of {num_layers} layers "
        "with an attention and an MLP block)",
        "layer localisation supports the Llama, Qwen2/Qwen3 and Mistral families and models built "
        "like them; compare token streams for this architecture",
    )


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, (tuple, list)) else x


class _Recorder:
    """Keeps the rows of the asked positions from each hooked module's output."""

    def __init__(self, positions: list[int], noise_eps: float | None, seed: int):
        import torch

        self.want = positions
        self.rows: dict[str, dict[int, Any]] = {}
        self.current: Any = None  # the positions tensor of the forward being run (vLLM), else None
        self.noise_eps = noise_eps
        self.gen = torch.Generator().manual_seed(seed)

    def _pick(self, t: Any) -> dict[int, Any]:
        """{position: row} for the wanted positions present in a [tokens, dim] or [1, tokens, dim] tensor."""
        t = t.detach()
        if t.dim() == 3:
            t = t[0]
        if self.current is None:  # HF: one sequence, row i is position i
            return {p: t[p].float().cpu() for p in self.want if p < t.shape[0]}
        pos = self.current.tolist()
        out = {}
        for p in self.want:
            if p in pos:
                out[p] = t[pos.index(p)].float().cpu()
        return out

    def keep(self, name: str, t: Any) -> None:
        self.rows.setdefault(name, {}).update(self._pick(t))

    def noise(self, t: Any) -> Any:
        import torch

        assert self.noise_eps is not None, "noise() is only called on a noise-floor run (noise_eps set)"
        u = (torch.rand(t.shape, generator=self.gen) * 2 - 1).to(t.device, t.dtype)
        return t * (1 + self.noise_eps * u)

    def result(self, names: list[str], logits_of: Any) -> dict[str, Any]:
        missing = [n for n in names if set(self.rows.get(n, {})) != set(self.want)]
        if missing:
            raise EngineFault(
                f"the forward pass did not reach {missing[0]} at every asked position (hooks did not "
                "fire: the model ran compiled or as a CUDA graph)",
                "capture with enforce_eager=true on this side",
            )
        import torch

        data, dims = {}, {}
        for n in names:
            stacked = torch.stack([self.rows[n][p] for p in self.want])
            data[n], dims[n] = stacked.numpy().tobytes(), int(stacked.shape[1])
        final = torch.stack([self.rows["final_norm"][p] for p in self.want])
        logits = logits_of(final).float().cpu()
        data["logits"], dims["logits"] = logits.numpy().tobytes(), int(logits.shape[1])
        return {"positions": list(self.want), "names": [*names, "logits"], "data": data, "dims": dims}


def _hook_layers(rec: _Recorder, layers: Any, attn: str, mlp: str, vllm_style: bool) -> tuple[list[Any], list[str]]:
    handles, names = [], []

    def layer_pre(mod: Any, args: Any, kwargs: Any) -> Any:
        if vllm_style:
            rec.current = args[0] if args else kwargs.get("positions")
        if not rec.noise_eps:
            return None
        # The noise-floor run: perturb the stream entering every layer at rounding level.
        if vllm_style:
            args, kwargs = list(args), dict(kwargs)
            hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
            residual = args[2] if len(args) > 2 else kwargs.get("residual")
            if residual is None:
                hidden = rec.noise(hidden)
            else:
                residual = rec.noise(hidden + residual) - hidden
            for i, key, value in ((1, "hidden_states", hidden), (2, "residual", residual)):
                if len(args) > i:
                    args[i] = value
                else:
                    kwargs[key] = value
            return tuple(args), kwargs
        if args:
            return (rec.noise(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": rec.noise(kwargs["hidden_states"])}

    def layer_post(i: int) -> Any:
        def hook(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
            if vllm_style:  # (hidden, residual): the stream is their sum
                rec.keep(f"L{i}.residual", out[0] + out[1])
            else:
                rec.keep(f"L{i}.residual", _first(out))

        return hook

    def block(name: str) -> Any:
        return lambda mod, args, out: rec.keep(name, _first(out))

    for i, layer in enumerate(layers):
        if not hasattr(layer, attn):  # a pipeline-parallel placeholder for another rank's layer
            continue
        handles.append(layer.register_forward_pre_hook(layer_pre, with_kwargs=True))
        handles.append(getattr(layer, attn).register_forward_hook(block(f"L{i}.attn")))
        handles.append(getattr(layer, mlp).register_forward_hook(block(f"L{i}.mlp")))
        handles.append(layer.register_forward_hook(layer_post(i), with_kwargs=True))
        names += [f"L{i}.attn", f"L{i}.mlp", f"L{i}.residual"]
    return handles, names


def _final_norm(parent: Any) -> Any:
    norm = next((getattr(parent, n) for n in NORM_NAMES if hasattr(parent, n)), None)
    if norm is None:
        raise EngineFault(
            f"cannot find the final norm of {type(parent).__name__}",
            "layer localisation supports the Llama, Qwen2/Qwen3 and Mistral families",
        )
    return norm


def capture_hf(
    model: Any, req: CaptureRequest, num_layers: int | None, noise_eps: float | None = None
) -> dict[str, Any]:
    import torch

    parent, layers, attn, mlp = find_blocks(model, num_layers)
    rec = _Recorder(req.positions, noise_eps, req.seed)
    handles, names = _hook_layers(rec, layers, attn, mlp, vllm_style=False)
    norm = _final_norm(parent)
    handles.append(norm.register_forward_hook(lambda m, a, out: rec.keep("final_norm", _first(out))))
    head = model.get_output_embeddings()
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            model(input_ids=torch.tensor([req.ids], device=device), use_cache=False, logits_to_keep=1)

            def logits_of(x: Any) -> Any:
                w = head.weight
                return head(x.to(w.device, w.dtype))

            out = rec.result([*names, "final_norm"], logits_of)
    finally:
        for h in handles:
            h.remove()
    return out


def capture_vllm(
    llm: Any, req: CaptureRequest, num_layers: int | None, noise_eps: float | None = None
) -> dict[str, Any]:
    import torch
    from vllm import SamplingParams

    from .vllm_support import engine_input

    cfg = llm.llm_engine.vllm_config.parallel_config
    if cfg.tensor_parallel_size > 1 or cfg.pipeline_parallel_size > 1:
        raise EngineFault(
            "layer capture is not supported yet for tensor- or pipeline-parallel vLLM sides (the "
            "layers live in other processes)",
            "localise with tensor_parallel_size=1 on this side",
        )
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    model = runner.model
    parent, layers, attn, mlp = find_blocks(model, num_layers)
    rec = _Recorder(req.positions, noise_eps, req.seed)
    handles, names = _hook_layers(rec, layers, attn, mlp, vllm_style=True)
    norm = _final_norm(parent)
    handles.append(norm.register_forward_hook(lambda m, a, out: rec.keep("final_norm", _first(out))))
    engine = llm.llm_engine
    try:
        llm.reset_prefix_cache()  # cached blocks would skip the positions we need
        sp = SamplingParams(max_tokens=1, temperature=0.0)
        engine.add_request("capture", engine_input(engine, req.ids), sp)
        while engine.has_unfinished_requests():
            engine.step()

        def logits_of(x: Any) -> Any:
            w = next(model.parameters())
            with torch.no_grad():
                return model.compute_logits(x.to(w.device, _head_dtype(model, w.dtype)))

        out = rec.result([*names, "final_norm"], logits_of)
    finally:
        for h in handles:
            h.remove()
    return out


def _head_dtype(model: Any, default: Any) -> Any:
    head = getattr(model, "lm_head", None)
    w = getattr(head, "weight", None)
    return w.dtype if w is not None else default
