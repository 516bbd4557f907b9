"""Determinism probes and setting sweeps: the pure parts on hand-built data. Both on real engines (one
shared service; the sweep addresses a side's option by the side's name) are
tests/engines/test_probes_sweep_engines.py."""
from __future__ import annotations

import json
import pytest

from parity_ui.cli import main
from parity_ui.core.errors import ConfigError
from parity_ui.commands.probes import companions, first_fork, summarize_outputs
from parity_ui.store.runs import get_run, open_db
from parity_ui.commands.sweep import MAX_POINTS, Sweep, SweepPoint, grid_points, parse_grid, summarize_sweep
from parity_ui.core.findings import cross_scores_from_json, explanation_from_json
from parity_ui.core.types import Comparison, ModelInfo, PromptResult, Run, SideInfo, to_dict

PROMPT = "def main(args):"


# -- pure parts ------------------------------------------------------------------------------------

def test_first_fork_and_summary():
    assert first_fork([[1, 2, 3], [1, 2, 3]]) is None
    assert first_fork([[1, 2, 3], [1, 9, 3], [1, 2, 8]]) == 1
    assert first_fork([[1, 2, 3], [1, 2]]) == 2  # a stream that ended early forks at its end
    s = to_dict(summarize_outputs([[1, 2], [1, 3], [1, 2]]))
    assert s == {"runs": 3, "distinct": 2, "first_fork": 1, "counts": [2, 1], "lengths": [2, 2]}


def test_companions_are_longer_so_the_probed_prompt_is_padded():
    ids = [5, 6, 7, 8]
    others = companions(ids, 4)
    assert len(others) == 3
    assert all(len(o) > len(ids) and o[:4] == ids for o in others)


def test_parse_grid_and_points():
    grid = parse_grid(["batch_size=1,2", "dtype=float32,bfloat16", "b.enforce_eager=true,false"])
    assert grid["b.enforce_eager"] == [True, False] and grid["batch_size"] == [1, 2]
    points = grid_points(grid)
    assert len(points) == 8
    # the runtime key varies fastest, so consecutive points share loaded engines
    assert [p["batch_size"] for p in points[:2]] == [1, 2]
    assert points[0]["dtype"] == points[1]["dtype"]
    for bad in (["dtype"], ["dtype="], ["dtype=a", "dtype=b"], [f"seed={','.join(map(str, range(MAX_POINTS + 1)))}"], []):
        with pytest.raises(ConfigError):
            parse_grid(bad)


def _run(fd: int | None, status: str = "diverged") -> Run:
    comp = Comparison(a="ref", b="b", identical=fd is None, first_divergence=fd, compared=10, lengths=[10, 10],
                      explanation=explanation_from_json({"verdict": "numerical near-tie" if fd is not None
                                                         else "identical"}),
                      cross_scores=cross_scores_from_json({"b_by_ref": {"rms_gap": 0.5 if fd is not None else 0.001}}))
    return Run(id=f"r{fd}", created_utc="", model=ModelInfo(name="m", path=""), config={}, status=status,
               sides=[SideInfo(name="ref", kind="hf", reference=True), SideInfo(name="b", kind="vllm")],
               prompts=[PromptResult(index=0, prompt_text="p", prompt_token_ids=[1], comparisons=[comp])])


def test_summary_says_which_key_moves_the_divergence():
    grid = {"dtype": ["float32", "bfloat16"], "batch_size": [1, 2]}
    sweep = Sweep(group_id="g", grid=grid, points=[
        SweepPoint({"dtype": "float32", "batch_size": 1}, _run(None, "ok")),
        SweepPoint({"dtype": "float32", "batch_size": 2}, _run(None, "ok")),
        SweepPoint({"dtype": "bfloat16", "batch_size": 1}, _run(7)),
        SweepPoint({"dtype": "bfloat16", "batch_size": 2}, _run(7)),
    ])
    s = summarize_sweep(sweep)
    effects = {e["key"]: e for e in s["effects"]}
    assert effects["dtype"]["moves_divergence"] is True
    assert effects["batch_size"]["moves_divergence"] is False
    assert effects["dtype"]["first_divergence_by_value"] == {"float32": [None, None], "bfloat16": [7, 7]}
    assert [p["verdict"] for p in s["points"]][2] == "numerical near-tie"
    assert [p["cross_rms_gap"] for p in s["points"]] == [0.001, 0.001, 0.5, 0.5]


def test_a_run_that_stopped_before_the_fork_did_not_move_it():
    """max_new_tokens=16 is identical over its 16 tokens, 64 forks at 30: the shorter run never reached
    token 30, so the key did not move the divergence. A fork within the identical run's span did."""
    import dataclasses

    short, long = _run(None, "ok"), _run(30)
    short.prompts[0].comparisons[0].compared = 16
    grid = {"max_new_tokens": [16, 64]}
    s = summarize_sweep(Sweep(group_id="g", grid=grid, points=[SweepPoint({"max_new_tokens": 16}, short),
                                                               SweepPoint({"max_new_tokens": 64}, long)]))
    assert s["effects"][0]["moves_divergence"] is False
    early = _run(12)
    s = summarize_sweep(Sweep(group_id="g", grid=grid, points=[SweepPoint({"max_new_tokens": 16}, short),
                                                               SweepPoint({"max_new_tokens": 64}, early)]))
    assert s["effects"][0]["moves_divergence"] is True
    # Three sides: b identical, c forks at 5: the point shows c's verdict and gap beside divergence 5.
    three = _run(None, "diverged")
    fork = dataclasses.replace(_run(5).prompts[0].comparisons[0], b="c")
    three.prompts[0].comparisons.append(fork)
    (point,) = summarize_sweep(Sweep(group_id="g", grid={"x": [1]}, points=[SweepPoint({"x": 1}, three)]))["points"]
    assert point["first_divergence"] == 5 and point["verdict"] == "numerical near-tie"


def test_error_points_do_not_count_as_effects():
    grid = {"batch_size": [1, 2]}
    sweep = Sweep(group_id="g", grid=grid, points=[SweepPoint({"batch_size": 1}, _run(3)),
                                                   SweepPoint({"batch_size": 2}, _run(None, "error"))])
    assert summarize_sweep(sweep)["effects"][0]["moves_divergence"] is False


def test_cli_rejects_a_bad_probe_and_a_bad_grid_without_engines(tmp_path, capsys):
    db = str(tmp_path / "runs.db")
    assert main(["--db", db, "sweep", "--prompt", PROMPT, "--grid", "dtype"]) == 2
    assert "key=v1,v2" in capsys.readouterr().err
    assert main(["--db", db, "probe", "--prompt", PROMPT, "--n", "1", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "error" and "n >= 2" in out["error"]
    assert get_run(open_db(db), out["run_id"]).kind == "probe"
