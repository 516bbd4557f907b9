"""The whole next-token distribution (issue 31 item 3) without engines: KL both ways and TV on known
distributions, never negative, the rows files and where they meet, pooling, the floor verdict, the
memory budget, and a scored workload on the fake kind, whose sides cannot give full rows (named, the run
goes on). The real engines run it in tests/engines/test_sampling_engines.py."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from parity_ui.core.config import build_config
from parity_ui.core.distribution import Budget, DistributionPool, clamp_kl, pool
from parity_ui.core.pooled import distribution_against_floor as against_floor
from parity_ui.core.errors import ConfigError
from parity_ui.core.figures import FAMILIES, FIGURES, display_name
from parity_ui.core.requests import Rows
from parity_ui.core.types import StepColumns, TokenStep
from parity_ui.engines.full_distribution import (RowsMissing, device_narrowed, meet, narrowed, read_rows, row_figures,
                                                widened, write_rows)
from parity_ui.engines.step_rows import BITS, INDEX, WIDE, StepLog


def _stepped(log, step_rows):
    """One decode step into a step log as vLLM's processor on the CPU puts it: one block, bits where
    every row is exactly bfloat16, else float32. step_rows: [(path, position, float32 row)]."""
    block = np.stack([r for _, _, r in step_rows])
    bits = narrowed(block)
    kind = BITS if bits.dtype == np.int16 else WIDE
    log.write(kind, log.reserve(kind, [(p, i) for p, i, _ in step_rows]), bits)


def _logits(p):
    return torch.log(torch.tensor(p, dtype=torch.float64))


def test_kl_and_tv_of_known_distributions():
    ref, side = _logits([[0.5, 0.5], [0.9, 0.1]]), _logits([[0.9, 0.1], [0.9, 0.1]])
    f = row_figures(ref, side, k=1)
    kl = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    kl_rev = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert f["kl"][0].item() == pytest.approx(kl, rel=1e-12)
    assert f["kl_rev"][0].item() == pytest.approx(kl_rev, rel=1e-12)
    assert f["tv"][0].item() == pytest.approx(0.4, rel=1e-12)
    assert f["kl"][1].item() == 0.0 and f["tv"][1].item() == 0.0  # equal rows: exactly zero
    assert f["top1"].tolist() == [1, 1]  # argmax of [0.5, 0.5] is token 0, as of [0.9, 0.1]
    # top-k containment: the reference's argmax (token 2) among the side's 2 best?
    ref3, side3 = _logits([[0.1, 0.2, 0.7]]), _logits([[0.5, 0.3, 0.2]])
    assert row_figures(ref3, side3, k=1)["topk"].tolist() == [0]
    assert row_figures(ref3, side3, k=3)["topk"].tolist() == [1]
    assert row_figures(ref3, side3, k=3)["top1"].tolist() == [0]


def test_kl_is_never_negative_and_a_token_only_one_side_can_emit_is_finite():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200, 1000, generator=g, dtype=torch.float32)
    near = a + 1e-7 * torch.randn(200, 1000, generator=g)  # float rounding-sized differences
    for x, y in ((a, a), (a, near), (near, a)):
        f = row_figures(x, y, k=5)
        assert f["kl"].min().item() >= 0.0 and f["kl_rev"].min().item() >= 0.0
        assert f["tv"].min().item() >= 0.0
    assert clamp_kl(-1e-17) == 0.0 and clamp_kl(3e-9) == 3e-9
    masked = torch.tensor([[0.0, 0.0, -math.inf]], dtype=torch.float64)
    f = row_figures(torch.zeros(1, 3, dtype=torch.float64), masked, k=2)
    assert math.isfinite(f["kl"].item()) and f["kl"].item() >= 1e29  # p_ref > 0 where p_side = 0: infinite KL
    assert f["kl_rev"].item() == pytest.approx(math.log(1.5), rel=1e-12)


def test_rows_written_whole_or_a_step_at_a_time_meet_into_scalars(tmp_path):
    g = torch.Generator().manual_seed(1)
    side = torch.randn(5, 64, generator=g)
    other = torch.randn(3, 64, generator=g)
    ref = side + 0.05 * torch.randn(5, 64, generator=g)
    whole, stepped, short = str(tmp_path / "whole.npy"), str(tmp_path / "b-0.npy"), str(tmp_path / "b-1.npy")
    write_rows(whole, side)
    # vLLM's shape: two sequences of one batch share a log, a step's rows one block; max_tokens 8, the
    # first stops at 5, the second at 3 (its later steps carry only the first sequence's row).
    log = StepLog(stepped, vocab=64)
    log.add(stepped, 8)
    log.add(short, 8)
    for i in range(5):
        _stepped(log, [(stepped, i, side[i].numpy())] + ([(short, i, other[i].numpy())] if i < 3 else []))
    assert not os.path.exists(stepped + INDEX)  # an index appears only when its batch is closed
    assert log.finish([stepped, short, str(tmp_path / "never.npy")]) == [str(tmp_path / "never.npy")]
    assert sorted(os.listdir(tmp_path)) == ["b-0.npy.steps.json", "b-0.steps.f32", "b-1.npy.steps.json", "whole.npy"]
    a = meet(ref, Rows(read=whole, read_is="side", k=3), 5)
    b = meet(ref, Rows(read=stepped, read_is="side", k=3), 5)
    assert a == b and len(a["kl"]) == 5
    want = row_figures(ref, side, 3)
    assert a["kl"] == pytest.approx(want["kl"].tolist(), rel=1e-6)
    assert torch.equal(read_rows(short), other)  # rows stop where the sequence did
    with pytest.raises(RowsMissing):
        meet(ref, Rows(read=short, read_is="side", k=3), 5)  # 3 rows, 5 needed
    # The same pair met from the other end (the floor meeting the reference's rows): KL swaps direction.
    write_rows(str(tmp_path / "ref.npy"), ref)
    c = meet(side, Rows(read=str(tmp_path / "ref.npy"), read_is="ref", k=3), 5)
    assert c["kl"] == pytest.approx(a["kl"], rel=1e-6) and c["kl_rev"] == pytest.approx(a["kl_rev"], rel=1e-6)
    with pytest.raises(ValueError, match="vocabularies differ"):
        meet(torch.zeros(5, 65), Rows(read=whole), 5)


def test_pooling_gives_llama_cpp_figures_and_skips_unrecorded_positions():
    cols = [{"kl": [0.0, 0.1, 0.2, None], "kl_rev": [0.0, 0.1, 0.3, None], "tv": [0.0, 0.05, 0.1, None],
             "top1": [1, 1, 0, None], "topk": [1, 1, 1, None]},
            {"kl": [0.3], "kl_rev": [0.3], "tv": [0.2], "top1": [1], "topk": [0]},
            {"kl": None}]  # a pair with nothing recorded
    p = pool(cols)
    figs = p.figures()
    assert figs["positions"] == 4
    assert figs["kl_mean"] == pytest.approx(0.15) and figs["kl_max"] == 0.3
    assert figs["kl_p90"] == pytest.approx(float(np.quantile([0, 0.1, 0.2, 0.3], 0.9)))
    assert figs["kl_p99"] == pytest.approx(float(np.quantile([0, 0.1, 0.2, 0.3], 0.99)))
    assert figs["top1_agree"] == 0.75 and figs["top1_differ"] == 0.25 and figs["topk_contained"] == 0.75
    assert set(FAMILIES["distribution"]) <= set(figs)  # every registered figure is computed
    both = DistributionPool()
    both.add(p)
    both.add(p)
    assert both.figures()["kl_mean"] == pytest.approx(0.15) and both.figures()["positions"] == 8
    assert DistributionPool().figures()["kl_mean"] is None
    assert figs["kl_decades"] == {"0": 1, "-1": 3}  # 0, 0.1, 0.2, 0.3
    from parity_ui.core.distribution import kl_decades
    assert kl_decades([1e-12, 5e-12, 1e-20, 1e5, 0.0]) == {"-12": 2, "-16": 1, "2": 1, "0": 1}
    # Display names, no code identifiers.
    assert display_name("kl_mean") == "KL(ref‖side) mean" and FIGURES["kl_rev_p99"].name == "KL(side‖ref) p99"
    assert FIGURES["top1_agree"].format(0.75) == "75%"


def test_the_floor_verdict_reads_like_the_token_figures():
    floor = {"positions": 100, "kl_mean": 1e-4, "kl_rev_mean": 1e-4, "tv_mean": 0.01, "kl_p99": 1e-3,
             "top1_differ": 0.01}
    same = against_floor(dict(floor), floor)
    assert same.startswith("full distribution: within noise") and "KL(ref‖side) mean" in same
    worse = against_floor({**floor, "kl_mean": 1e-2, "tv_mean": 0.2}, floor)
    assert "exceeds noise (KL(ref‖side) mean, total variation mean)" in worse
    assert against_floor({**floor, "kl_mean": 2e-4}, floor).startswith("full distribution: within")  # < 1.5²
    assert against_floor(floor, None) is None and against_floor({"positions": 0}, floor) is None


def test_a_vocabulary_over_the_budget_is_refused_with_the_budget_named():
    Budget(1024).check(49152, 128)  # the demo model: 24 MiB a sequence
    with pytest.raises(ConfigError, match=r"over the memory budget of 16 MiB \(full_distribution_budget_mb\)"):
        Budget(16).check(152064, 4096)
    cfg = build_config(None, ["full_distribution=true", "full_distribution_budget_mb=64"])
    assert cfg.full_distribution and cfg.full_distribution_budget_mb == 64
    assert not build_config(None, []).full_distribution  # off by default
    with pytest.raises(ConfigError, match="full_distribution_budget_mb"):
        build_config(None, ["full_distribution_budget_mb=0"])


def test_distribution_columns_are_optional_step_columns():
    steps = [TokenStep(0, 5, "a", -0.1, 1, kl=0.01, kl_rev=0.02, tv=0.03, top1=1, topk=1),
             TokenStep(1, 6, "b", -0.2, 1)]
    cols = StepColumns.from_steps(steps)
    assert cols.column("kl") == [0.01, None] and cols[0].topk == 1 and cols[1].kl is None
    assert "kl" in cols.columns() and StepColumns(cols.columns()) == steps
    assert "kl" not in StepColumns.from_steps([TokenStep(0, 5, "a", -0.1, 1)]).columns()  # absent = not recorded


def test_a_scored_workload_whose_sides_cannot_give_rows_names_them_and_goes_on(tmp_path):
    from fake_engine import fake_model, fake_service, registered
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.inputs.prompts import PromptSpec

    with registered():
        model = str(fake_model(tmp_path / "fake", max_position_embeddings=64))
        with fake_service(tmp_path / "runs.db") as svc:
            cfg = build_config(None, ["max_new_tokens=6", "full_distribution=true"], sides=["ref=fake", "b=fake"])
            run = run_workload(svc, WorkloadRequest(model=model, prompts=[PromptSpec(text=f"x{i}") for i in range(3)],
                                                    config=cfg, options=WorkloadOptions(mode="scored", floor="none")))
    assert run.status == "ok", run.error
    named = [w for w in run.warnings if w.code == "full-distribution-unavailable"]
    assert {w.message.split()[2] for w in named} == {"ref", "b"}
    assert "its pair has no distribution figures" in named[0].message
    assert run.workload.sides["b"].stats.family("distribution") is None  # not recorded, never 0
    assert run.workload.sides["b"].stats.tokens.pairs == 18  # the rest of the run stands
    # The views read the family wherever a run recorded it (here planted on the stored report).
    from parity_ui.render.text import format_workload
    from parity_ui.render.workload import figures_table_html

    w = run.workload
    w.sides["b"].stats.families["distribution"] = {**pool([{"kl": [0.01, 0.03], "kl_rev": [0.02, 0.02], "tv": [0.1, 0.2],
                                                "top1": [1, 0], "topk": [1, 1]}]).figures()}
    w.sides["b"].verdicts["distribution"] = "full distribution: within noise: KL(ref‖side) mean 0.02 vs 0.02"
    html, text = figures_table_html(w), format_workload(w)
    for out in (html, text):
        assert "KL(ref‖side) mean" in out and "KL(ref‖side) p99" in out and "top-1 agreement" in out
        assert "50%" in out and "full distribution: within noise" in out
    assert "kl_mean" not in html and "kl_mean" not in text  # display names only
    assert "the whole distribution (full rows)" in html
    assert "KL(ref‖side) per position, each side against the floor" in html  # the KL distribution, drawn


def test_the_sampling_family_is_judged_against_the_floor_by_wilson_intervals():
    from parity_ui.core.pooled import sampling_against_floor

    floor = {"tokens": 1000, "renorm_outside_0.9_1.1": 0.01, "kept_sets_differ": 0.02}
    assert "within the floor" in sampling_against_floor({**floor, "renorm_outside_0.9_1.1": 0.012}, floor)
    over = sampling_against_floor({**floor, "tokens": 1000, "renorm_outside_0.9_1.1": 0.2}, floor)
    assert "above the floor (renormalised ratio outside [0.9, 1.1])" in over and "1,000 drawn" in over
    assert sampling_against_floor(floor, None) is None
    # kept_sets_differ is over the sets compared (every token and every fork's): 30/120 against 6/120 is
    # above the floor, which an interval over the 20 tokens alone hid.
    side_k = {"tokens": 20, "sets_compared": 120, "kept_sets_differ": 30 / 120}
    floor_k = {"tokens": 20, "sets_compared": 120, "kept_sets_differ": 6 / 120}
    got = sampling_against_floor(side_k, floor_k)
    assert "above the floor (" in got and "25.0% [18.1-33.4%]" in got and "5.0% [2.3-10.5%]" in got


def _plan(mode, *kinds, cross=True, findings=None, floor=None, chunk=1):
    """The distribution measure's view of a run: its sides (real kinds: what they can do with rows)."""
    from types import SimpleNamespace as NS

    from parity_ui.core.kinds import KINDS
    from parity_ui.measures.base import Plan

    cfg = build_config(None, ["full_distribution=true", "max_new_tokens=4", f"cross_score={'true' if cross else 'false'}"])
    sides = [NS(name=name, kind=KINDS[k]) for name, k in kinds]
    prep = NS(config=cfg, model=NS(vocab_size=1000), reference=sides[0], sides=sides, prompts=[])
    return Plan(prep, mode, NS(warnings=findings if findings is not None else []), floor=floor, chunk=chunk)


