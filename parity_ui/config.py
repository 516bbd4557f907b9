"""The ONE canonical generation config both engines are driven from.

`ParityConfig` is what the user edits (YAML, JSON accepted). `parity_ui.mapping` turns it into each
engine's native arguments; nothing else in the project knows those argument names.

Validation is strict: an unknown key, a wrong type or a value out of range raises `ConfigError`
naming the key and what is allowed.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_type_hints

import yaml

from .errors import ConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
VLLM_GENERATION_CONFIGS = ("vllm", "auto")
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2", "flex_attention")
ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")
MAX_LOGPROBS = 20  # vLLM's default max_logprobs


@dataclass
class VllmOptions:
    """Knobs only vLLM has. Defaults favour parity over throughput."""

    gpu_memory_utilization: float = 0.5  # HF shares the GPU: leave it room
    enforce_eager: bool | None = None  # None: eager on CPU (compiling takes a minute there), graphs on GPU
    enable_prefix_caching: bool = False  # a known cause of near-tie flips (vllm #40896)
    enable_chunked_prefill: bool = False  # different kernels for long prompts (vllm #5952)
    tensor_parallel_size: int = 1
    logprobs_mode: str = "raw_logprobs"  # processed_* also switches HF to processed scores
    generation_config: str = "vllm"  # "vllm": ignore the model's generation_config.json defaults
    kv_cache_gib: float = 1.0  # CPU only: the KV cache size (vLLM would otherwise take most of RAM)
    max_num_seqs: int | None = None
    batch_invariant: bool = False  # VLLM_BATCH_INVARIANT=1 where the installed vLLM supports it


@dataclass
class HfOptions:
    """Knobs only transformers has."""

    attn_implementation: str = "auto"
    device_map: str = "auto"  # "auto": cuda:0 when there is a GPU, else cpu; or "cpu", "cuda:1", ...


@dataclass
class ParityConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (both engines' "whole vocabulary")
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    stop_token_ids: list[int] = field(default_factory=list)  # on top of the model's EOS ids
    ignore_eos: bool = False
    dtype: str = "auto"
    max_model_len: int | None = None
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "linear", "factor": 2.0}
    logprobs: int = 5  # top-k alternatives recorded per position
    chat: bool = False  # apply the model's chat template once
    batch_size: int = 1
    cross_score: bool = True  # after generating, each engine re-scores the other's tokens (teacher forcing)
    vllm: VllmOptions = field(default_factory=VllmOptions)
    hf: HfOptions = field(default_factory=HfOptions)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# Allowed ranges, checked after the types: (test, human description).
_RANGES: dict[str, tuple[Any, str]] = {
    "max_new_tokens": (lambda v: 1 <= v <= 131072, "an integer from 1 to 131072"),
    "temperature": (lambda v: 0.0 <= v <= 10.0, "a number from 0 (greedy) to 10"),
    "top_p": (lambda v: 0.0 < v <= 1.0, "a number in (0, 1]; 1 = off"),
    "top_k": (lambda v: v >= 0, "an integer >= 0; 0 = off"),
    "min_p": (lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]; 0 = off"),
    "repetition_penalty": (lambda v: 0.0 < v <= 10.0, "a number in (0, 10]; 1 = off"),
    "seed": (lambda v: 0 <= v < 2**63, "an integer >= 0"),
    "stop_token_ids": (lambda v: all(t >= 0 for t in v), "a list of token ids >= 0"),
    "dtype": (lambda v: v in DTYPES, "one of " + ", ".join(DTYPES)),
    "max_model_len": (lambda v: v is None or 16 <= v <= 10_000_000, "an integer >= 16, or null for the model's own"),
    "logprobs": (lambda v: 0 <= v <= MAX_LOGPROBS, f"an integer from 0 to {MAX_LOGPROBS}"),
    "batch_size": (lambda v: 1 <= v <= 1024, "an integer from 1 to 1024"),
    "vllm.gpu_memory_utilization": (lambda v: 0.05 <= v <= 0.98, "a number from 0.05 to 0.98"),
    "vllm.tensor_parallel_size": (lambda v: 1 <= v <= 64, "an integer from 1 to 64"),
    "vllm.logprobs_mode": (lambda v: v in LOGPROBS_MODES, "one of " + ", ".join(LOGPROBS_MODES)),
    "vllm.generation_config": (lambda v: v in VLLM_GENERATION_CONFIGS,
                               "'vllm' (ignore the model's generation_config.json) or 'auto'"),
    "vllm.kv_cache_gib": (lambda v: 0.0625 <= v <= 1024, "a number of GiB from 0.0625 to 1024"),
    "vllm.max_num_seqs": (lambda v: v is None or 1 <= v <= 4096, "an integer from 1 to 4096, or null"),
    "hf.attn_implementation": (lambda v: v in ATTN_IMPLEMENTATIONS, "one of " + ", ".join(ATTN_IMPLEMENTATIONS)),
    "hf.device_map": (lambda v: v == "auto" or v == "cpu" or v.startswith("cuda"), "'auto', 'cpu' or 'cuda[:N]'"),
}


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """Return `value` coerced to `hint` where that is lossless (int -> float), else raise."""
    args = get_args(hint)
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(key, "must not be null", f"give a value or remove '{key}' to use the default")
    if args and type(None) in args:  # Optional[X]
        inner = [a for a in args if a is not type(None)][0]
        return _check_type(key, value, inner)
    origin = getattr(hint, "__origin__", None)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {value!r}", f"set {key}: true or {key}: false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(key, f"must be an integer, got {value!r}", f"write {key} as a whole number")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(key, f"must be a number, got {value!r}", f"write {key} as a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, f"must be a string, got {value!r}", f"quote the value of {key}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {value!r}", f"write {key} as [1, 2]")
        (item,) = get_args(hint)
        return [_check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {value!r}", f"write {key} as {{name: value}}")
        return dict(value)
    raise ConfigError(key, f"has an unsupported type {hint}")  # pragma: no cover - a coding error


def _build_section(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(prefix.rstrip(".") or "config", f"must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = prefix + unknown[0]
        raise ConfigError(key, "is not a known key",
                          "known keys here: " + ", ".join(sorted(names)))
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = prefix + name
        if name in ("vllm", "hf") and not prefix:
            kwargs[name] = _build_section(hints[name], value or {}, f"{name}.")
            continue
        kwargs[name] = _check_type(key, value, hints[name])
    return cls(**kwargs)


def _validate(cfg: ParityConfig) -> None:
    for key, (ok, allowed) in _RANGES.items():
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        if not ok(obj):
            raise ConfigError(key, f"is {obj!r}, must be {allowed}", f"set {key} to {allowed}")
    if cfg.rope_scaling is not None:
        _validate_rope(cfg.rope_scaling)


def _validate_rope(rope: dict[str, Any]) -> None:
    kind = rope.get("rope_type", rope.get("type"))
    if kind not in ROPE_TYPES:
        raise ConfigError("rope_scaling.rope_type", f"is {kind!r}, must be one of " + ", ".join(ROPE_TYPES),
                          "e.g. rope_scaling: {rope_type: linear, factor: 2.0}")
    factor = rope.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 1.0 <= factor <= 128:
        raise ConfigError("rope_scaling.factor", f"is {factor!r}, must be a number from 1 to 128",
                          "e.g. rope_scaling: {rope_type: linear, factor: 2.0}")


def config_from_dict(data: dict[str, Any] | None) -> ParityConfig:
    """Build and validate a config; raises ConfigError naming the first bad key."""
    cfg = _build_section(ParityConfig, dict(data or {}), "")
    if cfg.rope_scaling is not None:
        rope = dict(cfg.rope_scaling)
        if "type" in rope and "rope_type" not in rope:  # the pre-transformers-4.45 spelling
            rope["rope_type"] = rope.pop("type")
        cfg.rope_scaling = rope
    _validate(cfg)
    return cfg


def parse_config_text(text: str, source: str = "config") -> dict[str, Any]:
    """Parse YAML (JSON is YAML too). Raises ConfigError on a syntax error or a non-mapping."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise ConfigError(source, f"is not valid YAML/JSON: {e}", "fix the syntax at the line shown") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "must be a mapping of keys to values", "e.g. 'max_new_tokens: 64'")
    return data


