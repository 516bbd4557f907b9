"""Why did two sides' streams fork? A verdict at the first divergence, from what both recorded there.

`explain(comparison, a, b, cfg, differing)` is a pure function of one comparison (both sides' steps,
the comparison, and the settings in which the two sides differ). It returns an Explanation
(parity_ui.core.findings):

- `verdict`: "identical" | "numerical near-tie" | "real disagreement" | "masked token" | "length"
  | "sampling" | "error"; shared-seed sampling also "kept-set near-tie" | "kept sets differ" (the sides
  drew from different kept sets at the fork)
- `summary`: one or two sentences for a human, naming the sides
- `a`, `b`: per side the chosen token, its top-1/top-2 margin, its margin over the other side's
  token, its rank of the other's token; `noise_before`: the largest gap before the fork;
  `differing_settings`: what differs between the two sides' resolved setups.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..core.config import ParityConfig
from ..core.findings import MASKED_LOGPROB, Explanation, SideAtFork
from ..core.measures import ROUTES
from ..core.settings import LABELS
from ..core.types import Comparison, SideResult, TokenStep
from .compare import rank_of, top_margin
from .routes import flip_summary, is_router_near_tie

# Two bf16 ulps at the logit magnitudes of small LMs (|logit| in [16, 32) has a bf16 step of 0.125):
# two tokens closer than this can swap on rounding alone. Measured on the demo model: the bf16 fork
# at token 27 had a vLLM margin of 0.125 and an exact HF tie.
NEAR_TIE_NATS = 0.25
# A margin is also a near-tie when it is within this multiple of the largest logprob gap the two
# sides showed on the same context before the fork: the noise they demonstrably have.
NOISE_MULTIPLE = 2.0
# Rows of the settings diff that are not a setting the note names: what the sides are (engine, its
# software, the model folder, the device as each engine names it) and the KV cache's size, which
# follows from the dtype and the memory given. max_num_seqs is named: it changes which requests share
# a batch, and so the numbers of an engine that is not batch invariant.
_IDENTITY = {"engine", "torch", "python", "environment", "model", "kv_cache_blocks", "device"}
# Of those, the ones that make the two sides different stacks: while one differs, the settings that
# differ are not the ONLY difference (issue 33: "differ only in attention backend" above a finding
# "only in engine (hf vs vllm)"), and each engine resolved its own settings.
_STACK = ("engine", "model", "environment", "python", "torch")
# A shared-seed draw records this sampling margin (or more) when one token was kept and nothing was
# drawn (engines.shared_seed.NO_RUNNER_UP, 1e30: finite for JSON): no margin, never a number to print.
ONE_KEPT = 1e29


def _step(res: SideResult | None, i: int | None) -> TokenStep | None:
    if res is None or i is None or i >= len(res.steps):
        return None
    return res.steps[i]


def _logprob_of(token_id: int | None, step: TokenStep | None) -> float | None:
    if token_id is None or step is None:
        return None
    if step.token_id == token_id:
        return step.logprob
    return next((t.logprob for t in step.top if t.token_id == token_id), None)


def _side(name: str, step: TokenStep | None, other_token: int | None) -> SideAtFork:
    """One side at the divergence: its choice, its confidence, where it put the other's token."""
    if step is None:
        return SideAtFork(name=name)
    other_lp = _logprob_of(other_token, step)
    margin = None
    if step.logprob is not None and other_lp is not None:
        margin = step.logprob - other_lp
    return SideAtFork(
        name=name,
        token_id=step.token_id,
        text=step.text,
        logprob=step.logprob,
        top12_margin=top_margin(step),
        other_token_rank=None if other_token is None else rank_of(other_token, step),
        other_token_logprob=other_lp,
        margin_over_other=margin,
        recorded_k=len(step.top),
        sampling_margin=step.margin,
        kept=step.kept,
        kept_mass=step.kept_mass,
    )


def _masked(*values: float | None) -> bool:
    return any(v is not None and v <= MASKED_LOGPROB for v in values)


