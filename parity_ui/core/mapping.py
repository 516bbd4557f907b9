"""Canonical config + a side -> that side's native arguments. The ONLY module that knows their names.

Each kind has a mapper (`_MAPPERS`) returning its arguments plus, per canonical key, the native
arguments it became; `mapping_table` joins the sides, so the table a user reads is produced by the
code that runs.

Semantics that differ between the engines (and that hand-written tables get wrong):
- greedy: vLLM `temperature=0`; HF `do_sample=False` with temperature/top_p/top_k unset (HF
  rejects temperature=0).
- top_k off: vLLM `top_k=0` (0 or -1 disable); HF `top_k=0` too (HF's GenerationConfig default is
  50, so "unset" would NOT be off).
- EOS: every side gets the same explicit id list (model generation_config + tokenizer), so none
  falls back to its own guess.
- ignore_eos: vLLM `ignore_eos=True`; HF: no EOS in `eos_token_id`. Never HF `min_new_tokens`,
  which MASKS EOS and changes the distribution.
- generation_config.json: vLLM `generation_config="vllm"`, and HF generates from a neutral
  GenerationConfig: no side merges the model's sampling defaults behind the user's back.
- dtype "auto": resolved once from the model's config (HF's rule); vLLM would otherwise pick
  bfloat16 for a float32 checkpoint on GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import ParityConfig
from .context import CONTEXT_FLOOR, positions_limit, rope_factor, sized_context
from .errors import ConfigError, SideError
from .kinds import (
    KINDS,
    SDPA_ENABLED,
    HfOptions,
    Kind,
    OpenAIOptions,
    VllmOptions,
    VllmServerOptions,
    VllmUpdatedOptions,
    get_kind,
)
from .sides import SideSpec
from .types import ModelInfo
from .validation import doc_of

# Shared canonical keys in display order, with what a reader must know about each mapping.
NOTES: dict[str, str] = {
    "max_new_tokens": "Same meaning: tokens generated after the prompt.",
    "temperature": "0 = greedy. HF rejects temperature=0: greedy there is do_sample=False with "
    "temperature/top_p/top_k unset.",
    "top_p": "Nucleus sampling; 1 = off. Ignored under greedy.",
    "top_k": "0 = off everywhere: vLLM's off is 0 (-1 is its older spelling), HF's 0 or None (its own default is "
    "50, so unset would NOT be off): parity-ui always passes 0. shared-seed: parity-ui's sampler, 0 = off.",
    "min_p": "0 = off.",
    "repetition_penalty": "Penalizes prompt AND generated tokens (HF PR #1424 semantics; not frequency_penalty).",
    "seed": "vLLM: per-request seed. HF: torch.manual_seed before generate. With sampling=native, sampled "
    "streams still differ (different RNG streams); with sampling=shared-seed the seed keys the shared noise.",
    "sampling": "native: each engine's own sampler. shared-seed: parity-ui's one sampler in every side (a vLLM "
    "logits processor, an HF logits processor): temperature, min_p, top_k, top_p in that order, then "
    "argmax of logits/T + Gumbel noise hashed from (seed, prompt ids, position, token id); the engine "
    "takes that token greedily, so its raw logprobs stay the model's. At temperature 0 it is greedy "
    "and nothing is drawn.",
    "stop_token_ids": "Extra stop ids, on top of the model's EOS ids.",
    "ignore_eos": "vLLM ignore_eos=True; HF: EOS removed from eos_token_id. NOT min_new_tokens, "
    "which masks EOS and changes the distribution.",
    "dtype": "'auto' is resolved once from the model's config; a side's own dtype overrides it.",
    "max_model_len": "vLLM's context limit; HF has none (parity-ui enforces it on the prompt). Unset: each vLLM "
    "side gets what the run needs (longest prompt + max_new_tokens, rounded up to 1024, 2048, "
    "4096...), at most the model's positions and what its KV cache holds. Set: checked before "
    "loading against the model's positions (RoPE-scaled) and the side's KV cache.",
    "rope_scaling": "vLLM: hf_overrides; HF: the loaded config's rope parameters. Every side reads the SAME dict.",
    "logprobs": "Top-k alternatives per position. HF: log_softmax(float32) of raw logits "
    "(output_logits), as vLLM's own tests do.",
    "logprobs_mode": "raw = before sampling processors. processed_logprobs: vLLM's processed mode and HF's "
    "processed scores (output_scores).",
    "generation_config": "'neutral': the model's generation_config.json sampling defaults are applied by no "
    "side (HF generates from a neutral GenerationConfig). 'model': every side applies them.",
    "chat": "Applied ONCE by parity-ui; every side receives the same token ids (no second BOS).",
    "batch_size": "Prompts per generate call. Batching HF pads on the left and changes HF's "
    "own numerics: the reference itself moves.",
    "cross_score": "parity-ui only: after generating, the reference and each side teacher-force each other's "
    "tokens (vLLM prompt_logprobs, HF one forward pass) to measure drift past the first fork.",
    "routes": "parity-ui only: MoE routes per token and layer. HF: a forward hook on each MoE layer's gate; vLLM: "
    "its routers wrapped in process (eager), and on a GPU also enable_return_routed_experts (ids). "
    "replay_routes (hf sides): the gate's top-k replaced by the reference's recorded experts.",
    "full_distribution": "parity-ui only: full next-token rows compared per position (scored mode, replays). vLLM: "
    "a rows-writing logits processor (LLM logits_processors, listed first); HF: generate's "
    "logits and the scoring forward pass. Rows go to a scratch .npy, never through the pipe.",
    "full_distribution_budget_mb": "parity-ui only: the most one sequence's full rows may take (vocabulary x "
    "tokens x 4 bytes); over it full_distribution is refused.",
    "generate_while_loading": "parity-ui only: when a side has loaded, it generates while slower sides still "
    "load (one side generates at a time). 'gpu' (default) on a GPU machine, 'always', "
    "'never'. The tokens do not change; the timings of a side that generated early "
    "were taken beside another side's start.",
    "eos_token_ids": "Resolved from generation_config.json and the tokenizer; the same list for every side.",
    "image_min_pixels": "Image prompts: the resize floor. vLLM: mm_processor_kwargs; HF: the processor's "
    "images_kwargs. null = the processor's default, resolved once and passed to every side.",
    "image_max_pixels": "Image prompts: the resize ceiling (same paths). Sides that differ see different image "
    "token counts (the resize trap).",
    "max_images_per_prompt": "vLLM: limit_mm_per_prompt (video 0); HF has no limit (parity-ui enforces it).",
}


@dataclass(frozen=True)
class NativeArg:
    where: str  # "LLM", "SamplingParams", "env", "from_pretrained", "config", "generate", "greedy loop", "runtime"
    name: str
    value: Any

    def __str__(self) -> str:
        return f"{self.where}.{self.name}={self.value!r}" if self.where != "env" else f"{self.name}={self.value}"


@dataclass
class Resolved:
    """Facts every side's mapper needs, decided once so that every side gets the same answer."""

    model: ModelInfo  # the run's model
    eos_token_ids: list[int]  # model generation_config + tokenizer EOS, deduplicated
    on_gpu: bool
    image_pixels: dict[str, int] | None = None  # the processor's min/max pixels (vision models)
    # side -> positions its longest prompt plus max_new_tokens need; prepare fills it once the prompts
    # are tokenized (empty before: `parity config show`, a worker started ahead).
    context_need: dict[str, int] = field(default_factory=dict)


