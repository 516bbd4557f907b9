"""Runtime settings as each side's engine resolved them, side by side, differing rows first.

Engines report their settings in one vocabulary (the keys of LABELS, with values worded alike:
"off" for no CUDA graphs, "raw"/"processed" logprobs), so a vLLM side and an HF side line up row by
row; a setting an engine does not have reads "—" and is no difference. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .types import SideInfo

# Key -> label, in display order (when nothing differs).
LABELS: dict[str, str] = {
    "engine": "engine",
    "model_impl": "model code",
    "dtype": "weights dtype",
    "logits_dtype": "logits / lm_head dtype",
    "device": "device",
    "cpu_threads": "CPU threads",
    "attention": "attention backend",
    "cuda_graphs": "CUDA graphs",
    "compilation": "compilation",
    "cuda_graph_sizes": "CUDA graph sizes",
    "decode": "decode path",
    "kv_cache": "KV cache",
    "prefix_caching": "prefix caching",
    "chunked_prefill": "chunked prefill",
    "async_scheduling": "async scheduling",
    "batch_invariant": "batch invariant",
    "deterministic": "deterministic algorithms",
    "logprobs_mode": "logprobs mode",
    "forced_tokens": "forced tokens",
    "generation_config": "generation_config.json",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "token budget per step",
    "block_size": "KV block size",
    "max_model_len": "max_model_len",
    "kv_cache_blocks": "KV cache blocks",
    "tensor_parallel": "tensor parallel",
    "pipeline_parallel": "pipeline parallel",
    "seed": "seed",
    "model": "model folder",
    "torch": "torch",
    "python": "python",
    "environment": "environment",
}
MISSING = "—"

# Side option -> its row in the resolved settings (a key of LABELS, or "sdpa_kernels", which the HF
# engine reports under its own name). An option not listed is looked up under its own name (the tests'
# fake kind reports its options so); "model" and "python" are the model folder and the interpreter.
OPTION_ROWS: dict[str, str] = {
    "dtype": "dtype",
    "fp32_logits": "logits_dtype",
    "device": "device",
    "cpu_threads": "cpu_threads",
    "enforce_eager": "cuda_graphs",
    "attention_backend": "attention",
    "attn_implementation": "attention",
    "enable_prefix_caching": "prefix_caching",
    "enable_chunked_prefill": "chunked_prefill",
    "async_scheduling": "async_scheduling",
    "batch_invariant": "batch_invariant",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "tensor_parallel_size": "tensor_parallel",
    "pipeline_parallel_size": "pipeline_parallel",
    "decode": "decode",
    "sdpa_kernels": "sdpa_kernels",
    "generation_config": "generation_config",
    "max_cudagraph_capture_size": "cuda_graph_sizes",
    "kv_cache_gib": "kv_cache_blocks",
    "model": "model",
    "python": "environment",
}


def option_row(option: str) -> str:
    """The resolved-settings row that shows side option `option` (its own name when none is listed)."""
    return OPTION_ROWS.get(option, option)


def reported(side: SideInfo | None, key: str | None) -> Any:
    """What a side's engine resolved for row `key`, or None where it did not report it (no side, no
    key, a setting its engine does not have). The model folder and the interpreter are rows too; a
    side that reported no dtype row reads its recorded dtype."""
    if side is None or key is None:
        return None
    if key == "model":
        return side.model_path or None
    if key == "environment":
        return side.python or "this environment"
    value = side.resolved.get(key)
    if value is None and key == "dtype":
        value = side.dtype or None
    return value


@dataclass
class SettingRow:
    key: str
    label: str
    values: dict[str, Any]  # side name -> value (MISSING when the side's engine has no such setting)
    differs: bool


def _value(side: SideInfo, key: str) -> Any:
    # The diff shows what engines resolved: no fallback to the recorded dtype here.
    v = reported(side, key) if key in ("model", "environment") else side.resolved.get(key)
    return MISSING if v is None else v


def settings_diff(sides: list[SideInfo]) -> list[SettingRow]:
    """One row per setting any side reports; rows whose values differ first (in LABELS order)."""
    keys = [k for k in LABELS if any(k in s.resolved for s in sides) or k in ("model", "environment")]
    keys += sorted({k for s in sides for k in s.resolved} - set(keys))
    rows = []
    for key in keys:
        values = {s.name: _value(s, key) for s in sides}
        # A setting one engine does not have is no difference: only sides that report it disagree.
        reported = {repr(v) for v in values.values() if v != MISSING}
        rows.append(SettingRow(key, LABELS.get(key, key), values, len(reported) > 1))
    return [r for r in rows if r.differs] + [r for r in rows if not r.differs]


def differing(sides: list[SideInfo], a: str, b: str) -> list[str]:
    """The setting keys in which sides a and b differ (engine identity aside)."""
    pair = [s for s in sides if s.name in (a, b)]
    if len(pair) != 2:
        return []
    return [r.key for r in settings_diff(pair) if r.differs]


def format_text(rows: list[SettingRow], width: int = 28) -> str:
    """The diff as aligned text for the CLI."""
    if not rows:
        return ""
    names = list(rows[0].values)
    head = f"  {'setting':24} " + " ".join(f"{n[:width]:{width}}" for n in names)
    lines = [head]
    for r in rows:
        mark = "*" if r.differs else " "
        cells = " ".join(f"{str(r.values[n])[:width]:{width}}" for n in names)
        lines.append(f"{mark} {r.label[:24]:24} {cells}")
    return "\n".join(lines)