def _stopped_summary(c: Comparison, a: SideResult | None, b: SideResult | None) -> tuple[str, dict[str, Any]]:
    sides = {c.a: a, c.b: b}
    short, long_ = (c.a, c.b) if c.lengths[0] < c.lengths[1] else (c.b, c.a)
    s_res, l_res = sides[short], sides[long_]
    last = s_res.token_ids[-1] if s_res and s_res.token_ids else None
    fields = {
        "stopped_side": short,
        "stopped_after": len(s_res.token_ids) if s_res else 0,
        "stopped_finish_reason": s_res.finish_reason if s_res else None,
        "stop_token_id": last,
        "continued_side": long_,
        "continued_to": len(l_res.token_ids) if l_res else 0,
    }
    if s_res is not None and s_res.error:
        return f"{short} failed after {fields['stopped_after']} tokens: {s_res.error}", fields
    if s_res is not None and s_res.finish_reason == "stop" and last is not None:
        text = s_res.steps[-1].text if s_res.steps else ""
        if c.compared and l_res is not None and l_res.token_ids[c.compared - 1] == last:
            why = (
                f"both made {text!r} (id {last}) there, but it is a stop id only for {short}: "
                "the sides were given different EOS/stop ids"
            )
        else:
            why = f"it stopped on {text!r} (id {last})"
        return (
            f"{short} stopped after {fields['stopped_after']} tokens and {long_} went on "
            f"to {fields['continued_to']}: {why}."
        ), fields
    return (
        f"{short} ended after {fields['stopped_after']} tokens (finish={fields['stopped_finish_reason']}) "
        f"while {long_} made {fields['continued_to']}."
    ), fields


def _settings_note(differing: list[str]) -> str:
    """What the sides differ in, never called "only" while they are different stacks (engines,
    environments, model folders): then the settings are what each stack resolved."""
    numeric = [k for k in differing if k not in _IDENTITY]
    if not numeric:
        return ""
    names = ", ".join(LABELS.get(k, k) for k in numeric)
    stack = [k for k in _STACK if k in differing]
    if stack:
        return (
            f" The sides differ in {' and '.join(LABELS.get(k, k) for k in stack)}; as each side resolved "
            f"its settings, also in {names}."
        )
    return f" The sides differ only in {names}." if len(numeric) <= 3 else f" The sides differ in {names}."