@dataclass
class VllmArgs:
    llm: dict[str, Any]
    sampling: dict[str, Any]
    env: dict[str, str]
    used: dict[str, list[NativeArg]] = field(default_factory=dict)
    fp32_logits: bool = False
    forced_tokens: str = "prompt"  # trace | prompt | auto: how score_batch forces tokens (the engine decides auto)


@dataclass
class HfArgs:
    load: dict[str, Any]  # from_pretrained kwargs (dtype as a string: the worker maps it to torch)
    config_overrides: dict[str, Any]  # set on the loaded config before the weights load
    sampling: dict[str, Any]  # GenerationConfig fields
    device: str  # "cpu" | "cuda" | "cuda:N"; "balanced" spreads over the visible GPUs
    seed: int
    logprobs_source: str  # "logits" (raw) | "scores" (processed)
    keep_model_generation_config: bool
    env: dict[str, str] = field(default_factory=dict)
    fp32_logits: bool = False
    decode: str = "eager"
    sdpa_kernels: list[str] | None = None  # the SDPA kernels the worker leaves enabled (None: torch's choice)
    used: dict[str, list[NativeArg]] = field(default_factory=dict)
    image_pixels: dict[str, int] | None = None  # images_kwargs for the processor (vision models)
    shared_seed: dict[str, Any] | None = None  # the shared-seed sampler's settings (sampling=shared-seed)
    score_batch: str = "auto"  # how score_batch packs rows (parity_ui.engines.hf_score)
    score_tokens: int | None = None  # tokens a scoring forward holds; None: the engine's default
    deterministic: bool = False  # torch's deterministic algorithms in the worker (its env carries cuBLAS's)


@dataclass
class VllmServerArgs(VllmArgs):
    """vllm serve started by the side's worker: `llm` becomes its command-line flags, `sampling`
    the body of every completions request."""

    server: dict[str, Any] = field(default_factory=dict)  # port, startup_timeout_s


@dataclass
class VllmUpdatedArgs(VllmArgs):
    """A vLLM that loads `update["start_from"]` and then receives `update["pushed_from"]` (the side's
    model) in flight (parity_ui.engines.vllm_updated)."""

    update: dict[str, Any] = field(default_factory=dict)  # start_from, pushed_from, skip, zero, sleep, path


@dataclass
class OpenAIArgs:
    connection: dict[str, Any]  # url, served_model, api_key_env, timeout_s, verify_tls, check_tokenizer
    sampling: dict[str, Any]  # the completions request body's sampling fields, every one explicit
    env: dict[str, str] = field(default_factory=dict)
    used: dict[str, list[NativeArg]] = field(default_factory=dict)


SideArgs = VllmArgs | HfArgs | VllmServerArgs | OpenAIArgs | VllmUpdatedArgs


class _Recorder:
    def __init__(self) -> None:
        self.used: dict[str, list[NativeArg]] = {}

    def __call__(self, key: str, where: str, name: str, value: Any) -> Any:
        self.used.setdefault(key, []).append(NativeArg(where, name, value))
        return value


# OpenMP on a CPU that other work shares. libgomp's threads spin at every barrier (300k turns by
# default) before they sleep. When a busy process elsewhere holds a core, the spinning thread keeps
# its partner off the CPU and every barrier costs a scheduler slice: measured on 2 cores, demo
# model, bf16, 64 tokens, bare HF 110-125 s with one busy process in another session against 12 s
# with 10k turns (4.2-4.9 s fully passive), while an idle machine pays 1.07-1.1x for the 10k turns
# (1.3x passive). A choice set by the user (OMP_WAIT_POLICY, GOMP_SPINCOUNT) is left alone.
CPU_SPINCOUNT = "10000"


def _cpu_threads_env(rec: _Recorder, p: str, on_cpu: bool, threads: int | None) -> dict[str, str]:
    if not on_cpu:
        if threads is not None:
            rec(p + "cpu_threads", "runtime", "(not used on a GPU)", threads)
        return {}
    env: dict[str, str] = {}
    if threads is not None:
        # Read by libgomp and torch when the worker starts (vLLM's CPU worker respects it too): the
        # worker's key holds its env, so a side of another thread count never reuses this one's worker.
        env["OMP_NUM_THREADS"] = rec(p + "cpu_threads", "env", "OMP_NUM_THREADS", str(threads))
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        env["GOMP_SPINCOUNT"] = rec(p + "device", "env", "GOMP_SPINCOUNT", CPU_SPINCOUNT)
    return env


def _known_dtype(d: str) -> str:
    d = (d or "").replace("torch.", "")
    return d if d in ("float32", "bfloat16", "float16") else "float32"


def auto_dtype(model: ModelInfo) -> str:
    """What dtype=auto loads, resolved once for every side: the config's dtype, else the weights'
    (transformers 5 and vLLM both read the checkpoint when config.json names none), else float32.
    (vLLM alone would then downcast a float32 checkpoint to bfloat16: preflight says so.)"""
    return _known_dtype(model.config_dtype or model.weights_dtype)


def side_dtype(cfg: ParityConfig, side: SideSpec, model: ModelInfo) -> str:
    """The explicit dtype a side loads its weights in: its own, else the run's; 'auto' as auto_dtype."""
    if not hasattr(side.options, "dtype"):
        return "as served"  # a server's own dtype: recorded from what it reports
    asked = side.options.dtype or cfg.dtype
    return auto_dtype(model) if asked == "auto" else asked


def side_logprobs_mode(cfg: ParityConfig, side: SideSpec) -> str | None:
    """The logprobs a side reports: its own mode, else the run's; None for a server (the server's own)."""
    if not hasattr(side.options, "logprobs_mode"):
        return None
    mode = side.options.logprobs_mode or cfg.logprobs_mode
    if cfg.shared_seed and mode != "raw_logprobs":
        raise SideError(
            side.name,
            "logprobs_mode",
            f"is {mode}, and sampling=shared-seed records the processed logprob "
            "itself; the engine's own would include the shared noise",
            "unset this side's logprobs_mode (raw; the processed logprob is recorded beside it)",
        )
    return mode


def side_generation_config(cfg: ParityConfig, side: SideSpec) -> str:
    """How a side treats the model's generation_config.json: its own setting, else the run's. A side
    of its own ("model" on one side only) reproduces the trap of one engine silently taking the
    file's defaults while the other does not."""
    return getattr(side.options, "generation_config", None) or cfg.generation_config


