"""Sampled tokens' records above the engines (no engine runs here): the optional draw columns survive
the columns and the store, a comparison's kept mass and both ratios from hand-built draws, pooling by
adding, and the token panes' hover data."""
from __future__ import annotations

import json
import math

import pytest

from parity_ui.analysis.compare import compare
from parity_ui.analysis.kept_mass import kept_mass
from parity_ui.core.figures import FIGURES, SAMPLING_ROWS, family
from parity_ui.core.kept_mass import SAMPLING_FIGURE_KEYS, KeptMass, kept_mass_from_json
from parity_ui.core.pooled import pool_kept_mass
from parity_ui.core.types import (SAMPLING_COLUMNS, StepColumns, SideResult, TokenStep, comparison_from_dict,
                                  to_dict)
from parity_ui.render.tokens import Stream, details_json


def drawn(pos: int, tid: int, lp: float, processed: float, mass: float, kept: int = 10, h: int = 7,
          margin: float = 0.5) -> TokenStep:
    return TokenStep(pos, tid, f"<{tid}>", lp, 1, margin=margin, kept=kept, kept_mass=mass,
                     processed_logprob=processed, kept_hash=h)


def side(name: str, steps: list[TokenStep]) -> SideResult:
    return SideResult(side=name, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps)


def test_draw_columns_survive_columns_and_are_absent_when_not_recorded():
    steps = [drawn(0, 5, -1.0, -0.8, 0.82), drawn(1, 6, -2.0, -1.7, 0.74, margin=1e30)]
    cols = StepColumns.from_steps(steps)
    back = StepColumns(json.loads(json.dumps(cols.columns())))
    assert list(back) == steps and back[1].margin == 1e30 and back[0].kept_hash == 7
    assert back.column("kept_mass") == [0.82, 0.74]
    plain = StepColumns.from_steps([TokenStep(0, 5, "", -1.0, 1)])
    assert not set(SAMPLING_COLUMNS) & set(plain.columns())  # not recorded: no column at all
    assert plain.column("margin") == [None] and plain[0].margin is None


def test_kept_mass_naive_and_renormalised_ratios_from_the_draws():
    # ref (trainer) raw logprob ln 0.4; the side's processed logprob ln(0.4 / 0.8) (S = 0.8, same set):
    # naive ratio 0.8 (outside [0.9, 1.1]), renormalised 1 (the reference's processed is the same).
    ref = side("ref", [drawn(i, 5 + i, math.log(0.4), math.log(0.5), 0.8) for i in range(4)])
    sid = side("b", [drawn(i, 5 + i, math.log(0.41), math.log(0.5), 0.8, h=7 if i else 9) for i in range(4)])
    k = kept_mass(compare(ref, sid), ref, sid)
    f = k.figures()
    assert k.tokens == 4 and f["naive_rho_mean"] == pytest.approx(0.8)
    assert f["naive_outside_0.9_1.1"] == 1.0 and f["renorm_outside_0.9_1.1"] == 0.0
    assert f["renorm_rho_mean"] == pytest.approx(1.0) and f["kept_mass_mean"] == pytest.approx(0.8)
    assert f["kept_sets_differ"] == 0.25  # position 0's fingerprints differ
    assert f["raw_minus_processed_mean"] == pytest.approx(math.log(0.41 / 0.5))
    # Only the shared prefix counts (the same context): a fork at 2 leaves 2 tokens.
    forked = side("b", [*sid.steps[:2], drawn(2, 99, -1.0, -0.9, 0.8), drawn(3, 98, -1.0, -0.9, 0.8)])
    assert kept_mass(compare(ref, forked), ref, forked).tokens == 2
    # The fork's own kept sets compare (the same context), and there they differ (issue 46 item 3:
    # "kept sets differ 0%" stopped before the one difference that made the fork).
    same_before = side("b", [drawn(i, 5 + i, math.log(0.41), math.log(0.5), 0.8) for i in range(2)])
    forked = side("b", [*same_before.steps, drawn(2, 99, -1.0, -0.9, 0.8, h=3), drawn(3, 98, -1.0, -0.9, 0.8)])
    k = kept_mass(compare(ref, forked), ref, forked)
    assert k.tokens == 2 and k.sets_compared == 3 and k.figures()["kept_sets_differ"] == pytest.approx(1 / 3)
    at_first = side("b", [drawn(0, 99, -1.0, -0.9, 0.8, h=3)])
    k = kept_mass(compare(ref, at_first), ref, at_first)
    assert k.tokens == 0 and k.figures()["kept_sets_differ"] == 1.0
    # No draws recorded (greedy, native sampling): no record.
    plain = side("b", [TokenStep(i, 5 + i, "", -1.0, 1) for i in range(4)])
    assert kept_mass(compare(ref, plain), ref, plain) is None


