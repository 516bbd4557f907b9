"""A workload on a Ray cluster, above the engines: the --cluster and --replicas rules; the blocks'
hand-out, retry and progress on a stand-in for the replicas (no Ray); and, on a real local Ray instance
with the fake engine kind in real worker processes, the same run as in process, a replica killed
mid-run that loses nothing, a lost replica replaced (and the replacements bounded), and Stop then
resume. The real engines run on Ray in
tests/engines/test_cluster_engines.py."""
from __future__ import annotations

import threading

import pytest

from fake_engine import fake_model, fake_service, registered
from parity_ui.commands.workload.blocks import MAX_ATTEMPTS, BlockProgress, run_blocks
from parity_ui.commands.workload.run import WorkloadRequest, resume_workload, run_workload
from parity_ui.core.cluster import ALL, ClusterRecord, parse_cluster, parse_replicas
from parity_ui.core.config import build_config
from parity_ui.core.errors import CancelledError, ConfigError, EngineError
from parity_ui.core.workload_record import WorkloadOptions, WorkloadReport, FloorSpec
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.render.workload import workload_card_html
from parity_ui.run.cluster import ReplacementBudget, ReplicaLost
from parity_ui.store.runs import pair_samples

# -- the options ----------------------------------------------------------------------------------


def test_replicas_and_cluster_are_read_once_with_a_fix_for_bad_input():
    assert parse_replicas("2") == {ALL: 2}
    assert parse_replicas("2,b=4") == {ALL: 2, "b": 4}
    assert parse_replicas("ref=1,b=3") == {"ref": 1, "b": 3, ALL: 1}
    assert parse_replicas(3) == {ALL: 3}
    for bad in ("0", "b=x", "=2", "b=-1"):
        with pytest.raises(ConfigError) as e:
            parse_replicas(bad)
        assert "replicas" in e.value.message and "ref=1,b=4" in e.value.fix
    assert parse_cluster(None) is None and parse_cluster(" none ") is None
    assert parse_cluster("local") == "local" and parse_cluster("ray://head:10001") == "ray://head:10001"
    with pytest.raises(ConfigError) as e:
        parse_cluster("head node; rm -rf")
    assert "--cluster local" in e.value.fix


def test_a_bad_cluster_request_is_an_error_run_naming_the_fix(tmp_path):
    with registered():
        model = str(fake_model(tmp_path / "fake", max_position_embeddings=64))
        with fake_service(tmp_path / "runs.db") as svc:
            cfg = build_config(None, ["max_new_tokens=4"], sides=["ref=fake", "b=fake"])
            prompts = [PromptSpec(text="a"), PromptSpec(text="b")]
            for opts, needle in ((WorkloadOptions(replicas={"c": 2}, cluster="local"), "not a side of this run"),
                                 (WorkloadOptions(replicas={ALL: 2}), "replicas run on a Ray cluster")):
                run = run_workload(svc, WorkloadRequest(model=model, prompts=prompts, config=cfg, options=opts))
                assert run.status == "error" and needle in run.error, run.error


def test_the_record_says_where_it_ran_and_that_batches_differ():
    rec = ClusterRecord(address="local", nodes=1, cpus=2, gpus=0, replicas={"ref": 2, "b": 2}, block=3,
                        placement="spread", retried_blocks=1, lost_replicas=["b#0: its actor died"])
    line = rec.describe()
    assert "ref x2, b x2" in line and "1 node, 2 CPUs, 0 GPUs" in line and "1 block(s) retried" in line
    assert "batch composition differs per replica" in rec.to_dict()["note"]
    rec.replaced_replicas = ["b#0"]
    assert "1 replica(s) lost, 1 replaced, 1 block(s) retried" in rec.describe()
    assert rec.to_dict()["replaced_replicas"] == ["b#0"]


def test_a_side_is_replaced_at_most_as_often_as_it_has_replicas_failed_starts_counted():
    budget = ReplacementBudget({"ref": 1, "b": 2})
    assert budget.take("b") and budget.take("b")  # each take is a replacement started, up or not
    assert not budget.take("b") and not budget.take("b")  # spent: a dying engine is not started again and again
    assert budget.describe("b") == "2 of 2"
    assert budget.take("ref") and not budget.take("ref")  # the sides' budgets are their own
    assert not ReplacementBudget({"b": 1}).take("c")  # a side it was not given: none


# -- the blocks, on a stand-in for the replicas ---------------------------------------------------------

class _Pool:
    cancelled = False


class _Sides:
    """What run_blocks needs of ClusterSides: the driver lock, liveness, concurrency."""

    def __init__(self, replicas: int = 2):
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.pool = _Pool()
        self.live = replicas
        self.retried = 0

    @property
    def concurrency(self) -> int:
        return self.live

    def alive(self, side: str) -> int:
        return self.live

    def busy(self) -> list[str]:
        return []