def test_a_comparison_meets_rows_in_one_cross_scoring_direction_or_names_the_pair():
    from types import SimpleNamespace as NS

    from parity_ui.core.types import Comparison
    from parity_ui.measures.base import ScoreAsk
    from parity_ui.measures.distribution import Distribution, FullRows

    def sides(*kinds):
        return [(f"s{i}", k) for i, k in enumerate(kinds)]

    findings = []
    plan = _plan("compare", *sides("hf", "vllm", "openai", "hf"), findings=findings)
    findings += Distribution().preflight(plan)  # named before anything loads
    rows = FullRows(plan)
    try:
        # hf reference: it meets the vllm side's rows (KL(ref‖side) over the side's tokens); the openai side
        # has no rows and cannot score them: named; an hf side: the reference meets its rows too.
        assert rows.direction == {"s1": ("s1", "s0"), "s3": ("s3", "s0")}
        assert rows.generate_fields("s0", range(2)) == {} and len(rows.generate_fields("s1", range(2))["rows"]) == 2
        c = Comparison(a="s0", b="s1", identical=True, first_divergence=None, compared=1)
        assert rows.score_fields(ScoreAsk("s1", "s0", 0, "cross", c=c)) == {}  # the other direction meets nothing
        ask = ScoreAsk("s0", "s1", 1, "cross", c=c)
        r = rows.score_fields(ask)["rows"]
        assert r.read.endswith("s1-1.npy") and r.read_is == "side"
        rows.on_scored(ask, [TokenStep(0, 1, "", -0.1, 1, kl=0.2, kl_rev=0.1, tv=0.05, top1=1, topk=1)])
        d = c.measures["distribution"]
        assert d["generator"] == "s1" and d.generator == "s1" and d["kl_mean"] == 0.2
        assert [f.message.split()[2] for f in findings] == ["s2"]
    finally:
        rows.close()
    # A vllm reference cannot score rows: an hf side meets the reference's instead (the KL directions swap).
    rows = FullRows(_plan("compare", *sides("vllm", "hf")))
    assert rows.direction == {"s1": ("s0", "s1")}
    assert rows.score_fields(ScoreAsk("s1", "s0", 0, "cross", c=NS(a="s0", b="s1")))["rows"].read_is == "ref"
    rows.close()
    named = Distribution().preflight(_plan("compare", *sides("hf", "vllm"), cross=False))
    assert "cross_score is off" in named[0].message


