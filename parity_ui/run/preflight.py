"""Preflight: settings and model files that make sides disagree, found before any engine runs.

`run_preflight(prepared)` runs every check in `CHECKS` and returns their findings. Each check is a
small function of the prepared run (model facts, the tokenizer, the encoded prompts, each side's
mapped arguments) and reads at most the model's config.json; it never loads weights. Every finding
has a stable `code`, a one-line message, the fix in words and, where there is one, the concrete
`setting` to change (rendered as a --set flag by the CLI and as a control by the app). Sources for
each cause: /work/shared/research/divergence-causes.md (cited as "cause N").

What an engine can run (head sizes, architectures, dtypes on the device) is checked inside each
side's worker before loading (parity_ui.engines.*.check), where the engine's own tables are.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.kinds import VllmOptions
from ..core.mapping import option
from ..core.types import Finding
from ..core.validation import non_default
from .hardware import batch_invariant_support
from .preflight_moe import check_moe

if TYPE_CHECKING:
    from .plan import Prepared, SidePlan

# The long-context seed found batches of up to 15 prompts stable in bf16 (cause 2); above that the
# batch composition moved vLLM's own outputs.
STABLE_BATCH_BOUND = 15

# generation_config.json keys vLLM reads as request defaults when generation_config="auto" (its own
# default): ModelConfig.get_diff_sampling_param in vLLM 0.32. vLLM ignores do_sample.
VLLM_GENERATION_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
)
# Keys HF generate applies only when do_sample is true.
HF_SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
# The value at which each key changes nothing (a value listed here is not reported).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "do_sample": (False, None),
    "temperature": (1.0, None),
    "top_p": (1.0, None),
    "top_k": (0, -1, None),
    "min_p": (0.0, None),
    "typical_p": (1.0, None),
    "repetition_penalty": (1.0, None),
    "presence_penalty": (0.0, None),
    "frequency_penalty": (0.0, None),
    "no_repeat_ngram_size": (0, None),
    "epsilon_cutoff": (0.0, None),
    "eta_cutoff": (0.0, None),
    "encoder_repetition_penalty": (1.0, None),
}
# Options that change only how a side's requests are scheduled: how much KV cache it holds and how
# many sequences share a step. They change which requests share a batch (and, short of cache, whether
# one is preempted and recomputed), so they keep the tokens only where the engine is batch invariant.
_SCHEDULING_OPTIONS = {"gpu_memory_utilization", "kv_cache_gib", "max_num_seqs"}


def _placement(device: str, on_gpu: bool) -> str:
    """Where a side's numbers are made, as far as they depend on it: the CPU, one GPU, or N GPUs.
    "auto" is the first GPU where there is one; cuda:0 and cuda:1 are the same kernels."""
    if device == "cpu" or (device == "auto" and not on_gpu):
        return "the CPU"
    n = len(device.split(":", 1)[1].split(",")) if device.startswith("cuda:") else 1
    return "1 GPU" if n == 1 else f"{n} GPUs"


def _batch_invariant(prepared: Prepared, p: SidePlan) -> bool:
    """Whether the side runs in its engine's batch-invariant mode (asked, and in effect here)."""
    return (
        p.kind.can_batch_invariant
        and bool(option(p.spec, "batch_invariant", False))
        and batch_invariant_support(prepared.resolved.on_gpu)[0]
    )


Check = Callable[["Prepared"], list[Finding]]


