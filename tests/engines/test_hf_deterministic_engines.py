"""An hf side's `deterministic=true` in a real transformers worker on the CPU: the worker turned torch's
deterministic algorithms on (read back from torch in the worker, in the side's resolved settings, with
cuBLAS's workspace from its environment and the ops torch warned about at load), it is a worker of its
own, and on the CPU (whose kernels are deterministic already) the tokens and logprob bits are the plain
side's. Whether it makes a GPU's replay identical is a GPU figure: bench/audit.py --setup hf-det."""
from __future__ import annotations

from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.prepare import RunRequest


def test_deterministic_is_applied_in_its_own_worker_and_changes_no_bit_on_the_cpu(service, tiny_llama):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=12", "ignore_eos=true", "batch_size=2"],
                       sides=["hf=hf", "det=hf,deterministic=true"])
    prompts = [PromptSpec(text="def parse_args(self, args=None, namespace=None):"),
               PromptSpec(text="Give me a brief explanation of gravity in simple terms, please.")]
    run = service.run(RunRequest(model=str(tiny_llama), prompts=prompts, config=cfg))
    assert run.status == "ok", run.error
    plain, det = run.side("hf").resolved, run.side("det").resolved
    assert plain["deterministic"] == "off" and "nondeterministic_ops" not in plain
    assert det["deterministic"] == "on (warn_only)"  # torch.are_deterministic_algorithms_enabled() in the worker
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in det["deterministic_settings"]
    assert "cudnn.deterministic=True, cudnn.benchmark=False, cuDNN attention off" in det["deterministic_settings"]
    assert "cudnn" not in det["sdpa_kernels"] and plain["sdpa_kernels"] == "torch's choice"
    assert det["nondeterministic_ops"] == [] and det["deterministic_probe"].startswith("a 2-token generate")
    workers = service.pool.by_side()
    assert workers["hf"].pid != workers["det"].pid  # a load-time setting: two processes
    for p in run.prompts:
        a, b = p.results["hf"], p.results["det"]
        assert len(a.token_ids) == 12 and a.token_ids == b.token_ids
        assert [s.logprob for s in a.steps] == [s.logprob for s in b.steps]  # the same bits, not merely close