def test_the_token_panes_hover_carries_the_per_position_kl():
    import json

    from parity_ui.render.tokens import Stream, details_json

    steps = [TokenStep(0, 5, "a", -0.1, 1, kl=1.234567e-12, kl_rev=2e-12, tv=3e-7, top1=1, topk=1),
             TokenStep(1, 6, "b", -0.2, 1)]
    d = json.loads(details_json([Stream("vllm", "vllm", steps, None)]))
    first, second = d["steps"]["vllm"]
    assert first[6] == [1.235e-12, 2e-12, 3e-7] and first[5] == [] and len(second) == 4


def test_a_workload_report_gets_the_sampling_family_and_its_floor_line():
    from types import SimpleNamespace as NS

    from parity_ui.core.kept_mass import KeptMass
    from parity_ui.measures.sampling import sampling_report

    side = KeptMass(tokens=100, mass_side=80.0, mass_ref=80.0, kept_side=5000, kept_ref=5000, mass_side_min=0.5,
                    sets_differ=30, naive_rho=110.0, renorm_rho=100.0, raw_minus_processed=-22.0,
                    naive_outside={"0.9_1.1": 100}, renorm_outside={"0.9_1.1": 40})
    floor = KeptMass(tokens=100, mass_side=80.0, mass_ref=80.0, kept_side=5000, kept_ref=5000, mass_side_min=0.5,
                     naive_outside={"0.9_1.1": 100}, renorm_outside={"0.9_1.1": 1})
    report = _report({"b"}, floor="floor")
    sampling_report(report, {"b": side, "floor": floor})
    b = report.sides["b"]
    assert b.stats.family("sampling")["tokens"] == 100 and b.stats.family("sampling")["kept_mass_mean"] == 0.8
    assert b.stats.family("sampling")["renorm_outside_0.9_1.1"] == 0.4 and report.floor_figures.stats.family("sampling")["tokens"] == 100
    assert "above the floor" in b.verdicts.get("sampling")


