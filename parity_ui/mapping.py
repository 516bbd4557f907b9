"""Canonical config -> each engine's native arguments. The ONLY module that knows their names.

`to_vllm` and `to_hf` each return the arguments plus, per canonical key, the native arguments it
became; `mapping_table` joins the two, so the table a user reads is produced by the code that runs.

Semantics that differ between the engines (and that hand-written tables get wrong):
- greedy: vLLM `temperature=0`; HF `do_sample=False` with temperature/top_p/top_k unset (HF
  rejects temperature=0).
- top_k off: vLLM `top_k=0` (0 or -1 disable); HF `top_k=0` too (HF's GenerationConfig default is
  50, so "unset" would NOT be off).
- EOS: both get the same explicit id list (model generation_config + tokenizer), so neither
  falls back to its own guess.
- ignore_eos: vLLM `ignore_eos=True`; HF: no EOS in `eos_token_id`. Never HF `min_new_tokens`,
  which MASKS EOS and changes the distribution.
- generation_config.json: vLLM `generation_config="vllm"`, and HF generates from a neutral
  GenerationConfig: neither merges the model's sampling defaults behind the user's back.
- dtype "auto": resolved once from the model's config (HF's rule); vLLM would otherwise pick
  bfloat16 for a float32 checkpoint on GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import ParityConfig
from .types import ModelInfo

# Canonical keys in display order, with what a reader must know about each mapping.
NOTES: dict[str, str] = {
    "max_new_tokens": "Same meaning: tokens generated after the prompt.",
    "temperature": "0 = greedy. HF rejects temperature=0: greedy there is do_sample=False with "
                   "temperature/top_p/top_k unset.",
    "top_p": "Nucleus sampling; 1 = off. Ignored under greedy by both.",
    "top_k": "0 = off in both. HF's own default is 50 (vLLM's is off): parity-ui always passes it.",
    "min_p": "0 = off.",
    "repetition_penalty": "Both penalize prompt AND generated tokens (HF PR #1424 semantics; not "
                          "frequency_penalty).",
    "seed": "vLLM: per-request seed. HF: torch.manual_seed before generate. Sampled streams still "
            "differ (different RNG streams); only greedy runs can match token for token.",
    "stop_token_ids": "Extra stop ids, on top of the model's EOS ids.",
    "ignore_eos": "vLLM ignore_eos=True; HF: EOS removed from eos_token_id. NOT min_new_tokens, "
                  "which masks EOS and changes the distribution.",
    "dtype": "'auto' is resolved once from the model's config for both engines.",
    "max_model_len": "vLLM's context limit; HF has none (parity-ui enforces it on the prompt).",
    "rope_scaling": "vLLM: hf_overrides; HF: the loaded config's rope parameters. Both read the SAME dict.",
    "logprobs": "Top-k alternatives per position. HF: log_softmax(float32) of raw logits "
                "(output_logits), as vLLM's own tests do.",
    "chat": "Applied ONCE by parity-ui; both engines receive the same token ids (no second BOS).",
    "batch_size": "Prompts per generate call. Batching HF pads on the left and changes HF's "
                  "own numerics: the reference itself moves.",
    "cross_score": "parity-ui only: after generating, each engine teacher-forces the other's tokens "
                   "(vLLM prompt_logprobs, HF one forward pass) to measure drift past the first fork.",
    "eos_token_ids": "Resolved from generation_config.json and the tokenizer; passed to both.",

    "vllm.generation_config": "'vllm': the model's generation_config.json sampling defaults are applied "
                              "by neither engine (HF generates from a neutral GenerationConfig). 'auto': "
                              "vLLM reads it and HF keeps the model's generation_config.",
    "vllm.gpu_memory_utilization": "vLLM only. HF shares the GPU.",
    "vllm.enforce_eager": "vLLM only. CUDA graphs vs eager moves bf16 divergence points.",
    "vllm.enable_prefix_caching": "vLLM only. Off for parity (near-tie flips, vllm #40896).",
    "vllm.enable_chunked_prefill": "vLLM only. Off for parity (different kernels, vllm #5952).",
    "vllm.tensor_parallel_size": "vLLM only.",
    "vllm.logprobs_mode": "raw = before sampling processors. processed_logprobs switches HF to "
                          "generate's processed scores (output_scores) too.",
    "vllm.kv_cache_gib": "vLLM on CPU only: the KV cache size.",
    "vllm.max_num_seqs": "vLLM only: sequences scheduled together.",
    "vllm.batch_invariant": "vLLM only: VLLM_BATCH_INVARIANT=1 (batch 1 == batch N bitwise).",
    "hf.attn_implementation": "HF only.",
    "hf.device_map": "HF only: where the HF model lives.",
}


@dataclass(frozen=True)
class NativeArg:
    where: str  # "LLM", "SamplingParams", "env", "from_pretrained", "config", "generate", "runtime"
    name: str
    value: Any

    def __str__(self) -> str:
        return f"{self.where}.{self.name}={self.value!r}" if self.where != "env" else f"{self.name}={self.value}"


@dataclass
class Resolved:
    """Facts both mappers need, decided once so both engines get the same answer."""

    model: ModelInfo
    eos_token_ids: list[int]  # model generation_config + tokenizer EOS, deduplicated
    dtype: str  # explicit: float32 / bfloat16 / float16
    on_gpu: bool


@dataclass
class VllmArgs:
    llm: dict[str, Any]
    sampling: dict[str, Any]
    env: dict[str, str]
    used: dict[str, list[NativeArg]] = field(default_factory=dict)


@dataclass
class HfArgs:
    load: dict[str, Any]  # from_pretrained kwargs (dtype as a string: the worker maps it to torch)
    config_overrides: dict[str, Any]  # set on the loaded config before the weights load
    generate: dict[str, Any]  # GenerationConfig fields
    device: str  # "cpu" | "cuda" | "cuda:N"
    seed: int
    logprobs_source: str  # "logits" (raw) | "scores" (processed)
    keep_model_generation_config: bool
    used: dict[str, list[NativeArg]] = field(default_factory=dict)


class _Recorder:
    def __init__(self) -> None:
        self.used: dict[str, list[NativeArg]] = {}

    def __call__(self, key: str, where: str, name: str, value: Any) -> Any:
        self.used.setdefault(key, []).append(NativeArg(where, name, value))
        return value


def resolve_dtype(cfg: ParityConfig, model: ModelInfo) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    d = (model.config_dtype or "").replace("torch.", "")
    return d if d in ("float32", "bfloat16", "float16") else "float32"


def resolve(cfg: ParityConfig, model: ModelInfo, tokenizer_eos: list[int], on_gpu: bool) -> Resolved:
    eos: list[int] = []
    for t in [*model.eos_token_ids, *tokenizer_eos]:
        if t not in eos:
            eos.append(t)
    return Resolved(model=model, eos_token_ids=eos, dtype=resolve_dtype(cfg, model), on_gpu=on_gpu)


def rope_override(cfg: ParityConfig, model: ModelInfo) -> dict[str, Any] | None:
    """The full rope dict both engines get: the model's own (rope_theta etc.) plus the user's scaling."""
    if cfg.rope_scaling is None:
        return None
    return {**model.rope_parameters, **cfg.rope_scaling}


def stop_ids(cfg: ParityConfig, r: Resolved) -> list[int]:
    """The ids that end generation, the same list for both engines: the model's EOS ids (unless
    ignore_eos) plus the user's stop ids."""
    return [*([] if cfg.ignore_eos else r.eos_token_ids), *cfg.stop_token_ids]


