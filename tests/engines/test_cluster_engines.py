"""Workloads on a local Ray instance with the real engines (HF reference, vLLM on the CPU), on the shared
tiny Llama in float32, 2 replicas a side: a scored and a free-running workload give the tokens and the
figures of the in-process path, and replicas killed mid-run are replaced and lose nothing. One Ray
instance for the module (the service's), stopped after it; 6 prompts of 16 tokens."""
from __future__ import annotations

import pytest

from parity_ui.commands.workload.run import WorkloadRequest, run_workload
from parity_ui.core.cluster import ALL
from parity_ui.core.config import build_config
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import pair_samples

PROMPTS = [PromptSpec(text=t) for t in ("def parse_args(", "class Namespace(", "import json", "return self.",
                                        "for key, value in", "if not isinstance(")]


@pytest.fixture(scope="module")
def on_ray(service):
    pytest.importorskip("ray")
    yield service
    service.close_cluster()  # the replicas' engines leave memory before the next module's tests


def _run(service, model, mode, cluster=None, emit=None):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=16", "ignore_eos=true"], sides=["ref=hf", "b=vllm"])
    opts = WorkloadOptions(mode=mode, floor="none", chunk=3, cluster=cluster, replicas={ALL: 2} if cluster else {})
    run = run_workload(service, WorkloadRequest(model=str(model), prompts=PROMPTS, config=cfg, options=opts), emit)
    assert run.status in ("ok", "diverged"), run.error
    assert run.workload.done == len(PROMPTS)
    return run


@pytest.fixture(scope="module")
def in_process(on_ray, tiny_llama):
    """The scored and the free workload in process, once for the module: what both tests hold the Ray
    runs to (the free one's streams are also the replay test's dump)."""
    return {mode: _run(on_ray, tiny_llama, mode) for mode in ("scored", "free")}


def _tokens(service, run):
    got = service.get_run(run.id)
    return {(p.index, side): list(r.token_ids) for p in got.prompts for side, r in p.results.items()}


def _figures(run):
    return {n: f.stats.to_dict() for n, f in run.workload.sides.items()}


