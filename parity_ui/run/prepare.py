"""Everything decided before an engine starts: the model, the prompt ids (tokenized ONCE), each
side's native arguments, interpreter and model folder, the GPU memory plan, and the preflight.

`prepare(request, gpu)` raises ParityError (ConfigError, ModelError, PromptError) with a fix, naming
the side where a side is at fault. It reads small files and runs tokenizers; it loads no weights.
"""

from __future__ import annotations

import importlib

from ..core.config import ParityConfig, routes_for
from ..core.context import check_context, max_context
from ..core.errors import ConfigError, PromptError, SideError
from ..core.kinds import Kind, get_kind
from ..core.mapping import Resolved, map_side, option, resolve, side_dtype, side_image_pixels
from ..core.sides import SideSpec
from ..core.types import ModelInfo
from ..inputs.models import describe_model
from ..inputs.prompts import (
    EncodedPrompt,
    PromptSpec,
    PromptTokenizer,
    VisionProcessor,
    check_chat_template,
    tokenizer_for,
    vision_for,
)
from .environments import PythonEnv, describe_python, require_package, this_python
from .memory_plan import fit_contexts, plan_gpu_memory
from .plan import Prepared, RunRequest, SidePlan
from .preflight import run_preflight

__all__ = [
    "prepare",
    "likely_workers",
    "likely_prewarms",
    "plan_side",
    "plan_sides",
    "max_context",
    "check_same_tokens",
    "Prepared",
    "RunRequest",
    "SidePlan",
]


def _check_context(cfg: ParityConfig, model: ModelInfo, encoded: list[EncodedPrompt]) -> int | None:
    """The run's context (max_context); PromptError when a prompt plus max_new_tokens passes it."""
    limit = max_context(cfg, model)
    check = check_context([len(e.token_ids) for e in encoded], cfg.max_new_tokens, limit, cfg.max_model_len)
    if check.over is not None:
        raise PromptError(check.message, check.fix)
    return limit


def _context_needs(
    cfg: ParityConfig, encoded: list[EncodedPrompt], side_prompts: dict[str, list[EncodedPrompt]], at_least: int
) -> dict[str, int]:
    """Per side, the positions its longest prompt (its own image expansion where it has one) plus
    max_new_tokens need, and at least `at_least`."""
    return {
        s.name: max(at_least, max(len(e.token_ids) for e in side_prompts.get(s.name, encoded)) + cfg.max_new_tokens)
        for s in cfg.sides
    }


def _side_model(spec: SideSpec, run_model: ModelInfo, trust_remote_code: bool) -> ModelInfo:
    if not spec.model:
        return run_model
    try:
        return describe_model(spec.model, trust_remote_code=trust_remote_code)
    except ConfigError:
        raise
    except Exception as e:  # ModelError: name the side
        raise SideError(
            spec.name, "model", getattr(e, "message", str(e)), getattr(e, "fix", "") or "give a model folder"
        ) from None


def check_same_tokens(
    spec: SideSpec,
    model: ModelInfo,
    ref_tok: PromptTokenizer,
    prompts: list[PromptSpec],
    encoded: list[EncodedPrompt],
    chat: bool,
    trust_remote_code: bool,
) -> None:
    """A side with its own model folder must tokenize every prompt to the reference's ids: else the
    sides would not be compared on the same input."""
    try:
        tok = tokenizer_for(model.path, trust_remote_code)
    except Exception as e:  # noqa: BLE001 - no or broken tokenizer files
        raise SideError(
            spec.name,
            "model",
            f"{model.path} has no usable tokenizer ({type(e).__name__}: {str(e)[:160]})",
            "copy the reference model's tokenizer files (tokenizer.json, tokenizer_config.json, "
            "special_tokens_map.json) into it",
        ) from None
    if len(tok.tok) != len(ref_tok.tok):
        raise SideError(
            spec.name,
            "model",
            f"{model.path}'s tokenizer has {len(tok.tok)} tokens, the reference's {len(ref_tok.tok)}",
            "use checkpoints of the same model family, with the same tokenizer files",
        )
    for i, (spec_p, ref) in enumerate(zip(prompts, encoded)):
        ids = tok.encode(spec_p, chat).token_ids
        if ids != ref.token_ids:
            at = next(
                (j for j, (x, y) in enumerate(zip(ids, ref.token_ids)) if x != y), min(len(ids), len(ref.token_ids))
            )
            raise SideError(
                spec.name,
                "model",
                f"{model.path} tokenizes prompt {i} differently from the reference (first at "
                f"token {at}: {ids[at] if at < len(ids) else 'end'} vs "
                f"{ref.token_ids[at] if at < len(ref.token_ids) else 'end'})",
                "copy the reference model's tokenizer files into the side's folder, or "
                "compare checkpoints of the same model",
            )


