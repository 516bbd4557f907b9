"""Which setting? in the app, above the engines: the pairs of a stored comparison or workload that a
bisect is offered for, requests refused before anything runs (with the problem and the fix), the
bisect started through the AppService and shown by the panel (progress, then the stored record),
a bisect that fails stored and shown with its fix, and History listing and opening bisects. The fake
engine kind in real worker processes: seconds."""
from __future__ import annotations

import re
import shutil

import pytest

pytest.importorskip("gradio")

import gradio as gr  # noqa: E402

from fake_engine import registered, registered_other  # noqa: E402
from parity_ui.store import runs as store  # noqa: E402
from parity_ui.core.config import build_config  # noqa: E402
from parity_ui.core.errors import ParityError  # noqa: E402
from parity_ui.run.plan import RunRequest  # noqa: E402
from parity_ui.inputs.prompts import PromptSpec  # noqa: E402
from parity_ui.core.runlog import RunEvent  # noqa: E402
from parity_ui.ui.live import BisectLive  # noqa: E402
from parity_ui.ui.runner import AppService  # noqa: E402
from parity_ui.commands.which_setting import bisect_choice, checked_request, latest_bisect, parse_pair  # noqa: E402
from parity_ui.core.workload_record import WorkloadOptions  # noqa: E402
from parity_ui.commands.workload.run import WorkloadRequest, run_workload  # noqa: E402

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(3)]
# b forks at token 3 where `same` does not; the pair is exact (float32, greedy): identical tokens decide.
DIVERGED = ["ref=fake,dtype=float32", "same=fake,dtype=float32", "b=fake,dtype=float32,swap_at=3,flag=x,delay_ms=1"]


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered(), registered_other():
        yield str(build_tiny("fake", max_position_embeddings=256))


@pytest.fixture(scope="module")
def runner(model, tmp_path_factory):
    r = AppService(str(tmp_path_factory.mktemp("db") / "runs.db"))
    yield r
    r.close()


def _compare(runner, model, *sides):
    cfg = build_config(None, ["max_new_tokens=8"], sides=list(sides))
    return runner.run(RunRequest(model=model, prompts=list(PROMPTS), config=cfg))


@pytest.fixture(scope="module")
def diverged(runner, model):
    run = _compare(runner, model, *DIVERGED)
    assert run.status == "diverged", run.error
    return run


def _bisects(runner):
    return [r for r in store.list_runs(runner.db) if r.kind == "bisect"]


def _view(cls, runner):
    from parity_ui.ui.compare_tab import RunGate

    view = cls("t", runner, RunGate(runner))
    with gr.Blocks():
        view.create_ui()
    return view


# -- which pairs are offered ------------------------------------------------------------------------

def test_a_comparison_offers_the_reference_against_each_side_that_forked(runner, model, diverged):
    choice = bisect_choice(runner.store, diverged.id)
    assert choice.pairs == [("ref", "b")] and choice.default == ("ref", "b") and not choice.problem
    same = _compare(runner, model, "ref=fake", "b=fake,shift=0.3")  # a gap, the same tokens
    none = bisect_choice(runner.store, same.id)
    assert none.pairs == [] and "token-identical against the reference ref" in none.problem and none.fix
    gone = bisect_choice(runner.store, "01NOSUCHRUN")
    assert gone.pairs == [] and "no run with id '01NOSUCHRUN'" in gone.problem and "History" in gone.fix


def test_a_workload_offers_the_sides_beyond_the_noise_floor_and_never_the_floor(runner, model):
    cfg = build_config(None, ["max_new_tokens=8"], sides=["ref=fake", "b=fake,swap_at=2", "c=fake"])
    run = run_workload(runner, WorkloadRequest(model=model, prompts=[*PROMPTS, *PROMPTS], config=cfg,
                                                       options=WorkloadOptions(chunk=8)))
    assert run.workload.sides["b"].verdict.verdict == "exceeds noise", run.error
    assert run.workload.sides["c"].verdict.verdict == "within noise" and run.workload.floor.side
    assert bisect_choice(runner.store, run.id).pairs == [("ref", "b")]


