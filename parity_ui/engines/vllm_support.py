"""What the installed vLLM can run, and what it resolved: read from vLLM's own tables and a tiny
kernel call, inside the worker, before the model loads (parity_ui.engines.vllm_engine).

Everything here reads attributes defensively: vLLM moves them between releases (0.26 on the GPU
machine, 0.32 on the CPU build), and a missing attribute must read as "unknown", not crash a run.
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Any

from ..inputs.models import sliding_window_of
from .base import LoadRequest, Problem


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        if obj is None:
            return None
        obj = getattr(obj, name, None)
    return obj


def _name(value: Any) -> Any:
    """Enums as their names (an IntEnum too: it is an int, but unpickling it in the parent imports
    vLLM), torch dtypes without 'torch.'."""
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "name") and not callable(value.name):
        return value.name
    return str(value).replace("torch.", "")


def _model_config(path: str) -> dict[str, Any]:
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}


def head_geometry(cfg: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(head_dim, attention heads, KV heads) from a config.json dict."""
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim")
    if head_dim is None and heads and cfg.get("hidden_size"):
        head_dim = cfg["hidden_size"] // heads
    return head_dim, heads, kv


def check_vllm(req: LoadRequest) -> list[Problem]:
    """Problems this vLLM would only hit after loading the weights (or not at all, silently)."""
    import torch
    import vllm

    llm = req.args["llm"]
    cfg = _model_config(req.model_path)
    problems: list[Problem] = []
    version = vllm.__version__
    on_gpu = torch.cuda.is_available()

    archs = (
        cfg.get("architectures")
        or json.loads((Path(req.model_path) / "config.json").read_text()).get("architectures")
        or []
    )
    try:
        from vllm.model_executor.models import ModelRegistry

        supported = set(ModelRegistry.get_supported_archs())
    except Exception:  # noqa: BLE001 - a registry we cannot read decides nothing
        supported = set()
    if supported and archs and not any(a in supported for a in archs) and not llm.get("trust_remote_code"):
        problems.append(
            Problem(
                "vllm-unknown-architecture",
                f"vLLM {version} does not know the architecture {archs[0]}"
                + (
                    " (a mixture-of-experts model)"
                    if any(k in cfg for k in ("num_experts", "n_routed_experts", "num_local_experts"))
                    else ""
                ),
                "use an environment with a vLLM that supports it (python=), or compare with an hf side only",
            )
        )

    head_dim, heads, kv = head_geometry(cfg)
    tp, pp = int(llm.get("tensor_parallel_size", 1)), int(llm.get("pipeline_parallel_size", 1))
    if tp > 1 and heads and heads % tp:
        problems.append(
            Problem(
                "tp-heads",
                f"tensor_parallel_size={tp} does not divide the model's {heads} attention heads",
                f"use a tensor_parallel_size that divides {heads} (or pipeline_parallel_size instead)",
            )
        )
    elif tp > 1 and kv and kv % tp and tp % kv:
        problems.append(
            Problem(
                "tp-kv-heads",
                f"tensor_parallel_size={tp} and the model's {kv} KV heads: neither divides the other",
                f"use a tensor_parallel_size that divides {kv}",
            )
        )
    layers = cfg.get("num_hidden_layers")
    if pp > 1 and layers and layers < pp:
        problems.append(
            Problem(
                "pp-layers",
                f"pipeline_parallel_size={pp} is more than the model's {layers} layers",
                f"use at most {layers}",
            )
        )
    gpus = torch.cuda.device_count() if on_gpu else 0
    if tp * pp > 1 and gpus < tp * pp:
        problems.append(
            Problem(
                "not-enough-gpus",
                f"tensor_parallel_size x pipeline_parallel_size = {tp * pp} GPUs, but {gpus} are visible to this side",
                "lower the parallel sizes or give the side more GPUs (device=cuda:0,1)",
            )
        )

    dtype = llm.get("dtype")
    if on_gpu and dtype == "bfloat16":
        major, minor = torch.cuda.get_device_capability(0)
        if major < 8:
            problems.append(
                Problem(
                    "bf16-unsupported",
                    f"bfloat16 needs compute capability >= 8.0; this GPU has {major}.{minor}",
                    "use dtype float16 or float32",
                )
            )
    if head_dim:
        problems.extend(_attention_problems(head_dim, dtype, on_gpu, version))
    sliding = sliding_window_of(cfg)
    if sliding and not on_gpu:
        # Not known before the run: parity_ui.analysis.window_check replaces this with what the run measured on
        # the tokens whose context ran past the window.
        problems.append(
            Problem(
                "sliding-window-cpu",
                f"the model uses a sliding window of {sliding} tokens, which vLLM's CPU attention "
                "applies with its own kernel: not measured yet (the run compares the tokens whose "
                "context runs past the window)",
                "compare with prompts shorter than the window, or run the vLLM side on a GPU",
                severity="warning",
            )
        )

    if (llm.get("hf_overrides") or {}).get("head_dtype") and not _has_head_dtype():
        problems.append(
            Problem(
                "fp32-logits-unsupported",
                f"fp32_logits needs vLLM's head_dtype override, which vLLM {version} lacks",
                "drop fp32_logits for this side, or use an environment with a newer vLLM (python=)",
            )
        )
    if os.environ.get("VLLM_BATCH_INVARIANT") == "1" and not on_gpu:
        problems.append(
            Problem(
                "batch-invariant-unsupported",
                "batch_invariant=true has no effect here: vLLM's CPU worker never enables it",
                "run this side on an NVIDIA GPU of compute capability >= 8.0, or drop batch_invariant",
                severity="warning",
            )
        )
    return problems


