"""Records written by parity-ui 0.1 (the fixed vLLM/HF pair), rewritten once into the sides shapes.

Used only by the store's m002_sides migration, so that everything that reads a run reads one
shape. In 0.1 the pair was vLLM against HF with gaps vLLM - HF; as sides, HF is the reference `a`
and vLLM the side `b`, which keeps every gap's sign.
"""

from __future__ import annotations

from typing import Any

LEGACY_SIDES = ("hf", "vllm")  # reference first
_MOVED_UP = {"logprobs_mode": {}, "generation_config": {"vllm": "neutral", "auto": "model"}}


def legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A 0.1 config ({..., vllm: {...}, hf: {...}}) as a sides config; anything else unchanged
    (error runs stored what the user typed: {"overrides": [...]}, {"yaml": "..."})."""
    if not isinstance(config, dict) or "sides" in config or not any(k in config for k in LEGACY_SIDES):
        return config
    out = {k: v for k, v in config.items() if k not in LEGACY_SIDES}
    sides = []
    for name in LEGACY_SIDES:
        section = dict(config.get(name) or {})
        for key, translate in _MOVED_UP.items():
            if key in section:
                value = section.pop(key)
                out.setdefault(key, translate.get(value, value))
        if "device_map" in section:
            section["device"] = section.pop("device_map")
        sides.append({"name": name, "kind": name, **section})
    out["sides"] = sides
    return out


def legacy_sides(
    config: dict[str, Any], engines: dict[str, Any], model_path: str, load_s: dict[str, float | None]
) -> list[dict[str, Any]]:
    """0.1's engines_json ({"vllm": EngineInfo, "hf": EngineInfo}) as a list of SideInfo dicts."""
    new_config = legacy_config(config)
    options = {
        s["name"]: {k: v for k, v in s.items() if k not in ("name", "kind")}
        for s in (new_config.get("sides") or [])
        if isinstance(s, dict)
    }
    if not engines and not options:
        return []
    out = []
    for i, name in enumerate(LEGACY_SIDES):
        e = engines.get(name) or {}
        details = e.get("details") or {}
        resolved = {"dtype": e.get("dtype"), "device": e.get("device")}
        if name == "vllm":
            if "enforce_eager" in details:
                resolved["cuda_graphs"] = "no (enforce_eager)" if details["enforce_eager"] else "yes"
            resolved.update(batch_invariant=details.get("batch_invariant"), max_model_len=details.get("max_model_len"))
        else:
            resolved["attention"] = details.get("attn_implementation")
        if e.get("version"):
            resolved["engine"] = f"{'vLLM' if name == 'vllm' else 'transformers'} {e['version']}"
        if e.get("torch_version"):
            resolved["torch"] = e["torch_version"]
        out.append(
            {
                "name": name,
                "kind": name,
                "reference": i == 0,
                "options": options.get(name, {}),
                "model_path": model_path,
                "python": None,
                "url": None,
                "version": e.get("version", ""),
                "device": e.get("device", ""),
                "dtype": e.get("dtype", ""),
                "versions": {
                    k: v
                    for k, v in (
                        ("vllm" if name == "vllm" else "transformers", e.get("version")),
                        ("torch", e.get("torch_version")),
                    )
                    if v
                },
                "resolved": {k: v for k, v in resolved.items() if v is not None},
                "load_s": load_s.get(name),
            }
        )
    return out


def legacy_comparison(c: dict[str, Any]) -> dict[str, Any]:
    """0.1's Comparison (vllm/hf fields) as a sides Comparison with a = hf, b = vllm."""
    d = c.get("divergence")
    div = None
    if d:
        div = {
            "index": d["index"],
            "token_ids": [d.get("hf_token_id"), d.get("vllm_token_id")],
            "texts": [d.get("hf_token_text", ""), d.get("vllm_token_text", "")],
            "in_other_topk": [d.get("hf_token_in_vllm_topk"), d.get("vllm_token_in_hf_topk")],
            "accepted": d.get("accepted_by_vllm_rule"),
            "reason": d.get("reason", "token"),
        }
    return {
        "a": "hf",
        "b": "vllm",
        "identical": c["identical"],
        "first_divergence": c.get("first_divergence"),
        "compared": c.get("compared", 0),
        "lengths": [c.get("length_hf", 0), c.get("length_vllm", 0)],
        "logprob_gaps": c.get("logprob_gaps", []),  # vLLM - HF = b - a
        "topk_overlap": c.get("topk_overlap", []),
        "max_abs_gap": c.get("max_abs_gap"),
        "mean_abs_gap": c.get("mean_abs_gap"),
        "divergence": div,
    }


def legacy_explanation(e: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(e, dict):
        return e
    out = {k: v for k, v in e.items() if k not in ("vllm", "hf", "stopped_engine", "continued_engine")}
    for new, old in (("a", "hf"), ("b", "vllm")):
        if isinstance(e.get(old), dict):
            out[new] = {"name": old, **e[old]}
    for key in ("stopped", "continued"):
        if f"{key}_engine" in e:
            out[f"{key}_side"] = e[f"{key}_engine"]
    out.setdefault("sides", list(LEGACY_SIDES))
    out.setdefault("differing_settings", [])
    return out


def legacy_probes(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """0.1's probes ({"vllm": ..., "vllm_batch_invariant": ..., "hf": ...}) keyed under "sides"."""
    if not isinstance(p, dict) or "sides" in p:
        return p
    out = {k: v for k, v in p.items() if k not in ("vllm", "vllm_batch_invariant", "hf")}
    sides = {}
    for label, side, inv in (("hf", "hf", False), ("vllm", "vllm", False), ("vllm_batch_invariant", "vllm", True)):
        if isinstance(p.get(label), dict):
            sides[side + ("+batch_invariant" if inv else "")] = {**p[label], "side": side, "batch_invariant": inv}
    out["sides"] = sides
    return out