def _interpreter(spec: SideSpec, kind: Kind) -> tuple[str, PythonEnv | None]:
    if not spec.python:
        return this_python(), None
    env = describe_python(spec.python, spec.name)
    require_package(env, kind.package, spec.name, kind.name)
    if kind.package:  # every engine's worker runs on torch: a transformers without it fails at import
        require_package(env, "torch", spec.name, kind.name)
    return spec.python, env


def plan_side(cfg: ParityConfig, spec: SideSpec, resolved: Resolved, model: ModelInfo) -> SidePlan:
    kind = get_kind(spec.kind)
    python, env = _interpreter(spec, kind)
    args = map_side(cfg, spec, resolved, model)
    return SidePlan(
        spec=spec,
        kind=kind,
        model=model,
        dtype=side_dtype(cfg, spec, model),
        args=args,
        python=python,
        env=env,
        worker_env=dict(getattr(args, "env", {}) or {}),
    )


def plan_sides(
    model_name: str, cfg: ParityConfig, gpu: bool, trust_remote_code: bool = False, *, context_need: int | None = None
) -> list[SidePlan]:
    """Every side's plan for `cfg` on a model, without prompts (a layer capture replays ids it already
    has; `context_need` is the positions it feeds). Raises ParityError like prepare()."""
    model = describe_model(model_name, trust_remote_code=trust_remote_code)
    cfg = routes_for(cfg, model.num_experts)
    resolved = resolve(model, tokenizer_for(model.path, trust_remote_code).eos_token_ids, gpu)
    if context_need is not None:
        resolved.context_need = {s.name: context_need for s in cfg.sides}
    plans = [plan_side(cfg, spec, resolved, _side_model(spec, model, trust_remote_code)) for spec in cfg.sides]
    plan_memory(plans, gpu, resolved, cfg, longest=context_need or 0, max_new=1, batch=1)
    return plans


def plan_memory(
    plans: list[SidePlan],
    gpu: bool,
    resolved: Resolved,
    cfg: ParityConfig,
    *,
    longest: int,
    max_new: int,
    batch: int,
    scored: bool = False,
) -> list:
    """Plan the GPU memory of sides that run together (each vLLM side's unset gpu_memory_utilization
    filled) and check each vLLM side's context against the KV cache that leaves it. Planning again
    with one more side re-divides the shares this plan filled; shares a user set stay. Returns the
    plan's findings; raises ParityError when the sides do not fit."""
    for p in plans:  # a share filled by an earlier plan is not the user's: divide it again
        llm = getattr(p.args, "llm", None)
        if p.kind.gpu_memory == "share" and isinstance(llm, dict) and "gpu_memory_utilization" in llm:
            llm["gpu_memory_utilization"] = option(p.spec, "gpu_memory_utilization")
    findings = plan_gpu_memory(plans, gpu, longest=longest, max_new=max_new, batch=batch, scored=scored)
    if resolved.context_need:
        fit_contexts(plans, gpu, resolved.context_need, explicit=cfg.max_model_len is not None)
    return findings


def plan_extra_side(prep: Prepared, spec: SideSpec, like: str, *, scored: bool | None = None) -> SidePlan:
    """One more side for a prepared run that is not the user's (a workload's noise floor), on the run's
    model: its context sized like side `like`'s, and the GPU memory planned again over every side, all
    resident at once, so that it gets a share too (a vLLM side left out of the plan starts with no
    gpu_memory_utilization) and the plan refuses the set when it does not fit, before anything loads.
    `scored`: the HF sides teacher-force whole sequences (default: the config's cross_score). The
    run's memory-plan finding is replaced IN PLACE (a recorder holding prep.warnings stores the new
    line, naming every side)."""
    if like in prep.resolved.context_need:
        prep.resolved.context_need[spec.name] = prep.resolved.context_need[like]
    plan = plan_side(prep.config, spec, prep.resolved, prep.side(like).model)
    cfg = prep.config
    findings = plan_memory(
        [*prep.sides, plan],
        prep.resolved.on_gpu,
        prep.resolved,
        cfg,
        longest=max((len(e.token_ids) for e in prep.prompts), default=0),
        max_new=cfg.max_new_tokens,
        batch=cfg.batch_size,
        scored=cfg.cross_score if scored is None else scored,
    )
    prep.warnings[:] = [w for w in prep.warnings if w.code != "memory-plan"] + findings
    return plan


