"""Shared-seed sampling: every side draws its sampled token with the SAME Gumbel noise.

Why: two engines that sample from their own random streams part at the first sampled token by
design, so a sampled run cannot be compared token by token. With Gumbel-max and noise that is a pure
function of (seed, prompt, position, token id), two sides with the same distribution pick the same
token; they part only where their numerics move the perturbed maximum (Token-DiFR, arXiv 2511.20621;
SGLang's deterministic `multinomial_with_seed`).

The noise: a 32-bit integer hash (lowbias32, Chris Wellons' hash prospector) chained over the
seed, the prompt's key (blake2b of its token ids: the prompt's identity, the same in every engine),
the generated-token index and the token id, computed with int64 tensor ops whose every product stays
below 2^49 (no signed overflow, so the same bits on any device) -> u = (h + 0.5) / 2^32, exact in
float64 -> g = -log(-log(u)) in float64. The uniform is bit-identical everywhere; the two logs are
the device's float64 libm, which may differ from another device's in the last float64 ulp (1e-16):
eight orders of magnitude below one float32 logit step, so it cannot move a choice that the logits
themselves do not.

The draw (`draw`) is ONE implementation used by every engine (HF through `HfSharedSeedProcessor`,
vLLM through parity_ui.engines.vllm_shared_seed): on the float32 logits row, in float64,
x = logits / T; then parity-ui's own kept set, in vLLM's order: min_p (p >= min_p * p_max), top_k
(the k largest; 0 = off), top_p (the smallest set, best first, whose mass over what is left reaches
top_p; 1 = off); the token is argmax over the kept set of x + g. The engine then takes that token as
a greedy choice (every other logit set to -inf), so its own sampler and random stream play no part
and its raw logprobs stay the model's. Per token it records the kept set's size, its mass S under
the side's own raw distribution (T=1, what a trainer's log-softmax sees), the processed logprob
(renormalised over the kept set at temperature T) and the sampling margin: the perturbed top-2 gap
(how far the chosen token's x + g is ahead of the runner-up's; +inf when one token was kept).

Runs inside workers (imports torch); the records cross the pipe as plain floats.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import torch

M32 = 0xFFFFFFFF
_C_SEED, _C_POS, _C_TOK, _C_ROUND = 0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F
EXTRA_ARGS_KEY = "parity_shared_seed"  # the key of vLLM's SamplingParams.extra_args this sampler reads
NO_RUNNER_UP = 1e30  # the margin when one token was kept (no draw): finite, so JSON carries it


# -- the hash --------------------------------------------------------------------------------------
def mix32(x: int) -> int:
    """lowbias32 on a Python int in [0, 2^32)."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def _mul32(x: Any, m: int) -> Any:
    """(x * m) mod 2^32 for an int64 tensor x in [0, 2^32) and m < 2^32, in 16-bit halves: every
    intermediate is below 2^49, so no int64 product overflows on any device."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * m + (((hi * m) & 0xFFFF) << 16)) & M32


def mix32_t(x: Any) -> Any:
    """lowbias32 on an int64 tensor of values in [0, 2^32): the same bits as `mix32`."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def prompt_key(prompt_ids: list[int]) -> int:
    """A prompt's identity: 64 bits of blake2b over its token ids (little-endian int64)."""
    data = b"".join(int(t).to_bytes(8, "little", signed=True) for t in prompt_ids)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def row_key(seed: int, key: int, position: int) -> tuple[int, int]:
    """The two 32-bit words that seed one position's noise row."""
    h = mix32((seed & M32) ^ _C_SEED)
    h = mix32(h ^ ((seed >> 32) & M32))
    h = mix32(h ^ (key & M32))
    h = mix32(h ^ ((key >> 32) & M32))
    h = mix32(h ^ mix32((position + _C_POS) & M32))
    return h, mix32(h ^ _C_ROUND)


_TOKEN_MIX: dict[tuple[int, str], Any] = {}


def _token_mix(vocab: int, device: Any) -> Any:
    """mix32(token id ^ C) for every id: the same for every row, so kept per (vocab, device)."""
    k = (vocab, str(device))
    if k not in _TOKEN_MIX:
        _TOKEN_MIX[k] = mix32_t(torch.arange(vocab, dtype=torch.int64, device=device) ^ _C_TOK)
    return _TOKEN_MIX[k]


def uniforms(seed: int, keys: list[tuple[int, int]], vocab: int, device: Any = "cpu") -> Any:
    """[len(keys), vocab] float64 uniforms in (0, 1), one row per (prompt key, position)."""
    words = torch.tensor([row_key(seed, k, p) for k, p in keys], dtype=torch.int64, device=device)
    tok = _token_mix(vocab, device)[None, :]
    h = mix32_t(tok ^ words[:, :1])
    h = mix32_t(h ^ words[:, 1:])
    return (h.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)


def gumbel(seed: int, keys: list[tuple[int, int]], vocab: int, device: Any = "cpu") -> Any:
    """[len(keys), vocab] float64 standard Gumbel noise: -log(-log(u))."""
    return -torch.log(-torch.log(uniforms(seed, keys, vocab, device)))


