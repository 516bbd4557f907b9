"""Which axes a side's setup has, and the second engine an axis needs.

The shared axes (replay, batch, order, prefix cache, prefill vs decode) are passes of the side's own
loaded engine. The others need an engine of their own: the same setup with one setting changed (a
chunk budget, CUDA graphs, async scheduling, tensor parallel, the attention kernel) or, for the
second instance, the same setup in a fresh process. Whether a setup has an axis is read from its
kind's capabilities and options (core.kinds), never from a kind's name, and from the machine.

Pure but for `gpu_count` (nvidia-smi, through parity_ui.run.hardware).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...core.audit_record import AXES, AXIS_KEYS, NOT_APPLICABLE
from ...core.errors import ConfigError
from ...core.kinds import Kind
from ...core.mapping import deterministic_off, option
from ...core.sides import SideSpec, side_arg
from ...core.types import ModelInfo

SHARED = ("replay", "batch", "order", "prefix", "prefill_decode")
VARIANT = ("chunked", "instance", "graphs", "async", "tp", "attention")
MIN_CHUNK = 32  # the smallest prefill chunk budget the chunked-prefill axis sets
# What each side's pair of streams is called in an axis's stored pair run (side names of that run).
PAIR_NAMES = {
    "replay": ("first", "again"),
    "batch": ("alone", "batched"),
    "order": ("inorder", "shuffled"),
    "prefix": ("cold", "warm"),
    "prefill_decode": ("decode", "prefill"),
    "chunked": ("base", "chunked"),
    "instance": ("first", "second"),
    "graphs": ("base", "flipped"),
    "async": ("base", "flipped"),
    "tp": ("base", "flipped"),
    "attention": ("base", "flipped"),
    "control": ("recorded", "planted"),
}
INSTANCE_ENV = "PARITY_AUDIT_INSTANCE"  # inert in the engine; a new value is a new worker process


def parse_axes(value: Any) -> list[str]:
    """Axes from a list or "a,b,c" ("all" or nothing: every axis), in run order. ConfigError names an
    unknown one and the known ones."""
    if value is None or value == "" or value == [] or value == "all":
        return list(AXIS_KEYS)
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(x).strip().replace("-", "_") for x in items if str(x).strip()]
    aliases = {"prefill": "prefill_decode", "cache": "prefix", "prefix_cache": "prefix", "tensor_parallel": "tp"}
    names = [aliases.get(n, n) for n in names]
    unknown = [n for n in names if n not in AXES]
    if unknown:
        raise ConfigError(
            "axes",
            f"unknown axis {unknown[0]!r}",
            "axes: " + ", ".join(AXIS_KEYS) + " (comma-separated; 'all' for every one)",
        )
    return [a for a in AXIS_KEYS if a in names]


@dataclass
class Machine:
    on_gpu: bool
    gpus: int


def gpu_count() -> int:
    from ...run.hardware import gpus

    return len(gpus())


def _has(spec: SideSpec, option: str) -> bool:
    return any(f.name == option for f in dataclasses.fields(spec.options))


def not_running(axis: str, spec: SideSpec, kind: Kind, machine: Machine, model: ModelInfo) -> tuple[str, str] | None:
    """(NOT_APPLICABLE or NOT_RUN, why) when `axis` does not run on this setup, before anything loads;
    None when it does. (The prefix axis can still turn out not applicable after the engine ran: one
    that reports no cached-token count per request.)"""
    if axis == "prefix":
        if not _has(spec, "enable_prefix_caching"):
            return NOT_APPLICABLE, f"kind {kind.name} keeps no prefix cache across requests"
        if not option(spec, "enable_prefix_caching"):
            return (
                NOT_APPLICABLE,
                f"prefix caching is off in this setup (enable_prefix_caching=false): audit side "
                f"{spec.name} with enable_prefix_caching=true to test it",
            )
    if axis == "prefill_decode" and not kind.can_score:
        return NOT_APPLICABLE, f"kind {kind.name} cannot rescore tokens (teacher forcing)"
    if axis == "chunked" and not _has(spec, "max_num_batched_tokens"):
        return NOT_APPLICABLE, f"kind {kind.name} prefills a prompt in one forward pass: there is no chunk budget"
    if axis == "instance" and not kind.in_worker:
        return NOT_APPLICABLE, "a server at a URL: parity-ui cannot start a second instance of it"
    if axis in ("graphs", "async", "tp"):
        setting = {"graphs": "enforce_eager", "async": "async_scheduling", "tp": "tensor_parallel_size"}[axis]
        if not _has(spec, setting) or not kind.in_worker:
            return NOT_APPLICABLE, f"kind {kind.name} has no {setting} setting"
        if not machine.on_gpu:
            why = {
                "graphs": "the CPU: vLLM's CPU build runs eager, there are no CUDA graphs",
                "async": "the CPU: vLLM's CPU build turns async scheduling off itself",
                "tp": "the CPU: tensor parallel splits a model over GPUs",
            }[axis]
            return NOT_APPLICABLE, why
        if axis == "tp":
            if machine.gpus < 2 and int(option(spec, "tensor_parallel_size", 1)) < 2:
                return NOT_APPLICABLE, f"TP 2 needs two GPUs; this machine has {machine.gpus}"
            heads = model.num_attention_heads
            if heads and heads % 2:
                return NOT_APPLICABLE, f"{model.name} has {heads} attention heads, which do not split over 2 GPUs"
    if axis == "attention" and not _has(spec, "attn_implementation"):
        return (
            NOT_APPLICABLE,
            f"the attention-kernel axis is an HF side's (eager vs sdpa); a {kind.name} side's attention "
            "backend is one of its settings: compare two with parity compare",
        )
    return None


def chunk_budget(lengths: list[int]) -> int | None:
    """The smaller prefill chunk budget: about a third of the longest prompt (a multiple of 16, at least
    MIN_CHUNK), so that prompt is prefilled in several chunks; None when no prompt is long enough."""
    longest = max(lengths, default=0)
    budget = max(MIN_CHUNK, (longest // 3) // 16 * 16)
    return budget if budget < longest else None


def needs_for_chunks(lengths: list[int]) -> str:
    return (
        f"it needs a prompt longer than {MIN_CHUNK} tokens to chunk (the longest here has "
        f"{max(lengths, default=0)}); the built-in prompt set has one"
    )


@dataclass
class Variant:
    """The second engine of an axis: its side (the base's options with one changed), the process
    environment that keeps it apart, and the setting changed, in words."""

    spec: SideSpec
    env: dict[str, str]
    changed: str


def variant(
    axis: str, spec: SideSpec, resolved: dict[str, Any], *, budget: int | None = None, nonce: str = ""
) -> Variant:
    """The second engine `axis` compares the base with. `resolved`: the base engine's resolved settings."""
    name = f"{spec.name}-{axis}"[:32]
    if axis == "instance":
        return Variant(dataclasses.replace(spec, name=name), {INSTANCE_ENV: nonce or "2"}, "a fresh engine process")
    if axis == "chunked":
        if budget is None:
            raise ValueError("the chunked-prefill axis needs a budget")
        # vLLM wants the budget >= max_num_seqs: lowered only where the base's is higher.
        seqs = option(spec, "max_num_seqs") or resolved.get("max_num_seqs")
        lower = {"max_num_seqs": budget} if not isinstance(seqs, int) or seqs > budget else {}
        v = spec.replace(enable_chunked_prefill=True, max_num_batched_tokens=budget, **lower)
        return Variant(dataclasses.replace(v, name=name), {}, f"chunked prefill with a budget of {budget} tokens")
    if axis == "graphs":
        eager = str(resolved.get("cuda_graphs", "off")) == "off"
        v = spec.replace(enforce_eager=not eager)
        return Variant(dataclasses.replace(v, name=name), {}, "CUDA graphs on" if eager else "eager (CUDA graphs off)")
    if axis == "async":
        on = bool(resolved.get("async_scheduling"))
        v = spec.replace(async_scheduling=not on)
        return Variant(dataclasses.replace(v, name=name), {}, f"async scheduling {'off' if on else 'on'}")
    if axis == "tp":
        tp = int(option(spec, "tensor_parallel_size", 1) or 1)
        width = 2 if tp == 1 else 1
        v = spec.replace(tensor_parallel_size=width)
        return Variant(dataclasses.replace(v, name=name), {}, f"tensor parallel {width}")
    if axis == "attention":
        now = str(resolved.get("attention") or option(spec, "attn_implementation", "auto"))
        other = "sdpa" if now == "eager" else "eager"
        v = spec.replace(attn_implementation=other)
        return Variant(dataclasses.replace(v, name=name), {}, f"attn_implementation={other} (base: {now})")
    raise ValueError(f"axis {axis} has no second engine")


def control_variant(spec: SideSpec, dtype_now: str, setting: str | None = None) -> Variant:
    """The setting control: the same engine with one logit-affecting setting changed. Default: the
    weights' dtype (float32 <-> bfloat16); `setting` "key=value" names another (a side option)."""
    name = f"{spec.name}-control"[:32]
    if setting:
        import yaml

        from ...core.config import TOP_KEYS
        from ...core.sides import build_side

        key, _, raw = setting.partition("=")
        key, raw = key.strip(), raw.strip()
        if not key or not raw or not _has(spec, key):
            raise ConfigError(
                "control_setting",
                f"{setting!r} is not OPTION=VALUE of one of side {spec.name}'s options",
                "e.g. dtype=bfloat16, or fp32_logits=true",
            )
        value = yaml.safe_load(raw)
        if option(spec, key) == value:
            raise ConfigError(
                "control_setting", f"{setting!r} changes nothing: side {spec.name} has it already", "give another value"
            )
        changed = build_side({**spec.to_dict(), key: value, "name": name}, "control_setting", set(TOP_KEYS))
        return Variant(changed, {}, f"{key}={value}")
    other = "bfloat16" if dtype_now == "float32" else "float32"
    return Variant(dataclasses.replace(spec.replace(dtype=other), name=name), {}, f"dtype={other} (base: {dtype_now})")


# The axes whose two streams are the same requests in the same setup: what breaks them is the engine
# picking other kernels or reduction orders from one call (or process) to the next.
SAME_SETUP = ("replay", "instance")


def axis_hint(axis: str, spec: SideSpec, resolved: dict[str, Any]) -> str:
    """What may make broken `axis` hold on this setup, where its kind has a switch for it (a capability,
    core.kinds), with the exact option the CLI takes; "" where there is none to offer."""
    if axis not in SAME_SETUP:
        return ""
    label = AXES[axis][0]
    if deterministic_off(spec):
        on = spec.replace(deterministic=True)
        return (
            f"side {spec.name} runs without torch's deterministic algorithms: on a GPU the same batch may take "
            "other kernels or reduction orders from one call to the next (cuBLAS's workspace, cuDNN's attention). "
            f"Re-run the audit with them on, adding --set {spec.name}.deterministic=true (or --side {side_arg(on)}); "
            f"if the {label} axis then holds, that was the cause"
        )
    ops = resolved.get("nondeterministic_ops")
    if option(spec, "deterministic", False) and ops:
        return (
            f"side {spec.name} ran with deterministic algorithms, and torch has no deterministic implementation "
            f"of {', '.join(map(str, ops))} here (met at load): the {label} axis may break there"
        )
    return ""