def resolve(
    model: ModelInfo, tokenizer_eos: list[int], on_gpu: bool, image_pixels: dict[str, int] | None = None
) -> Resolved:
    eos: list[int] = []
    for t in [*model.eos_token_ids, *tokenizer_eos]:
        if t not in eos:
            eos.append(t)
    return Resolved(model=model, eos_token_ids=eos, on_gpu=on_gpu, image_pixels=image_pixels)


def side_image_pixels(cfg: ParityConfig, side: SideSpec, r: Resolved) -> dict[str, int] | None:
    """The resize settings a side passes to its processor: its own override, else the run's, else the
    processor's defaults (resolved once). None for a text-only model."""
    if not r.model.vision:
        return None
    defaults = r.image_pixels or {}
    out = {}
    for key, name in (("min_pixels", "image_min_pixels"), ("max_pixels", "image_max_pixels")):
        v = getattr(side.options, name, None) or getattr(cfg, name) or defaults.get(key)
        if v is not None:
            out[key] = int(v)
    if out.get("min_pixels", 0) > out.get("max_pixels", 1 << 62):
        raise SideError(
            side.name,
            "image_min_pixels",
            f"resizes images with min_pixels={out['min_pixels']} over max_pixels={out['max_pixels']}",
            "set image_min_pixels at most image_max_pixels (the processor's defaults fill the unset one)",
        )
    return out


def _record_pixels(rec: _Recorder, side: SideSpec, px: dict[str, int], where: str, name: str) -> None:
    for key, native in (("image_min_pixels", "min_pixels"), ("image_max_pixels", "max_pixels")):
        if native in px:
            rec(key, where, f"{name}.{native}", px[native])
            if getattr(side.options, key, None) is not None:
                rec(f"{side.name}.{key}", where, f"{name}.{native}", px[native])


def rope_override(cfg: ParityConfig, model: ModelInfo) -> dict[str, Any] | None:
    """The full rope dict every side gets: the model's own (rope_theta etc.) plus the user's scaling."""
    if cfg.rope_scaling is None:
        return None
    return {**model.rope_parameters, **cfg.rope_scaling}


def stop_ids(cfg: ParityConfig, r: Resolved) -> list[int]:
    """The ids that end generation, the same list for every side: the model's EOS ids (unless
    ignore_eos) plus the user's stop ids."""
    return [*([] if cfg.ignore_eos else r.eos_token_ids), *cfg.stop_token_ids]


def _visible_gpus(device: str) -> str | None:
    """`cuda:1` / `cuda:0,1` -> the CUDA_VISIBLE_DEVICES value for the side's worker."""
    return device.split(":", 1)[1] if device.startswith("cuda:") else None