def test_a_pair_with_nothing_to_flip_is_not_offered_and_says_so_before_the_click(runner, model):
    """#33 item 10: sides that differ only in the engine itself (no option of its kind has a value to
    flip to) are not offered; the problem says so in plain words, and nothing is stored."""
    def workload(*sides):
        cfg = build_config(None, ["max_new_tokens=8"], sides=list(sides))
        return run_workload(runner, WorkloadRequest(model=model, prompts=[*PROMPTS, *PROMPTS], config=cfg,
                                                            options=WorkloadOptions(chunk=8)))

    run = workload("ref=fake", "b=fake-other,engine_shift=-0.3")  # its own numerics: beyond the floor
    assert run.workload.sides["b"].verdict.verdict == "exceeds noise", run.error
    before = len(_bisects(runner))
    choice = bisect_choice(runner.store, run.id)
    assert choice.pairs == [] and choice.problem.startswith(f"sides ref and b of run {run.id} differ only in the "
                                                            "engine itself (fake")
    assert "there is no setting to flip" in choice.problem and "(…)" not in choice.problem
    assert "a side of the reference's kind" in choice.fix
    with pytest.raises(ParityError, match="no setting to flip"):
        checked_request(runner.store, run.id)
    from parity_ui.ui.which_setting_view import WhichSettingView

    view = _view(WhichSettingView, runner)
    shown = view.show(run.id)  # the panel says it before the click, with its button off
    assert shown[view.box].visible is True and shown[view.btn].interactive is False
    assert "nothing to try here" in shown[view.progress] and "differ only in the engine itself" in shown[view.progress]
    # An engine-only setting its kind can flip (graphs_gap, like vLLM's CUDA graphs) is something to try.
    flippable = workload("ref=fake", "b=fake-other,engine_shift=-0.3,graphs_gap=0.2")
    assert bisect_choice(runner.store, flippable.id).pairs == [("ref", "b")]
    assert len(_bisects(runner)) == before


def test_requests_are_checked_before_anything_runs(runner, diverged):
    assert checked_request(runner.store, diverged.id) == (("ref", "b"), 8)
    assert checked_request(runner.store, diverged.id, "ref,b", 3.0) == (("ref", "b"), 3)
    assert checked_request(runner.store, diverged.id, ("ref", "b"), None) == (("ref", "b"), 8)
    with pytest.raises(ParityError, match="the pair ref vs same is not one of run .* pairs that differ") as e:
        checked_request(runner.store, diverged.id, "ref,same")
    assert e.value.fix == "pick one of: ref vs b"
    for bad in (0, 2.5, "many", 10_001):
        with pytest.raises(ParityError, match="is not a whole number from 1 to 10,000"):
            checked_request(runner.store, diverged.id, None, bad)
    with pytest.raises(ParityError, match="is not two side names"):
        parse_pair("ref")


# -- the bisect, through the runner and the panel ---------------------------------------------------