def _has_head_dtype() -> bool:
    try:
        import dataclasses

        from vllm.config import ModelConfig

        return "head_dtype" in {f.name for f in dataclasses.fields(ModelConfig)} or hasattr(ModelConfig, "head_dtype")
    except Exception:  # noqa: BLE001
        return False


def _attention_problems(head_dim: int, dtype: str | None, on_gpu: bool, version: str) -> list[Problem]:
    """Whether the attention kernel runs at this head size: on the CPU by calling it on tiny
    tensors (the declared list is not the truth: 48 runs although undeclared, 16 and 24 fail)."""
    from .attention_probe import probe_head_size

    ok, why = probe_head_size(head_dim, dtype or "float32", on_gpu)
    if ok:
        return []
    where = "GPU" if on_gpu else "CPU"
    return [
        Problem(
            "attention-head-size",
            f"vLLM {version}'s {where} attention cannot run head size {head_dim} in {dtype}: {why}",
            "compare with hf sides only (e.g. --side ref=hf,dtype=float32 --side b=hf), or run on "
            + ("the CPU build" if on_gpu else "a GPU")
            + " where the kernel supports it",
        )
    ]


def _model_impl(mc: Any) -> str | None:
    """Whose model code vLLM runs, resolved: "transformers" when the architecture it picked is its
    Transformers backend (asked, or auto's fallback for a model it has no code of), else "vllm"."""
    asked = _name(_get(mc, "model_impl"))
    if asked and str(asked).lower() not in ("auto", "none"):
        return str(asked).lower()
    try:
        arch = _get(mc, "architecture") or (_get(mc, "architectures") or [None])[0]
    except Exception:  # noqa: BLE001 - a vLLM without these fields: not reported
        return None
    return None if arch is None else ("transformers" if "Transformers" in str(arch) else "vllm")


def resolved_settings(llm: Any) -> dict[str, Any]:
    """The settings vLLM actually resolved, in parity-ui's common vocabulary (parity_ui.core.settings)."""
    import torch
    import vllm

    eng = llm.llm_engine
    vc = getattr(eng, "vllm_config", None)
    mc = _get(vc, "model_config") or eng.model_config
    cache, sched, comp, par = (
        _get(vc, n) for n in ("cache_config", "scheduler_config", "compilation_config", "parallel_config")
    )
    eager = bool(_get(mc, "enforce_eager"))
    mode = _name(_get(comp, "mode")) or _name(_get(comp, "level"))
    graphs = _name(_get(comp, "cudagraph_mode"))
    head_dtype = _name(_get(mc, "head_dtype")) or _name(_get(mc, "dtype"))
    sizes = _get(comp, "cudagraph_capture_sizes")
    logprobs_mode = str(_name(_get(mc, "logprobs_mode")) or "")
    device = device_name()
    out = {
        "dtype": _name(_get(mc, "dtype")),
        "device": device,
        # the CPU's thread count splits reductions (it changes bits there); a GPU's kernels don't use it
        "cpu_threads": torch.get_num_threads() if device.startswith("cpu") else None,
        "attention": _attention_backend(llm),
        "logits_dtype": head_dtype,
        "cuda_graphs": "off" if eager or str(graphs).upper() == "NONE" else (graphs or "on"),
        "compilation": "off" if eager else mode,
        "cuda_graph_sizes": (f"{len(sizes)} sizes, up to {max(sizes)}" if sizes else None) if not eager else None,
        "prefix_caching": _get(cache, "enable_prefix_caching"),
        "chunked_prefill": _get(sched, "chunked_prefill_enabled")
        if _get(sched, "chunked_prefill_enabled") is not None
        else _get(sched, "enable_chunked_prefill"),
        "async_scheduling": _get(sched, "async_scheduling"),
        "model_impl": _model_impl(mc),
        "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT") == "1",
        "logprobs_mode": ("processed" if logprobs_mode.startswith("processed") else "raw") if logprobs_mode else None,
        "generation_config": "neutral" if _get(mc, "generation_config") == "vllm" else _get(mc, "generation_config"),
        "max_num_seqs": _get(sched, "max_num_seqs"),
        "max_num_batched_tokens": _get(sched, "max_num_batched_tokens"),
        "block_size": _get(cache, "block_size"),
        "max_model_len": _get(mc, "max_model_len"),
        "kv_cache_blocks": _get(cache, "num_gpu_blocks") or _get(cache, "num_cpu_blocks"),
        "tensor_parallel": _get(par, "tensor_parallel_size"),
        "pipeline_parallel": _get(par, "pipeline_parallel_size"),
        "seed": _get(mc, "seed"),
        "engine": f"vLLM {vllm.__version__}",
        "torch": torch.__version__,
    }
    import sys

    out["python"] = sys.version.split()[0]
    return {k: v for k, v in out.items() if v is not None}


