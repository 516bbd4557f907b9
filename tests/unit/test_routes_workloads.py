"""MoE routes in workloads and replays above the engines, on the fake kind (its routes: 2 MoE layers,
8 experts, top-2, a fixed function of the context; `route_flip_every` plants route flips): a resumed
workload pools every stored chunk's routes, scored mode compares the reference's routes on a side's
tokens with the side's own, a scored route replay, and a dump's recorded routes in a replay."""
from __future__ import annotations

import pytest

from fake_engine import fake_model, fake_service, registered
from parity_ui.commands.workload.run import WorkloadRequest, resume_workload, run_workload
from parity_ui.core.config import build_config
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.inputs.prompts import PromptSpec

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(24)]
NEW = 10


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with registered():
        yield str(fake_model(tmp_path_factory.mktemp("fake"), max_position_embeddings=64))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _workload(svc, model, *sides, emit=None, overrides=(), **options):
    cfg = build_config(None, [f"max_new_tokens={NEW}", "routes=true", *overrides], sides=list(sides))
    opts = WorkloadOptions(**{"chunk": 8, **options})
    return run_workload(svc, WorkloadRequest(model=model, prompts=list(PROMPTS), config=cfg, options=opts), emit)


def test_a_resumed_workload_pools_the_routes_of_every_stored_chunk(service, model):
    sides = ("ref=fake,delay_ms=2", "b=fake,route_flip_every=3")
    whole = _workload(service, model, *sides)
    assert whole.status == "ok", whole.error
    full = whole.workload.sides["b"].stats.routing
    # every prompt's 10 tokens x 2 layers compared (the tokens agree); flips at input positions % 3 == 0
    assert full["cells"] == len(PROMPTS) * NEW * 2 and full["tokens"] == len(PROMPTS) * NEW
    assert 0.1 < full["route_differ"] < 0.25 and full["route_same_set"] == pytest.approx(1 - full["route_differ"])
    assert whole.workload.floor_figures.stats.routing["route_differ"] == 0.0
    assert "above the floor" in whole.workload.sides["b"].routing_verdict

    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 8:
            service.cancel()

    run = _workload(service, model, *sides, emit=stop_after_first_chunk)
    assert run.status == "cancelled" and 8 <= run.workload.done < len(PROMPTS), run.error
    assert run.workload.sides["b"].stats.routing["tokens"] == run.workload.done * NEW  # the figures so far
    again = resume_workload(service, run.id)
    assert again.status == "ok" and again.workload.done == len(PROMPTS), again.error
    # the resumed run's routing figures count the chunks run before the resume too: the whole run's figures
    assert again.workload.sides["b"].stats.routing == full
    assert again.workload.floor_figures.stats.routing == whole.workload.floor_figures.stats.routing
    assert again.workload.sides["b"].routing_verdict == whole.workload.sides["b"].routing_verdict
    stored = service.store.get_run(run.id, prompts=[]).workload
    assert stored.sides["b"].stats.routing == full