def _report(sides, floor=None, done=0):
    """An empty workload report (no figures yet) with these pairs and floor."""
    from parity_ui.core.pooled import Accumulator
    from parity_ui.core.workload_record import FloorSpec, SideFigures, WorkloadOptions, WorkloadReport

    return WorkloadReport(
        options=WorkloadOptions(),
        floor=FloorSpec("kernel" if floor else "none", floor, ""),
        n_prompts=2,
        done=done,
        sides={n: SideFigures(n, Accumulator().result()) for n in sides},
        floor_figures=SideFigures(floor, Accumulator().result()) if floor else None,
    )


def test_every_distribution_and_sampling_figure_is_a_gate_metric_with_its_direction():
    from types import SimpleNamespace as NS

    from parity_ui.commands.gate.metrics import METRICS, value_of

    for key in (*FAMILIES["distribution"], *FAMILIES["sampling"]):
        assert METRICS[key].higher_is_better == (not FIGURES[key].higher_is_worse), key
        assert METRICS[key].display == FIGURES[key].name
    stats = NS(family={"distribution": {"kl_mean": 2e-4, "top1_agree": 0.99}}.get)
    assert value_of("kl_mean", stats) == 2e-4 and value_of("top1_agree", stats) == 0.99
    assert METRICS["kl_mean"].higher_is_better is False and METRICS["top1_agree"].higher_is_better is True
    assert value_of("kept_mass_mean", stats) is None  # not recorded: the check cannot be made (fails, says so)


