"""The ONE canonical generation config every side is driven from, and the sides themselves.

`ParityConfig` is what the user edits (YAML, JSON accepted). It holds what every side shares
(sampling, stop ids, dtype, context, logprobs) and the list of sides; a side's own options
override the shared ones for that side only. `parity_ui.core.mapping` turns it into each kind's native
arguments; nothing else in the project knows those argument names.

Validation is strict: an unknown key, a wrong type or a value out of range raises `ConfigError`
naming the key and what is allowed. Older configs keep working: a `vllm:` or `hf:` section (and
`--set vllm.enforce_eager=true`) addresses the side of that name.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .kinds import DTYPES
from .sides import SideSpec, build_sides
from .validation import build, one_of, option

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
SAMPLING_MODES = ("native", "shared-seed")
GENERATION_CONFIGS = ("neutral", "model")
ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
# Keys that moved from the vllm: section to the top level when the pair became sides, and how
# their old values read now.
_MOVED_UP = {"logprobs_mode": {}, "generation_config": {"vllm": "neutral", "auto": "model"}}
# generation_config is a side option again (a side of its own reproduces one engine taking the
# file's defaults): only 0.1's spelling of it ("vllm", "auto") in a section still means the run's.
_SIDE_OPTION_TOO = {"generation_config": ("neutral", "model")}


def _lifted(key: str, value: Any, section: str = "vllm") -> bool:
    """Whether a side section's `key: value` is 0.1's run-wide key (moved up) rather than the side's own.
    0.1 had logprobs_mode under `vllm:` only: in any other section it is that side's own mode."""
    if key == "logprobs_mode" and section != "vllm":
        return False
    return key in _MOVED_UP and value not in _SIDE_OPTION_TOO.get(key, ())


_RENAMED = {"device_map": "device"}


def _int_range(lo: int, hi: int) -> Any:
    return (lambda v: lo <= v <= hi, f"an integer from {lo} to {hi}")