def likely_workers(req: RunRequest, gpu: bool) -> list[tuple[str, str, str, dict[str, str]]]:
    """(side, engine, interpreter, environment) of the worker each side of `req` will most likely
    run in, guessed from the model's config alone, before the tokenizer loads (a wrong guess costs a
    process that is dropped). Sides on another interpreter, and kinds whose worker imports nothing
    heavy, are left out; so is everything when the request would not prepare."""
    try:
        model = describe_model(req.model, trust_remote_code=req.trust_remote_code)
        check_chat_template(model.path, req.prompts, req.config.chat)  # a refusal starts no worker
        resolved = resolve(model, [], gpu)
        out = []
        for spec in req.config.sides:
            kind = get_kind(spec.kind)
            if spec.python or not kind.head_start:
                continue
            cfg = routes_for(req.config, model.num_experts)
            env = dict(getattr(map_side(cfg, spec, resolved, model), "env", {}) or {})
            out.append((spec.name, kind.engine, this_python(), env))
        return out
    except Exception:  # noqa: BLE001 - prepare() reports the same problem, with its fix
        return []


def likely_prewarms(req: RunRequest, gpu: bool) -> list[tuple[str, str, dict[str, str], str]]:
    """(module, interpreter, environment, model folder) of each prewarm (Kind.prewarm) the run's sides
    would want now, on a GPU host only: its own process imports the engine's library once more, which
    a 2-core machine pays in the workers' start. Nothing when the request would not prepare, or the
    cache it fills is there already."""
    if not gpu:
        return []
    try:
        model = describe_model(req.model, trust_remote_code=req.trust_remote_code)
        check_chat_template(model.path, req.prompts, req.config.chat)
        resolved = resolve(model, [], gpu)
        out = []
        for spec in req.config.sides:
            kind = get_kind(spec.kind)
            if spec.python or not kind.prewarm or spec.model:
                continue
            env = dict(getattr(map_side(req.config, spec, resolved, model), "env", {}) or {})
            if importlib.import_module(kind.prewarm).needed(model.path, env):
                out.append((kind.prewarm, this_python(), env, model.path))
        return list({(m, p, tuple(sorted(e.items())), f): (m, p, e, f) for m, p, e, f in out}.values())
    except Exception:  # noqa: BLE001 - prepare() reports the same problem; the worker inspects as before
        return []


def prepare(req: RunRequest, gpu: bool) -> Prepared:
    """Resolve the model, tokenize every prompt once, check lengths, plan every side (each vLLM side's
    context sized to the run and checked against its KV cache), preflight."""
    if not req.prompts:
        raise PromptError("no prompt was given", "type a prompt or upload a prompt file")
    model = describe_model(req.model, trust_remote_code=req.trust_remote_code)
    cfg = routes_for(req.config, model.num_experts)  # routes unset: on for a MoE model
    check_chat_template(model.path, req.prompts, cfg.chat)  # from the files: before transformers imports
    tok = tokenizer_for(model.path, req.trust_remote_code)
    vision = _check_images(req, model)
    resolved = resolve(model, tok.eos_token_ids, gpu, vision.defaults if vision else None)
    ref_px = side_image_pixels(cfg, cfg.sides[0], resolved) or {}
    prompts = list(req.prompts)
    encoded = [vision.encode(p, ref_px) if p.images and vision else tok.encode(p, cfg.chat) for p in prompts]
    kept, skipped = _too_long(req, model, encoded)
    if skipped:
        prompts, encoded = [prompts[i] for i in kept], [encoded[i] for i in kept]
    side_prompts = _side_prompts(cfg, resolved, vision, prompts, encoded, ref_px)
    limit = _check_context(cfg, model, encoded)
    resolved.context_need = _context_needs(cfg, encoded, side_prompts, req.min_context)
    plans = []
    text_only = [(p, e) for p, e in zip(prompts, encoded) if not p.images]
    for spec in cfg.sides:
        side_model = _side_model(spec, model, req.trust_remote_code)
        if spec.model and text_only:
            check_same_tokens(
                spec,
                side_model,
                tok,
                [p for p, _ in text_only],
                [e for _, e in text_only],
                cfg.chat,
                req.trust_remote_code,
            )
        plans.append(plan_side(cfg, spec, resolved, side_model))
    warnings = plan_memory(
        plans,
        gpu,
        resolved,
        cfg,
        longest=max(len(e.token_ids) for e in encoded),
        max_new=cfg.max_new_tokens,
        batch=cfg.batch_size,
        scored=cfg.cross_score,
    )
    prepared = Prepared(
        config=cfg,
        model=model,
        tokenizer=tok,
        prompts=encoded,
        resolved=resolved,
        sides=plans,
        max_context=limit,
        side_prompts=side_prompts,
        image_token_id=vision.image_token_id if vision else None,
        kept=kept,
        skipped_too_long=skipped,
    )
    prepared.warnings = run_preflight(prepared) + warnings
    if vision is not None:
        from ..inputs.images import image_findings

        prepared.warnings += image_findings(prepared, vision)
    return prepared