def test_rows_that_never_reached_the_scorer_are_named_and_a_chunk_deletes_only_its_files():
    from types import SimpleNamespace as NS

    from parity_ui.measures.base import ScoreAsk
    from parity_ui.measures.distribution import Distribution, FullRows

    findings = []
    plan = _plan("scored", ("ref", "hf"), ("b", "vllm"), findings=findings, chunk=2)
    assert Distribution().preflight(plan) == []  # hf meets, vllm writes: nothing unavailable up front
    full = FullRows(plan)
    try:
        (r1, r2) = full.generate_fields("b", [1, 12])["rows"]
        assert r1.write.endswith("b-1.npy") and full.score_fields(ScoreAsk("ref", "b", 12, "reference"))["rows"].read == r2.write
        for r in (r1, r2):
            write_rows(r.write, torch.zeros(4, 100))
        for j in (1, 12):  # vLLM's step logs (named after their batch's first sequence) and their indices
            log = StepLog(os.path.join(full.dir, f"b-{j}.npy"), 100)
            log.add(log.base + ".npy", 4)
            _stepped(log, [(log.base + ".npy", 0, np.zeros(100, np.float32))])
            log.finish([log.base + ".npy"])
        assert len(os.listdir(full.dir)) == 6
        full.end_chunk([1])  # another block's chunk (12) is still under way
        assert sorted(os.listdir(full.dir)) == ["b-12.npy", "b-12.npy.steps.json", "b-12.steps"]
        report = _report({"b"}, done=2)
        full.pool(NS(distribution_columns=lambda run_id, side: iter(())), "run", report)
        assert [f.code for f in findings] == ["full-distribution-missing"] and "side b" in findings[0].message
        assert report.sides["b"].stats.family("distribution") is None
    finally:
        full.close()
    assert not os.path.exists(full.dir)