def test_kept_mass_pools_by_adding_and_round_trips_through_the_comparison():
    a = KeptMass(tokens=2, mass_side=1.6, mass_side_min=0.7, naive_outside={"0.9_1.1": 2}, naive_rho=1.6)
    b = KeptMass(tokens=2, mass_side=1.8, mass_side_min=0.85, naive_outside={"0.9_1.1": 1}, naive_rho=1.9)
    total = pool_kept_mass([a, None, b])
    assert total.tokens == 4 and total.mass_side_min == 0.7 and total.naive_outside == {"0.9_1.1": 3}
    assert total.figures()["naive_outside_0.9_1.1"] == 0.75 and total.figures()["kept_mass_mean"] == pytest.approx(0.85)
    assert pool_kept_mass([None]) is None
    assert kept_mass_from_json(total.to_json()) == total
    ref = side("ref", [drawn(0, 5, -1.0, -0.9, 0.9)])
    c = compare(ref, side("b", [drawn(0, 5, -1.0, -0.9, 0.9)]))
    c.measures["kept_mass"] = total
    assert comparison_from_dict(to_dict(c)).measures["kept_mass"] == total
    assert to_dict(c)["kept_mass"] == total.to_json()  # stored and printed under its key, as before measures


def test_the_sampling_family_is_registered_with_display_names():
    keys = {f.key for f in family("sampling")}
    assert keys == set(SAMPLING_FIGURE_KEYS) and set(SAMPLING_ROWS) <= keys
    assert FIGURES["renorm_outside_0.9_1.1"].name == "renormalised ratio outside [0.9, 1.1]"
    assert FIGURES["kept_mass_mean"].higher_is_worse is False and FIGURES["kept_sets_differ"].kind == "share"
    assert all("_" not in FIGURES[k].name for k in SAMPLING_ROWS)  # no code identifier in front of people


def test_the_hover_data_carries_each_draw():
    steps = [drawn(0, 5, -1.0, -0.8, 0.8234567, kept=12, margin=0.0123456), TokenStep(1, 6, "", -1.0, 1)]
    data = json.loads(details_json([Stream("a", "a", steps)]))
    first, second = data["steps"]["a"]
    assert first[5] == [0.01235, 12, 0.82346] and first[4] == []
    assert len(second) == 4  # no draw recorded there: no sixth item


def test_every_optional_step_column_is_declared_by_its_measure():
    """TokenStep's optional per-token fields are exactly the columns the measures declare
    (core.measures), which StepColumns stores; a column added to one and not the other fails here."""
    import dataclasses

    from parity_ui.core.measures import SPECS, STEP_COLUMNS

    fixed = {"position", "token_id", "text", "logprob", "rank", "top", "raw"}
    assert {f.name for f in dataclasses.fields(TokenStep)} - fixed == set(STEP_COLUMNS)
    assert StepColumns.OPTIONAL == STEP_COLUMNS and len(set(STEP_COLUMNS)) == len(STEP_COLUMNS)
    owners = {c: s.key for s in SPECS for c in s.columns}
    assert owners["kept_hash"] == "sampling" and owners["kl"] == "distribution"