def load_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), "file not found", "check the path given to --config") from None
    except UnicodeDecodeError:
        raise ConfigError(str(p), "is not UTF-8 text", "save the config as UTF-8 YAML or JSON") from None
    return parse_config_text(text, str(p))


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key=value` strings (dotted keys for sections; values parsed as YAML scalars)."""
    out = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, "is not of the form key=value", "e.g. --set temperature=0 --set vllm.enforce_eager=true")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        target = out
        parts = key.split(".")
        for part in parts[:-1]:
            if target.get(part) is None:  # `vllm:` with nothing under it loads as null
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                raise ConfigError(key, "is not a section", "only vllm.* and hf.* keys are nested")
        target[parts[-1]] = value
    return out


def build_config(path: str | Path | None = None, overrides: list[str] | None = None,
                 base: dict[str, Any] | None = None) -> ParityConfig:
    """The config from defaults <- base <- file <- overrides, validated."""
    data: dict[str, Any] = dict(base or {})
    if path:
        data = _merge(data, load_config_file(path))
    if overrides:
        data = apply_overrides(data, overrides)
    return config_from_dict(data)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Presets shown in the app and accepted by `--preset`: each is a partial config over the defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "greedy-parity": {"temperature": 0.0, "max_new_tokens": 64, "logprobs": 5},
    "fp32-exact": {"temperature": 0.0, "dtype": "float32", "max_new_tokens": 128, "logprobs": 5,
                   "vllm": {"enforce_eager": True}},
    # The long-context seed: an 8k model stretched to 16k by linear RoPE scaling, 9k-token prompts.
    "long-context-9k": {
        "temperature": 0.0, "max_new_tokens": 256, "logprobs": 5, "max_model_len": 16384,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "batch_size": 1,
    },
}
PRESET_LABELS = {
    "greedy-parity": "Greedy parity (defaults, 64 tokens)",
    "fp32-exact": "fp32 exact (float32, eager)",
    "long-context-9k": "Long context 9k (linear RoPE x2, 16k context)",
}