def to_vllm(cfg: ParityConfig, r: Resolved) -> VllmArgs:
    rec = _Recorder()
    v = cfg.vllm
    eager = v.enforce_eager if v.enforce_eager is not None else not r.on_gpu
    llm: dict[str, Any] = {
        "model": r.model.path,
        "tokenizer": r.model.path,
        "trust_remote_code": r.model.trust_remote_code,
        "dtype": rec("dtype", "LLM", "dtype", r.dtype),
        "seed": rec("seed", "LLM", "seed", cfg.seed),
        "enforce_eager": rec("vllm.enforce_eager", "LLM", "enforce_eager", eager),
        "enable_prefix_caching": rec("vllm.enable_prefix_caching", "LLM", "enable_prefix_caching",
                                     v.enable_prefix_caching),
        "enable_chunked_prefill": rec("vllm.enable_chunked_prefill", "LLM", "enable_chunked_prefill",
                                      v.enable_chunked_prefill),
        "tensor_parallel_size": rec("vllm.tensor_parallel_size", "LLM", "tensor_parallel_size",
                                    v.tensor_parallel_size),
        "logprobs_mode": rec("vllm.logprobs_mode", "LLM", "logprobs_mode", v.logprobs_mode),
        "generation_config": rec("vllm.generation_config", "LLM", "generation_config", v.generation_config),
        "max_logprobs": max(cfg.logprobs, 1),
    }
    if r.on_gpu:
        llm["gpu_memory_utilization"] = rec("vllm.gpu_memory_utilization", "LLM", "gpu_memory_utilization",
                                            v.gpu_memory_utilization)
    else:
        llm["kv_cache_memory_bytes"] = rec("vllm.kv_cache_gib", "LLM", "kv_cache_memory_bytes",
                                           int(v.kv_cache_gib * 2**30))
    if cfg.max_model_len is not None:
        llm["max_model_len"] = rec("max_model_len", "LLM", "max_model_len", cfg.max_model_len)
    if v.max_num_seqs is not None:
        llm["max_num_seqs"] = rec("vllm.max_num_seqs", "LLM", "max_num_seqs", v.max_num_seqs)
    rope = rope_override(cfg, r.model)
    if rope is not None:
        # transformers 5 reads rope_parameters; older configs rope_scaling. vLLM normalises both.
        llm["hf_overrides"] = rec("rope_scaling", "LLM", "hf_overrides",
                                  {"rope_scaling": rope, "rope_parameters": rope})
    env: dict[str, str] = {}
    if v.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = rec("vllm.batch_invariant", "env", "VLLM_BATCH_INVARIANT", "1")

    stops = stop_ids(cfg, r)
    sampling: dict[str, Any] = {
        "max_tokens": rec("max_new_tokens", "SamplingParams", "max_tokens", cfg.max_new_tokens),
        "temperature": rec("temperature", "SamplingParams", "temperature", cfg.temperature),
        "top_p": rec("top_p", "SamplingParams", "top_p", cfg.top_p),
        "top_k": rec("top_k", "SamplingParams", "top_k", cfg.top_k),
        "min_p": rec("min_p", "SamplingParams", "min_p", cfg.min_p),
        "repetition_penalty": rec("repetition_penalty", "SamplingParams", "repetition_penalty",
                                  cfg.repetition_penalty),
        "seed": rec("seed", "SamplingParams", "seed", cfg.seed),
        "stop_token_ids": rec("stop_token_ids", "SamplingParams", "stop_token_ids", stops),
        "ignore_eos": rec("ignore_eos", "SamplingParams", "ignore_eos", cfg.ignore_eos),
        # Always ask for at least 1: the chosen token's logprob is what the comparison needs.
        "logprobs": rec("logprobs", "SamplingParams", "logprobs", max(cfg.logprobs, 1)),
        "skip_special_tokens": False,  # show <|im_end|> and friends as the tokens they are
        "n": 1,
    }
    rec("eos_token_ids", "SamplingParams", "stop_token_ids", stops)
    rec("chat", "runtime", "prompt_token_ids", "the ids parity-ui tokenized")
    rec("batch_size", "runtime", "requests added per engine step loop", cfg.batch_size)
    return VllmArgs(llm=llm, sampling=sampling, env=env, used=rec.used)