def test_the_panel_finds_the_setting_shows_progress_and_history_lists_and_opens_it(runner, diverged, monkeypatch):
    from parity_ui.ui import which_setting_view
    from parity_ui.ui.history_tab import ID, RESULT, HistoryTab, history_rows
    from parity_ui.ui.which_setting_view import WhichSettingView

    monkeypatch.setattr(which_setting_view, "THROTTLE_S", 0.02)
    view = _view(WhichSettingView, runner)
    shown = view.show(diverged.id)
    assert shown[view.box].visible and shown[view.pair].value == "ref,b" and shown[view.result] == ""
    assert shown[view.pair].choices == [("ref vs b", "ref,b")]
    assert view.show("01NOSUCHRUN")[view.box].visible is False
    updates = list(view.search(diverged.id, "ref,b", 2))
    assert updates[0][view.stop_btn].visible and updates[0][view.btn].interactive is False
    said = [u[view.progress] for u in updates[1:-1] if view.progress in u]
    assert said and any(re.search(r"Trial \d+: ", p) for p in said) and any("trial(s) done" in p for p in said)
    assert any("pc-bisect" in u.get(view.result, "") for u in updates[1:-1])  # the table grew as trials ran
    last = updates[-1]
    assert last[view.btn].interactive and last[view.stop_btn].visible is False and last[view.progress] == ""
    (b,) = _bisects(runner)
    stored = store.get_run(runner.db, b.id, prompts=[])
    assert stored.status == "ok" and stored.bisect.culprit == ["swap_at"] and stored.bisect.run_id == diverged.id
    assert (stored.bisect.reference, stored.bisect.side, len(stored.bisect.prompts)) == ("ref", "b", 2)
    result = last[view.result]
    assert f'data-run="{b.id}"' in result and "Which setting is it? b against ref" in result
    assert "swap_at explains the divergence" in result and "Run failed" not in result
    # Reopened later: the newest stored answer shows with the run.
    assert latest_bisect(runner.store, diverged.id).id == b.id and b.id in view.show(diverged.id)[view.result]
    # History lists the bisect with its answer, and opens it as its record; a bisect offers no bisect.
    (row,) = [r for r in history_rows(runner.store) if r[ID] == b.id]
    assert row[RESULT].startswith(f"which setting? b vs ref of {diverged.id}: swap_at explains")
    tab = HistoryTab(runner)
    with gr.Blocks():
        tab.create_ui()
    opened = tab.open(b.id)
    assert "Which setting is it?" in opened[tab.view.summary] and opened[tab.view.panes] == ""
    assert tab.which.show(b.id)[tab.which.box].visible is False
    assert "a bisect run" in bisect_choice(runner.store, b.id).problem
    # A panel that cannot be built (here Which setting?, reading a record it cannot parse) shows its
    # error in its place; the run's token view and the workload panel still come with the open.
    def unreadable(run_id):
        raise ValueError("a stored bisect this version cannot read")

    tab.which.show = unreadable
    opened = tab.open_all(diverged.id)
    assert f'data-run="{diverged.id}"' in opened[tab.view.summary] and "pt-root" in opened[tab.view.panes]
    assert opened[tab.wview.box].visible is False  # not a workload: hidden, as always
    err = opened[tab.which.progress]
    assert "Which setting? could not be built" in err and "cannot read" in err and diverged.id in err
    assert opened[tab.which.box].visible is True and opened[tab.which.btn].interactive is False


def test_a_refused_request_is_a_message_with_the_fix_and_nothing_is_stored(runner, model, diverged):
    from parity_ui.ui.which_setting_view import WhichSettingView

    same = _compare(runner, model, "ref=fake", "b=fake,flag=x")
    before = len(_bisects(runner))
    with pytest.raises(ParityError, match="no pair differs"):
        runner.which_setting(same.id)
    view = _view(WhichSettingView, runner)
    last = list(view.search(same.id, None, 8))[-1]
    assert "Which setting? cannot start" in last[view.result] and "no pair differs" in last[view.result]
    assert "Fix:" in last[view.result] and last[view.btn].interactive
    bad = list(view.search(diverged.id, "ref,b", "lots"))[-1][view.result]
    assert "not a whole number" in bad and "Fix:" in bad
    assert len(_bisects(runner)) == before


def test_a_bisect_that_fails_is_stored_and_shown_with_its_fix(runner, model, tmp_path):
    from parity_ui.ui.which_setting_view import WhichSettingView, bisect_result_html

    copy = shutil.copytree(model, tmp_path / "moved")
    run = _compare(runner, str(copy), *DIVERGED)
    assert run.status == "diverged", run.error
    shutil.rmtree(copy)
    b = runner.which_setting(run.id, "ref,b", 2)
    assert b.status == "error" and b.kind == "bisect" and f"the model folder {copy}" in b.error
    html = bisect_result_html(b)
    assert "Which setting? failed" in html and "is gone" in html and "Fix:" in html and "put it back" in html
    view = _view(WhichSettingView, runner)
    assert b.id in view.show(run.id)[view.result]  # stored: reopening the run shows it


def test_the_live_card_follows_the_trials():
    live = BisectLive("ref vs b")
    live.feed(RunEvent("status", "bisect 01ABC of run 01RUN: b against the reference ref, on 2 prompt(s)"))
    assert live.bisect_id == "01ABC" and "checking the settings" in live.progress()
    live.feed(RunEvent("status", "estimate: 3 flippable setting(s): ddmin takes 4 to 9 trials"))
    live.feed(RunEvent("status", "trial 1: as it ran: flipping nothing to the reference's values"))
    live.feed(RunEvent("status", "  trial 1: loading b"))
    assert "Trial 1: as it ran" in live.progress() and not live.take_changed()
    live.feed(RunEvent("status", "trial 1: DIVERGES (0.4 s): identical 0/2"))
    html = live.progress()
    assert live.take_changed() and not live.take_changed() and "1 trial(s) done; 3 flippable setting(s)" in html
    assert "loading b" in html and "identical 0/2" in html