def test_bfloat16_logits_are_kept_as_their_bits_losslessly_and_meet_as_float32_would(tmp_path):
    """A bf16 model's logits (every value a bfloat16) are written as 2-byte bits: half the bytes, the
    same figures; a row that is not a bfloat16 widens a stepped file to float32 for good."""
    g = torch.Generator().manual_seed(2)
    side = torch.randn(6, 128, generator=g).to(torch.bfloat16).to(torch.float32)  # bf16 values, as float32
    ref = side + 0.03 * torch.randn(6, 128, generator=g)
    wide, narrow = str(tmp_path / "wide.npy"), str(tmp_path / "narrow.npy")
    np.save(wide, side.numpy())
    write_rows(narrow, side)
    assert np.load(narrow).dtype == np.int16 and os.path.getsize(narrow) < 0.6 * os.path.getsize(wide)
    assert np.array_equal(widened(np.load(narrow)), side.numpy())  # exact round trip
    a = meet(ref, Rows(read=wide, read_is="side", k=3), 6)
    b = meet(ref, Rows(read=narrow, read_is="side", k=3), 6)
    assert a == b  # bit-identical figures from the narrow file
    assert narrowed(ref.numpy()).dtype == np.float32  # not bfloat16-exact: kept as it is
    write_rows(str(tmp_path / "ref.npy"), ref)
    assert np.load(str(tmp_path / "ref.npy")).dtype == np.float32
    # Stepped: bfloat16 rows as bits, and one step that is not: that block goes as float32 and the
    # sequence reads back as float32, every row still exact; a sequence with only bits reads as bits.
    stepped, plain = str(tmp_path / "b-0.npy"), str(tmp_path / "b-1.npy")
    log = StepLog(stepped, vocab=128)
    log.add(stepped, 6)
    log.add(plain, 6)
    for i in range(6):
        _stepped(log, [(stepped, i, (ref if i == 3 else side)[i].numpy())])
        _stepped(log, [(plain, i, side[i].numpy())])
    assert log.finish([stepped, plain]) == []
    got = read_rows(stepped).numpy()
    assert got.dtype == np.float32
    want = side.numpy().copy()
    want[3] = ref[3].numpy()
    assert np.array_equal(got, want)
    assert read_rows(plain).dtype == torch.int16 and np.array_equal(widened(read_rows(plain).numpy()), side.numpy())
    # A bits row replaced by its float32 form (the GPU writer's path for a row bfloat16 cannot hold).
    log = StepLog(str(tmp_path / "b-2.npy"), vocab=128)
    log.add(str(tmp_path / "b-2.npy"), 2)
    _stepped(log, [(str(tmp_path / "b-2.npy"), 0, side[0].numpy())])
    _stepped(log, [(str(tmp_path / "b-2.npy"), 1, side[1].numpy())])
    log.append_wide(str(tmp_path / "b-2.npy"), 1, ref[1].numpy())
    log.finish([str(tmp_path / "b-2.npy")])
    assert np.array_equal(read_rows(str(tmp_path / "b-2.npy")).numpy(), np.stack([side[0].numpy(), ref[1].numpy()]))


