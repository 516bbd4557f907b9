"""Workloads on the real engines (vLLM on the CPU and HF), on the shared tiny Llama: float32 is identical
everywhere with a zero floor, bfloat16 is judged against the floor, scored mode gives free-running's
per-token gaps up to each fork, Stop and resume finish every prompt exactly once, and a .parquet and a
.jsonl of the same prompts make the same run. Kept small: 24 prompts, a few tokens each."""
from __future__ import annotations

import json

import pytest

from parity_ui.core.config import build_config
from parity_ui.store.runs import pair_samples
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.commands.workload.run import WorkloadRequest, resume_workload, run_workload
from parity_ui.inputs.workload_source import load_workload


LINES = ["def parse_args(", "class Namespace(", "import json", "return self.", "for key, value in",
         "if not isinstance(", "raise ValueError(", "with open(path", "def __init__(self,", "try:\n    import",
         "while True:", "print(f\"{name}", "from pathlib import", "def __repr__(self):", "elif option ==",
         "lambda x: x", "self._parser =", "assert len(", "yield from", "def wrap(text,", "except KeyError:",
         "args = parser.", "return {k: v", "if __name__"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("workload")
    jsonl, parquet = root / "w.jsonl", root / "w.parquet"
    jsonl.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in LINES))
    pq.write_table(pyarrow.table({"prompt": LINES, "id": list(range(len(LINES)))}), parquet)
    return {"jsonl": jsonl, "parquet": parquet}


def _run(service, model, files, dtype, emit=None, fmt="jsonl", sides=("ref=hf", "b=vllm"), **options):
    cfg = build_config(None, [f"dtype={dtype}", "max_new_tokens=6", "ignore_eos=true"], sides=list(sides))
    src = load_workload(files[fmt])
    opts = WorkloadOptions(**{"chunk": 8, **options}, source={"content_hash": src.content_hash})
    return run_workload(service, WorkloadRequest(model=str(model), prompts=src.prompts, config=cfg, options=opts), emit)


def _samples(service, run, side="b"):
    return list(pair_samples(service.db, run.id, side))


def test_float32_is_identical_everywhere_and_the_floor_is_zero(service, tiny_llama, files):
    run = _run(service, tiny_llama, files, "float32")
    assert run.status == "ok", run.error
    w = run.workload
    assert w.done == len(LINES) and w.floor.change == "batch"
    b, floor = w.sides["b"].stats, w.floor_figures.stats
    assert b.sequences.share_identical == 1.0 and floor.sequences.share_identical == 1.0
    assert b.tokens.abs_dlogp_max < 1e-3 and floor.tokens.abs_dlogp_max < 1e-3  # rounding only
    assert w.sides["b"].verdict.verdict == "within noise"


def test_bfloat16_figures_are_judged_against_the_floor(service, tiny_llama, files):
    run = _run(service, tiny_llama, files, "bfloat16")
    assert run.status in ("ok", "diverged"), run.error
    f = run.workload.sides["b"]
    assert f.stats.tokens.abs_dlogp_max > 1e-3  # bf16 rounding shows
    assert f.verdict.verdict in ("within noise", "exceeds noise")
    checked = {c.name: c for c in f.verdict.figures}
    assert checked["abs_dlogp_p99"].floor == run.workload.floor_figures.stats.tokens.abs_dlogp_p99
    assert checked["abs_dlogp_p99"].side == f.stats.tokens.abs_dlogp_p99


def test_scored_mode_gives_the_free_running_gaps_up_to_each_fork(service, tiny_llama, files):
    free = _run(service, tiny_llama, files, "float32", floor="none")
    scored = _run(service, tiny_llama, files, "float32", mode="scored", floor="none")
    assert scored.status in ("ok", "diverged"), scored.error
    by_prompt = {s.prompt_index: s for s in _samples(service, scored)}
    compared = 0
    for f in _samples(service, free):
        s = by_prompt[f.prompt_index]
        n = len(f.logp_side)  # free-running: up to the fork
        # The same tokens (vLLM generated both), the reference on the same context: HF's incremental
        # decode against one teacher-forced forward, equal to float32 rounding (a scoring shifted by
        # one position would be off by nats).
        assert list(s.logp_side[:n]) == pytest.approx(list(f.logp_side), abs=1e-6)
        assert list(s.logp_ref[:n]) == pytest.approx(list(f.logp_ref), abs=1e-4)
        assert s.first_divergence == f.first_divergence
        compared += n
    assert compared > len(LINES)


def test_stop_and_resume_finish_every_prompt_exactly_once(service, tiny_llama, files):
    def stop_after_the_first_chunk(e):
        if e.kind == "progress" and e.prompt_index >= 8:
            service.cancel()

    run = _run(service, tiny_llama, files, "float32", emit=stop_after_the_first_chunk)
    assert run.status == "cancelled" and 8 <= run.workload.done < len(LINES), run.error
    again = resume_workload(service, run.id)
    assert again.status == "ok", again.error
    for side in ("b", "floor"):
        assert sorted(s.prompt_index for s in _samples(service, again, side)) == list(range(len(LINES)))


def test_parquet_and_jsonl_make_the_same_run(service, tiny_llama, files):
    a = _run(service, tiny_llama, files, "float32", fmt="jsonl", floor="none")
    b = _run(service, tiny_llama, files, "float32", fmt="parquet", floor="none")
    assert a.workload.sides["b"].stats == b.workload.sides["b"].stats
    ids = {run.id: [s.logp_side for s in _samples(service, run)] for run in (a, b)}
    assert ids[a.id] == ids[b.id]