def device_name() -> str:
    import platform

    import torch

    if torch.cuda.is_available():
        return f"cuda:0 ({torch.cuda.get_device_name(0)})"
    return f"cpu ({platform.machine()})"


def _attention_backend(llm: Any) -> str | None:
    """The attention backend the model runner chose (its class name), or the forced one."""
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    except AttributeError:
        runner = None
    for attr in ("attn_backends", "attn_groups"):
        groups = getattr(runner, attr, None)
        if groups:
            names = set()
            for g in groups:
                for x in g if isinstance(g, list) else [g]:
                    backend = getattr(x, "backend", x)
                    name = getattr(backend, "get_name", None)
                    names.add(name() if callable(name) else type(backend).__name__)
            if names:
                return ", ".join(sorted(names))
    forced = _get(llm.llm_engine, "vllm_config", "attention_config", "backend")
    return _name(forced) if forced else os.environ.get("VLLM_ATTENTION_BACKEND")


def engine_input(engine: Any, ids: list[int] | dict[str, Any]) -> Any:
    """What `LLMEngine.add_request` takes for pre-tokenized ids (or a TokensPrompt dict with
    multi_modal_data). vLLM >= 0.32 deprecates raw prompt dicts there in favour of the renderer's
    output; older releases take the TokensPrompt dict."""
    prompt = dict(ids) if isinstance(ids, dict) else {"prompt_token_ids": list(ids)}
    renderer = getattr(engine, "renderer", None)
    if renderer is not None and hasattr(renderer, "render_cmpl"):
        (rendered,) = renderer.render_cmpl([prompt])
        return rendered
    return prompt


# -- forced tokens: trace replay or prompt logprobs -------------------------------------------------

TRACE = "trace"
PROMPT = "prompt"
AUTO = "auto"  # trace where this vLLM runs it, else prompt (the engine decides at load)


def trace_unavailable() -> str | None:
    """Why this vLLM cannot force tokens through decode steps (SamplingParams.trace_decode_token_ids,
    vLLM #46701), or None when it may. vLLM 0.26 has no such field; 0.32 has it, but only with
    `enable_trace_replay` on Model Runner V2, which needs Triton (the CPU build has none): that last
    refusal comes from vLLM's config check at load, so the engine tries and falls back there."""
    import vllm
    from vllm import SamplingParams

    fields = getattr(SamplingParams, "__struct_fields__", None) or getattr(SamplingParams, "__annotations__", {})
    if "trace_decode_token_ids" not in fields:
        return f"vLLM {vllm.__version__} has no SamplingParams.trace_decode_token_ids"
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return f"vLLM {vllm.__version__}: EngineArgs not found"
    if "enable_trace_replay" not in getattr(EngineArgs, "__dataclass_fields__", {}):
        return f"vLLM {vllm.__version__} has no enable_trace_replay engine option"
    return None


def trace_unavailable_here() -> str | None:
    """trace_unavailable(), and what vLLM would refuse at load without trying: Model Runner V2 (which
    trace replay runs on) needs Triton. Only where this says no is an engine loaded with prompt logprobs
    the same as one asked for "auto" (EngineInfo.serves_also)."""
    why = trace_unavailable()
    if why is not None:
        return why
    return None if _has_triton() else "trace replay needs Model Runner V2, which needs Triton; this vLLM build has none"


def _has_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:  # pragma: no cover - layout of another vLLM
        return True
    return bool(HAS_TRITON)


def trace_refusal(error: BaseException) -> str | None:
    """The reason, when `error` is vLLM refusing enable_trace_replay at load (its config check);
    None for any other error (which must not be hidden by a fallback)."""
    text = str(error)
    if "trace replay" not in text.lower():
        return None
    line = next((ln.strip() for ln in text.splitlines() if "trace replay" in ln.lower()), text.strip())
    line = line.split("[type=")[0].strip().removeprefix("Value error, ")
    return line + ("; Model Runner V2 needs Triton, which this vLLM build lacks" if not _has_triton() else "")


def forced_tokens_label(path: str, why: str | None) -> str:
    """The resolved-settings row: which path scores forced tokens, and why not trace."""
    if path == TRACE:
        return "trace (decode steps, SamplingParams.trace_decode_token_ids)"
    return "prompt logprobs over prompt + response" + (f" ({why})" if why else "")