def test_the_rows_scratch_dir_is_in_memory_where_it_holds_a_chunk_and_refused_where_nothing_does(tmp_path, monkeypatch):
    import shutil

    from parity_ui.measures import scratch as rows_scratch
    monkeypatch.delenv("PARITY_ROWS_DIR", raising=False)
    if rows_scratch._shm_holds(2**20):  # this machine has a /dev/shm: a small chunk goes there
        s = rows_scratch.scratch_dir(2**20)
        assert s.in_memory and s.path.startswith("/dev/shm/") and "memory" in s.describe()
        shutil.rmtree(s.path)
    # More than half of free memory: not in memory; the temp dir's disk holds it.
    monkeypatch.setattr(rows_scratch, "available_memory", lambda: 2 * 2**20)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(rows_scratch.tempfile, "tempdir", None)
    s = rows_scratch.scratch_dir(4 * 2**20)
    assert not s.in_memory and s.path.startswith(str(tmp_path))
    # Named by the user: used as it is.
    monkeypatch.setenv("PARITY_ROWS_DIR", str(tmp_path / "mine"))
    assert rows_scratch.scratch_dir(2**20).path.startswith(str(tmp_path / "mine"))
    # Nothing holds it: refused before anything loads, with the sizes and the fixes named.
    with pytest.raises(ConfigError, match=r"GiB of full rows to the scratch dir .*GiB free") as e:
        rows_scratch.scratch_dir(2**60)
    assert "PARITY_ROWS_DIR" in e.value.fix and "--chunk" in e.value.fix