def _differ(a, b, path="", tol=1e-5) -> list[str]:
    """Where two figures' records differ: not equal, or (floats) more than float32 rounding apart."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _differ(a[k], b[k], f"{path}.{k}", tol)]
    if isinstance(a, list) and isinstance(b, list):
        if path.endswith("worst_by_gap"):  # prompts whose gaps tie up to float32 rounding may swap places
            a, b = (sorted(x, key=lambda w: w["prompt_index"]) for x in (a, b))
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differ(x, y, f"{path}[{i}]", tol)]
    if isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= tol else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_scored_and_free_on_ray_give_the_in_process_tokens_and_figures_and_killed_replicas_are_replaced(
        on_ray, tiny_llama, in_process):
    import ray

    service, here = on_ray, in_process
    for mode in ("scored", "free"):
        there = _run(service, tiny_llama, mode, cluster="local")
        assert len(_tokens(service, there)) == 2 * len(PROMPTS)
        assert _tokens(service, there) == _tokens(service, here[mode]), mode
        assert not _differ(_figures(there), _figures(here[mode])), (mode, _differ(_figures(there), _figures(here[mode])))
        c = there.workload.cluster
        assert c["replicas"] == {"ref": 2, "b": 2} and c["nodes"] == 1 and c["retried_blocks"] == 0
        assert any(f.code == "cluster-batches" for f in there.warnings)

    killed: list[str] = []
    status: list[str] = []

    def kill_every_vllm_replica(e):
        if e.kind == "status":
            status.append(e.message)
        # At the run's first progress line: the blocks are handed out, b#0 is (or is about to be) asked
        # for the first block's tokens; the driver learns of each death from its next call. With both
        # of b's replicas gone, every block waits for their replacements: none is left to go on with.
        if e.kind == "progress" and not killed:
            for h in [h for h in service._cluster.replicas.handles.values() if h.side == "b"]:
                killed.append(h.name)
                ray.kill(h.actor)

    again = _run(service, tiny_llama, "scored", cluster="local", emit=kill_every_vllm_replica)
    c = again.workload.cluster
    assert sorted(killed) == ["b#0", "b#1"] and c["retried_blocks"] >= 2, c
    # Both lost replicas get a replacement started; each serves once loaded. The first one loaded may
    # run every waiting block before the second is ready, and a replacement still loading when the run
    # ends is stopped, not counted as replaced (cluster.py, _bring_back): which of them made it is a race.
    assert len(c["lost_replicas"]) == 2, c
    assert sorted(n for n in ("b#0", "b#1") if any(m.startswith(f"replica {n} lost") and "replacing it" in m
                                                     for m in status)) == ["b#0", "b#1"], status
    assert c["replaced_replicas"] and set(c["replaced_replicas"]) <= {"b#0", "b#1"}, c
    assert _tokens(service, again) == _tokens(service, here["scored"])  # the replacements' tokens are b's
    rows = list(pair_samples(service.db, again.id, "b"))
    assert sorted(s.prompt_index for s in rows) == list(range(len(PROMPTS)))  # each prompt stored once


def test_a_replay_on_ray_gives_the_in_process_figures(on_ray, tiny_llama, in_process, tmp_path):
    """A dump of the tiny model's own greedy rollouts (its vLLM side's tokens and logprobs), replayed in
    process and on the replicas the workload test left warm: every pair's figures the same, and no engine
    started. The vLLM side forces tokens through prompt logprobs, as the workloads' does (a replay's
    default, forced_tokens=auto, is another engine setup: it would load trace replay where vLLM has it;
    tests/engines/test_replay_engines.py runs that default)."""
    import json

    from parity_ui.service import ReplayRequest

    service = on_ray
    got = service.get_run(in_process["free"].id)
    dump = tmp_path / "r.jsonl"
    with open(dump, "w") as f:
        for p in got.prompts:
            b = p.results["b"]
            f.write(json.dumps({"prompt_ids": list(p.prompt_token_ids), "response_ids": list(b.token_ids),
                                "rollout_logprobs": [s.logprob for s in b.steps],
                                "loss_mask": [1] * len(b.token_ids)}) + "\n")
    cfg = build_config(None, ["dtype=float32", "ignore_eos=true"], sides=["ref=hf", "b=vllm,forced_tokens=prompt"])
    status: list[str] = []
    # The workload test's last run killed b's replicas; a replacement still loading when that run ended was
    # stopped (a race it allows): only such a replica may start again here, nothing else.
    down = {h.name for h in service._cluster.replicas.handles.values() if not h.alive}

    def note(e):
        if e.kind == "status":
            status.append(e.message)

    runs = [service.replay(ReplayRequest(dump=str(dump), model=str(tiny_llama), config=cfg, chunk=3, floor="none",
                                         cluster=cluster, replicas={ALL: 2} if cluster else {}), note)
            for cluster in (None, "local")]
    started = [m for m in status if (m.startswith("starting") and "replica(s)" not in m) or "starting its engine" in m]
    assert not started, started  # the workloads' warm in-process workers served the replay
    replicas = {n for m in status if "replica(s) on the Ray cluster (" in m
                for n in m.split("on the Ray cluster (", 1)[1].split(")", 1)[0].split(", ")}
    assert replicas <= down, (replicas, down)  # and their warm replicas, but for any the kill left down
    for run in runs:
        assert run.kind == "replay" and run.status in ("ok", "diverged"), run.error
        assert run.workload.done == len(PROMPTS)
    here, there = ({n: f.stats.to_dict() for n, f in r.workload.sides.items()} for r in runs)
    assert set(here) >= {"recorded vs ref", "b vs ref"} and not _differ(there, here), _differ(there, here)
    assert runs[1].workload.cluster["replicas"] == {"ref": 2, "b": 2}