@dataclass
class ParityConfig:
    max_new_tokens: int = option(64, "tokens generated after the prompt", _int_range(1, 131072))
    temperature: float = option(0.0, "0 = greedy", (lambda v: 0.0 <= v <= 10.0, "a number from 0 (greedy) to 10"))
    top_p: float = option(1.0, "nucleus sampling; 1 = off", (lambda v: 0.0 < v <= 1.0, "a number in (0, 1]; 1 = off"))
    top_k: int = option(0, "0 = off in every side", (lambda v: v >= 0, "an integer >= 0; 0 = off"))
    min_p: float = option(0.0, "0 = off", (lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]; 0 = off"))
    repetition_penalty: float = option(1.0, "1 = off", (lambda v: 0.0 < v <= 10.0, "a number in (0, 10]; 1 = off"))
    seed: int = option(0, "sampling seed", (lambda v: 0 <= v < 2**63, "an integer >= 0"))
    sampling: str = option(
        "native",
        "how sampled tokens are drawn: native = each side's own sampler and random "
        "stream (sampled streams part at once); shared-seed = every side draws with the "
        "same Gumbel noise per (seed, prompt, position, token), so sampled streams "
        "compare token by token (temperature 0 stays greedy)",
        one_of(*SAMPLING_MODES),
    )
    stop_token_ids: list[int] = option(
        doc="extra stop ids on top of the model's EOS ids",
        factory=list,
        allowed=(lambda v: all(t >= 0 for t in v), "a list of token ids >= 0"),
    )
    ignore_eos: bool = option(False, "keep generating past EOS")
    dtype: str = option("auto", "weights dtype of every side (a side may override it)", one_of(*DTYPES))
    max_model_len: int | None = option(
        None,
        "context limit of the vLLM sides; null = what the run needs "
        "(longest prompt + max_new_tokens, rounded up), at most the model's own",
        (lambda v: v is None or 16 <= v <= 10_000_000, "an integer >= 16, or null to size it to the run"),
    )
    rope_scaling: dict[str, Any] | None = option(None, "e.g. {rope_type: linear, factor: 2.0}")
    logprobs: int = option(5, "top-k alternatives recorded per position", _int_range(0, MAX_LOGPROBS))
    chat: bool = option(False, "apply the model's chat template once")
    batch_size: int = option(1, "prompts per generate call", _int_range(1, 1024))
    cross_score: bool = option(
        True,
        "after generating, each side re-scores the reference's tokens and the reference each side's (teacher forcing)",
    )
    routes: bool | None = option(
        None,
        "mixture-of-experts models: record which experts every MoE layer chose for each "
        "token on every side that can, and compare them layer by layer; unset (null): on for a "
        "model whose config names experts, off for a dense one",
    )
    full_distribution: bool = option(
        False,
        "compare the sides' FULL next-token distributions per position (KL both "
        "ways, total variation, top-1 agreement, top-k containment) where both "
        "see the same context: a scored workload, a replay, cross-scores",
    )
    full_distribution_budget_mb: int = option(
        1024,
        "full_distribution: the most one sequence's full rows may take "
        "(vocabulary x tokens x 4 bytes), on the scorer's device and on disk",
        _int_range(1, 1_048_576),
    )
    generate_while_loading: str = option(
        "gpu",
        "a side that has loaded generates while slower sides still load: gpu = on a GPU machine "
        "(the first answer comes sooner), always, never (per-token timings of each side alone)",
        one_of("gpu", "always", "never"),
    )
    logprobs_mode: str = option(
        "raw_logprobs",
        "raw: before sampling processors (comparable across runs); processed: after them",
        one_of(*LOGPROBS_MODES),
    )
    generation_config: str = option(
        "neutral",
        "neutral: no side applies the model's generation_config.json sampling defaults; model: every side does",
        one_of(*GENERATION_CONFIGS),
    )
    image_min_pixels: int | None = option(
        None,
        "image prompts: the fewest pixels an image is resized to (every "
        "side; a side may override it); null = the model's processor default",
        (lambda v: v is None or 1 <= v <= 10**9, "an integer >= 1, or null"),
    )
    image_max_pixels: int | None = option(
        None,
        "image prompts: the most pixels an image is resized to (every "
        "side; a side may override it); null = the model's processor default",
        (lambda v: v is None or 1 <= v <= 10**9, "an integer >= 1, or null"),
    )
    max_images_per_prompt: int = option(
        4, "image prompts: images a prompt may hold (vLLM's limit_mm_per_prompt)", _int_range(1, 64)
    )
    sides: list[SideSpec] = option(
        doc="the sides compared; the first is the reference", factory=lambda: build_sides(None, {}, set())
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shared_seed(self) -> bool:
        """Sampled with shared-seed noise (at temperature 0 shared-seed is greedy: nothing is drawn)."""
        return self.sampling == "shared-seed" and not self.greedy

    @property
    def reference(self) -> SideSpec:
        return self.sides[0]

    def side(self, name: str) -> SideSpec:
        for s in self.sides:
            if s.name == name:
                return s
        raise ConfigError(
            name,
            f"no side is named {name!r} (sides: {', '.join(s.name for s in self.sides)})",
            "use one of the run's side names",
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sides"}
        out = json.loads(json.dumps(out))  # deep copy of plain data
        out["sides"] = [s.to_dict() for s in self.sides]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_sides(self, sides: list[SideSpec]) -> ParityConfig:
        return dataclasses.replace(self, sides=list(sides))


TOP_KEYS = frozenset(f.name for f in dataclasses.fields(ParityConfig))


def _validate_rope(rope: dict[str, Any]) -> dict[str, Any]:
    rope = dict(rope)
    if "type" in rope and "rope_type" not in rope:  # the pre-transformers-4.45 spelling
        rope["rope_type"] = rope.pop("type")
    kind = rope.get("rope_type")
    if kind not in ROPE_TYPES:
        raise ConfigError(
            "rope_scaling.rope_type",
            f"is {kind!r}, must be one of " + ", ".join(ROPE_TYPES),
            "e.g. rope_scaling: {rope_type: linear, factor: 2.0}",
        )
    factor = rope.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 1.0 <= factor <= 128:
        raise ConfigError(
            "rope_scaling.factor",
            f"is {factor!r}, must be a number from 1 to 128",
            "e.g. rope_scaling: {rope_type: linear, factor: 2.0}",
        )
    return rope


def _split_sections(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Top-level keys vs. side sections (a mapping under a key that is not a config key). Keys that
    moved up from the old vllm: section are lifted out of every section."""
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in TOP_KEYS:
            top[key] = value
        elif isinstance(value, dict) or value is None:  # `vllm:` with nothing under it loads as null
            sections[key] = dict(value or {})
        else:
            raise ConfigError(
                str(key),
                "is not a known key",
                "known keys: " + ", ".join(sorted(TOP_KEYS)) + "; a side's options go under "
                "its name (b: {enforce_eager: false}) or in sides:",
            )
    for name, section in sections.items():
        for key, translate in _MOVED_UP.items():
            if key in section and _lifted(key, section[key], name):
                value = section.pop(key)
                top.setdefault(key, translate.get(value, value))
        for old, new in _RENAMED.items():
            if old in section:
                section.setdefault(new, section.pop(old))
    return top, sections


def config_from_dict(data: dict[str, Any] | None, min_sides: int = 2) -> ParityConfig:
    """Build and validate a config; raises ConfigError naming the first bad key. `min_sides`: 1 for an
    invariance audit (one setup audited alone), else a comparison's two."""
    top, sections = _split_sections(dict(data or {}))
    raw_sides = top.pop("sides", None)
    cfg = build(ParityConfig, top)
    if cfg.rope_scaling is not None:
        cfg.rope_scaling = _validate_rope(cfg.rope_scaling)
    cfg.sides = build_sides(raw_sides, sections, set(TOP_KEYS), min_sides)
    _check_shared_seed(cfg)
    return cfg


def routes_for(cfg: ParityConfig, num_experts: int | None) -> ParityConfig:
    """`routes` follows the model where it is unset (issue 46 item 12): on for a mixture-of-experts
    model (`num_experts`, from its config.json: parity_ui.inputs.models), off for a dense one; a
    value the user set stays."""
    if cfg.routes is not None:
        return cfg
    return dataclasses.replace(cfg, routes=bool(num_experts))


def decoding_text(config: Any) -> str:
    """How the tokens were chosen, in words, from a config or a stored run's config dict: "greedy";
    "shared-seed sampling (seed 0), T=1, top_p 0.8"; "native sampling (each side its own random
    stream), T=0.7". Sampled runs must never read as greedy (issue 46 item 11)."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    t = float(get("temperature", 0.0) or 0.0)
    if t == 0.0:
        return "greedy"
    cuts = [
        f"{k} {v:g}"
        for k, v, off in (
            ("top_p", get("top_p", 1.0), 1.0),
            ("top_k", get("top_k", 0), 0),
            ("min_p", get("min_p", 0.0), 0.0),
        )
        if v is not None and v != off
    ]
    how = (
        f"shared-seed sampling (seed {get('seed', 0)})"
        if get("sampling", "native") == "shared-seed"
        else "native sampling (each side its own random stream)"
    )
    return ", ".join([how, f"T={t:g}", *cuts])


def _check_shared_seed(cfg: ParityConfig) -> None:
    """What shared-seed sampling cannot honour, refused by name (never silently changed)."""
    if not cfg.shared_seed:
        return
    if cfg.repetition_penalty != 1.0:
        raise ConfigError(
            "repetition_penalty",
            f"is {cfg.repetition_penalty}, and sampling=shared-seed draws before "
            "vLLM applies its penalties (HF after its own): the sides would draw "
            "from different distributions",
            "set repetition_penalty=1, or sampling=native",
        )
    if cfg.logprobs_mode != "raw_logprobs":
        raise ConfigError(
            "logprobs_mode",
            f"is {cfg.logprobs_mode}, and sampling=shared-seed records the processed "
            "logprob of every token itself (renormalised over the kept set); the "
            "engines' own processed logprobs would include the shared noise",
            "set logprobs_mode=raw_logprobs (the processed logprob is recorded beside it)",
        )


def yaml_error_text(error: Exception, text: str) -> tuple[str, str]:
    """(message, fix) for a YAML syntax error, readable on one line: what is wrong, at which line
    and column, and the offending line itself (PyYAML's own text spans several lines and repeats
    the position)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or "cannot be parsed"
    problem = " ".join(str(problem).split())
    if mark is None:
        return f"is not valid YAML/JSON: {problem}", "fix the syntax, e.g. 'max_new_tokens: 64', one key per line"
    lines = text.splitlines()
    line_no, col = mark.line + 1, mark.column + 1
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    where = f"line {line_no}, column {col}"
    offending = f": `{shown[:80]}`" if shown else ""
    return (
        f"is not valid YAML/JSON: {problem} at {where}{offending}",
        f"fix line {line_no} (YAML is 'key: value', one per line; indent nested keys with spaces)",
    )


def parse_config_text(text: str, source: str = "config") -> dict[str, Any]:
    """Parse YAML (JSON is YAML too). Raises ConfigError on a syntax error or a non-mapping."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        message, fix = yaml_error_text(e, text)
        raise ConfigError(source, message, fix) from None
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
    """Apply `key=value` strings (dotted keys: SIDE.option, rope_scaling.factor; values parsed as
    YAML scalars)."""
    out = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                item, "is not of the form key=value", "e.g. --set temperature=0 --set vllm.enforce_eager=true"
            )
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        set_key(out, key, value)
    return out


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set one dotted `key` (SIDE.option, rope_scaling.factor) of a config's plain data to `value`, in
    place, as a later layer over it. Raises ConfigError when a part before the last is not a section."""
    parts = key.split(".")
    if len(parts) == 2 and parts[0] not in TOP_KEYS and _lifted(parts[1], value, parts[0]):
        # An old-style `--set vllm.generation_config=auto` is a run-wide key now; as a later
        # layer it must win over the file's value (not be dropped behind it).
        translate = _MOVED_UP[parts[1]]
        parts, value = [parts[1]], translate.get(value, value)
    target = data
    for part in parts[:-1]:
        if target.get(part) is None:  # `vllm:` with nothing under it loads as null
            target[part] = {}
        target = target[part]
        if not isinstance(target, dict):
            raise ConfigError(
                key, "is not a section", "only a side's options (SIDE.option) and rope_scaling.* are nested"
            )
    target[parts[-1]] = value


def apply_side_args(data: dict[str, Any], side_args: list[str]) -> dict[str, Any]:
    """`--side NAME=KIND[,k=v]` items replace the config's sides (all of them, in the given order)."""
    from .sides import parse_side_arg

    if not side_args:
        return data
    out = dict(data)
    out["sides"] = [parse_side_arg(s) for s in side_args]
    return out


def build_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    sides: list[str] | None = None,
    min_sides: int = 2,
) -> ParityConfig:
    """The config from defaults <- base <- file <- --side <- --set, validated (`min_sides`: as
    config_from_dict)."""
    data: dict[str, Any] = dict(base or {})
    if path:
        data = _merge(data, load_config_file(path))
    data = apply_side_args(data, sides or [])
    if overrides:
        data = apply_overrides(data, overrides)
    return config_from_dict(data, min_sides)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Presets shown in the app and accepted by `--preset`: each is a partial config over the defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "greedy-parity": {"temperature": 0.0, "max_new_tokens": 64, "logprobs": 5},
    "fp32-exact": {"temperature": 0.0, "dtype": "float32", "max_new_tokens": 128, "logprobs": 5},
    # The long-context seed: an 8k model stretched to 16k by linear RoPE scaling, 9k-token prompts.
    "long-context-9k": {
        "temperature": 0.0,
        "max_new_tokens": 256,
        "logprobs": 5,
        "max_model_len": 16384,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "batch_size": 1,
    },
}
PRESET_LABELS = {
    "greedy-parity": "Greedy parity (defaults, 64 tokens)",
    "fp32-exact": "fp32 exact (float32)",
    "long-context-9k": "Long context 9k (linear RoPE x2, 16k context)",
}

# The common pairs (or triples), for `--sides-preset` and the app's Sides panel.
SIDE_PRESETS: dict[str, list[dict[str, Any]]] = {
    "vllm-vs-hf": [{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"}],
    "eager-vs-graphs": [
        {"name": "eager", "kind": "vllm", "enforce_eager": True},
        {"name": "graphs", "kind": "vllm", "enforce_eager": False},
    ],
    "fp32-reference": [
        {"name": "ref", "kind": "hf", "dtype": "float32"},
        {"name": "vllm", "kind": "vllm", "dtype": "bfloat16"},
    ],
    "rl-rollout": [
        {"name": "trainer", "kind": "hf", "dtype": "float32", "fp32_logits": True},
        {"name": "rollout", "kind": "vllm", "dtype": "bfloat16", "fp32_logits": True},
    ],
    "batch-invariant": [
        {"name": "default", "kind": "vllm"},
        {"name": "invariant", "kind": "vllm", "batch_invariant": True},
    ],
    "three-way": [
        {"name": "ref", "kind": "hf", "dtype": "float32"},
        {"name": "bf16", "kind": "vllm", "dtype": "bfloat16"},
        {"name": "bf16-inv", "kind": "vllm", "dtype": "bfloat16", "batch_invariant": True},
    ],
}
SIDE_PRESET_LABELS = {
    "vllm-vs-hf": "vLLM vs HF (the default)",
    "eager-vs-graphs": "vLLM eager vs vLLM CUDA graphs",
    "fp32-reference": "HF fp32 reference vs vLLM bf16",
    "rl-rollout": "RL: HF fp32 trainer vs vLLM bf16 rollout, fp32 logits on both",
    "batch-invariant": "vLLM default vs vLLM batch-invariant",
    "three-way": "HF fp32 vs vLLM bf16 vs vLLM bf16 batch-invariant",
}
