"""The figures' one registry (core.figures) and the wording every view shows (issue 33, items 3, 11, 15):
display names, never code keys, in the CLI screen, the app's and report's HTML and the gate's messages;
no figure named KL is ever negative; counts and indices read as such; exact ties say so."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from parity_ui.analysis.compare import compare
from parity_ui.analysis.explain import NEAR_TIE_NATS, explain
from parity_ui.render.text import format_workload, verdict_line
from parity_ui.core.bisect_record import Estimate
from parity_ui.core.config import ParityConfig
from parity_ui.core.figures import FIGURE_ROWS, FIGURES, LEGEND, TABLE_ROWS, count, display_name
from parity_ui.core.pooled import FLOOR_FIGURE_NAMES, NOT_IDENTICAL, PairSample, compare_to_floor, workload_stats
from parity_ui.core.types import SideResult, TokenStep, TopLogprob
from parity_ui.core.workload_record import FloorSpec, SideFigures, WorkloadOptions, WorkloadReport
from parity_ui.render.workload import figures_table_html, verdicts_html

ROOT = Path(__file__).resolve().parents[2]
# What users must never see: the code's keys of figures that have a display name.
CODE_KEYS = ("outside_0.9_1.1", "outside_0.99_1.01", "outside_0.999_1.002", "token_mult_prob_error_minus_1",
             "seq_abs_log_ratio_max", "one_minus_pearson", "abs_dlogp_", "abs_dprob_", "abs_kl", "KL (kl)")


def _sample(i: int, gaps: list[float], first: int | None = 2) -> PairSample:
    """dlogp = gap at each token (the side's logprob -1, the reference's -1 - gap)."""
    return PairSample(prompt_index=i, identical=first is None, first_divergence=first, length=len(gaps), verdict=None,
                      logp_side=[-1.0] * len(gaps), logp_ref=[-1.0 - g for g in gaps], positions=list(range(len(gaps))))


def _report(side_gaps: list[list[float]], floor_gaps: list[list[float]], firsts: list[int | None] | None = None
            ) -> WorkloadReport:
    firsts = firsts or [2] * len(side_gaps)
    side = workload_stats([_sample(i, g, f) for i, (g, f) in enumerate(zip(side_gaps, firsts))])
    floor = workload_stats([_sample(i, g, None) for i, g in enumerate(floor_gaps)])
    r = WorkloadReport(options=WorkloadOptions(), floor=FloorSpec("batch", "floor", "the reference at batch 8"),
                       n_prompts=len(side_gaps), done=len(side_gaps))
    r.sides = {"b": SideFigures("b", side, compare_to_floor(side, floor))}
    r.floor_figures = SideFigures("floor", floor)
    return r


def test_every_figure_is_registered_once_with_a_name_and_a_meaning():
    for key in (*FLOOR_FIGURE_NAMES, NOT_IDENTICAL, *(k for k, _ in TABLE_ROWS), "share_identical",
                "identical_wilson_lower", "median_first_divergence"):
        f = FIGURES[key]
        assert f.name and f.meaning and f.name != key or key in ("k3",), key
        assert display_name(key) == f.name
    names = [f.name for f in FIGURES.values()]
    assert len(names) == len(set(names)), "two figures share a display name"
    assert [k for _, k in FIGURE_ROWS] == [k for k, _ in TABLE_ROWS]
    # the gate's metrics are figures too: each has its display name
    from parity_ui.commands.gate.metrics import METRICS
    assert all(m.display for m in METRICS.values())
    # rho is explained wherever the table is
    assert any("ρ = p_ref / p_side" in line for line in LEGEND)


def test_render_takes_its_rows_from_core_not_from_a_command():
    """render may import core and analysis only (its package docstring): the rows live in core.figures."""
    text = (ROOT / "parity_ui" / "render" / "workload.py").read_text()
    assert "commands" not in "".join(re.findall(r"^from \S+ import", text, re.M))


def test_no_figure_named_kl_is_ever_negative_and_each_estimator_is_named():
    # the side puts more mass on its own tokens than the reference does on half of them and less on the
    # rest, more so: mean(logp_side - logp_ref) < 0
    side = [[-0.02, 0.01] * 16 for _ in range(8)]
    r = _report(side, [[0.001, -0.001] * 16 for _ in range(8)])
    stats = r.sides["b"].stats.tokens
    assert stats.k1 < 0 <= stats.k3
    screen = format_workload(r, "RUN")
    html = figures_table_html(r)
    for text in (screen, re.sub(r"<[^>]+>", " ", html)):
        for line in text.splitlines() if text is screen else re.split(r"</tr>", html):
            if "KL" in line and "k3" in line:
                cells = re.sub(r"<[^>]+>", " ", line)
                assert not re.search(r"(?<![\w.])-\d", cells.split("estimate", 1)[1]), line  # k3 >= 0
        assert "mean log-ratio (k1)" in text and "KL(side‖ref), k3 estimate" in text
        assert "KL (kl)" not in text
    # each estimator is named in the legend (the CLI prints it under the table, the HTML too)
    assert all(line in screen for line in LEGEND)
    k1_row = next(line for line in screen.splitlines() if line.strip().startswith("mean log-ratio (k1)"))
    assert re.search(r"-\d", k1_row)  # the estimator that can be negative shows it, under its own name


def test_no_code_key_in_front_of_users():
    # a side over the floor on every figure, with a median first divergence
    r = _report([[0.3, -0.3] * 16 for _ in range(8)], [[0.01, -0.01] * 16 for _ in range(8)])
    v = r.sides["b"].verdict
    assert v.verdict == "exceeds noise"
    texts = {"screen": format_workload(r, "RUN"), "verdict line": verdict_line(v), "summary": v.summary,
             "html": figures_table_html(r) + verdicts_html(r)}
    for where, text in texts.items():
        for key in CODE_KEYS:
            assert key not in text, (where, key)
        assert not re.search(r"\brho\b", text), where  # ρ, explained in the legend
    assert "ρ outside [0.9, 1.1]" in texts["html"] and "ρ outside [0.9, 1.1] 1 vs 0 (floor is zero)" in v.summary


def test_the_gate_names_figures_by_their_display_name():
    from parity_ui.commands.gate.judge import judge
    from parity_ui.commands.gate.spec import Threshold
    r = _report([[0.3, -0.3] * 16 for _ in range(8)], [[0.01, -0.01] * 16 for _ in range(8)])
    whole, = judge(r, ["b"], [Threshold("within_floor", 1.5, 1)])
    per, = judge(r, ["b"], [Threshold("within_floor", None, 1, {"outside_0.9_1.1": 1.5, "abs_dlogp_p99": 2.0})])
    for o in (whole, per):
        assert o.status == "fail"
        for key in CODE_KEYS:
            assert key not in o.message, (key, o.message)
    assert "ρ outside [0.9, 1.1]" in per.message and "|Δlogprob| p99" in per.message


def test_median_first_divergence_is_a_token_index():
    # two prompts forked at 0 and 1: the median prompt forked at token 0, not "0.5"
    r = _report([[0.3] * 4, [0.3] * 4], [[0.0] * 4, [0.0] * 4], firsts=[0, 1])
    seq = r.sides["b"].stats.sequences
    assert seq.median_first_divergence == 0.0
    row = next(line for line in format_workload(r).splitlines() if "median first divergence" in line)
    assert "0.5" not in row and row.split()[-2] == "0"
    assert ">0.5<" not in figures_table_html(r)


def test_counts_read_as_counts():
    assert count(1, "position") == "1 position" and count(2, "position") == "2 positions"
    assert count(1_000, "prompt") == "1,000 prompts"
    one = Estimate(factors=1, best=2, worst=2, one_at_a_time=3, seconds_per_trial=10.0).line()
    assert one.startswith("1 flippable setting: ddmin takes 2 trials ") and "2 to 2" not in one
    assert "20 s to" not in one
    many = Estimate(factors=4, best=4, worst=9, one_at_a_time=6).line()
    assert many.startswith("4 flippable settings: ddmin takes 4 to 9 trials")


def test_cross_scores_say_one_position():
    from parity_ui.analysis.crossscore import key as cross_key
    from parity_ui.core.findings import CrossScores, GapStats
    from parity_ui.core.types import Comparison
    from parity_ui.render import cards
    c = Comparison(a="ref", b="b", identical=False, first_divergence=2, compared=4)
    c.cross_scores = CrossScores(directions={cross_key("b", "ref"): GapStats(
        generator="b", scorer="ref", positions=4, skipped=0, other_disagrees=1, rms_gap=0.1, max_abs_gap=0.2,
        share_outside_band=0.0)})
    text = cards._cross_scores(c)
    assert "1 position where ref" in text and "1 positions" not in text


def _step(pos: int, tid: int, top: list[tuple[int, float]]) -> TokenStep:
    lp = dict(top)[tid]
    return TokenStep(position=pos, token_id=tid, text=f"t{tid}", logprob=lp,
                     rank=[t for t, _ in top].index(tid) + 1, top=[TopLogprob(t, x, f"t{t}") for t, x in top])


def test_an_exact_tie_is_called_a_tie_in_the_verdict_and_the_token_view():
    from parity_ui.render.tokens import Stream, details_json
    # position 1: both sides give tokens 50 and 51 the same logprob; hf's engine listed 51 first
    a = [_step(0, 10, [(10, -0.1), (99, -3.0)]), _step(1, 51, [(51, -0.7), (50, -0.7)])]
    b = [_step(0, 10, [(10, -0.1), (99, -3.0)]), _step(1, 50, [(50, -0.7), (51, -0.7)])]
    ra = SideResult(side="hf", prompt_index=0, steps=a, token_ids=[s.token_id for s in a], finish_reason="length")
    rb = SideResult(side="vllm", prompt_index=0, steps=b, token_ids=[s.token_id for s in b], finish_reason="length")
    e = explain(compare(ra, rb), ra, rb, ParityConfig())
    assert e.verdict == "numerical near-tie" and "an exact tie on hf and vllm" in e.summary
    assert "rank 1 and rank 2 are an arbitrary order" in e.summary and NEAR_TIE_NATS > 0
    data = __import__("json").loads(details_json([Stream("hf", "hf", a, None), Stream("vllm", "vllm", b, 1)]))
    tied = data["steps"]["vllm"][1]
    assert tied[2] == 1 and tied[4] == [2]  # vllm chose its rank 1, tied exactly with its rank 2
    assert len(data["steps"]["vllm"][0]) == 4  # no tie, no fifth item
    from parity_ui.render.assets import JS
    assert "exact tie with rank" in JS


def test_the_readme_config_block_matches_parity_config_show():
    """The README's (or docs/') block of the default config must say what `parity config show --yaml`
    says (issue 33: it claimed the default vLLM side has enforce_eager: true)."""
    shown = yaml.safe_load(ParityConfig().to_yaml())
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        if path.exists():
            blocks += [(path.name, b) for b in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)]
    parsed = [(name, yaml.safe_load(b)) for name, b in blocks if "sides:" in b and "max_new_tokens:" in b]
    # a whole config (a gate spec nests one under its cases and defaults: not this block)
    defaults = [(name, d) for name, d in parsed if isinstance(d, dict) and {"sides", "max_new_tokens"} <= set(d)]
    if not defaults:
        pytest.skip("no block of the default config in README.md or docs/")
    for name, block in defaults:
        for key, value in block.items():
            assert key in shown, f"{name}: {key!r} is not a config key"
            assert value == shown[key], f"{name}: {key}: {value!r}, parity config show says {shown[key]!r}"


def test_too_few_prompts_to_tell_in_the_screen_the_card_and_the_gate():
    import random
    from parity_ui.commands.gate.judge import judge
    from parity_ui.commands.gate.spec import Threshold
    from parity_ui.render.workload import badge_html  # noqa: F401 (the card's badge reads too_few_to_tell)

    def draw(rng: random.Random, n: int) -> list[PairSample]:  # one process: a prompt-level scale, Gaussian gaps
        out = []
        for i in range(n):
            scale = rng.lognormvariate(-5, 1.0)
            side = [-rng.expovariate(1.0) for _ in range(64)]
            out.append(PairSample(i, False, 3, 64, None, side, [min(0.0, a + rng.gauss(0, scale)) for a in side],
                                  list(range(64))))
        return out

    for seed in range(40):
        rng = random.Random(seed)
        side, floor = workload_stats(draw(rng, 16)), workload_stats(draw(rng, 16))
        v = compare_to_floor(side, floor)
        if v.verdict == "too few prompts to tell":
            break
    r = WorkloadReport(options=WorkloadOptions(), floor=FloorSpec("batch", "floor", "x"), n_prompts=16, done=16,
                       sides={"b": SideFigures("b", side, v)}, floor_figures=SideFigures("floor", floor))
    assert r.too_few_to_tell and r.within_noise is False
    line = verdict_line(v)
    assert line.startswith("TOO FEW PROMPTS TO TELL over 16 prompts: ") and "95% interval" in line
    html = verdicts_html(r)
    assert 'data-verdict="too few prompts to tell"' in html and "EXCEEDS" not in html
    o, = judge(r, ["b"], [Threshold("within_floor", 1.5, 1)])
    assert o.status == "fail" and o.message.startswith("side b: too few prompts to tell: over 16 prompts")
    assert "exceeds" not in o.message