def _progress(events, todo=10):
    report = WorkloadReport(options=WorkloadOptions(), floor=FloorSpec("none", None, ""), n_prompts=todo)
    return BlockProgress(events.append, report, todo, 4, 4, 2, lambda: ["b#0"], 2)


def test_blocks_are_handed_out_in_order_and_a_lost_replicas_block_runs_again():
    sides, events, ran, stored = _Sides(), [], [], []
    lost = {"once": True}

    def chunk(s, block):
        ran.append(list(block))
        if block == [3, 4, 5] and lost["once"]:
            lost["once"] = False
            s.live -= 1  # the replica is retired, as ClusterSides does
            raise ReplicaLost("b", 1, "its actor died")

    run_blocks(chunk, sides, list(range(10)), 3, _progress(events), stored.append)
    assert sorted(map(tuple, stored)) == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9,)]  # each block stored once
    assert ran.count([3, 4, 5]) == 2 and sides.retried == 1
    assert any("block 2 runs again" in e.message for e in events if e.kind == "status")
    done = [e for e in events if e.kind == "progress"][-1]
    assert done.fraction == 1.0 and "10/10" not in done.message  # the report's done is the caller's to count


def test_a_block_that_keeps_losing_replicas_stops_the_run_and_keeps_the_others():
    sides, stored = _Sides(replicas=4), []

    def chunk(s, block):
        if block == [0, 1]:
            raise ReplicaLost("b", 0, "its engine crashed")

    with pytest.raises(EngineError) as e:
        run_blocks(chunk, sides, list(range(6)), 2, _progress([], 6), stored.append)
    assert "block 1 could not be finished" in e.value.message and "parity resume" in e.value.fix
    assert sides.retried == MAX_ATTEMPTS - 1 and [0, 1] not in stored


def test_stop_ends_the_hand_out_with_what_finished_stored():
    sides, stored = _Sides(replicas=1), []

    def chunk(s, block):
        if block == [2, 3]:
            s.pool.cancelled = True

    with pytest.raises(CancelledError):
        run_blocks(chunk, sides, list(range(8)), 2, _progress([], 8), stored.append)
    assert stored == [[0, 1], [2, 3]]


def test_progress_counts_the_blocks_under_way_and_gives_the_time_left():
    events = []
    p = _progress(events, todo=8)
    p.started(0, 4)
    p.call("b", "generating")
    p.counts({0: 4, 1: 4, 2: 4, 3: 4})  # the first of its 2 calls: every token made
    assert p.fraction() == pytest.approx(0.25)
    p.call_done()
    p.finished(4)
    assert p.fraction() == pytest.approx(0.5)
    last = events[-1]
    assert last.kind == "progress" and "50% of the work" in last.message and "left" in last.message
    assert "on 1 of 2 replica(s) (b#0)" in last.message


# -- on a real local Ray instance, the fake engine in real workers ---------------------------------------

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(12)]


@pytest.fixture(scope="module")
def ray_service(tmp_path_factory):
    pytest.importorskip("ray")
    root = tmp_path_factory.mktemp("cluster")
    with registered():
        model = str(fake_model(root / "fake", max_position_embeddings=64))
        with fake_service(root / "runs.db") as svc:
            yield svc, model


def _run(svc, model, emit=None, cluster="local", **options):
    cfg = build_config(None, ["max_new_tokens=8"], sides=["ref=fake,delay_ms=20", "b=fake,shift=0.1,swap_at=5"])
    opts = WorkloadOptions(**{"chunk": 3, "floor": "none", "cluster": cluster,
                              "replicas": {ALL: 2} if cluster else {}, **options})
    return run_workload(svc, WorkloadRequest(model=model, prompts=PROMPTS, config=cfg, options=opts), emit)


def _by_prompt(svc, run):
    return {s.prompt_index: (s.first_divergence, s.logp_side, s.logp_ref) for s in pair_samples(svc.db, run.id, "b")}


