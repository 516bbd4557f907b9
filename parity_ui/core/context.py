"""The context of a run: how many positions it needs, how many the model serves, how many each vLLM
side is given, and how many a KV cache holds. Pure functions, no I/O.

vLLM sizes its engine for `max_model_len`, not for the requests it will get: left unset it takes
the model's whole context (32k, 128k) and refuses to start, after loading the weights, when one
request of that length does not fit its KV cache. parity-ui knows what a run needs before anything
loads (the longest prompt, tokenized, plus max_new_tokens), so each vLLM side is given that, rounded
up to a bucket (`sized_context`), and an explicit max_model_len is checked against the model's
positions here and against the side's KV memory in `parity_ui.run.memory_plan` before loading.

The token-count check the app shows under the prompt and the one `prepare` raises are the same
function (`check_context`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .types import ModelInfo

# A vLLM side's context is the run's need rounded up to CONTEXT_FLOOR, then to the next power of
# two. Why buckets: max_model_len is part of what a warm worker loaded (SidePlan.load_key), so a
# context that followed the prompt token by token would restart vLLM whenever a prompt grew by one
# token. Why 1024 first: the prompts people iterate on (a few hundred tokens, max_new_tokens up to
# ~700) all land in one bucket, and 1024 positions of KV cost little (a 1B model's 1024 tokens of
# fp32 KV are ~70 MiB; vLLM on a GPU batches max(max_model_len, 8192) tokens anyway). Why powers of
# two above it: a prompt that keeps growing restarts vLLM once per doubling, and the headroom is
# never more than 2x the need; `memory_plan.fit_contexts` trims a bucket the KV cache cannot hold
# back to what it holds (never below the need).
CONTEXT_FLOOR = 1024

# RoPE types whose `factor` extends the positions the model serves, as vLLM (0.26 to 0.32) counts
# them: llama3 and longrope configs already state the extended length in max_position_embeddings.
# YaRN: vLLM 0.32 stopped applying the factor (it reads max_position_embeddings as already scaled,
# as transformers does); earlier releases and the HF side apply it, so it still counts here, and a
# 0.32 side refuses a context past max_position_embeddings itself.
_EXTENDING_ROPE = ("linear", "dynamic", "yarn")


def _rope_type(rope: dict[str, Any]) -> str | None:
    return rope.get("rope_type", rope.get("type"))


def rope_factor(model: ModelInfo, rope_scaling: dict[str, Any] | None) -> float:
    """The factor by which RoPE scaling (the config's, else the model's own) extends the model's
    positions; 1 when it does not (Gemma 3 states its scaled length already, as vLLM knows)."""
    rope = rope_scaling or model.rope_scaling or {}
    if "gemma3" in (model.model_type or "") or _rope_type(rope) not in _EXTENDING_ROPE:
        return 1.0
    return float(rope.get("factor") or 1.0)


def positions_limit(model: ModelInfo, rope_scaling: dict[str, Any] | None = None) -> int | None:
    """The positions the model serves: max_position_embeddings, scaled by RoPE. None when unknown."""
    if model.max_position_embeddings is None:
        return None
    return int(model.max_position_embeddings * rope_factor(model, rope_scaling))


def max_context(cfg: Any, model: ModelInfo) -> int | None:
    """The context every side can serve: max_model_len when set, else the model's (RoPE-scaled)."""
    if cfg.max_model_len is not None:
        return cfg.max_model_len
    return positions_limit(model, cfg.rope_scaling)


def sized_context(need: int, limit: int | None) -> int:
    """The max_model_len a vLLM side gets when the user sets none: `need` rounded up to CONTEXT_FLOOR,
    then to a power of two, never over `limit` (the model's positions; the caller has checked that
    `need` fits them)."""
    bucket = CONTEXT_FLOOR
    while bucket < need:
        bucket *= 2
    return bucket if limit is None else min(bucket, limit)


@dataclass(frozen=True)
class ContextCheck:
    """Prompt lengths against the context: what the app shows under the prompt, and what `prepare`
    refuses with (`message`, `fix`) when `over` names a prompt."""

    counts: list[int]  # tokens of each prompt, as the engines see them (image tokens expanded)
    max_new_tokens: int
    limit: int | None  # the context every side serves (max_context); None: unknown
    vllm_context: int  # what a vLLM side gets: max_model_len, else the run's need, bucketed
    over: int | None  # index of the first prompt whose tokens + max_new_tokens pass the limit

    @property
    def longest(self) -> int:
        return max(self.counts)

    @property
    def need(self) -> int:
        """Positions the run needs: its longest prompt plus max_new_tokens."""
        return self.longest + self.max_new_tokens

    @property
    def message(self) -> str:
        if self.over is None:
            return ""
        n = self.counts[self.over]
        which = "the prompt" if len(self.counts) == 1 else f"prompt {self.over}"
        return (
            f"{which} has {n:,} tokens; with max_new_tokens={self.max_new_tokens} it needs "
            f"{n + self.max_new_tokens:,} positions, over the context of {self.limit:,}"
        )

    @property
    def fix(self) -> str:
        return (
            "shorten the prompt, lower max_new_tokens, or extend the context with max_model_len and "
            "rope_scaling (e.g. the 'long context 9k' preset)"
        )


