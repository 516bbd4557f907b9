"""Where a run's replicas sit on a cluster's GPUs: the layout rule (parity_ui.run.cluster.group_layout),
and, on a real local Ray instance given 2 logical GPUs (Ray assigns and names them as on a GPU node; no
GPU is touched: the fake engine runs in the replicas' workers), a TP=2 side's replica group placed as
one placement group of 2 GPUs on one node, the reference on the first of them and the TP side on both,
as in process, and a lost replica's replacement placed on the same GPUs."""
from __future__ import annotations

import functools
import time

import pytest

from fake_engine import fake_model, fake_service
from parity_ui.core.cluster import ALL, ClusterSpec
from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.cluster import gpus_per_replica, group_layout
from parity_ui.run.pipeline import CapabilityError
from parity_ui.run.prepare import RunRequest, prepare


def test_a_replica_group_is_the_widest_sides_gpus_and_the_others_sit_on_the_first_as_in_process():
    assert group_layout({"ref": 1, "b": 1}) == (1, {"ref": (0.5, 1), "b": (0.5, 1)})  # one GPU, a share each
    assert group_layout({"ref": 1, "b": 1, "floor": 1})[1]["floor"] == (1 / 3, 1)
    # TP=2: 2 GPUs, not 3 (the reference does not get a GPU of its own, as in process it shares GPU 0);
    # Ray cannot give a fraction and whole GPUs at once, so the sides are given the group's GPUs by name.
    assert group_layout({"ref": 1, "b": 2}) == (2, {"ref": (0.0, 1), "b": (0.0, 2)})
    assert group_layout({"ref": 2, "b": 4}) == (4, {"ref": (0.0, 2), "b": (0.0, 4)})


def test_a_vllm_sides_tensor_parallel_size_is_its_replicas_gpus(tiny_llama):
    cfg = build_config(None, ["max_new_tokens=4"], sides=["ref=hf", "b=vllm,tensor_parallel_size=2"])
    prep = prepare(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text="def f(x):")], config=cfg), True)
    assert {p.name: gpus_per_replica(p) for p in prep.sides} == {"ref": 1, "b": 2}


def test_a_tp2_side_on_ray_is_one_placement_group_of_2_gpus_and_a_replacement_lands_on_them(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from parity_ui.run import cluster

    cluster.shutdown()  # a Ray instance of its own: one with GPUs
    monkeypatch.setattr(ray, "init", functools.partial(ray.init, num_gpus=2))
    # The fake engine has no tensor_parallel_size option: b is made a TP=2 side where the placement reads it.
    monkeypatch.setattr(cluster, "gpus_per_replica", lambda p: 2 if p.name == "b" else 1)
    with fake_service(tmp_path / "runs.db") as svc:
        model = str(fake_model(tmp_path / "fake", max_position_embeddings=64))
        cfg = build_config(None, ["max_new_tokens=4"], sides=["ref=fake", "b=fake,shift=0.1"])
        prep = prepare(RunRequest(model=model, prompts=[PromptSpec(text="def f(x):")], config=cfg), False)
        with svc.cluster_sides(prep.sides, ClusterSpec("local", {ALL: 1}), gpu=True) as sides:
            reps = svc._cluster.replicas
            (group,) = reps.groups
            table = ray.util.placement_group_table(group)
            assert table["strategy"] == "STRICT_PACK" and table["bundles"] == {0: {"GPU": 2.0}}, table
            assert reps.devices == [["0", "1"]] and "1 replica group(s) of 2 GPUs" in reps.placement
            seen = {h.side: ray.get(h.actor.start.remote())["devices"] for h in reps.handles.values()}
            assert seen == {"ref": "0", "b": "0,1"}  # the reference on the first, the TP side on both

            b = next(h for h in reps.handles.values() if h.side == "b")
            with sides.lock:
                sides._lost(b, "killed by the test")
            deadline = time.monotonic() + 120
            while not any(h.side == "b" and h.alive for h in reps.handles.values()):
                assert time.monotonic() < deadline, sides.lost
                time.sleep(0.2)
            again = next(h for h in reps.handles.values() if h.side == "b")
            assert again is not b and ray.get(again.actor.start.remote())["devices"] == "0,1"
            assert sides.replaced == ["b#0"]

        # A group no node can hold is refused with the fix, not waited for (Ray would wait for ever).
        monkeypatch.setattr(cluster, "gpus_per_replica", lambda p: 4 if p.name == "b" else 1)
        svc._cluster.release()  # (a real TP=4 side is another setup: its replicas are not the warm ones)
        with pytest.raises(CapabilityError) as e:
            with svc.cluster_sides(prep.sides, ClusterSpec("local", {ALL: 1}), gpu=True):
                pass
        assert "needs 4 GPUs on one node" in e.value.message and "largest node has 2" in e.value.message
        assert "at most 2 GPUs" in e.value.fix
