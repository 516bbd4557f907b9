"""A whole RL run from real rollouts: a real vLLM (CPU, the tiny model, T=1 seeded sampling) makes the
rollouts once for the module; the trainer's logprobs of those tokens come from a real transformers
forward of the same weights, and from step 3 on of weights with ONE layer changed (its MLP's down
projection scaled by 1.25: a weight sync that missed a layer). Five steps are written in each of
prime-rl's, slime's (rollout + train dump v2) and NeMo-RL's formats (tests/rl_dumps.py):
- the trend (recorded-only, no engine) names step 3;
- a step's recorded-only figures equal, to the digit, the engine replay's pair of the same recorded
  rollout and trainer logprobs, and the engine's own trainer re-run agrees with the recorded trainer;
- follow mode picks up a step written while it runs and fails the gate there.
Small on purpose: 10 prompts, 8 tokens, 2 rows a step; the session `service` keeps workers warm."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from parity_ui.core.config import build_config
from parity_ui.core.trend import parse_gate
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.service import ReplayRequest, RunRequest, TrendRequest
from rl_dumps import write_nemo_step, write_prime_step, write_slime_step

pytestmark = pytest.mark.engines

SIDES = ["a=hf,dtype=float32", "b=vllm,dtype=float32,enforce_eager=true"]
PROMPTS = ["def parse(self, args):", "class Path(object):", "import json\nimport", "for i in range(",
           "return self._", "with open(path) as f:", "if __name__ ==", "raise ValueError(", "print(json.",
           "while True:"]
FORMATS = {"prime-rl": write_prime_step, "slime": write_slime_step, "nemo-rl": write_nemo_step}
FAULT_FROM = 3


@pytest.fixture(scope="module")
def rollouts(service, tiny_llama):
    """Real rollouts: (prompt ids, response ids, vLLM's logprobs) per prompt."""
    cfg = build_config(None, ["temperature=1.0", "seed=11", "max_new_tokens=8"], sides=SIDES)
    run = service.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text=p) for p in PROMPTS], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    out = []
    for pr in run.prompts:
        res = pr.results["b"]
        out.append((list(pr.prompt_token_ids), list(res.token_ids), [s.logprob for s in res.steps]))
    return out