def explain(
    c: Comparison | None,
    a: SideResult | None,
    b: SideResult | None,
    cfg: ParityConfig,
    differing: list[str] | None = None,
) -> Explanation:
    """The verdict for one comparison's first divergence (see the module docstring). Never raises
    on missing data: fields it cannot compute are None."""
    base = Explanation(
        verdict="",
        summary="",
        differing_settings=list(differing or []),
        thresholds={"near_tie_nats": NEAR_TIE_NATS, "noise_multiple": NOISE_MULTIPLE, "masked_logprob": MASKED_LOGPROB},
    )
    if c is None:
        return replace(base, verdict="error", summary="no comparison: a side produced no result.")
    noise = c.max_abs_gap
    routes = ROUTES.of(c)  # the routing measure's record (MoE, routes=true), harvested before the explanation
    note = _settings_note(differing or [])
    base = replace(base, index=c.first_divergence, noise_before=noise, sides=[c.a, c.b])
    if c.identical:
        gap = "n/a" if noise is None else f"{noise:.3g}"
        flip = flip_summary(routes, None)
        return replace(
            base,
            verdict="identical",
            summary=f"{c.b} matches {c.a} for all {c.compared} tokens; largest logprob gap {gap} nats."
            + (f" The tokens agree, but {flip}." if flip else "")
            + note,
        )
    d, i = c.divergence, c.first_divergence
    if d is not None and d.reason == "length":
        summary, fields = _stopped_summary(c, a, b)
        failed = {c.a: a, c.b: b}.get(fields["stopped_side"])
        verdict = "error" if failed is not None and failed.error else "length"
        return replace(base, **fields, verdict=verdict, summary=summary)
    sa, sb = _step(a, i), _step(b, i)
    side_a = _side(c.a, sa, sb.token_id if sb else None)
    side_b = _side(c.b, sb, sa.token_id if sa else None)
    out = replace(base, a=side_a, b=side_b, accepted_by_vllm_rule=d.accepted if d else None)
    at = f"at token {i}, {c.a} chose {side_a.text!r} and {c.b} {side_b.text!r}"
    if cfg.shared_seed:
        return _kept_set_fork(out, at, sa, sb, noise, cfg, note) or _shared_seed_verdict(out, at, d, noise, cfg, note)
    if not cfg.greedy:
        return replace(
            out,
            verdict="sampling",
            summary=f"{at}: temperature={cfg.temperature}, each side draws from its own random "
            "stream, so sampled tokens are expected to differ.",
        )
    if _masked(side_a.logprob, side_b.logprob, side_a.other_token_logprob, side_b.other_token_logprob):
        who = c.a if _masked(side_a.logprob, side_a.other_token_logprob) else c.b
        return replace(
            out,
            verdict="masked token",
            summary=f"{at}: {who} recorded a masked logprob (-inf) there: a logits processor "
            "forbade a token (e.g. EOS under min_new_tokens), so the models were not "
            "compared on equal terms.",
        )
    margins = [m for m in (side_a.margin_over_other, side_b.margin_over_other) if m is not None]
    if not margins:  # the other's token is outside one's top-k: fall back to the top-1/top-2 margins
        margins = [m for m in (side_a.top12_margin, side_b.top12_margin) if m is not None]
    worst = max(margins) if margins else None
    tie_bound = (
        max(NEAR_TIE_NATS, NOISE_MULTIPLE * noise) if noise is not None and math.isfinite(noise) else NEAR_TIE_NATS
    )
    out = replace(out, largest_margin=worst, tie_bound=tie_bound)
    in_topk = d is not None and d.accepted
    flip = flip_summary(routes, i)
    if flip and is_router_near_tie(routes):
        # The routing that made the forked token (or an earlier one) chose other experts at a router near-tie:
        # the cause sits in the router, before any logit.
        f = routes.first_flip if routes else None
        assert f is not None  # flip_summary names a flip only when there is one
        return replace(
            out,
            verdict="router near-tie",
            route_layer=f.layer,
            route_step=f.step,
            route_margin=min(m for m in f.margins if m is not None),
            summary=f"{at}: {flip}. Two experts' router scores were that close, so rounding alone can "
            "swap them; the other experts changed the token. Replaying the routes "
            "(replay_routes) tells how much of the gap they explain." + note,
        )
    if flip:
        f = routes.first_flip if routes else None
        assert f is not None  # flip_summary names a flip only when there is one
        out = replace(
            out,
            route_layer=f.layer,
            route_step=f.step,
            route_margin=min((m for m in f.margins if m is not None), default=None),
        )
        note = f" Also, {flip}." + note
    if worst is not None and worst <= tie_bound and in_topk:
        exact = [s.name for s in (side_a, side_b) if s.margin_over_other == 0.0]
        if exact:
            # The two tokens have the same logprob there: the engine's rank 1 and rank 2 are an arbitrary order.
            tie = (
                f"an exact tie on {' and '.join(exact)} (both tokens the same logprob: rank 1 and rank 2 are "
                f"an arbitrary order there)"
            )
            return replace(
                out,
                verdict="numerical near-tie",
                summary=f"{at}: {tie}; each token is in the other's top-k, so rounding alone can flip "
                "it. float32 usually removes it." + note,
            )
        return replace(
            out,
            verdict="numerical near-tie",
            summary=f"{at}: a near-tie; each side preferred its token by at most {worst:.3g} nats "
            f"(bound {tie_bound:.3g}) and each token is in the other's top-k, so rounding "
            "alone can flip it. float32 usually removes it." + note,
        )
    margin_text = "unknown" if worst is None else f"{worst:.3g} nats"
    return replace(
        out,
        verdict="real disagreement",
        summary=f"{at}: a real disagreement; margin {margin_text} (near-tie bound {tie_bound:.3g})"
        + ("" if in_topk else ", and a token is outside the other's top-k")
        + ". Look for a config difference (see warnings) or a model-loading difference."
        + note,
    )