def _too_long(req: RunRequest, model: ModelInfo, encoded: list[EncodedPrompt]) -> tuple[list[int], list[int]]:
    """(kept, skipped): with too_long="skip", the prompts that fit the context and those that do not.
    With "stop" every prompt is kept and the context check refuses the run. PromptError when every
    prompt is too long."""
    limit = max_context(req.config, model)
    if req.too_long != "skip" or limit is None:
        return list(range(len(encoded))), []
    need = req.config.max_new_tokens
    kept = [i for i, e in enumerate(encoded) if len(e.token_ids) + need <= limit]
    keep = set(kept)
    skipped = [i for i in range(len(encoded)) if i not in keep]
    if not kept:
        raise PromptError(
            f"every one of the {len(encoded)} prompts is longer than the context of {limit} with max_new_tokens={need}",
            "lower max_new_tokens, or raise max_model_len with rope_scaling",
        )
    return kept, skipped


def _check_images(req: RunRequest, model: ModelInfo) -> VisionProcessor | None:
    """Image prompts need a vision model, sides that take images and at most the configured images a
    prompt: refused here, before any engine starts. Returns the run's ONE processor when images are given."""
    with_images = [(i, p) for i, p in enumerate(req.prompts) if p.images]
    if not with_images:
        return None
    i, first = with_images[0]
    if not model.vision:
        raise PromptError(
            f"image {first.images[0].name!r} was given with prompt {i}, but {model.name} "
            f"({model.architecture or model.model_type}) is a text-only model",
            "drop the image (--image), or pick a vision-language model such as Qwen2-VL, Qwen2.5-VL or Qwen3-VL",
        )
    limit = req.config.max_images_per_prompt
    for i, p in with_images:
        if len(p.images) > limit:
            raise PromptError(
                f"prompt {i} has {len(p.images)} images ({', '.join(x.name for x in p.images)}), "
                f"over max_images_per_prompt={limit} (vLLM's limit_mm_per_prompt)",
                f"attach at most {limit} images, or raise the limit: --set max_images_per_prompt={len(p.images)}",
            )
    refusing = [s for s in req.config.sides if not get_kind(s.kind).accepts_images]
    if refusing:
        s = refusing[0]
        raise SideError(
            s.name,
            "kind",
            f"kind {s.kind} ({get_kind(s.kind).label}) cannot take image prompts yet",
            "compare image prompts with vllm and hf sides; give this side's text prompts only",
        )
    return vision_for(model.path, req.trust_remote_code)


def _side_prompts(
    cfg: ParityConfig,
    resolved: Resolved,
    vision: VisionProcessor | None,
    prompts: list[PromptSpec],
    encoded: list[EncodedPrompt],
    ref_px: dict[str, int],
) -> dict[str, list[EncodedPrompt]]:
    """The ids a side with its own resize settings will see (the same processor, its settings)."""
    if vision is None:
        return {}
    out = {}
    for spec in cfg.sides[1:]:
        px = side_image_pixels(cfg, spec, resolved) or {}
        if px != ref_px:
            out[spec.name] = [vision.encode(p, px) if p.images else e for p, e in zip(prompts, encoded)]
    return out