def _trainer_logprobs(folder, rows, change_layer=False):
    """The trainer: a transformers forward over prompt + response, the logprob of each response token."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    if change_layer:  # one layer's worth of fault: the last layer's MLP output scaled
        with torch.no_grad():
            model.model.layers[-1].mlp.down_proj.weight.mul_(1.25)
    out = []
    with torch.no_grad():
        for p, r, _ in rows:
            ids = torch.tensor([p + r])
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            out.append([float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(r)])
    return out


@pytest.fixture(scope="module")
def steps(rollouts, tiny_llama):
    """Five steps of two rows each: the recorded rollout and the trainer (clean, then one layer off)."""
    clean = _trainer_logprobs(tiny_llama, rollouts)
    fault = _trainer_logprobs(tiny_llama, rollouts, change_layer=True)
    out = {}
    for s in range(1, 6):
        rows = []
        for k in (2 * (s - 1), 2 * (s - 1) + 1):
            p, r, lp = rollouts[k]
            trainer = fault[k] if s >= FAULT_FROM else clean[k]
            rows.append({"prompt": p, "response": r, "rollout": lp, "trainer": trainer, "index": k, "version": s})
        out[s] = rows
    return out


@pytest.fixture(scope="module")
def run_dirs(steps, tmp_path_factory):
    dirs = {}
    for fmt, write in FORMATS.items():
        root = tmp_path_factory.mktemp(fmt.replace("-", ""))
        for s, rows in steps.items():
            write(root, s, rows)
        dirs[fmt] = root
    return dirs


def _trend(service, model, root, **kw):
    return TrendRequest(root=str(root), model=str(model), config=build_config(None, [], sides=SIDES),
                        settle_s=0.0, **kw)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_trend_of_real_rollouts_names_step_3(service, tiny_llama, run_dirs, fmt):
    run = service.trend(_trend(service, tiny_llama, run_dirs[fmt]))
    report = service.store.trend(run.id)
    assert run.status == "ok" and [s.status for s in report.steps] == ["ok"] * 5, [s.note for s in report.steps]
    assert report.changes and report.changes[0].step == FAULT_FROM, report.changes
    k3 = {s.step: s.figures.figures["k3"] for s in report.steps}
    assert max(k3[1], k3[2]) * 100 < min(k3[3], k3[4], k3[5]), k3
    assert report.step(1).figures.tokens == 16 and report.mode == "recorded"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_recorded_only_figures_equal_the_engine_replay_to_the_digit(service, tiny_llama, run_dirs, fmt):
    from parity_ui.commands.replay_recorded import replay_recorded
    from parity_ui.inputs.run_steps import scan_run

    pair = "recorded vs trainer (recorded)"  # the same pair's one name in both replays

    srcs = {s.step: s for s in scan_run(run_dirs[fmt]).steps}
    for step in (1, FAULT_FROM):
        req = ReplayRequest(dump=str(srcs[step].path), model=str(tiny_llama), format=fmt, floor="none",
                            config=build_config(None, [], sides=SIDES))
        recorded = replay_recorded(service, req).run.workload
        engine = service.replay(req)
        assert engine.status in ("ok", "diverged"), engine.error
        a, b = recorded.sides[pair], engine.workload.sides[pair]
        assert dataclasses.asdict(a.stats) == dataclasses.asdict(b.stats), (fmt, step)  # the clipped ratio too
        assert dataclasses.asdict(a.hist) == dataclasses.asdict(b.hist)
        assert recorded.replay.tokens == engine.workload.replay.tokens and a.stats.family("clipped")
        assert recorded.replay.masked == engine.workload.replay.masked
        # The engine's own trainer (HF re-run) scores the recorded tokens as the recorded trainer did.
        own = engine.workload.replay.main
        assert own.name == "recorded vs a"
        rerun = engine.workload.sides[own.name].stats.tokens
        assert rerun.pairs == a.stats.tokens.pairs
        if step == 1:  # fp32, the same weights: the recorded trainer and the re-run agree to float rounding
            assert abs(rerun.abs_dlogp_max - a.stats.tokens.abs_dlogp_max) < 1e-4
        else:  # the recorded trainer had a layer off; the re-run (the right weights) has not
            assert rerun.k3 * 100 < a.stats.tokens.k3


def test_follow_picks_up_a_step_written_while_it_runs(service, tiny_llama, steps, tmp_path):
    root = tmp_path / "logs"
    for s in (1, 2):
        write_nemo_step(root, s, steps[s])
    clean = max(_k3(steps[1]), _k3(steps[2]))
    faulty = _k3(steps[FAULT_FROM])
    limit = (clean * faulty) ** 0.5  # between the clean steps' mismatch and the faulty one's
    seen = []

    def later():
        time.sleep(1.5)
        write_nemo_step(root, FAULT_FROM, steps[FAULT_FROM])

    writer = threading.Thread(target=later)
    writer.start()
    req = dataclasses.replace(
        _trend(service, tiny_llama, root), follow=True, settle_s=0.5, poll_s=0.1, idle_exit_s=60,
        gate=parse_gate([f"k3>{limit:.3g}"]),
    )
    run = service.trend(req, on_step=lambda s, r: seen.append(s.step))
    writer.join()
    report = service.store.trend(run.id)
    assert seen == [1, 2, FAULT_FROM] and report.breach["step"] == FAULT_FROM and run.status == "diverged"
    assert report.step(FAULT_FROM).landed_s is not None


def _k3(rows):
    import math

    vals = [math.exp(t - r) - (t - r) - 1 for row in rows for r, t in zip(row["rollout"], row["trainer"])]
    return sum(vals) / len(vals)