def _shared_seed_verdict(
    out: Explanation, at: str, d: Any, noise: float | None, cfg: ParityConfig, note: str
) -> Explanation:
    """Both sides drew with the same noise: they part where the numerics moved the perturbed maximum.
    Each side's sampling margin (its perturbed top-2 gap) is what its numbers had to move; the sum of
    the two sides' gaps between the two tokens is their logprob drift / T, so a margin within the
    near-tie bound (over T) is a flip of rounding, the sampled counterpart of a greedy near-tie."""
    sa, sb = out.a, out.b
    margins = [
        m
        for m in (sa.sampling_margin if sa else None, sb.sampling_margin if sb else None)
        if m is not None and m < ONE_KEPT
    ]
    bound = (
        max(NEAR_TIE_NATS, NOISE_MULTIPLE * noise) if noise is not None and math.isfinite(noise) else NEAR_TIE_NATS
    ) / cfg.temperature
    kept = [
        f"{s.name} from {s.kept:,} kept tokens (S = {s.kept_mass:.3g})"
        for s in (sa, sb)
        if s is not None and s.kept is not None and s.kept_mass is not None
    ]
    drawn = (" Drawn " + ", ".join(kept) + ".") if kept else ""
    if not margins:
        return replace(
            out,
            verdict="real disagreement",
            tie_bound=bound,
            summary=f"{at}: shared-seed sampling, but no side recorded its draw (sampling margin not "
            "recorded), so the fork cannot be weighed." + drawn + note,
        )
    worst = max(margins)
    out = replace(out, largest_margin=worst, tie_bound=bound)
    # Not vLLM's top-k rule: a sampled token is seldom in the other side's raw top-k at T=1. What
    # matters is that BOTH draws were close calls (each side's runner-up nearly won).
    both = len(margins) == 2
    if worst <= bound and both:
        return replace(
            out,
            verdict="numerical near-tie",
            summary=f"{at}: a sampling-margin near-tie; with the same noise each side's drawn token led "
            f"its runner-up by at most {worst:.3g} nats (bound {bound:.3g} at T={cfg.temperature:g}), "
            "so rounding alone can move the sample." + drawn + note,
        )
    return replace(
        out,
        verdict="real disagreement",
        summary=f"{at}: a real disagreement under the same noise; sampling margin {worst:.3g} nats "
        f"(near-tie bound {bound:.3g} at T={cfg.temperature:g})"
        + ("" if both else ", recorded by one side only")
        + ": the sides' distributions differ there, not just their rounding."
        + drawn
        + note,
    )


def _prefix_mass(step: TokenStep, k: int) -> float | None:
    """The raw (T=1) probability of the side's own k most likely tokens, from its recorded top-k;
    None when it recorded fewer than k."""
    if len(step.top) < k:
        return None
    return math.fsum(math.exp(t.logprob) for t in step.top[:k])