def check_context(
    counts: list[int], max_new_tokens: int, limit: int | None, max_model_len: int | None = None
) -> ContextCheck:
    """Check each prompt's token count plus max_new_tokens against `limit` (see `max_context`), and
    say which context a vLLM side gets (`max_model_len` when set, else `sized_context`)."""
    over = None
    if limit is not None:
        over = next((i for i, n in enumerate(counts) if n + max_new_tokens > limit), None)
    need = max(counts) + max_new_tokens
    return ContextCheck(
        counts=list(counts),
        max_new_tokens=max_new_tokens,
        limit=limit,
        over=over,
        vllm_context=max_model_len if max_model_len is not None else sized_context(need, limit),
    )


# -- the KV cache -----------------------------------------------------------------------------------

# Keys of a config.json that mark layers whose cache is not plain K and V per KV head (Mamba and
# linear-attention state, DeepSeek's compressed latent KV): there the estimate below does not hold.
_NOT_PLAIN_KV = ("kv_lora_rank", "mamba_d_state", "ssm_state_size", "hybrid_override_pattern", "attn_layer_indices")
_ATTENTION_LAYERS = ("full_attention", "sliding_attention", "attention")


def kv_layout(text_config: dict[str, Any]) -> str:
    """'standard' when every layer caches K and V per KV head; 'mla' or 'hybrid' otherwise."""
    if text_config.get("kv_lora_rank"):
        return "mla"
    types = text_config.get("layer_types") or text_config.get("layers_block_type") or []
    if any(k in text_config for k in _NOT_PLAIN_KV) or any(t not in _ATTENTION_LAYERS for t in types):
        return "hybrid"
    return "standard"


@dataclass(frozen=True)
class KvPerToken:
    """One token's keys and values in one rank's vLLM KV cache."""

    layers: int  # on this rank (pipeline parallel splits them)
    kv_heads: int  # on this rank (tensor parallel splits them; vLLM replicates when TP exceeds them)
    head_dim: int
    dtype_bytes: int
    # A sliding-window layer holds one block more: its window may start mid-block (vLLM's
    # SlidingWindowSpec). Counted for every layer of a windowed model: at most one block too many.
    extra_blocks: int = 0

    @property
    def bytes(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def __str__(self) -> str:
        return (
            f"{self.bytes / 1024:.1f} KiB a token: 2 (K and V) x {self.layers} layers x {self.kv_heads} KV heads "
            f"x {self.head_dim} x {self.dtype_bytes} bytes"
        )


def kv_per_token(model: ModelInfo, dtype_bytes: int, tp: int = 1, pp: int = 1) -> KvPerToken | None:
    """vLLM 0.32's figure (v1/kv_cache_interface.py, AttentionSpec.page_size_bytes over a block):
    (head_size + head_size_v) x num_kv_heads x dtype bytes per layer, summed over the layers. None
    when the model's geometry is unknown or its cache is not plain attention KV (`kv_layout`)."""
    layers, kv, hd = model.num_hidden_layers, model.num_key_value_heads, model.head_dim
    if (
        model.kv_layout != "standard"
        or not (isinstance(layers, int) and isinstance(kv, int) and isinstance(hd, int))
        or min(layers, kv, hd) <= 0
    ):
        return None
    return KvPerToken(
        layers=-(-layers // max(pp, 1)),
        kv_heads=max(1, kv // max(tp, 1)),
        head_dim=hd,
        dtype_bytes=dtype_bytes,
        extra_blocks=1 if model.sliding_window else 0,
    )


def kv_bytes(tokens: int, per_token: KvPerToken, block: int) -> int:
    """Bytes one request of `tokens` positions takes: vLLM allocates whole blocks of `block` tokens."""
    return (-(-tokens // block) + per_token.extra_blocks) * block * per_token.bytes


def pool_bytes(tokens: int, per_token: KvPerToken, block: int) -> int:
    """The KV cache that serves one request of `tokens` positions: its blocks plus the null block
    vLLM's block pool holds back (v1/core/kv_cache_utils.py checks against the memory less it)."""
    return kv_bytes(tokens, per_token, block) + block * per_token.bytes


def tokens_that_fit(budget: float, per_token: KvPerToken, block: int) -> int:
    """The longest request (a whole number of blocks) a KV cache of `budget` bytes serves."""
    return max(int(budget // (block * per_token.bytes)) - 1 - per_token.extra_blocks, 0) * block
