"""Resolve what the user picked (demo, local folder, HF id) to a local folder and describe it.

Reads only small files (config.json, generation_config.json, tokenizer_config.json, safetensors
headers): no weights are loaded in the calling process.
"""

from __future__ import annotations

import json
import os
from math import prod
from pathlib import Path
from typing import Any

from ..core.context import kv_layout
from ..core.errors import ModelError
from ..core.types import ModelInfo
from .checkpoints import read_header
from .demo_model import DEMO_NAME, ensure_demo_model

# config.json keys naming the expert count and top-k, by model family
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k_experts")


def moe_shape_of(cfg: dict[str, Any]) -> tuple[int, int] | None:
    """(experts, top-k) of a (text) config.json dict; None for a dense model."""
    experts = next((cfg[k] for k in EXPERT_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    top_k = next((cfg[k] for k in TOPK_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0), None)
    return (experts, top_k) if experts and top_k else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{path} is not valid JSON: {e}", "repair or re-download the model files") from None
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value if isinstance(v, int)]


# safetensors' names of the floating dtypes a checkpoint's weights may be stored in.
_FLOAT_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _headers(folder: Path) -> list[dict[str, Any]]:
    """Each .safetensors file's header (8-byte length + JSON), without loading a tensor."""
    return [read_header(f)[1] for f in sorted(folder.glob("*.safetensors"))]


def count_parameters(folder: Path, headers: list[dict[str, Any]] | None = None) -> int | None:
    """Sum of tensor sizes from the safetensors headers."""
    headers = _headers(folder) if headers is None else headers
    if not headers:
        return None
    return sum(prod(v["shape"]) for h in headers for k, v in h.items() if k != "__metadata__")


def weights_dtype(headers: list[dict[str, Any]]) -> str:
    """The one floating dtype the weights are stored in ("" when there are none, or several): what
    both engines load a checkpoint in when its config.json names no dtype and dtype is auto
    (transformers 5 reads the weights; vLLM reads the safetensors metadata)."""
    found = {
        _FLOAT_DTYPES[v["dtype"]]
        for h in headers
        for k, v in h.items()
        if k != "__metadata__" and isinstance(v, dict) and v.get("dtype") in _FLOAT_DTYPES
    }
    return found.pop() if len(found) == 1 else ""


def _locate(name: str) -> Path:
    if name in ("", DEMO_NAME):
        return ensure_demo_model()
    p = Path(name).expanduser()
    if p.exists() or name.startswith((".", "/", "~")):
        if not p.is_dir():
            raise ModelError(
                f"model {name!r} not found: the folder {p.absolute()} does not exist or is not a folder",
                "give a folder holding config.json and the weights, or 'demo'",
            )
        if not (p / "config.json").is_file():
            raise ModelError(
                f"model folder {name!r} has no config.json",
                "point at the folder that holds config.json (a Hugging Face model folder)",
            )
        return p.resolve()
    if name.count("/") != 1:
        raise ModelError(
            f"model {name!r} not found: there is no folder {p.absolute()}, and it is not a Hugging Face id (org/name)",
            "give 'demo', a local folder, or an id such as HuggingFaceTB/SmolLM2-135M-Instruct",
        )
    return _from_hub(name)


FIX_NOT_FOUND = (
    "check the id (org/name, as on huggingface.co); where there is network, download it (hf download ID) "
    "and give its folder; or give 'demo'"
)


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001 - only named in a message
        return "the Hugging Face cache"


def _first_sentence(text: str, limit: int = 160) -> str:
    """A library's message cut at its first sentence (or line), never mid-word."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.split(". ")[0].rstrip(".")
    if len(first) > limit:
        first = first[:limit].rsplit(" ", 1)[0] + " …"
    return first


def hub_reason(e: BaseException) -> str:
    """Why the hub gave no model, in words: the library's exception told apart by its kind."""
    kinds = {type(c).__name__ for c in (e, e.__cause__, e.__context__) if c is not None}
    if "GatedRepoError" in kinds:
        return "the hub keeps that model gated: accept its terms on huggingface.co and log in (hf auth login)"
    if kinds & {"RepositoryNotFoundError", "RevisionNotFoundError"}:
        return "the hub has no model by that id (or it is private: log in with hf auth login)"
    if kinds & {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectError", "ConnectTimeout", "ConnectionError"}:
        return "the hub could not be reached (no network here?)"
    if isinstance(e, (ConnectionError, TimeoutError)):
        return "the hub could not be reached (no network here?)"
    said = _first_sentence(str(e))
    return f"the hub answered {type(e).__name__}" + (f": {said}" if said else "")


def _from_hub(repo_id: str) -> Path:
    """A hub id: the local HF cache first, the hub only if the machine allows it. Not found: a
    ModelError naming each place tried."""
    from huggingface_hub import snapshot_download  # ships with transformers

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    tried = f"model {repo_id!r} not found: there is no folder {Path(repo_id).absolute()}, it is not in {_hub_cache()}"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelError(f"{tried}, and HF_HUB_OFFLINE=1 keeps the hub from being asked", FIX_NOT_FOUND)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:  # network, auth, missing repo: told apart in words, never the library's raw text
        raise ModelError(f"{tried}, and {hub_reason(e)}", FIX_NOT_FOUND) from None


def describe_model(name: str, *, trust_remote_code: bool = False) -> ModelInfo:
    """Resolve `name` and read what both engines will see. Raises ModelError with a fix."""
    folder = _locate(name.strip())
    cfg = _read_json(folder / "config.json")
    gen = _read_json(folder / "generation_config.json")
    tok_cfg = _read_json(folder / "tokenizer_config.json")
    text_cfg = cfg.get("text_config", cfg)  # multimodal configs nest the LM's
    has_template = bool(tok_cfg.get("chat_template")) or (folder / "chat_template.jinja").is_file()
    rope = text_cfg.get("rope_scaling") or text_cfg.get("rope_parameters")
    rope_full = dict(text_cfg.get("rope_parameters") or text_cfg.get("rope_scaling") or {})
    if "rope_theta" in text_cfg:
        rope_full.setdefault("rope_theta", text_cfg["rope_theta"])
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in (None, "default"):
        rope = None  # transformers 5 writes rope_parameters even for plain RoPE
    eos = list(dict.fromkeys(_ids(gen.get("eos_token_id")) + _ids(text_cfg.get("eos_token_id"))))
    archs = cfg.get("architectures") or []
    moe = moe_shape_of(text_cfg)
    headers = _headers(folder)
    if not archs and not trust_remote_code:
        raise ModelError(
            f"{folder}/config.json names no architectures",
            "use a causal LM folder whose config.json lists its architecture",
        )
    return ModelInfo(
        name=name or DEMO_NAME,
        path=str(folder),
        architecture=archs[0] if archs else "",
        model_type=str(cfg.get("model_type", "")),
        num_parameters=count_parameters(folder, headers),
        config_dtype=str(text_cfg.get("torch_dtype") or text_cfg.get("dtype") or cfg.get("torch_dtype") or ""),
        weights_dtype=weights_dtype(headers),
        max_position_embeddings=text_cfg.get("max_position_embeddings"),
        vocab_size=text_cfg.get("vocab_size"),
        has_chat_template=has_template,
        bos_token_id=_first(gen.get("bos_token_id"), text_cfg.get("bos_token_id")),
        eos_token_ids=eos,
        pad_token_id=_first(gen.get("pad_token_id"), text_cfg.get("pad_token_id")),
        generation_config=gen,
        rope_scaling=rope if isinstance(rope, dict) else None,
        rope_parameters=rope_full,
        trust_remote_code=trust_remote_code,
        head_dim=_head_dim(text_cfg),
        num_attention_heads=text_cfg.get("num_attention_heads"),
        num_key_value_heads=text_cfg.get("num_key_value_heads", text_cfg.get("num_attention_heads")),
        num_hidden_layers=text_cfg.get("num_hidden_layers"),
        sliding_window=sliding_window_of(text_cfg),
        kv_layout=kv_layout(text_cfg),
        vision=isinstance(cfg.get("vision_config"), dict),
        image_token_id=cfg.get("image_token_id") if isinstance(cfg.get("image_token_id"), int) else None,
        num_experts=moe[0] if moe else None,
        experts_per_token=moe[1] if moe else None,
    )


def sliding_window_of(cfg: dict[str, Any]) -> int | None:
    """The attention window a (text) config.json dict puts on at least one layer, else None: off when
    use_sliding_window is false (Qwen2), and when layer_types (transformers 5) lists no
    "sliding_attention" layer -- a config can carry a sliding_window that no layer uses."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or not cfg.get("use_sliding_window", True):
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types and "sliding_attention" not in types:
        return None
    return window


def _head_dim(cfg: dict[str, Any]) -> int | None:
    if isinstance(cfg.get("head_dim"), int):
        return cfg["head_dim"]
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    return hidden // heads if isinstance(heads, int) and isinstance(hidden, int) and heads else None


def _first(*values: Any) -> int | None:
    for v in values:
        ids = _ids(v)
        if ids:
            return ids[0]
    return None


def local_models() -> list[str]:
    """Causal-LM folders in the local Hugging Face cache, as hub ids, for the model picker."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:
        return []
    return sorted(r.repo_id for r in info.repos if r.repo_type == "model")