def to_hf(cfg: ParityConfig, r: Resolved) -> HfArgs:
    rec = _Recorder()
    h = cfg.hf
    load: dict[str, Any] = {
        "dtype": rec("dtype", "from_pretrained", "dtype", r.dtype),
        "trust_remote_code": r.model.trust_remote_code,
    }
    if h.attn_implementation != "auto":
        load["attn_implementation"] = rec("hf.attn_implementation", "from_pretrained", "attn_implementation",
                                          h.attn_implementation)
    overrides: dict[str, Any] = {}
    rope = rope_override(cfg, r.model)
    if rope is not None:
        overrides["rope_parameters"] = rec("rope_scaling", "config", "rope_parameters", rope)
    device = h.device_map if h.device_map != "auto" else ("cuda" if r.on_gpu else "cpu")
    rec("hf.device_map", "runtime", "model.to", device)

    gen: dict[str, Any] = {
        "max_new_tokens": rec("max_new_tokens", "generate", "max_new_tokens", cfg.max_new_tokens),
        "min_new_tokens": None,  # never: it masks EOS
    }
    if cfg.greedy:
        gen["do_sample"] = rec("temperature", "generate", "do_sample", False)
        gen.update(temperature=None, top_p=None, top_k=None, min_p=None)
        for key in ("top_p", "top_k", "min_p"):
            rec(key, "generate", key, None)
    else:
        gen["do_sample"] = rec("temperature", "generate", "do_sample", True)
        gen["temperature"] = rec("temperature", "generate", "temperature", cfg.temperature)
        gen["top_p"] = rec("top_p", "generate", "top_p", cfg.top_p)
        gen["top_k"] = rec("top_k", "generate", "top_k", cfg.top_k)
        gen["min_p"] = rec("min_p", "generate", "min_p", cfg.min_p if cfg.min_p > 0 else None)
    gen["repetition_penalty"] = rec("repetition_penalty", "generate", "repetition_penalty",
                                    cfg.repetition_penalty)
    stops = stop_ids(cfg, r)
    gen["eos_token_id"] = rec("eos_token_ids", "generate", "eos_token_id", stops or None)
    rec("stop_token_ids", "generate", "eos_token_id", stops or None)
    rec("ignore_eos", "generate", "eos_token_id", "without EOS" if cfg.ignore_eos else "with EOS")
    pad = r.model.pad_token_id if r.model.pad_token_id is not None else (r.eos_token_ids or [0])[0]
    gen["pad_token_id"] = pad
    gen["bos_token_id"] = r.model.bos_token_id
    processed = cfg.vllm.logprobs_mode.startswith("processed")
    rec("logprobs", "generate", "output_scores" if processed else "output_logits", True)
    rec("vllm.logprobs_mode", "generate", "output_scores" if processed else "output_logits", True)
    rec("seed", "runtime", "torch.manual_seed", cfg.seed)
    rec("chat", "runtime", "input_ids", "the ids parity-ui tokenized")
    rec("batch_size", "runtime", "rows per generate call (left padded)", cfg.batch_size)
    keep = cfg.vllm.generation_config == "auto"
    rec("vllm.generation_config", "runtime", "model.generation_config",
        "model's generation_config.json" if keep else "neutral GenerationConfig")
    return HfArgs(load=load, config_overrides=overrides, generate=gen, device=device, seed=cfg.seed,
                  logprobs_source="scores" if processed else "logits",
                  keep_model_generation_config=keep, used=rec.used)


@dataclass
class MappingRow:
    key: str
    value: Any
    vllm: str
    hf: str
    note: str


def _canonical_value(cfg: ParityConfig, key: str, r: Resolved) -> Any:
    if key == "eos_token_ids":
        return r.eos_token_ids
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def mapping_table(cfg: ParityConfig, r: Resolved) -> list[MappingRow]:
    """One row per canonical key: value, what vLLM gets, what HF gets, and why."""
    v, h = to_vllm(cfg, r), to_hf(cfg, r)
    rows = []
    for key, note in NOTES.items():
        rows.append(MappingRow(
            key=key,
            value=_canonical_value(cfg, key, r),
            vllm=", ".join(str(a) for a in v.used.get(key, [])) or "(not used)",
            hf=", ".join(str(a) for a in h.used.get(key, [])) or "(not used)",
            note=note,
        ))
    return rows


def format_table(rows: list[MappingRow]) -> str:
    """The mapping table as Markdown (the CLI prints it; the app renders it)."""
    out = ["| canonical key | value | vLLM | HF transformers | note |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [r.key, repr(r.value), r.vllm, r.hf, r.note]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)