def test_on_ray_a_killed_replica_loses_nothing_and_stop_then_resume_finishes(ray_service):
    import ray

    svc, model = ray_service
    here = _run(svc, model, cluster=None)
    killed: list[str] = []

    def kill_a_busy_replica(e):
        if e.kind == "progress" and not killed:
            busy = [h for h in svc._cluster.replicas.handles.values() if h.busy and h.side == "ref"]
            if busy:
                killed.append(busy[0].name)
                ray.kill(busy[0].actor)

    run = _run(svc, model, emit=kill_a_busy_replica)
    assert run.status == "diverged", run.error
    assert killed, "no replica was busy to kill"
    w = run.workload
    assert w.done == len(PROMPTS) and w.cluster["retried_blocks"] >= 1
    assert any(killed[0] in x for x in w.cluster["lost_replicas"])
    assert w.cluster["replicas"] == {"ref": 2, "b": 2} and w.cluster["nodes"] == 1
    assert any(f.code == "cluster-batches" for f in run.warnings)
    card = workload_card_html(svc.get_run(run.id, prompts=[]))  # the app's view of the stored run says where
    assert "On Ray cluster local (1 node" in card and "replica(s) lost" in card and "block(s) retried" in card
    assert _by_prompt(svc, run) == _by_prompt(svc, here)  # every prompt once, the same figures
    assert w.sides["b"].stats.to_dict() == here.workload.sides["b"].stats.to_dict()

    def stop_after_a_block(e):
        if e.kind == "progress" and e.prompt_index and e.prompt_index >= 3:
            svc.cancel()

    stopped = _run(svc, model, emit=stop_after_a_block)  # the dead replica is started again for it
    assert stopped.status == "cancelled", stopped.error
    assert 3 <= stopped.workload.done < len(PROMPTS)
    resumed = resume_workload(svc, stopped.id)
    assert resumed.status == "diverged" and resumed.workload.done == len(PROMPTS)
    assert resumed.workload.cluster is not None  # it went on on the cluster
    assert _by_prompt(svc, resumed) == _by_prompt(svc, here)


def test_replicas_and_their_engines_run_at_normal_priority(ray_service):
    """Ray starts its workers at nice 15 and their engines inherit it: beside other work they got a few
    percent of a core. A local instance started by parity-ui runs them at nice 0; a replica below
    normal priority (another cluster's setting) warns and says how to fix it."""
    import os

    import ray

    from parity_ui.run.replica import niceness_problem

    svc, model = ray_service
    _run(svc, model)
    handles = list(svc._cluster.replicas.handles.values())
    assert handles
    for h in handles:
        got = ray.get(h.actor.start.remote())
        assert os.getpriority(os.PRIO_PROCESS, got["pid"]) == 0
        assert os.getpriority(os.PRIO_PROCESS, got["worker_pid"]) == 0
        assert not [p for p in got["problems"] if p.code == "replica_niceness"]
    assert niceness_problem(0) is None
    low = niceness_problem(15)
    assert low.severity == "warning" and "nice 15" in low.message and "RAY_worker_niceness=0" in low.fix


def _one_replica_each(svc, model, b_options: str, emit=None):
    """12 prompts, blocks of 3, one replica of each side: a lost b replica leaves none to go on with,
    so every later block waits for its replacement (what the replacement tests need to be exact)."""
    cfg = build_config(None, ["max_new_tokens=8"], sides=["ref=fake", f"b=fake,shift=0.1,swap_at=5{b_options}"])
    opts = WorkloadOptions(chunk=3, floor="none", cluster="local", replicas={ALL: 1})
    return run_workload(svc, WorkloadRequest(model=model, prompts=PROMPTS, config=cfg, options=opts), emit)


def test_on_ray_a_lost_replica_is_replaced_and_its_block_runs_on_the_replacement(ray_service):
    """b's only replica crashes at its 7th prompt (fail_after: its third block): a replacement starts
    in its place, the block runs again on it, and the run finishes as an unbroken one, 1 lost and 1
    replaced. Without replacement, the side has no replica left and the run stops."""
    svc, model = ray_service
    here = _run(svc, model, cluster=None, replicas={})
    events = []
    run = _one_replica_each(svc, model, ",fail_after=6", emit=events.append)
    assert run.status == "diverged", run.error
    c = run.workload.cluster
    assert run.workload.done == len(PROMPTS) and c["replicas"] == {"ref": 1, "b": 1}
    assert len(c["lost_replicas"]) == 1 and "crashed after 6 prompts" in c["lost_replicas"][0], c
    assert c["replaced_replicas"] == ["b#0"] and c["retried_blocks"] == 1, c
    said = [e.message for e in events if e.kind == "status"]
    assert any(m.startswith("replica b#0 lost (") and "replacing it" in m for m in said), said
    assert any(m.startswith("replica b#0 replaced: loaded in") for m in said), said
    assert _by_prompt(svc, run) == _by_prompt(svc, here)  # every prompt once, the unbroken run's figures
    assert "1 replica(s) lost, 1 replaced" in workload_card_html(svc.get_run(run.id, prompts=[]))


def test_on_ray_a_side_that_keeps_dying_is_replaced_once_a_replica_then_the_run_stops(ray_service):
    """An engine that crashes at every request: its one replica is replaced once (the side started with
    one), the replacement dies too and is not replaced, and the run stops with an error naming the side
    instead of starting replicas for ever."""
    svc, model = ray_service
    run = _one_replica_each(svc, model, ",fail_after=0")
    assert run.status == "error" and "no replica of b is left" in run.error, run.error
    c = run.workload.cluster
    assert c["replaced_replicas"] == ["b#0"] and len(c["lost_replicas"]) == 2, c
    assert run.workload.done == 0


