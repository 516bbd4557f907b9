"""The records that flow end to end: engine output, comparison, run.

Plain dataclasses with typed fields, picklable (they cross process boundaries) and convertible to
JSON-ready dicts with `to_dict` / `from_dict` (they are stored in SQLite and printed by the CLI).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

EngineName = Literal["vllm", "hf"]
ENGINES: tuple[EngineName, ...] = ("vllm", "hf")
RunStatus = Literal["ok", "diverged", "error", "cancelled"]


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float
    text: str


@dataclass
class TokenStep:
    """One generated position of one engine."""

    position: int
    token_id: int
    text: str
    logprob: float | None  # of the chosen token, float32 log-softmax of the engine's logits
    rank: int | None  # 1 = the engine's own argmax
    top: list[TopLogprob] = field(default_factory=list)  # best first


@dataclass
class EngineTimings:
    load_s: float | None = None  # model load (0 when the worker was already warm)
    prefill_s: float | None = None  # request start to first generated token
    total_s: float | None = None  # request start to last token


@dataclass
class EngineInfo:
    name: EngineName
    version: str
    device: str  # "cuda:0 (NVIDIA H100 80GB HBM3)" or "cpu"
    dtype: str  # what the model weights were loaded as
    torch_version: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineResult:
    """One engine's output for one prompt. On failure, `error` is set and `steps` holds what was made."""

    engine: EngineName
    prompt_index: int
    token_ids: list[int] = field(default_factory=list)
    steps: list[TokenStep] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "error" | "cancelled"
    timings: EngineTimings = field(default_factory=EngineTimings)
    error: str | None = None


@dataclass
class Divergence:
    """The first position where the two greedy streams pick different tokens."""

    index: int
    vllm_token_id: int | None  # None: that stream ended here
    hf_token_id: int | None
    vllm_token_text: str = ""
    hf_token_text: str = ""
    # vLLM's own acceptance rule (tests/models/utils.py::check_logprobs_close): at the first
    # mismatch each engine's token must be in the other's top-k.
    vllm_token_in_hf_topk: bool | None = None
    hf_token_in_vllm_topk: bool | None = None
    accepted_by_vllm_rule: bool | None = None
    reason: str = "token"  # "token" | "length" (one stream stopped earlier)


@dataclass
class Comparison:
    identical: bool
    first_divergence: int | None
    compared: int  # positions compared (the shorter stream's length)
    length_vllm: int
    length_hf: int
    # Per position up to the divergence (where both chose the same token):
    logprob_gaps: list[float | None] = field(default_factory=list)  # vllm - hf, chosen token
    topk_overlap: list[float | None] = field(default_factory=list)  # |A & B| / k of top-k id sets
    max_abs_gap: float | None = None
    mean_abs_gap: float | None = None
    divergence: Divergence | None = None


@dataclass
class PromptResult:
    index: int
    prompt_text: str  # what the engines saw, decoded (chat template applied when chat=True)
    prompt_token_ids: list[int]
    messages: list[dict[str, str]] | None = None
    vllm: EngineResult | None = None
    hf: EngineResult | None = None
    comparison: Comparison | None = None
    explanation: dict[str, Any] | None = None  # filled by parity_ui.explain
    cross_scores: dict[str, Any] | None = None  # teacher-forced cross-scoring


@dataclass
class Finding:
    """A preflight or runtime observation with a stable code, e.g. 'eos-mismatch'."""

    code: str
    severity: Literal["info", "warning", "error"]
    message: str
    fix: str = ""


@dataclass
class ModelInfo:
    """What a model resolves to, read from its folder without loading weights."""

    name: str  # what the user typed ("demo", an HF id, a path)
    path: str  # local folder both engines load
    architecture: str = ""
    model_type: str = ""
    num_parameters: int | None = None
    config_dtype: str = ""
    max_position_embeddings: int | None = None
    vocab_size: int | None = None
    has_chat_template: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)  # union of generation_config and tokenizer
    pad_token_id: int | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)  # generation_config.json as is
    rope_scaling: dict[str, Any] | None = None  # scaling in effect in the model's own config
    rope_parameters: dict[str, Any] = field(default_factory=dict)  # the full dict, rope_theta included
    trust_remote_code: bool = False


@dataclass
class Run:
    id: str
    created_utc: str
    model: ModelInfo
    config: dict[str, Any]
    status: RunStatus
    prompts: list[PromptResult] = field(default_factory=list)
    error: str | None = None
    error_code: str | None = None
    warnings: list[Finding] = field(default_factory=list)
    engines: dict[str, EngineInfo] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device: str = ""
    duration_ms: int | None = None
    group_id: str | None = None  # runs of one sweep or probe share it
    kind: str = "compare"  # "compare" | "sweep" | "probe"
    probes: dict[str, Any] | None = None

    @property
    def identical(self) -> bool | None:
        comps = [p.comparison for p in self.prompts if p.comparison is not None]
        if not comps or len(comps) != len(self.prompts):
            return None
        return all(c.identical for c in comps)

    @property
    def first_divergence(self) -> int | None:
        """The earliest first-divergence index over all prompts (None when none diverged)."""
        idx = [p.comparison.first_divergence for p in self.prompts
               if p.comparison is not None and p.comparison.first_divergence is not None]
        return min(idx) if idx else None


def to_dict(obj: Any) -> Any:
    """A JSON-ready copy of a dataclass tree."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _build(cls: Any, data: Any) -> Any:
    if data is None:
        return None
    return cls(**data)


def engine_result_from_dict(d: dict[str, Any] | None) -> EngineResult | None:
    if d is None:
        return None
    steps = [TokenStep(**{**s, "top": [TopLogprob(**t) for t in s.get("top", [])]})
             for s in d.get("steps", [])]
    return EngineResult(**{**d, "steps": steps, "timings": EngineTimings(**d.get("timings", {}))})


def comparison_from_dict(d: dict[str, Any] | None) -> Comparison | None:
    if d is None:
        return None
    return Comparison(**{**d, "divergence": _build(Divergence, d.get("divergence"))})


def prompt_result_from_dict(d: dict[str, Any]) -> PromptResult:
    return PromptResult(**{
        **d,
        "vllm": engine_result_from_dict(d.get("vllm")),
        "hf": engine_result_from_dict(d.get("hf")),
        "comparison": comparison_from_dict(d.get("comparison")),
    })


def run_from_dict(d: dict[str, Any]) -> Run:
    return Run(**{
        **d,
        "model": ModelInfo(**d["model"]),
        "prompts": [prompt_result_from_dict(p) for p in d.get("prompts", [])],
        "warnings": [Finding(**w) for w in d.get("warnings", [])],
        "engines": {k: EngineInfo(**v) for k, v in d.get("engines", {}).items()},
    })