def _kept_set_fork(
    out: Explanation,
    at: str,
    sa: TokenStep | None,
    sb: TokenStep | None,
    noise: float | None,
    cfg: ParityConfig,
    note: str,
) -> Explanation | None:
    """Shared-seed sides whose kept sets differ at the fork drew from different sets: the same noise
    cannot give the same token, so the fork is the sets' doing, not the draw's (issue 46 item 3: a
    top-p cut that fell between the sides' top-token masses, 0.7825 and 0.8029 around 0.8, was called
    a real disagreement with a sampling margin of 1e+30, the one-token placeholder). Named as such,
    with both sides' masses at the boundary; a near-tie when they are within the near-tie bound in
    nats (the sampled counterpart of two logits a rounding apart). None when the sets agree."""
    if sa is None or sb is None or out.a is None or out.b is None:
        return None
    if sa.kept_hash is None or sb.kept_hash is None or sa.kept_hash == sb.kept_hash:
        return None  # the same set (or no fingerprints to tell by: a run stored before they were recorded)
    a, b = out.a, out.b
    sizes = [
        f"{s.name} kept {s.kept:,} token{'s' if s.kept != 1 else ''} (S = {s.kept_mass:.4g})"
        for s in (a, b)
        if s.kept is not None and s.kept_mass is not None
    ]
    sets = f"the kept sets differ at the fork ({', '.join(sizes)})" if sizes else "the kept sets differ at the fork"
    bound = max(NEAR_TIE_NATS, NOISE_MULTIPLE * noise) if noise is not None and math.isfinite(noise) else NEAR_TIE_NATS
    out = replace(out, tie_bound=bound)
    tail = ": the same noise over different sets draws different tokens." + note
    if sa.kept is None or sb.kept is None or sa.kept == sb.kept:
        return replace(
            out,
            verdict="kept sets differ",
            summary=f"{at}: {sets}, with other members: a token sat inside the cut on one side and outside "
            "it on the other" + tail,
        )
    few, many = (a, b) if sa.kept < sb.kept else (b, a)
    k = few.kept
    assert k is not None  # few is out.a or out.b, whose kept is sa.kept or sb.kept: both checked above
    top_p_alone = cfg.top_p < 1.0 and cfg.min_p == 0.0 and cfg.top_k == 0
    if top_p_alone and cfg.temperature == 1.0:
        # Top-p keeps each side's own most likely tokens until their mass reaches top_p: the side that
        # kept k reached it with k, the other did not. Their k-token masses are the boundary, from the
        # recorded top-k (raw logprobs; at T=1 the cut's distribution is the raw one).
        m_few = _prefix_mass(sa if few is a else sb, k)
        m_many = _prefix_mass(sb if few is a else sa, k)
        if m_few is not None and m_many is not None and 0 < m_few < 1 and 0 < m_many < 1:
            # In log-odds: moving the kept tokens' logits together by d moves log(m / (1 - m)) by d,
            # so this gap is the logit shift between the two sides' boundaries, on the near-tie's scale.
            gap = abs(math.log(m_few / (1 - m_few)) - math.log(m_many / (1 - m_many)))
            out = replace(out, largest_margin=gap)
            top = "the top token" if k == 1 else f"the top {k} tokens"
            boundary = (
                f"{top} held {m_few:.4f} of {few.name}'s distribution (at or over top_p {cfg.top_p:g}: "
                f"{'it' if k == 1 else 'they'} alone kept) and {m_many:.4f} of {many.name}'s (under it: more "
                "kept)"
            )
            if gap <= bound:
                return replace(
                    out,
                    verdict="kept-set near-tie",
                    summary=f"{at}: a top-p boundary near-tie; {sets}: {boundary}, {gap:.3g} nats "
                    f"apart in log-odds (bound {bound:.3g}), so rounding alone moved the cut" + tail,
                )
            return replace(
                out,
                verdict="real disagreement",
                summary=f"{at}: {sets}: {boundary}, {gap:.3g} nats apart in log-odds (near-tie bound "
                f"{bound:.3g}): the distributions differ there, not just their rounding" + tail,
            )
    cuts = [c for c, on in (("min_p", cfg.min_p > 0), ("top_k", cfg.top_k > 0), ("top_p", cfg.top_p < 1)) if on]
    if cfg.temperature != 1.0:
        unknown = f"at T={cfg.temperature:g} the cut is on the tempered distribution, which the recorded raw top-k cannot rebuild"
    elif not top_p_alone:
        unknown = "the boundary of a min_p or top_k cut is not a mass the recorded top-k shows"
    else:
        unknown = f"the recorded top-{len(sa.top)} is shorter than the kept set"
    return replace(
        out,
        verdict="kept sets differ",
        summary=f"{at}: {sets}; the {'/'.join(cuts) or 'kept-set'} cut fell between them ({unknown}, so the "
        "masses at the boundary are not known)" + tail,
    )