def default_capture_size(batch_size: int) -> int:
    """The largest CUDA-graph batch a side captures when the user does not say: the run's batch size,
    at least 16 (determinism probes batch a few copies), rounded up to a power of two up to vLLM's own
    512 (above it, to a multiple of 8).

    Why a power of two: the size is part of vLLM's compile-cache key (CompilationConfig.compute_hash),
    so every new size compiles the model again (21-22 s on an H100, docs/performance.md); buckets let
    runs of nearby batch sizes reuse one compile. The numerics stay vLLM's default ones: the sizes
    captured are vLLM's own list (1, 2, 4, 8, 16, 24, ...) cut at this size, so a batch runs padded to
    the same captured size whatever the cut, as long as the cut is not below it."""
    if batch_size > 512:
        return -(-batch_size // 8) * 8
    return max(16, 1 << (batch_size - 1).bit_length())


def to_vllm(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo) -> VllmArgs:
    rec = _Recorder()
    v: VllmOptions = side.options  # type: ignore[assignment]
    p = f"{side.name}."
    if v.device == "cpu" and r.on_gpu:
        raise SideError(
            side.name,
            "device",
            "device=cpu: the vLLM installed here is its GPU build, which cannot run a side on the CPU",
            "drop device=cpu for this vLLM side, or use an hf side with device=cpu",
        )
    eager = v.enforce_eager if v.enforce_eager is not None else not r.on_gpu
    llm: dict[str, Any] = {
        "model": model.path,
        "tokenizer": model.path,
        "trust_remote_code": model.trust_remote_code,
        "dtype": rec("dtype", "LLM", "dtype", side_dtype(cfg, side, model)),
        "seed": rec("seed", "LLM", "seed", cfg.seed),
        "enforce_eager": rec(p + "enforce_eager", "LLM", "enforce_eager", eager),
        "enable_prefix_caching": rec(
            p + "enable_prefix_caching", "LLM", "enable_prefix_caching", v.enable_prefix_caching
        ),
        "enable_chunked_prefill": rec(
            p + "enable_chunked_prefill", "LLM", "enable_chunked_prefill", v.enable_chunked_prefill
        ),
        "tensor_parallel_size": rec(p + "tensor_parallel_size", "LLM", "tensor_parallel_size", v.tensor_parallel_size),
        "logprobs_mode": rec("logprobs_mode", "LLM", "logprobs_mode", side_logprobs_mode(cfg, side)),
        "generation_config": rec(
            "generation_config",
            "LLM",
            "generation_config",
            "vllm" if side_generation_config(cfg, side) == "neutral" else "auto",
        ),
        "max_logprobs": max(cfg.logprobs, 1),
    }
    if getattr(v, "generation_config", None):
        rec(p + "generation_config", "LLM", "generation_config", llm["generation_config"])
    if cfg.routes and r.on_gpu:
        # vLLM's own capture (V1 model runner on a GPU; the CPU build refuses it): the expert ids.
        llm["enable_return_routed_experts"] = rec("routes", "LLM", "enable_return_routed_experts", True)
    else:
        rec("routes", "runtime", "hooks on the routers (select_experts), in process", cfg.routes)
    if v.logprobs_mode:
        rec(p + "logprobs_mode", "LLM", "logprobs_mode", llm["logprobs_mode"])
    if v.pipeline_parallel_size > 1:
        llm["pipeline_parallel_size"] = rec(
            p + "pipeline_parallel_size", "LLM", "pipeline_parallel_size", v.pipeline_parallel_size
        )
    if v.pipeline_parallel_size > 1 or v.tensor_parallel_size > 1:
        # One worker process per GPU; the engine core stays in this worker.
        llm["distributed_executor_backend"] = "mp"
    if v.attention_backend:
        llm["attention_backend"] = rec(p + "attention_backend", "LLM", "attention_backend", v.attention_backend)
    if v.async_scheduling is not None:
        llm["async_scheduling"] = rec(p + "async_scheduling", "LLM", "async_scheduling", v.async_scheduling)
    if v.model_impl:
        llm["model_impl"] = rec(p + "model_impl", "LLM", "model_impl", v.model_impl)
    if r.on_gpu:
        # None: parity_ui.run.memory_plan fills the share before loading (sides share the GPU).
        llm["gpu_memory_utilization"] = rec(
            p + "gpu_memory_utilization", "LLM", "gpu_memory_utilization", v.gpu_memory_utilization
        )
        if not eager:
            # vLLM captures a CUDA graph per batch size up to 512 by default: most of a cold start
            # for a run that sends batches of 1..batch_size. Capture what the run can use.
            cap = v.max_cudagraph_capture_size or default_capture_size(side.batch_size(cfg.batch_size))
            llm["max_cudagraph_capture_size"] = rec(
                p + "max_cudagraph_capture_size", "LLM", "max_cudagraph_capture_size", cap
            )
    else:
        llm["kv_cache_memory_bytes"] = rec(
            p + "kv_cache_gib", "LLM", "kv_cache_memory_bytes", int(v.kv_cache_gib * 2**30)
        )
    context = vllm_context(cfg, side, r, model)
    if context is not None:
        llm["max_model_len"] = rec("max_model_len", "LLM", "max_model_len", context)
    else:
        limit = positions_limit(model, cfg.rope_scaling)
        rec(
            "max_model_len",
            "LLM",
            "max_model_len",
            f"the run's need, rounded up to {CONTEXT_FLOOR}, 2048, 4096..." + (f" (at most {limit})" if limit else ""),
        )
    if v.max_num_seqs is not None:
        llm["max_num_seqs"] = rec(p + "max_num_seqs", "LLM", "max_num_seqs", v.max_num_seqs)
    if v.max_num_batched_tokens is not None:
        llm["max_num_batched_tokens"] = rec(
            p + "max_num_batched_tokens", "LLM", "max_num_batched_tokens", v.max_num_batched_tokens
        )
    rec(p + "batch_size", "runtime", "requests added per engine step loop (this side)", side.batch_size(cfg.batch_size))
    overrides: dict[str, Any] = {}
    rope = rope_override(cfg, model)
    if rope is not None:
        # transformers 5 reads rope_parameters; older configs rope_scaling. vLLM normalises both.
        overrides.update(rec("rope_scaling", "LLM", "hf_overrides", {"rope_scaling": rope, "rope_parameters": rope}))
    if v.fp32_logits:
        overrides.update(rec(p + "fp32_logits", "LLM", "hf_overrides", {"head_dtype": "float32"}))
    if overrides:
        llm["hf_overrides"] = overrides
    px = side_image_pixels(cfg, side, r)
    if px is not None:
        llm["limit_mm_per_prompt"] = rec(
            "max_images_per_prompt", "LLM", "limit_mm_per_prompt", {"image": cfg.max_images_per_prompt, "video": 0}
        )
        if px:
            llm["mm_processor_kwargs"] = dict(px)
            _record_pixels(rec, side, px, "LLM", "mm_processor_kwargs")
    env: dict[str, str] = {}
    if v.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = rec(p + "batch_invariant", "env", "VLLM_BATCH_INVARIANT", "1")
    gpus = _visible_gpus(v.device)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = rec(p + "device", "env", "CUDA_VISIBLE_DEVICES", gpus)
    env.update(_cpu_threads_env(rec, p, not r.on_gpu, v.cpu_threads))

    stops = stop_ids(cfg, r)
    sampling: dict[str, Any] = {
        "max_tokens": rec("max_new_tokens", "SamplingParams", "max_tokens", cfg.max_new_tokens),
        "temperature": rec("temperature", "SamplingParams", "temperature", cfg.temperature),
        "top_p": rec("top_p", "SamplingParams", "top_p", cfg.top_p),
        "top_k": rec("top_k", "SamplingParams", "top_k", cfg.top_k),
        "min_p": rec("min_p", "SamplingParams", "min_p", cfg.min_p),
        "repetition_penalty": rec("repetition_penalty", "SamplingParams", "repetition_penalty", cfg.repetition_penalty),
        "seed": rec("seed", "SamplingParams", "seed", cfg.seed),
        "stop_token_ids": rec("stop_token_ids", "SamplingParams", "stop_token_ids", stops),
        "ignore_eos": rec("ignore_eos", "SamplingParams", "ignore_eos", cfg.ignore_eos),
        # Always ask for at least 1: the chosen token's logprob is what the comparison needs.
        "logprobs": rec("logprobs", "SamplingParams", "logprobs", max(cfg.logprobs, 1)),
        "skip_special_tokens": False,  # show <|im_end|> and friends as the tokens they are
        # parity-ui decodes with the run's one tokenizer (parity_ui.inputs.prompts.decode_as_is); vLLM's own
        # text is never read. Its detokenizer would also decode every top-k token of every step, and
        # print transformers' clean_up_tokenization_spaces warning into the worker's log.
        "detokenize": False,
        "n": 1,
    }
    rec("eos_token_ids", "SamplingParams", "stop_token_ids", stops)
    if cfg.shared_seed:
        _vllm_shared_seed(cfg, v, r, llm, sampling, env, rec)
    else:
        rec("sampling", "runtime", "sampler", "greedy" if cfg.greedy else "vLLM's own (its random stream)")
    if cfg.full_distribution:
        _vllm_full_rows(v, r, llm, env, rec)
    rec(
        "full_distribution_budget_mb",
        "runtime",
        "one sequence's full rows at most (MiB)",
        cfg.full_distribution_budget_mb,
    )
    rec("chat", "runtime", "prompt_token_ids", "the ids parity-ui tokenized")
    rec("batch_size", "runtime", "requests added per engine step loop", cfg.batch_size)
    rec("cross_score", "SamplingParams", "prompt_logprobs", max(cfg.logprobs, 1))
    rec("generate_while_loading", "runtime", "generates once loaded, while others load", cfg.generate_while_loading)
    for key in ("kv_cache_gib",) if r.on_gpu else ("gpu_memory_utilization", "max_cudagraph_capture_size"):
        rec(p + key, "runtime", "(not used " + ("on a GPU)" if r.on_gpu else "on the CPU)"), None)
    forced = v.forced_tokens or "prompt"
    if forced == "prompt":
        rec(p + "forced_tokens", "SamplingParams", "prompt_logprobs", forced)
    else:  # the engine enables trace replay where its vLLM runs it ("auto" falls back to prompt logprobs)
        rec(p + "forced_tokens", "LLM", "enable_trace_replay", forced)
    return VllmArgs(llm=llm, sampling=sampling, env=env, used=rec.used, fp32_logits=v.fp32_logits, forced_tokens=forced)


# The shared-seed sampler's names in the engines (parity_ui.engines.shared_seed, vllm_shared_seed).
SHARED_SEED_PROCESSOR = "parity_ui.engines.vllm_shared_seed:SharedSeedLogitsProcessor"
SHARED_SEED_EXTRA_ARGS = "parity_shared_seed"


def shared_seed_settings(cfg: ParityConfig) -> dict[str, Any]:
    """What every side's shared-seed sampler draws with: the canonical values, 0 / 1 = off."""
    return {
        "seed": cfg.seed,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "min_p": cfg.min_p,
    }


def _vllm_shared_seed(
    cfg: ParityConfig,
    v: VllmOptions,
    r: Resolved,
    llm: dict[str, Any],
    sampling: dict[str, Any],
    env: dict[str, str],
    rec: _Recorder,
) -> None:
    """vLLM samples greedily over the logits its shared-seed processor masked to the drawn token."""
    llm["logits_processors"] = [rec("sampling", "LLM", "logits_processors", SHARED_SEED_PROCESSOR)]
    for key, off in (("temperature", 0.0), ("top_p", 1.0), ("top_k", 0), ("min_p", 0.0)):
        sampling[key] = off
        rec.used.pop(key, None)  # what vLLM gets instead of the canonical value recorded above
        rec(key, "SamplingParams", key, f"{off} (the shared-seed processor applies {cfg.to_dict()[key]})")
    sampling["extra_args"] = {SHARED_SEED_EXTRA_ARGS: shared_seed_settings(cfg)}
    rec("sampling", "SamplingParams", f"extra_args.{SHARED_SEED_EXTRA_ARGS}", shared_seed_settings(cfg))
    if r.on_gpu and v.async_scheduling is None:
        # The processor reads each request's position from its output token list, which async
        # scheduling fills one step late.
        llm["async_scheduling"] = rec("sampling", "LLM", "async_scheduling", False)
    if r.on_gpu:
        # The processor implements the V1 runner's interface (BatchUpdate): vLLM before Model Runner
        # V2 took custom processors (vllm#56497) falls back to V1 by itself; later ones need asking.
        env["VLLM_USE_V2_MODEL_RUNNER"] = rec("sampling", "env", "VLLM_USE_V2_MODEL_RUNNER", "0")


FULL_ROWS_PROCESSOR = "parity_ui.engines.vllm_full_rows:FullRowsLogitsProcessor"


def _vllm_full_rows(v: VllmOptions, r: Resolved, llm: dict[str, Any], env: dict[str, str], rec: _Recorder) -> None:
    """full_distribution: vLLM writes its full rows through parity-ui's rows processor, listed FIRST
    (the shared-seed processor masks the row it draws from). Like that one it reads each request's
    position from its output list (no async scheduling) and implements the V1 runner's interface."""
    llm["logits_processors"] = [
        rec("full_distribution", "LLM", "logits_processors", FULL_ROWS_PROCESSOR),
        *llm.get("logits_processors", []),
    ]
    if r.on_gpu and v.async_scheduling is None:
        llm["async_scheduling"] = rec("full_distribution", "LLM", "async_scheduling", False)
    if r.on_gpu:
        env["VLLM_USE_V2_MODEL_RUNNER"] = rec("full_distribution", "env", "VLLM_USE_V2_MODEL_RUNNER", "0")


def _long_context_allowed() -> bool:
    """vLLM's own switch for a max_model_len past the model's positions (its workers inherit it)."""
    return os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true")


def vllm_context(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo) -> int | None:
    """The max_model_len a vLLM side starts with: the config's, checked against the positions the
    side's model serves (vLLM refuses more, after loading), else the run's need for this side
    bucketed by `sized_context`. None when the need is not known yet (no prompts)."""
    limit = positions_limit(model, cfg.rope_scaling)
    factor = rope_factor(model, cfg.rope_scaling)
    served = (
        (
            f"{limit:,} positions ({model.max_position_embeddings:,} x RoPE factor {factor:g})"
            if factor != 1
            else f"{limit:,} positions (max_position_embeddings)"
        )
        if limit
        else ""
    )
    if cfg.max_model_len is not None:
        if limit is not None and cfg.max_model_len > limit and not _long_context_allowed():
            raise ConfigError(
                "max_model_len",
                f"{cfg.max_model_len:,} is over the {served} that {model.path} "
                f"serves; vLLM (side '{side.name}') would refuse it after loading",
                f"lower max_model_len to {limit} or less, or unset it (each vLLM side then gets what "
                "the run needs), or extend the context with rope_scaling (e.g. {rope_type: linear, "
                "factor: 2.0})",
            )
        return cfg.max_model_len
    need = r.context_need.get(side.name)
    if need is None:
        return None
    if limit is not None and need > limit:  # the run's model passed prepare's check: a side's own model or images
        raise SideError(
            side.name,
            "model",
            f"its prompts need {need:,} positions (the longest plus max_new_tokens), "
            f"over the {served} that {model.path} serves",
            "shorten the prompt or lower max_new_tokens, or give this side a model with a longer context",
        )
    return sized_context(need, limit)


def _hf_device(device: str, on_gpu: bool) -> tuple[str, dict[str, str]]:
    """(where the model goes, worker env): one device, or 'balanced' over the side's GPUs."""
    if device == "auto":
        return ("cuda" if on_gpu else "cpu"), {}
    if device.startswith("cuda:") and "," in device:
        return "balanced", {"CUDA_VISIBLE_DEVICES": device.split(":", 1)[1]}
    return device, {}


def _refuse_graphed_settings(cfg: ParityConfig, side: SideSpec, h: HfOptions) -> None:
    """decode=graphed is a greedy argmax over raw logits: a setting that generate() would turn into a
    logits processor or a sampler would be silently dropped there, so it is refused here."""
    fix = "use decode=static (generate() with the same static cache), which supports it"
    if not cfg.greedy:
        raise SideError(
            side.name,
            "decode",
            f"decode=graphed decodes greedily only, and this run samples (temperature={cfg.temperature})",
            "set temperature=0, or " + fix,
        )
    if cfg.repetition_penalty != 1.0:
        raise SideError(
            side.name,
            "decode",
            f"decode=graphed applies no repetition penalty, and this run sets "
            f"repetition_penalty={cfg.repetition_penalty}",
            "set repetition_penalty=1, or " + fix,
        )
    mode = side_logprobs_mode(cfg, side) or cfg.logprobs_mode
    if mode.startswith("processed"):
        raise SideError(
            side.name,
            "decode",
            f"decode=graphed records raw logprobs, and this side asks for logprobs_mode={mode}",
            "use a raw logprobs_mode, or " + fix,
        )
    if h.attn_implementation not in ("auto", "sdpa", "eager"):
        raise SideError(
            side.name,
            "decode",
            f"decode=graphed passes no 2-D attention mask, which "
            f"attn_implementation={h.attn_implementation} needs "
            "to cut the static cache to its filled length",
            "set attn_implementation=sdpa or eager, or " + fix,
        )
    if side_generation_config(cfg, side) == "model":
        raise SideError(
            side.name,
            "decode",
            "decode=graphed ignores the model's generation_config.json, and "
            "this side asks for it (generation_config=model)",
            "set generation_config=neutral, or " + fix,
        )


def _as_greedy_loop(used: dict[str, list[NativeArg]]) -> dict[str, list[NativeArg]]:
    """decode=graphed never calls generate(): the sampling values go to parity-ui's loop, which decodes
    one prompt at a time (no left padding, whatever batch_size says)."""

    def moved(key: str, a: NativeArg) -> NativeArg:
        if key == "batch_size":
            return NativeArg("runtime", "one prompt at a time (batch_size does not apply)", 1)
        return NativeArg("greedy loop", a.name, a.value) if a.where == "generate" else a

    return {key: [moved(key, a) for a in args] for key, args in used.items()}


def to_hf(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo) -> HfArgs:
    rec = _Recorder()
    h: HfOptions = side.options  # type: ignore[assignment]
    p = f"{side.name}."
    load: dict[str, Any] = {
        "dtype": rec("dtype", "from_pretrained", "dtype", side_dtype(cfg, side, model)),
        "trust_remote_code": model.trust_remote_code,
    }
    if h.attn_implementation != "auto":
        load["attn_implementation"] = rec(
            p + "attn_implementation", "from_pretrained", "attn_implementation", h.attn_implementation
        )
    overrides: dict[str, Any] = {}
    rope = rope_override(cfg, model)
    if rope is not None:
        overrides["rope_parameters"] = rec("rope_scaling", "config", "rope_parameters", rope)
    device, env = _hf_device(h.device, r.on_gpu)
    rec(p + "device", "runtime", "device_map" if device == "balanced" else "model.to", device)
    if env:
        rec(p + "device", "env", "CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])
    env = {**env, **_cpu_threads_env(rec, p, device == "cpu", h.cpu_threads)}
    env.update(_deterministic(rec, p, h))
    rec(p + "fp32_logits", "runtime", "lm_head in float32, input upcast", h.fp32_logits)
    rec(p + "batch_size", "runtime", "rows per generate call (this side; left padded)", side.batch_size(cfg.batch_size))
    _sdpa_kernels(rec, side, h)

    gen: dict[str, Any] = {
        "max_new_tokens": rec("max_new_tokens", "generate", "max_new_tokens", cfg.max_new_tokens),
        "min_new_tokens": None,  # never: it masks EOS
    }
    shared = shared_seed_settings(cfg) if cfg.shared_seed else None
    if shared is not None:
        # parity-ui's sampler (the last logits processor) masks every token but the drawn one.
        gen["do_sample"] = rec("temperature", "generate", "do_sample", False)
        gen.update(temperature=None, top_p=None, top_k=None, min_p=None)
        for key in ("temperature", "top_p", "top_k", "min_p"):
            rec(key, "generate", "logits_processor", f"shared-seed {key}={shared[key]}")
        rec("sampling", "generate", "logits_processor", "shared-seed sampler " + str(shared))
    elif cfg.greedy:
        rec("sampling", "generate", "do_sample", "greedy")
        gen["do_sample"] = rec("temperature", "generate", "do_sample", False)
        gen.update(temperature=None, top_p=None, top_k=None, min_p=None)
        for key in ("top_p", "top_k", "min_p"):
            rec(key, "generate", key, None)
    else:
        rec("sampling", "generate", "do_sample", "HF's own sampler")
        gen["do_sample"] = rec("temperature", "generate", "do_sample", True)
        gen["temperature"] = rec("temperature", "generate", "temperature", cfg.temperature)
        gen["top_p"] = rec("top_p", "generate", "top_p", cfg.top_p)
        gen["top_k"] = rec("top_k", "generate", "top_k", cfg.top_k)
        gen["min_p"] = rec("min_p", "generate", "min_p", cfg.min_p if cfg.min_p > 0 else None)
    gen["repetition_penalty"] = rec("repetition_penalty", "generate", "repetition_penalty", cfg.repetition_penalty)
    stops = stop_ids(cfg, r)
    gen["eos_token_id"] = rec("eos_token_ids", "generate", "eos_token_id", stops or None)
    rec("stop_token_ids", "generate", "eos_token_id", stops or None)
    rec("ignore_eos", "generate", "eos_token_id", "without EOS" if cfg.ignore_eos else "with EOS")
    pad = model.pad_token_id if model.pad_token_id is not None else (r.eos_token_ids or [0])[0]
    gen["pad_token_id"] = pad
    gen["bos_token_id"] = model.bos_token_id
    if h.decode == "graphed":
        _refuse_graphed_settings(cfg, side, h)
        rec(p + "decode", "runtime", "StaticCache + model.forward", "parity-ui's greedy loop, one prompt at a time")
        rec(p + "decode", "runtime", "torch.cuda.CUDAGraph", "decode step, on a GPU (a CPU runs it uncaptured)")
    elif h.decode != "eager":
        gen["cache_implementation"] = rec(p + "decode", "generate", "cache_implementation", "static")
        if h.decode == "compiled":
            rec(p + "decode", "runtime", "torch.compile", "decode step")
    else:
        rec(p + "decode", "generate", "cache_implementation", "dynamic (default)")
    processed = (side_logprobs_mode(cfg, side) or "").startswith("processed")
    rec("logprobs", "generate", "output_scores" if processed else "output_logits", True)
    rec("logprobs_mode", "generate", "output_scores" if processed else "output_logits", True)
    if h.logprobs_mode:
        rec(p + "logprobs_mode", "generate", "output_scores" if processed else "output_logits", True)
    rec("seed", "runtime", "torch.manual_seed", cfg.seed)
    rec("chat", "runtime", "input_ids", "the ids parity-ui tokenized")
    rec("batch_size", "runtime", "rows per generate call (left padded)", cfg.batch_size)
    rec("cross_score", "runtime", "one forward pass over prompt + tokens", True)
    rec(p + "score_batch", "runtime", "teacher-forced rows a forward (hf_score)", h.score_batch)
    rec(p + "score_tokens", "runtime", "tokens a scoring forward holds", h.score_tokens or "the device's default")
    rec("routes", "runtime", "forward hooks on the MoE gates", cfg.routes)
    rec(
        "full_distribution",
        "runtime",
        "full rows from generate's logits and the scoring forward pass",
        cfg.full_distribution,
    )
    rec(
        "full_distribution_budget_mb",
        "runtime",
        "one sequence's full rows at most (MiB)",
        cfg.full_distribution_budget_mb,
    )
    if h.replay_routes != "off":
        rec(p + "replay_routes", "runtime", "the gates' top-k replaced by recorded experts", h.replay_routes)
    rec("generate_while_loading", "runtime", "generates once loaded, while others load", cfg.generate_while_loading)
    keep = side_generation_config(cfg, side) == "model"
    rec(
        "generation_config",
        "runtime",
        "model.generation_config",
        "model's generation_config.json" if keep else "neutral GenerationConfig",
    )
    if h.generation_config:
        rec(
            p + "generation_config",
            "runtime",
            "model.generation_config",
            "model's generation_config.json" if keep else "neutral GenerationConfig",
        )
    px = side_image_pixels(cfg, side, r)
    if px:
        _record_pixels(rec, side, px, "processor", "images_kwargs")
        rec("max_images_per_prompt", "runtime", "(no limit in HF; parity-ui checks it)", cfg.max_images_per_prompt)
    used = _as_greedy_loop(rec.used) if h.decode == "graphed" else rec.used
    return HfArgs(
        load=load,
        config_overrides=overrides,
        sampling=gen,
        device=device,
        seed=cfg.seed,
        logprobs_source="scores" if processed else "logits",
        keep_model_generation_config=keep,
        env=env,
        fp32_logits=h.fp32_logits,
        decode=h.decode,
        sdpa_kernels=SDPA_ENABLED.get(h.sdpa_kernels),
        used=used,
        image_pixels=px,
        shared_seed=shared,
        score_batch=h.score_batch,
        score_tokens=h.score_tokens,
        deterministic=h.deterministic,
    )


# cuBLAS picks its reduction split per call from a shared workspace unless told a fixed one: the same
# matmul can round differently between two calls on a GPU. torch's deterministic mode refuses (or, with
# warn_only, warns about) cuBLAS without one of these two settings, read when the CUDA context starts.
CUBLAS_WORKSPACE = ":4096:8"
_CUBLAS_WORKSPACES = (":4096:8", ":16:8")


def _deterministic(rec: _Recorder, p: str, h: HfOptions) -> dict[str, str]:
    """deterministic=true: the worker's environment gets cuBLAS's fixed workspace (before torch starts
    CUDA: the worker is spawned with it) and the engine turns torch's switches on as it loads. A value
    of the user's own that torch accepts is kept."""
    if not h.deterministic:
        rec(p + "deterministic", "runtime", "torch.use_deterministic_algorithms", False)
        return {}
    rec(p + "deterministic", "runtime", "torch.use_deterministic_algorithms", "True, warn_only=True")
    rec(p + "deterministic", "runtime", "torch.backends.cudnn", "deterministic=True, benchmark=False")
    rec(p + "deterministic", "runtime", "torch.backends.cuda.enable_cudnn_sdp", False)  # unless sdpa_kernels says
    own = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    value = own if own in _CUBLAS_WORKSPACES else CUBLAS_WORKSPACE
    return {"CUBLAS_WORKSPACE_CONFIG": rec(p + "deterministic", "env", "CUBLAS_WORKSPACE_CONFIG", value)}


def _sdpa_kernels(rec: _Recorder, side: SideSpec, h: HfOptions) -> None:
    """Which SDPA kernels the worker leaves enabled (torch.backends.cuda.enable_*_sdp, process-wide in
    the side's worker). A kernel choice is a numerics choice: it can move a near-tie, and torch's
    own pick differs by GPU, dtype and version. no-cudnn also spares a bf16 reference cuDNN's plan
    for every new KV length, most of a fresh process's first generate (16.5 s -> 5.1 s, H100)."""
    if h.sdpa_kernels == "auto":
        rec(side.name + ".sdpa_kernels", "runtime", "scaled_dot_product_attention", "torch's choice")
        return
    if h.attn_implementation not in ("auto", "sdpa"):
        raise SideError(
            side.name,
            "sdpa_kernels",
            f"sdpa_kernels={h.sdpa_kernels} chooses among the kernels of "
            f"sdpa attention, and this side asks for "
            f"attn_implementation={h.attn_implementation}",
            "set attn_implementation=sdpa (or auto) on this side, or leave sdpa_kernels=auto",
        )
    rec(
        side.name + ".sdpa_kernels",
        "runtime",
        "torch.backends.cuda.enable_*_sdp",
        "only " + ", ".join(SDPA_ENABLED[h.sdpa_kernels]),
    )


def _refuse_shared_seed(cfg: ParityConfig, side: SideSpec) -> None:
    if cfg.shared_seed:
        raise SideError(
            side.name,
            "sampling",
            f"a {side.kind} side samples on its server, which cannot draw "
            "parity-ui's shared-seed noise (and may drop the seed)",
            "compare shared-seed runs with vllm and hf sides, or set sampling=native",
        )


def completions_sampling(cfg: ParityConfig, r: Resolved, rec: _Recorder) -> dict[str, Any]:
    """The sampling fields of a completions request. Every field is set: a vLLM server fills an
    omitted one from the model's generation_config.json, which must never happen silently."""
    stops = stop_ids(cfg, r)
    w = "request"
    body = {
        "max_tokens": rec("max_new_tokens", w, "max_tokens", cfg.max_new_tokens),
        "temperature": rec("temperature", w, "temperature", cfg.temperature),
        "top_p": rec("top_p", w, "top_p", cfg.top_p),
        "top_k": rec("top_k", w, "top_k", cfg.top_k),
        "min_p": rec("min_p", w, "min_p", cfg.min_p),
        "repetition_penalty": rec("repetition_penalty", w, "repetition_penalty", cfg.repetition_penalty),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_tokens": 0,
        "seed": rec("seed", w, "seed", cfg.seed),
        "stop_token_ids": rec("stop_token_ids", w, "stop_token_ids", stops),
        "stop": [],
        "ignore_eos": rec("ignore_eos", w, "ignore_eos", cfg.ignore_eos),
        "logprobs": rec("logprobs", w, "logprobs", max(cfg.logprobs, 1)),
        "skip_special_tokens": False,
        "n": 1,
        "echo": False,
        "return_tokens_as_token_ids": True,  # tokens named by id, never by a string to map back
    }
    rec("eos_token_ids", w, "stop_token_ids", stops)
    rec("sampling", w, "sampler", "greedy" if cfg.greedy else "the server's own (its random stream)")
    rec("chat", w, "prompt", "the ids parity-ui tokenized (a list of ints)")
    rec("batch_size", w, "prompts per request", cfg.batch_size)
    rec("cross_score", w, "prompt_logprobs", max(cfg.logprobs, 1))
    return body


def to_vllm_server(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo) -> VllmServerArgs:
    _refuse_shared_seed(cfg, side)
    base = to_vllm(cfg, side, r, model)
    rec = _Recorder()
    rec.used = base.used
    for key in (
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "sampling",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "eos_token_ids",
        "chat",
        "batch_size",
        "cross_score",
    ):
        rec.used.pop(key, None)
    rec.used["seed"] = [NativeArg("vllm serve", "--seed", cfg.seed)]
    sampling = completions_sampling(cfg, r, rec)
    o: VllmServerOptions = side.options  # type: ignore[assignment]
    if o.forced_tokens == "trace":
        raise SideError(
            side.name,
            "forced_tokens",
            "trace: a vllm serve side scores through its completions API, which has no trace replay here",
            "use forced_tokens=prompt, or an in-process vllm side",
        )
    rec(f"{side.name}.forced_tokens", "vllm serve", "prompt_logprobs", "prompt")
    rec(f"{side.name}.port", "vllm serve", "--port", o.port or "a free port on 127.0.0.1")
    rec(f"{side.name}.startup_timeout_s", "runtime", "wait for /health", o.startup_timeout_s)
    return VllmServerArgs(
        llm=base.llm,
        sampling=sampling,
        env=base.env,
        used=rec.used,
        fp32_logits=base.fp32_logits,
        server={"port": o.port, "startup_timeout_s": o.startup_timeout_s},
    )


def to_openai(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo) -> OpenAIArgs:
    _refuse_shared_seed(cfg, side)
    o: OpenAIOptions = side.options  # type: ignore[assignment]
    if not o.url:
        raise SideError(
            side.name,
            "url",
            "kind openai needs the server's URL",
            f"e.g. --side {side.name}=openai,url=http://127.0.0.1:8000/v1",
        )
    rec = _Recorder()
    sampling = completions_sampling(cfg, r, rec)
    p = f"{side.name}."
    for name in ("url", "served_model", "api_key_env", "timeout_s", "verify_tls", "check_tokenizer", "max_in_flight"):
        rec(p + name, "client", name, getattr(o, name))
    for key, why in (
        ("dtype", "the server's"),
        ("generation_config", "every sampling field is sent explicitly"),
        ("logprobs_mode", "the server's"),
    ):
        rec(key, "server", "(set when the server started)", why)
    return OpenAIArgs(
        connection={
            k: getattr(o, k)
            for k in (
                "url",
                "served_model",
                "api_key_env",
                "timeout_s",
                "verify_tls",
                "check_tokenizer",
                "max_in_flight",
            )
        },
        sampling=sampling,
        used=rec.used,
    )


def to_vllm_updated(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo) -> VllmUpdatedArgs:
    """vLLM started from `start_from`, then the side's model pushed in through vLLM's own update path
    (issue 41). The push's settings travel with the load: a worker that pushed otherwise is another setup."""
    o: VllmUpdatedOptions = side.options  # type: ignore[assignment]
    p = f"{side.name}."
    if not o.start_from.strip():
        raise SideError(
            side.name,
            "start_from",
            "a vllm-updated side needs the checkpoint it starts from",
            f"e.g. --side {side.name}=vllm-updated,start_from=/path/to/checkpoint-A (the side's model is pushed into it)",
        )
    path = o.update_path if o.update_path != "auto" else ("load_weights" if r.on_gpu else "reload")
    if path == "load_weights" and not r.on_gpu:
        raise SideError(
            side.name,
            "update_path",
            "load_weights cannot land on vLLM's CPU build: it packs each linear layer's weight into its kernel "
            "and empties the parameter, so the loader refuses ('Attempted to load weight ... into parameter "
            "(torch.Size([0]))')",
            "use update_path=reload (vLLM's reload_weights re-packs each layer), or auto",
        )
    base = to_vllm(cfg, side, r, model)
    rec = _Recorder()
    rec.used = base.used
    llm = dict(base.llm)
    llm["model"] = rec(p + "start_from", "LLM", "model", o.start_from)
    if o.sleep and r.on_gpu:
        llm["enable_sleep_mode"] = rec(p + "sleep", "LLM", "enable_sleep_mode", True)
    native = "model.load_weights(weights)" if path == "load_weights" else "worker.reload_weights(weights_iterator=...)"
    rec(p + "update_path", "collective_rpc", native, path)
    rec(p + "skip", "runtime", "tensors left out of the push", o.skip)
    rec(p + "zero", "runtime", "tensors pushed as zeros", o.zero)
    rec(p + "sleep", "LLM", "sleep(level) / wake_up(tags)", o.sleep)
    update = {
        "start_from": o.start_from,
        "pushed_from": model.path,
        "skip": o.skip,
        "zero": o.zero,
        "sleep": o.sleep,
        "path": path,
    }
    return VllmUpdatedArgs(
        llm=llm,
        sampling=base.sampling,
        env=base.env,
        used=rec.used,
        fp32_logits=base.fp32_logits,
        forced_tokens=base.forced_tokens,
        update=update,
    )


_MAPPERS: dict[str, Callable[[ParityConfig, SideSpec, Resolved, ModelInfo], Any]] = {
    "vllm": to_vllm,
    "vllm-updated": to_vllm_updated,
    "hf": to_hf,
    "vllm-server": to_vllm_server,
    "openai": to_openai,
}


# -- a side's options read by name: here and nowhere else above the kinds (code above asks a kind what it
# can do, core.kinds; an option one kind has and another lacks reads as its default on the other) --


def option(side: SideSpec, name: str, default: Any = None) -> Any:
    """The side's option `name`, or `default` where its kind has no such option."""
    return getattr(side.options, name, default)


def route_replay_mode(side: SideSpec) -> str:
    """The side's replay_routes mode (off, ids, ids+weights): "off" unless its kind can force routes
    (Kind.can_replay_routes)."""
    return str(option(side, "replay_routes", "off")) if get_kind(side.kind).can_replay_routes else "off"


def deterministic_off(side: SideSpec) -> bool:
    """Whether the side's kind could run with deterministic algorithms (Kind.can_deterministic) and this
    side does not: what an audit's hint offers when the side's own replay breaks."""
    return get_kind(side.kind).can_deterministic and not option(side, "deterministic", False)


def register_kind(
    kind: Kind, mapper: Callable[[ParityConfig, SideSpec, Resolved, ModelInfo], Any]
) -> Callable[[], None]:
    """Add a kind and its mapper (the tests' fake engine registers itself here; users never see one
    that was not registered). Returns the function that removes it again."""
    KINDS[kind.name] = kind
    _MAPPERS[kind.name] = mapper

    def unregister() -> None:
        KINDS.pop(kind.name, None)
        _MAPPERS.pop(kind.name, None)

    return unregister


def map_side(cfg: ParityConfig, side: SideSpec, r: Resolved, model: ModelInfo | None = None) -> Any:
    """The side's native arguments (its kind's *Args), for its own model folder or the run's."""
    return _MAPPERS[side.kind](cfg, side, r, model or r.model)


@dataclass
class MappingRow:
    key: str
    value: Any
    sides: dict[str, str]  # side name -> what that side's engine gets
    note: str


def _canonical_value(cfg: ParityConfig, key: str, r: Resolved) -> Any:
    if key == "eos_token_ids":
        return r.eos_token_ids
    head, _, rest = key.partition(".")
    if rest:
        return getattr(cfg.side(head).options, rest)
    return getattr(cfg, key)


def mapping_table(cfg: ParityConfig, r: Resolved, models: dict[str, ModelInfo] | None = None) -> list[MappingRow]:
    """One row per shared canonical key, then one per side option: what each side's engine gets."""
    args = {s.name: map_side(cfg, s, r, (models or {}).get(s.name)) for s in cfg.sides}
    rows = []

    def row(key: str, note: str) -> None:
        cells = {name: ", ".join(str(x) for x in a.used.get(key, [])) or "(not used)" for name, a in args.items()}
        rows.append(MappingRow(key=key, value=_canonical_value(cfg, key, r), sides=cells, note=note))

    for key, note in NOTES.items():
        row(key, note)
    for s in cfg.sides:
        kind = get_kind(s.kind)
        for name in s.all_options():
            if name == "dtype":
                continue  # the dtype row above shows each side's
            row(f"{s.name}.{name}", f"{kind.label} option: {doc_of(kind.options, name)}")
    return rows


def format_table(rows: list[MappingRow], labels: dict[str, str] | None = None) -> str:
    """The mapping table as Markdown (the CLI prints it; the app renders it)."""
    names = list(rows[0].sides) if rows else []
    heads = [(labels or {}).get(n, n) for n in names]
    out = ["| canonical key | value | " + " | ".join(heads) + " | note |", "|---|---|" + "---|" * len(names) + "---|"]
    for r in rows:
        cells = [r.key, repr(r.value), *(r.sides[n] for n in names), r.note]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)
