"""Issue 33 items 9 and 14, on the fake engine kind in real worker processes: a workload's progress
moves inside a chunk (per token, with the share of the work and the time left) in the app's live card
and on the CLI, and the live status says what each side really does during a cold start (loading,
waiting for another side to load, warming up its first call), never "generating" while it waits."""
from __future__ import annotations

import time

import pytest

from fake_engine import fake_service, registered
from parity_ui.commands.workload.run import WorkloadRequest, run_workload
from parity_ui.core.config import build_config
from parity_ui.core.runlog import RunEvent
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.plan import RunRequest
from parity_ui.ui.live import LiveRun, WorkloadLive

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(8)]


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake"))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _recorder():
    events: list[tuple[float, RunEvent]] = []
    return events, lambda e: events.append((time.monotonic(), e))


def test_a_workloads_progress_moves_before_its_first_chunk_finishes(service, model):
    events, emit = _recorder()
    cfg = build_config(None, ["max_new_tokens=12"], sides=["ref=fake,delay_ms=25", "b=fake,delay_ms=25"])
    req = WorkloadRequest(model=model, prompts=list(PROMPTS), config=cfg, options=WorkloadOptions(chunk=8, floor="none"))
    run = run_workload(service, req, emit)
    assert run.status == "ok", run.error
    progress = [(t, e) for t, e in events if e.kind == "progress"]
    chunk_end = next(t for t, e in progress if e.prompt_index == 8)
    inside = [e for t, e in progress if t < chunk_end]
    moving = [e for e in inside if e.fraction is not None and 0 < e.fraction < 1 and "tokens of up to" in e.message]
    assert len(moving) >= 3, [e.message for e in inside]  # 2 sides x 8 prompts x 12 tokens x 25 ms: ~5 s
    fractions = [e.fraction for e in moving]
    assert fractions == sorted(fractions) and fractions[-1] > fractions[0]
    assert any("left" in e.message and "about" in e.message for e in moving)
    assert any(e.side == "b" and "b generating" in e.message for e in moving)
    # the app's card: the bar follows the work, the side says what it does
    live = WorkloadLive(len(PROMPTS))
    for _, e in events:
        if e is moving[-1]:
            break
        live.feed(e)
    live.feed(moving[-1])
    card = live.progress()
    assert live.done == 0 and 0 < live.fraction < 1
    assert f'width:{100 * live.fraction:.0f}%' in card and "Generating" in card and "b: generating" in card


def test_the_cli_prints_progress_inside_a_chunk_without_flooding(monkeypatch, capsys):
    from parity_ui import cli

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    cli._last_progress.update(t=0.0, done=None)
    for i in range(20):  # one progress event a second inside the first chunk
        now[0] += 1
        cli._progress(RunEvent("progress", f"0/16 prompts done; chunk 1 of 1: b generating ({i} tokens)",
                               prompt_index=0, fraction=i / 40))
    cli._progress(RunEvent("progress", "16/16 prompts done", prompt_index=16, fraction=1.0))
    lines = capsys.readouterr().err.splitlines()
    assert 4 <= len(lines) <= 6 and lines[-1].endswith("16/16 prompts done")


def test_a_cold_start_says_who_waits_for_whom_and_that_a_first_call_warms_up(service, model):
    # On the CPU sides are gated: the one that loads first waits for the other before generating.
    events, emit = _recorder()
    cfg = build_config(None, ["max_new_tokens=6"], sides=["a=fake", "b=fake,load_s=1.5"])
    run = service.run(RunRequest(model=model, prompts=PROMPTS[:1], config=cfg), on_event=emit)
    assert run.status == "ok", run.error
    lines = [(e.side, e.message) for _, e in events if e.kind == "status"]
    msgs = [m for _, m in lines]
    waiting = next(i for i, m in enumerate(msgs) if m.startswith("a: loaded; waiting for b to load"))
    b_loaded = next(i for i, m in enumerate(msgs) if m.startswith("b: loaded in"))
    assert waiting < b_loaded
    assert any(m.startswith("b: loading the weights") for m in msgs)
    warm = [i for i, (s, m) in enumerate(lines) if s == "b" and "first call since it loaded: warming up" in m]
    assert warm and warm[0] > b_loaded
    # The live card, as it stood while a waited: a is waiting, b is loading; nobody "generating".
    live = LiveRun(["a", "b"], n_prompts=1, max_new_tokens=6)
    for _, e in events:
        live.feed(e)
        if e.kind == "status" and e.message.startswith("a: loaded; waiting"):
            break
    card = live.progress()
    assert "waiting for b to load" in card and "loading the weights" in card
    assert "· generating" not in card and "prefill" not in card and "Generating" not in card
    # ... and once b's first tokens come, it is generating
    for _, e in events[[x for _, x in events].index(e) + 1:]:
        live.feed(e)
        if e.kind == "token" and e.side == "b":
            break
    assert 'data-side="b"' in live.progress() and "· generating" in live.progress()


def test_a_one_chunk_workload_shows_its_work_moving_and_a_side_done_with_its_part_says_so(monkeypatch):
    """Issue 46 item 14: "0/12 prompts done" stood for the whole of a one-chunk run (prompts are stored
    when their chunk ends), and a side that had generated its part read "generating" on."""
    from parity_ui.commands.workload.run import Progress
    from parity_ui.core.workload_record import FloorSpec, WorkloadOptions, WorkloadReport
    from parity_ui.ui.live import WorkloadLive

    live = WorkloadLive(12)
    report = WorkloadReport(options=WorkloadOptions(), floor=FloorSpec("none", None, ""), n_prompts=12)
    progress = Progress(live.feed, report, todo=12, max_new=8, n_chunks=1)
    monkeypatch.setattr(Progress, "EVERY_S", 0.0)
    progress.chunk(0, 12, 2)  # one chunk of all 12 prompts, two calls: ref's generate, b's
    progress.call("ref", "generating")
    progress.counts({i: 8 for i in range(12)})
    assert live.eta.startswith("50% of the work") and "0/12 prompts stored" in live.eta, live.eta
    progress.call_done()
    progress.call("b", "generating")
    progress.counts({i: 4 for i in range(12)})
    assert live.eta.startswith("75% of the work"), live.eta
    states = live.states.now()
    assert states["b"].startswith("generating") and states["ref"].startswith("its part of the chunk done"), states
    progress.call_done()
    report.done, report.rate = 12, 1.5
    progress.chunk_done(12)
    assert live.eta.startswith("100% of the work") and "12/12 prompts stored, 1.50 prompts/s" in live.eta
    assert all(s.startswith("its part of the chunk done") for s in live.states.now().values())
