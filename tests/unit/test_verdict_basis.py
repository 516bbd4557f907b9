"""A verdict against the noise floor names the figure that decided it (issue 46 item 2): a replay whose
ρ band share sits at the floor's while its mean log-ratio (k1) is over it must not read as if the
band share were what exceeds. Pure: pooled figures of synthetic pairs, no engine."""
from __future__ import annotations

import random

from parity_ui.core.replay_record import FLOOR_PAIR, RECORDED_PAIR, ReplayPair, ReplayRecord
from parity_ui.core.pooled import EXCEEDS, PairSample, compare_to_floor, workload_stats
from parity_ui.core.workload_record import FloorSpec, SideFigures, WorkloadOptions, WorkloadReport


def _pairs(bias: float, seed: int, n: int = 256, tokens: int = 50) -> list[PairSample]:
    """`n` prompts whose side leans `bias` nats above the reference on every token (a k1 drift),
    and about 0.9% of tokens 0.3 nats apart either way (outside [0.8, 1.2]) on both the side and the floor."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ref = [-0.5 - rng.expovariate(1.5) for _ in range(tokens)]
        gaps = [bias + rng.gauss(0, 0.002) for _ in range(tokens)]
        if rng.random() < 0.45:
            gaps[rng.randrange(tokens)] = rng.choice([-0.3, 0.3])
        out.append(PairSample(prompt_index=i, identical=True, first_divergence=None, length=tokens, verdict=None,
                              logp_side=[r + g for r, g in zip(ref, gaps)], logp_ref=ref,
                              positions=list(range(tokens))))
    return out


def _replay_report() -> WorkloadReport:
    side, floor = workload_stats(_pairs(0.0017, 1)), workload_stats(_pairs(0.0, 2))
    verdict = compare_to_floor(side, floor)
    assert verdict.verdict == EXCEEDS and verdict.exceeded == ["abs_kl"]  # the k1 drift alone decides
    pairs = [
        ReplayPair(kind=RECORDED_PAIR, a="hf", b="recorded", meaning="the rollout against the trainer"),
        ReplayPair(kind=FLOOR_PAIR, a="hf", b="floor", meaning="the trainer against itself", side="floor"),
    ]
    record = ReplayRecord(dump="d.jsonl", format="verl", rows=256, tokens=12800, pairs=pairs)
    return WorkloadReport(options=WorkloadOptions(mode="replay"), floor=FloorSpec("batch", "floor", "the floor"),
                          n_prompts=256, done=256,
                          sides={"recorded vs hf": SideFigures("recorded vs hf", side, verdict)},
                          floor_figures=SideFigures("floor", floor),
                          replay=record)


def test_the_replay_headline_names_the_figure_that_decided_with_its_floor_and_interval():
    from parity_ui.commands.replay import replay_headline

    report = _replay_report()
    line = replay_headline(report)
    k1 = report.sides["recorded vs hf"].verdict.figures[[c.name for c in report.sides["recorded vs hf"].verdict.figures].index("abs_kl")]
    assert f"exceeds noise on |mean log-ratio (k1)| {k1.side:.3g} vs the floor's {k1.floor:.3g}" in line, line
    assert "95% interval" in line, line
    # The band share is shown beside the floor's, not beside the verdict as if it had decided it.
    band = report.sides["recorded vs hf"].stats.tokens.outside[-1].outside
    floor_band = report.floor_figures.stats.tokens.outside[-1].outside
    assert f"ρ outside [0.8, 1.2] {100 * band:.2g}% (the floor's {100 * floor_band:.2g}%)" in line, line
    assert "(exceeds noise)" not in line


def test_the_replay_pairs_table_names_what_each_verdict_rests_on():
    from parity_ui.render.sections.replay_pairs import pairs_html

    report = _replay_report()
    html = pairs_html(report)
    assert "exceeds noise (|mean log-ratio (k1)|)" in html
    assert 'title="exceeds noise on |mean log-ratio (k1)|' in html