def test_on_ray_a_replacement_that_does_not_start_stops_the_run_and_resume_finishes_it(ray_service):
    """The replacement itself dies while it starts (its actor killed): it is a lost replica too, b has
    none left, and the run stops with the 6 prompts of its finished blocks stored; resume goes on."""
    import ray

    svc, model = ray_service
    here = _run(svc, model, cluster=None, replicas={})
    killed: list[str] = []

    def kill_the_replacement(e):
        if e.kind == "status" and "replacing it" in e.message and not killed:
            new = next(h for h in svc._cluster.replicas.handles.values() if h.side == "b" and h.starting)
            killed.append(new.name)
            ray.kill(new.actor)

    run = _one_replica_each(svc, model, ",fail_after=6", emit=kill_the_replacement)
    assert killed and run.status == "error", run.error
    assert "every replica was lost" in run.error, run.error
    c = run.workload.cluster
    assert c["replaced_replicas"] == [] and len(c["lost_replicas"]) == 2, c
    assert any("(replacement): did not start" in x for x in c["lost_replicas"]), c
    assert run.workload.done == 6  # the two blocks b#0 finished before it crashed
    resumed = resume_workload(svc, run.id)
    assert resumed.status == "diverged" and resumed.workload.done == len(PROMPTS), resumed.error
    assert _by_prompt(svc, resumed) == _by_prompt(svc, here)


def test_routes_on_ray_are_recorded_compared_and_replayed_as_in_process(ray_service, tmp_path):
    """routes=true with --cluster local: the replicas answer the routes verbs (the side-set contract,
    parity_ui.run.sideset), so a scored workload's routing figures, its route replay's pair and the
    stored route agreements are the in-process run's."""
    from fake_engine import fake_model

    svc, _ = ray_service
    moe = str(fake_model(tmp_path / "moe", max_position_embeddings=64, moe=True))
    cfg = build_config(None, ["max_new_tokens=6", "routes=true"],
                       sides=["ref=fake", "b=fake,route_flip_every=3,replay_routes=ids"])
    runs = [run_workload(svc, WorkloadRequest(model=moe, prompts=PROMPTS[:6], config=cfg, options=WorkloadOptions(
        mode="scored", chunk=3, floor="none", cluster=cluster, replicas={ALL: 2} if cluster else {})))
        for cluster in (None, "local")]
    here, there = (r.workload for r in runs)
    for run in runs:
        assert run.status in ("ok", "diverged"), run.error
        assert not [w for w in run.warnings if w.code.startswith("route")], run.warnings
    assert there.cluster is not None and there.cluster["replicas"] == {"ref": 2, "b": 2}
    assert here.sides["b"].stats.family("routing")["route_differ"] > 0  # the flips are recorded, on Ray too
    assert there.sides["b"].stats.family("routing") == here.sides["b"].stats.family("routing")
    replayed = "b+ref routes"  # b scoring its own tokens with the reference's experts: no flip left
    assert there.sides[replayed].stats.to_dict() == here.sides[replayed].stats.to_dict()
    assert list(svc.store.route_agreements(runs[1].id, "b")) == list(svc.store.route_agreements(runs[0].id, "b"))


def test_the_cli_runs_a_workload_on_ray_and_its_screen_says_where(ray_service, tmp_path, capsys):
    """Last in the module: the CLI's service stops the local Ray instance when it closes."""
    import json

    from parity_ui.cli import main

    _, model = ray_service
    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in PROMPTS[:6]))
    code = main(["--db", str(tmp_path / "cli.db"), "compare", "--model", model, "--prompt-file", str(f),
                 "--side", "ref=fake", "--side", "b=fake,swap_at=3", "--set", "max_new_tokens=6", "--chunk", "2",
                 "--floor", "none", "--cluster", "local", "--replicas", "ref=1,b=2"])
    out = capsys.readouterr()
    assert code == 1, out.err  # diverged
    assert "on Ray cluster local (1 node" in out.out and "replicas ref x1, b x2" in out.out
    assert "batch composition differs per replica" in out.out
    assert "block(s) under way on" in out.err and "left" in out.err  # progress across the replicas, with an ETA
    bad = main(["--db", str(tmp_path / "cli.db"), "compare", "--model", model, "--prompt-file", str(f),
                "--side", "ref=fake", "--side", "b=fake", "--cluster", "local", "--replicas", "c=2", "--quiet"])
    assert bad == 2  # refused with the fix, nothing stored (issue 46 item 5)
    err = capsys.readouterr().err
    assert "not a side of this run" in err and "Fix:" in err and "stored as run" not in err