def _setting(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": value}


def _model_config(prepared: Prepared) -> dict[str, Any]:
    """The model's config.json as written (the LM's part for multimodal configs); {} if unreadable."""
    try:
        cfg = json.loads((Path(prepared.model.path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


DTYPE_NAMES = ("float32", "bfloat16", "float16")


def _sides_of(prepared: Prepared, kind: str) -> list[SidePlan]:
    """The sides of an engine family: "vllm" also names vLLM servers parity-ui starts (same options)."""
    if kind == "vllm":
        return [p for p in prepared.sides if isinstance(p.spec.options, VllmOptions)]
    return [p for p in prepared.sides if p.kind.name == kind]


# -- EOS / stop ids (cause 12) ------------------------------------------------------------------


def check_eos(prepared: Prepared) -> list[Finding]:
    """EOS ids that differ between the tokenizer, generation_config.json and config.json, and side
    model folders whose EOS differ from the run's."""
    cfg = prepared.config
    tokenizer = prepared.tokenizer.eos_token_ids
    gen_file = _ids(prepared.model.generation_config.get("eos_token_id"))
    config = _ids(_model_config(prepared).get("eos_token_id"))
    # vLLM alone: the tokenizer's EOS plus generation_config's. HF generate alone: model.generation_config
    # only, never the tokenizer's. Both fall back to config.json only when generation_config.json is
    # ABSENT (GenerationConfig.from_pretrained raising OSError): a file without eos_token_id leaves HF
    # with no EOS at all.
    has_gen_file = (Path(prepared.model.path) / "generation_config.json").is_file()
    gen_effective = gen_file if has_gen_file else config
    vllm_alone = sorted(set(tokenizer) | set(gen_effective))
    hf_alone = sorted(set(gen_effective))
    sources = {
        "tokenizer": sorted(set(tokenizer)),
        "generation_config.json": sorted(set(gen_file)),
        "config.json": sorted(set(config)),
    }
    present = [v for v in sources.values() if v]
    out: list[Finding] = []
    union = prepared.resolved.eos_token_ids
    if len({tuple(v) for v in present}) > 1 or vllm_alone != hf_alone:
        said = ", ".join(f"{k} {v}" for k, v in sources.items() if v)
        out.append(
            Finding(
                code="eos-mismatch",
                severity="warning" if vllm_alone != hf_alone else "info",
                message=(
                    f"EOS ids differ by source ({said}): alone, vLLM would stop on {vllm_alone} and HF "
                    f"generate on {hf_alone or 'none (generation_config.json names no eos_token_id)'}; "
                    f"parity-ui passes {union} to every side"
                    + (" (ignored: ignore_eos=true)" if cfg.ignore_eos else "")
                    + "."
                ),
                fix="nothing to do here; when serving, pass the same stop ids to every engine (vLLM stop_token_ids, "
                "HF eos_token_id) or fix generation_config.json's eos_token_id",
            )
        )
    for p in prepared.sides:
        if p.model.path != prepared.model.path and sorted(p.model.eos_token_ids) != sorted(
            prepared.model.eos_token_ids
        ):
            out.append(
                Finding(
                    code="side-model-eos",
                    severity="info",
                    side=p.name,
                    message=f"side {p.name}'s model folder declares EOS {p.model.eos_token_ids}, the run's model "
                    f"{prepared.model.eos_token_ids}; every side stops on {union}.",
                    fix="align generation_config.json's eos_token_id in the two folders if they should be one model",
                )
            )
    return out


# -- BOS (cause 8) -------------------------------------------------------------------------------


def check_bos(prepared: Prepared) -> list[Finding]:
    """A chat template that writes BOS for a tokenizer that adds one too; prompts with two BOS."""
    tok = prepared.tokenizer.tok
    bos_id, bos_text = tok.bos_token_id, tok.bos_token
    if bos_id is None:
        return []
    out: list[Finding] = []
    templated = prepared.config.chat or any(p.spec.messages for p in prepared.prompts)
    adds_bos = tok("a", add_special_tokens=True)["input_ids"][:1] == [bos_id]
    if templated and adds_bos and prepared.tokenizer.has_chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
        if bos_text and text.startswith(bos_text):
            out.append(
                Finding(
                    code="template-bos",
                    severity="info",
                    message=(
                        f"the chat template already writes BOS {bos_text!r} and the tokenizer adds it "
                        "again with add_special_tokens=True: a server that tokenizes the templated text "
                        "(vllm #9519) gets two BOS; parity-ui tokenizes it once, without special tokens."
                    ),
                    fix="when serving, tokenize templated text with add_special_tokens=False "
                    "(or drop {{ bos_token }} from the template)",
                )
            )
    doubled = [i for i, p in enumerate(prepared.prompts) if p.token_ids[:2] == [bos_id, bos_id]]
    if doubled:
        out.append(
            Finding(
                code="double-bos",
                severity="warning",
                message=f"prompt(s) {doubled} start with BOS {bos_text!r} twice: the text already holds BOS "
                "and the tokenizer added another; every side sees it, the model likely never did.",
                fix=f"remove the leading {bos_text!r} from the prompt text (the tokenizer adds it)",
            )
        )
    return out


# -- generation_config.json sampling defaults (cause 5) -------------------------------------------


def _non_neutral(gen: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in gen.items() if k in NEUTRAL and v not in NEUTRAL[k]}


def check_generation_config(prepared: Prepared) -> list[Finding]:
    """Sampling defaults in generation_config.json that one engine would apply and another not."""
    found = _non_neutral(prepared.model.generation_config)
    if not found:
        return []
    shown = ", ".join(f"{k}={v!r}" for k, v in found.items())
    samples = bool(found.get("do_sample"))
    vllm_alone = [k for k in found if k in VLLM_GENERATION_KEYS]
    hf_alone = [
        k
        for k in found
        if k not in ("presence_penalty", "frequency_penalty") and (samples or k not in HF_SAMPLING_ONLY)
    ]
    alone = (
        f"alone, vLLM would apply {vllm_alone or 'none'} (it ignores do_sample) and HF generate {hf_alone or 'none'}"
    )
    applying = [
        p
        for p in prepared.sides
        if (option(p.spec, "generation_config") or prepared.config.generation_config) == "model"
    ]
    if not applying:
        return [
            Finding(
                code="generation-config-defaults",
                severity="info",
                message=f"generation_config.json sets {shown}; {alone}; parity-ui neutralises them for every side "
                "(generation_config=neutral).",
                fix="set the values you want explicitly in the canonical config; keep generation_config neutral",
            )
        ]
    # With "model", HF generate fills every field parity-ui left unset (None) from the file, while
    # vLLM gets explicit SamplingParams from parity-ui.
    names = {p.name for p in applying}
    hf_sides = [p for p in _sides_of(prepared, "hf") if p.name in names]  # a side of its own: only that side
    if not hf_sides:
        return []
    sampling = hf_sides[0].args.sampling
    unset = [k for k in found if sampling.get(k) is None and k not in ("presence_penalty", "frequency_penalty")]
    # Under greedy, do_sample=False is passed explicitly: filled sampling-only fields change nothing.
    inert = not sampling.get("do_sample") and all(k in HF_SAMPLING_ONLY for k in unset)
    return [
        Finding(
            code="generation-config-applied",
            severity="info" if inert else "warning",
            message=f"generation_config=model: generation_config.json sets {shown}; HF generate fills the "
            f"fields parity-ui left unset from it ({unset or 'none'}"
            + (", inert under greedy" if inert and unset else "")
            + "), vLLM gets parity-ui's explicit "
            f"sampling values; {alone}.",
            fix="put the values you want in the canonical config and keep the model's defaults out",
            side=None if prepared.config.generation_config == "model" else hf_sides[0].name,
            setting=_setting(
                "generation_config"
                if prepared.config.generation_config == "model"
                else f"{hf_sides[0].name}.generation_config",
                "neutral",
            ),
        )
    ]


# -- sampling semantics (causes 6, 7) -------------------------------------------------------------


def check_sampling(prepared: Prepared) -> list[Finding]:
    cfg = prepared.config
    out: list[Finding] = []
    if cfg.sampling == "shared-seed" and cfg.greedy:
        out.append(
            Finding(
                code="shared-seed-greedy",
                severity="info",
                message="sampling=shared-seed at temperature=0 is greedy decoding: no noise is drawn, every side "
                "takes its argmax.",
                fix="set temperature > 0 (e.g. 1) to sample with the shared noise",
            )
        )
    elif cfg.shared_seed:
        out.append(
            Finding(
                code="shared-seed",
                severity="info",
                message=f"sampling=shared-seed: every side draws with the same Gumbel noise (seed {cfg.seed}) through "
                "parity-ui's one sampler (temperature, min_p, top_k, top_p, then argmax of logits/T + noise), "
                "so sampled streams compare token by token; the engines' own samplers are not exercised.",
                fix="expected; use sampling=native to compare the engines' own samplers (streams then part at once)",
            )
        )
        return out
    if not cfg.greedy:
        out.append(
            Finding(
                code="sampled-streams",
                severity="warning",
                message=f"temperature={cfg.temperature}: the sides draw from different random streams, so "
                "sampled tokens cannot match token for token (a seed does not align them).",
                fix="compare greedily for a token-level comparison; compare logprobs or distributions otherwise",
                setting=_setting("temperature", 0),
            )
        )
        if cfg.top_k == 0:
            out.append(
                Finding(
                    code="top-k-off",
                    severity="info",
                    message="top_k=0 (off): parity-ui passes it to every side; HF generate's own default would be "
                    "top_k=50, vLLM's is off (-1/0).",
                    fix="set top_k explicitly when serving with HF, or it samples from the top 50 only",
                )
            )
        if cfg.top_k > 0 and cfg.top_p < 1.0:
            out.append(
                Finding(
                    code="top-k-top-p-order",
                    severity="info",
                    message="top_k and top_p together: HF and vLLM both apply top-k, then top-p on the renormalised "
                    "rest (older vLLM releases did not, vllm #718); vLLM's FlashInfer sampler (GPU) draws by "
                    "rejection sampling, the same set statistically but other draws; a token at a cut-off can "
                    "be kept by one side only when their numbers differ there.",
                    fix="use one of top_k / top_p when comparing sampled runs",
                    setting=_setting("top_k", 0),
                )
            )
        if cfg.min_p > 0 and (cfg.top_p < 1.0 or cfg.top_k > 0):
            out.append(
                Finding(
                    code="min-p-order",
                    severity="warning",
                    message=f"min_p={cfg.min_p} with top_p/top_k: vLLM applies min_p first (top-p then runs on the "
                    "min_p-renormalised set), HF generate applies it after top-k and top-p, so the two keep "
                    "different sets (probabilities 0.5, 0.3, 0.1, 0.1 with min_p=0.3, top_p=0.6: vLLM keeps one "
                    "token, HF two).",
                    fix="use min_p alone, or top_k/top_p without min_p, when comparing sampled runs",
                    setting=_setting("min_p", 0),
                )
            )
    elif cfg.top_k > 0 or cfg.top_p < 1.0 or cfg.min_p > 0:
        out.append(
            Finding(
                code="greedy-ignores-filters",
                severity="info",
                message="temperature=0 (greedy): top_k, top_p and min_p have no effect on any side.",
                fix="remove them, or set temperature > 0 to sample",
            )
        )
    if cfg.repetition_penalty != 1.0:
        out.append(
            Finding(
                code="repetition-penalty",
                severity="info",
                message=f"repetition_penalty={cfg.repetition_penalty} penalises tokens of the PROMPT and the output "
                "on every side (HF PR #1424 semantics); it is not frequency_penalty.",
                fix="compare the models rather than the penalty",
                setting=_setting("repetition_penalty", 1),
            )
        )
    return out


# -- dtype and logits (causes 1, 10) --------------------------------------------------------------


def _streams(cfg: Any) -> str:
    """What forks at a near-tie, as the run decodes: greedy streams, or shared-seed samples."""
    if getattr(cfg, "greedy", True):
        return "greedy streams"
    return "shared-seed samples" if getattr(cfg, "shared_seed", False) else "sampled streams (each its own draws)"


def check_dtype(prepared: Prepared) -> list[Finding]:
    cfg = prepared.config
    out: list[Finding] = []
    declared = (prepared.model.config_dtype or "").replace("torch.", "")
    stored = prepared.model.weights_dtype
    auto = [
        p for p in prepared.sides if hasattr(p.spec.options, "dtype") and (p.spec.options.dtype or cfg.dtype) == "auto"
    ]
    # What both engines start from under auto: the config's dtype, else the weights' (transformers 5
    # and vLLM both read the checkpoint then). From a float32 one vLLM alone downcasts (to bfloat16, on a
    # GPU and on x86/Arm CPUs alike: its platforms' first supported dtype); HF keeps float32.
    start = declared or stored
    if auto and start in ("", "float32"):
        what = (
            f"a {declared} checkpoint"
            if declared
            else "a checkpoint whose config.json names no dtype and whose weights are "
            + (f"{stored}" if stored else "of no single floating dtype parity-ui could read")
        )
        out.append(
            Finding(
                code="dtype-auto",
                severity="info",
                message=f"dtype=auto with {what}: vLLM alone would downcast it to bfloat16 (on a GPU and on the "
                "CPU), HF would keep it in float32; parity-ui resolved 'auto' once, to "
                f"{auto[0].dtype}, for {', '.join(p.name for p in auto)}.",
                fix="set dtype explicitly (float32 for identical streams, bfloat16 to match serving)",
            )
        )
    low = sorted({p.dtype for p in prepared.sides if p.dtype in ("bfloat16", "float16")})
    dtypes = {p.name: p.dtype for p in prepared.sides if p.dtype in DTYPE_NAMES}  # not a server's: unknown here
    if low and len(set(dtypes.values())) == 1:
        out.append(
            Finding(
                code="low-precision",
                severity="info",
                message=f"{low[0]}: the engines' kernels round differently, so {_streams(prepared.config)} usually "
                "fork within tens of tokens at near-ties; float32 makes them (nearly) identical.",
                fix="run in float32 to see whether a divergence is numerical",
                setting=_setting("dtype", "float32"),
            )
        )
    elif len(set(dtypes.values())) > 1:
        shown = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        out.append(
            Finding(
                code="sides-dtype-differ",
                severity="info",
                message=f"the sides run in different dtypes ({shown}): expect the lower precision's gaps "
                "(bf16 ~0.03 nats RMS against an fp32 reference, Fast-LLM #525), and forks at near-ties.",
                fix="that is the point when a trainer in fp32 checks bf16 rollouts; use one dtype to compare engines",
            )
        )
    fp32 = [p.name for p in prepared.sides if option(p.spec, "fp32_logits", False)]
    if fp32 and len(fp32) < len(prepared.sides) and low:
        others = [p.name for p in prepared.sides if p.name not in fp32]
        out.append(
            Finding(
                code="fp32-logits-one-sided",
                severity="warning",
                message=f"fp32_logits is on for {', '.join(fp32)} only: a float32 lm_head on one side and not "
                f"the other ({', '.join(others)}) widens the logprob gap (NeMo-RL #3936).",
                fix="turn fp32_logits on for every side, or for none",
                setting=_setting(f"{others[0]}.fp32_logits", True),
                side=others[0],
            )
        )
    return out


# -- RoPE and context (cause 11) ------------------------------------------------------------------


def _rope_kind(d: dict[str, Any]) -> str | None:
    return d.get("rope_type", d.get("type"))


def check_rope(prepared: Prepared) -> list[Finding]:
    cfg = prepared.config
    out: list[Finding] = []
    raw = _model_config(prepared)
    legacy = raw.get("rope_scaling") if isinstance(raw.get("rope_scaling"), dict) else None
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else None
    if legacy and "type" in legacy and "rope_type" not in legacy:
        out.append(
            Finding(
                code="rope-legacy-type",
                severity="info",
                message=f"config.json spells rope_scaling with 'type' ({legacy['type']!r}), the pre-4.45 key; "
                "transformers 5 maps it to rope_type, and vLLM reads the config through transformers (and "
                "maps it too), so the engines scale alike; a reader of the raw file may not.",
                fix="rename 'type' to 'rope_type' in config.json so the file says what runs",
            )
        )
    if legacy and params and _rope_kind(params) not in (None, "default"):
        a = (_rope_kind(legacy), legacy.get("factor"))
        b = (_rope_kind(params), params.get("factor"))
        if a != b:
            out.append(
                Finding(
                    code="rope-conflict",
                    severity="warning",
                    message=f"config.json holds rope_scaling {a} and rope_parameters {b}: transformers (4.x and "
                    "5.x) uses rope_scaling and drops rope_parameters, and vLLM reads the config through "
                    "transformers; a tool or engine that reads rope_parameters itself scales otherwise.",
                    fix="keep one of them in config.json (rope_scaling is what runs today), or set rope_scaling "
                    "in the canonical config (every side then gets the same dict)",
                )
            )
    scaling = cfg.rope_scaling or prepared.model.rope_scaling or {}
    if (
        cfg.rope_scaling
        and prepared.model.rope_scaling
        and (_rope_kind(cfg.rope_scaling), cfg.rope_scaling.get("factor"))
        != (_rope_kind(prepared.model.rope_scaling), prepared.model.rope_scaling.get("factor"))
    ):
        out.append(
            Finding(
                code="rope-override",
                severity="info",
                message=f"rope_scaling {cfg.rope_scaling} replaces the model's own {prepared.model.rope_scaling} "
                "for every side.",
                fix="remove rope_scaling from the config to use the model's own",
                setting=_setting("rope_scaling", None),
            )
        )
    if _rope_kind(scaling) == "yarn":
        out.append(
            Finding(
                code="rope-yarn",
                severity="info",
                message="YaRN scaling: engines derive the attention factor and original context differently "
                "when original_max_position_embeddings is missing (vllm #10293).",
                fix="give original_max_position_embeddings explicitly in rope_scaling",
            )
        )
    mpe = prepared.model.max_position_embeddings
    if mpe:
        longest = max(len(p.token_ids) for p in prepared.prompts) + cfg.max_new_tokens
        if longest > mpe:
            scaled = _rope_kind(scaling) not in (None, "default")
            out.append(
                Finding(
                    code="context-over-unscaled",
                    severity="warning",
                    message=f"up to {longest} positions, over the model's unscaled context of {mpe}: "
                    + (
                        "results rest on the RoPE scaling, which each engine implements itself."
                        if scaled
                        else "no RoPE scaling is set, so every side extrapolates past the trained "
                        "positions (HF silently)."
                    ),
                    fix="shorten the prompt or max_new_tokens"
                    + ("" if scaled else ", or set rope_scaling (e.g. linear, factor 2)"),
                )
            )
    return out


# -- batching, caching, chunking (causes 2, 3, 4) -------------------------------------------------


def check_batching(prepared: Prepared) -> list[Finding]:
    cfg = prepared.config
    out: list[Finding] = []
    batched = min(cfg.batch_size, len(prepared.prompts))
    invariant = [p for p in prepared.sides if p.kind.can_batch_invariant]
    if cfg.batch_size > STABLE_BATCH_BOUND:
        out.append(
            Finding(
                code="batch-size-unstable",
                severity="warning",
                message=f"batch_size={cfg.batch_size} is above {STABLE_BATCH_BOUND}, the largest batch found "
                "stable: batch composition changes vLLM's kernels and its outputs.",
                fix=f"set batch_size <= {STABLE_BATCH_BOUND}, or batch_invariant on a supported GPU",
                setting=_setting("batch_size", STABLE_BATCH_BOUND),
            )
        )
    hf_batched = [min(p.spec.batch_size(cfg.batch_size), len(prepared.prompts)) for p in _sides_of(prepared, "hf")]
    batched = max([b for b in hf_batched if b > 1], default=batched)
    if any(b > 1 for b in hf_batched):
        lengths = {len(p.token_ids) for p in prepared.prompts}
        how = "pads shorter prompts on the left, which" if len(lengths) > 1 else "runs them as one matrix, which"
        out.append(
            Finding(
                code="hf-left-padding",
                severity="info",
                message=f"{batched} prompts per generate call: HF {how} changes HF's own numerics versus "
                "batch 1 (transformers #26869), so an HF reference moves too.",
                fix="use batch 1 for a reference that does not depend on the other prompts",
                setting=_setting("batch_size", 1),
            )
        )
    for p in _sides_of(prepared, "vllm"):
        o = p.spec.options
        assert isinstance(o, VllmOptions)  # _sides_of(..., "vllm") keeps only those
        if o.enable_prefix_caching:
            out.append(
                Finding(
                    code="prefix-caching",
                    severity="warning",
                    side=p.name,
                    message=f"side {p.name}: prefix caching is on: a request reusing cached blocks can flip near-ties "
                    "against the first one (vllm #40896) and prompt_logprobs can be stale (#42019).",
                    fix="turn it off for parity",
                    setting=_setting(f"{p.name}.enable_prefix_caching", False),
                )
            )
        if o.enable_chunked_prefill:
            out.append(
                Finding(
                    code="chunked-prefill",
                    severity="warning",
                    side=p.name,
                    message=f"side {p.name}: chunked prefill is on: long prompts go through different kernels in "
                    "chunks (vllm #5952).",
                    fix="turn it off for parity",
                    setting=_setting(f"{p.name}.enable_chunked_prefill", False),
                )
            )
    for p in invariant:
        if option(p.spec, "batch_invariant", False) and not p.spec.python:  # `invariant`: kinds that can
            ok, why = batch_invariant_support(prepared.resolved.on_gpu)
            if not ok:
                out.append(
                    Finding(
                        code="batch-invariant-unsupported",
                        severity="warning",
                        side=p.name,
                        message=f"side {p.name}: batch_invariant=true has no effect: {why}.",
                        fix="run on an NVIDIA GPU of compute capability >= 8.0, or drop it",
                        setting=_setting(f"{p.name}.batch_invariant", False),
                    )
                )
    return out


# -- logprobs mode (cause 9) ----------------------------------------------------------------------


def _reported_mode(p: SidePlan, run_mode: str) -> str | None:
    """What a side's logprobs are: raw or processed (the mapper's choice), None when a server decides."""
    args = p.args
    if hasattr(args, "logprobs_source"):
        return "processed_logprobs" if args.logprobs_source == "scores" else "raw_logprobs"
    llm = getattr(args, "llm", None)
    if isinstance(llm, dict) and "logprobs_mode" in llm:
        return llm["logprobs_mode"]
    return None


def check_logprobs_mode_mismatch(prepared: Prepared) -> list[Finding]:
    """A side reporting processed logprobs against one reporting raw ones: every gap and ratio between
    them carries the temperature and log S (S = the kept mass), not the models' numerics (trl#6789)."""
    cfg = prepared.config
    modes = {p.name: _reported_mode(p, cfg.logprobs_mode) for p in prepared.sides}
    known = {m for m in modes.values() if m is not None}
    if len(known) < 2:
        return []
    processed = [n for n, m in modes.items() if m == "processed_logprobs"]
    raw = [n for n, m in modes.items() if m == "raw_logprobs"]
    filters = cfg.top_p < 1.0 or cfg.top_k > 0 or cfg.min_p > 0 or cfg.temperature not in (0.0, 1.0)
    # Processed logprobs are after the penalties too (vLLM's sampler and HF's scores both), greedy or not.
    penalty = cfg.repetition_penalty != 1.0
    if filters and not cfg.greedy:
        effect = "their logprobs differ by the temperature and log S of the kept set at every sampled token"
    elif penalty:
        effect = (
            f"the processed ones are after repetition_penalty={cfg.repetition_penalty}, so they differ at "
            "every token the penalty touches"
        )
    else:
        effect = (
            "under these settings the two agree, but any temperature, top_p, top_k or min_p puts log S (the "
            "kept mass) into every gap, and any penalty its own shift"
        )
    return [
        Finding(
            code="logprobs-mode-mismatch",
            severity="warning",
            side=processed[0],
            message=f"logprobs_mode differs between sides: {', '.join(processed)} report processed logprobs (after "
            f"penalties, temperature and top-k/top-p/min-p, renormalised over the kept set) and {', '.join(raw)} raw ones; {effect}, "
            "which reads as a numerics gap that is not one.",
            fix="give every side the same logprobs_mode (raw compares the models; processed compares what a sampler saw)",
            setting=_setting(f"{processed[0]}.logprobs_mode", "raw_logprobs"),
        )
    ]


def check_logprobs(prepared: Prepared) -> list[Finding]:
    cfg = prepared.config
    processed = cfg.logprobs_mode.startswith("processed")
    if processed and not cfg.greedy:
        return [
            Finding(
                code="processed-logprobs-sampling",
                severity="warning",
                message="processed logprobs with sampling: values are after temperature/top-k/top-p (filtered "
                "tokens show -inf), and the engines apply those processors differently.",
                fix="compare raw logprobs to compare the models' distributions",
                setting=_setting("logprobs_mode", "raw_logprobs"),
            )
        ]
    if processed:
        return [
            Finding(
                code="processed-logprobs",
                severity="info",
                message="processed logprobs: every side reports scores after its processors; do not compare "
                "these values with runs made in raw mode.",
                fix="use raw logprobs (the default) for values comparable across runs",
                setting=_setting("logprobs_mode", "raw_logprobs"),
            )
        ]
    if not cfg.greedy or cfg.repetition_penalty != 1.0:
        return [
            Finding(
                code="raw-logprobs-processors",
                severity="info",
                message="raw logprobs are before temperature/penalties: the token a side chose can rank "
                "below 1 in its own recorded logprobs.",
                fix="expected; read ranks with that in mind, or switch to processed logprobs",
            )
        ]
    return []


# -- what the sides differ in --------------------------------------------------------------------


def _option_text(value: object) -> str:
    """An option as a user wrote it; unset (None) is the engine's own default, not Python's None."""
    return "default" if value is None else repr(value)


def check_side_differences(prepared: Prepared) -> list[Finding]:
    """Name what each side changes against the reference, so a divergence can be read against it."""
    ref = prepared.reference
    out = []
    for p in prepared.sides[1:]:
        diffs: list[str] = []
        inert: list[str] = []
        if p.kind.name != ref.kind.name:
            diffs.append(f"engine ({ref.kind.name} vs {p.kind.name})")
        # The dtype each side loads (a side's own, else the run's): as resolved, not as written.
        if p.dtype != ref.dtype:
            diffs.append(f"dtype ({ref.dtype} vs {p.dtype})")
        # Every option both kinds have (all of them for one kind; device, fp32_logits... across kinds).
        shared = {f.name for f in dataclasses.fields(ref.spec.options)} & {
            f.name for f in dataclasses.fields(p.spec.options)
        }
        mine, theirs = non_default(p.spec.options), non_default(ref.spec.options)
        ref_opts, side_opts = ref.spec.all_options(), p.spec.all_options()
        # Scheduling settings keep the tokens only where both sides are batch invariant; elsewhere they
        # are named as a difference, with what they change (the batches), not waved through as inert.
        invariant = _batch_invariant(prepared, ref) and _batch_invariant(prepared, p)
        scheduling: list[str] = []
        for k in sorted((set(mine) | set(theirs)) & shared - {"dtype"}):
            a, b = ref_opts[k], side_opts[k]
            if a == b:
                continue
            text = f"{k} ({_option_text(a)} vs {_option_text(b)})"
            if k == "device":
                on_gpu = prepared.resolved.on_gpu
                where = _placement(str(a), on_gpu), _placement(str(b), on_gpu)
                # The CPU against a GPU, or one GPU against several, are other kernels: other numbers.
                (inert if where[0] == where[1] else diffs).append(
                    text if where[0] == where[1] else f"device ({where[0]} vs {where[1]})"
                )
            elif k in _SCHEDULING_OPTIONS:
                (inert if invariant else scheduling).append(text)
            else:
                diffs.append(text)
        if scheduling:
            diffs.append(
                "scheduling: " + ", ".join(scheduling) + ", which change which requests share a batch, and so "
                "the numbers of an engine that is not batch invariant (batch_invariant=true on a supported GPU)"
            )
        if p.model.path != ref.model.path:
            diffs.append(f"model folder ({ref.model.path} vs {p.model.path})")
        if p.python != ref.python:
            diffs.append(f"environment ({ref.spec.python or 'this one'} vs {p.spec.python or 'this one'})")
        if not diffs and not inert:
            out.append(
                Finding(
                    code="sides-identical-setup",
                    severity="info",
                    side=p.name,
                    message=f"side {p.name} has the same setup as the reference {ref.name}: any difference is "
                    "run-to-run nondeterminism.",
                    fix="change a setting on one side to compare setups (e.g. enforce_eager, dtype, python=)",
                )
            )
        elif not diffs:
            out.append(
                Finding(
                    code="sides-differ",
                    severity="info",
                    side=p.name,
                    message=f"side {p.name} differs from the reference {ref.name} only in settings that should not "
                    f"change its tokens ({'; '.join(inert)}): a difference is nondeterminism or a bug.",
                )
            )
        else:
            out.append(
                Finding(
                    code="sides-differ",
                    severity="info",
                    side=p.name,
                    # "as configured": the settings each side resolves (its attention backend, ...) are
                    # only known once it has loaded; the explanation names those, and the two must read alike.
                    message=f"side {p.name} differs from the reference {ref.name}, as configured, "
                    + ("only in " if len(diffs) == 1 and not inert else "in ")
                    + "; ".join(diffs + inert)
                    + ".",
                )
            )
    return out


CHECKS: tuple[Check, ...] = (
    check_eos,
    check_bos,
    check_generation_config,
    check_sampling,
    check_dtype,
    check_rope,
    check_batching,
    check_logprobs,
    check_logprobs_mode_mismatch,
    check_side_differences,
    check_moe,
)


def run_preflight(prepared: Prepared) -> list[Finding]:
    """Every check's findings, warnings first. Reads only small model files; never raises for a
    model quirk (a check that cannot read something reports nothing)."""
    findings = [f for check in CHECKS for f in check(prepared)]
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])