# -- the draw ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """What a side samples with (the canonical config's values; 0 / 1 mean off as there)."""

    seed: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        return cls(
            int(d["seed"]),
            float(d["temperature"]),
            float(d.get("top_p", 1.0)),
            int(d.get("top_k", 0)),
            float(d.get("min_p", 0.0)),
        )


@dataclass
class Drawn:
    """One row's draw: the token and what the run records of it."""

    token_id: int
    margin: float  # perturbed top-2 gap, nats (NO_RUNNER_UP when one token was kept)
    kept: int  # tokens in the kept set
    kept_mass: float  # S: the kept set's mass under the side's raw (T=1) distribution
    processed_logprob: float  # the token's logprob at temperature T, renormalised over the kept set
    kept_hash: int = 0  # the kept set's fingerprint (equal sets, equal prints): do two sides' sets agree?


def kept_mask(x: Any, s: Settings) -> Any:
    """Boolean [n, vocab]: the kept set of each row of x = logits / T (float64), min_p -> top_k -> top_p."""
    keep = torch.ones_like(x, dtype=torch.bool)
    if s.min_p > 0:
        p = torch.softmax(x, dim=-1)
        keep &= p >= s.min_p * p.max(dim=-1, keepdim=True).values
    if 0 < s.top_k < x.shape[-1]:
        kth = torch.topk(x, s.top_k, dim=-1).values[:, -1:]
        keep &= x >= kth
    if s.top_p < 1.0:
        p = torch.softmax(x.masked_fill(~keep, -math.inf), dim=-1)
        order = torch.argsort(p, dim=-1, descending=True, stable=True)
        sorted_p = p.gather(-1, order)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the better tokens
        keep_sorted = before < s.top_p
        keep_sorted[:, 0] = True
        by_top_p = torch.zeros_like(keep).scatter(-1, order, keep_sorted)
        keep &= by_top_p
    return keep


FINGERPRINT_BITS = 52  # a JSON number holds it exactly


def kept_fingerprint(keep: Any) -> Any:
    """Per row, the sum of the kept ids' hashes mod 2^52: order-free, equal for equal sets, and two
    different sets collide with odds of about 2^-52 (the sum of at most 2^31 32-bit values stays in int64)."""
    tok = _token_mix(keep.shape[-1], keep.device)
    return (tok[None, :] * keep).sum(dim=-1) & ((1 << FINGERPRINT_BITS) - 1)


def draw(logits: Any, s: Settings, keys: list[tuple[int, int]]) -> tuple[Any, list[Drawn]]:
    """The shared-seed choice of each row of `logits` ([n, vocab], any float dtype), keys[i] = (prompt
    key, generated-token index). Returns (the chosen ids as an int64 tensor on logits' device, records)."""
    if s.temperature <= 0:
        raise ValueError("shared-seed draw at temperature 0: that is greedy, and no noise is drawn")
    raw = logits.to(torch.float64)
    x = raw / s.temperature
    keep = kept_mask(x, s)
    g = gumbel(s.seed, keys, raw.shape[-1], raw.device)
    perturbed = (x + g).masked_fill(~keep, -math.inf)
    two = torch.topk(perturbed, min(2, raw.shape[-1]), dim=-1)
    chosen = two.indices[:, 0]
    margin = two.values[:, 0] - two.values[:, 1] if raw.shape[-1] > 1 else torch.full_like(two.values[:, 0], math.inf)
    mass = (torch.softmax(raw, dim=-1) * keep).sum(dim=-1)
    processed = torch.log_softmax(x.masked_fill(~keep, -math.inf), dim=-1).gather(-1, chosen[:, None])[:, 0]
    n_kept = keep.sum(dim=-1)
    prints = kept_fingerprint(keep)
    records = [
        Drawn(int(t), float(m) if math.isfinite(m) else NO_RUNNER_UP, int(k), float(sm), float(lp), int(h))
        for t, m, k, sm, lp, h in zip(
            chosen.tolist(), margin.tolist(), n_kept.tolist(), mass.tolist(), processed.tolist(), prints.tolist()
        )
    ]
    return chosen, records


def force(logits: Any, chosen: Any) -> Any:
    """New logits that an engine's greedy argmax turns into `chosen`: 0 there, -inf elsewhere. Never in
    place: transformers keeps the very tensor it hands the processors as its raw `output_logits`."""
    out = torch.full_like(logits, -math.inf)
    return out.scatter_(-1, chosen.view(-1, 1).to(logits.device), 0.0)


class HfSharedSeedProcessor:
    """A transformers logits processor (the last of generate's list): the shared-seed draw of every
    row, then every other token masked so generate's greedy argmax takes it. Rows are the batch's
    prompts, left padded to `width`: the position is the tokens generated so far."""

    def __init__(self, settings: Settings, prompts: list[list[int]], width: int):
        self.settings = settings
        self.keys = [prompt_key(p) for p in prompts]
        self.width = width
        self.records: list[list[Drawn]] = [[] for _ in prompts]  # per row, per generated token

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        position = input_ids.shape[1] - self.width
        chosen, drawn = draw(scores, self.settings, [(k, position) for k in self.keys])
        for row, d in enumerate(drawn):
            self.records[row].append(d)
        return force(scores, chosen)