def test_the_gpu_rows_writer_writes_what_was_submitted_and_close_waits_for_it(tmp_path):
    """vLLM's rows processor on a GPU hands each step to a writer thread (the copy's event, a host
    buffer, the batch's log and the rows' places); close() waits for the writes in flight and writes
    each sequence's index. Here with CPU tensors and an event that is already complete: the same
    thread, queue, buffer reuse and block writes in parts."""
    pytest.importorskip("vllm")
    from parity_ui.engines import vllm_full_rows as vfr

    class Done:
        def synchronize(self):
            pass

    w = vfr._Writer(rows_per_buffer=2, pin=False)
    old, vfr.WRITER = vfr.WRITER, w
    try:
        rows = torch.randn(4, 9, 16).to(torch.bfloat16).to(torch.float32)  # 4 steps x 9 sequences (3 parts)
        paths = [str(tmp_path / f"b-{i}.npy") for i in range(9)]
        log = vfr._log_for(paths[0], 4, 16)
        assert all(vfr._log_for(p, 4, 16) is log for p in paths)  # one batch, one log
        rows[2, 1, 5] += 1e-3  # one row of one step that bfloat16 cannot hold: added as float32
        for step in range(4):
            wide, narrow, inexact = slot = w.buffer(9, 16)
            bits, flags = device_narrowed(rows[step])  # what the writer's step() does on the GPU
            wide[:9].copy_(rows[step])
            narrow[:9].copy_(bits)
            inexact[:9].copy_(flags)
            w.submit(Done(), slot, log, [(p, step) for p in paths])
        assert w.made <= vfr.SLOTS  # buffers reused, not one per step
        assert vfr.close(paths) == [] and vfr.CURRENT is None and not vfr.OPEN
        for i, p in enumerate(paths):
            assert np.array_equal(widened(read_rows(p).numpy()), rows[:, i].numpy())
        assert read_rows(paths[0]).dtype == torch.int16 and read_rows(paths[1]).dtype == torch.float32
        # A write that fails (its log closed under it) is reported, its paths named missing.
        p = str(tmp_path / "b-20.npy")
        bad = vfr._log_for(p, 1, 16)
        assert bad is not log  # the last batch's log was closed: a new batch, a new log
        bad.write = None  # not callable: the writer thread's call raises
        w.submit(Done(), w.buffer(1, 16), bad, [(p, 0)])
        assert vfr.close([p]) == [p] and p not in vfr.OPEN
    finally:
        vfr.WRITER = old
        vfr.CURRENT = None


def test_rows_read_ahead_meet_as_rows_read_in_place(tmp_path):
    """The scorer's read-ahead (full_distribution.ReadAhead: the next items' rows files read on a thread
    while this item's forward runs) gives the same figures as reading in place; a missing file is
    RowsMissing when its item is reached, not before."""
    from parity_ui.engines.full_distribution import ReadAhead, RowsMissing

    g = torch.Generator().manual_seed(3)
    sides = [torch.randn(4, 32, generator=g) for _ in range(5)]
    refs = [s + 0.1 * torch.randn(4, 32, generator=g) for s in sides]
    paths = []
    for i, s in enumerate(sides):
        paths.append(str(tmp_path / f"b-{i}.npy"))
        if i != 3:  # item 3's rows were never written
            write_rows(paths[-1], s)
    ahead = ReadAhead([*paths[:2], None, *paths[3:]], pin=False)
    try:
        for i in range(5):
            rows = Rows(read=paths[i], read_is="side", k=2)
            if i == 2:
                assert ahead.take(i) is None  # an item that reads nothing
                continue
            if i == 3:
                with pytest.raises(RowsMissing):
                    ahead.take(i)
                continue
            assert meet(refs[i], rows, 4, ahead.take(i)) == meet(refs[i], rows, 4)
    finally:
        ahead.close()


def test_full_rows_on_a_cluster_of_several_machines_are_refused_by_name_before_anything_loads():
    """A side's rows wait in a scratch dir on its own machine for the scorer that meets them: on --cluster
    local they do; on a cluster at an address the scorer's replica may be elsewhere, so the measure is
    refused in preflight, named, with the fix. Every other measure runs on a cluster as in process."""
    from parity_ui.core.errors import ConfigError
    from parity_ui.measures.distribution import Distribution

    plan = _plan("scored", ("ref", "hf"), ("b", "vllm"))
    plan.cluster = "local"
    assert Distribution().preflight(plan) == []
    plan.cluster = "ray://head:10001"
    with pytest.raises(ConfigError) as e:
        Distribution().preflight(plan)
    assert e.value.key == "full_distribution" and "--cluster local" in e.value.fix
