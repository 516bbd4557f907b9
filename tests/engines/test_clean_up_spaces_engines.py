"""A real run (HF and vLLM) with a tokenizer whose tokenizer_config.json asks for clean_up_tokenization_spaces:
no "Ignoring clean_up_tokenization_spaces=True ..." in the tool nor in the workers' logs. Decoding
without engines is tests/unit/test_clean_up_spaces.py."""
from __future__ import annotations

from pathlib import Path

from clean_up_models import TEXT, WARNING, caught, model, with_config  # noqa: F401  (model: a fixture)
from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec


def test_a_run_prints_no_clean_up_warning_in_the_tool_nor_in_the_workers_logs(service, model, tmp_path):
    """A real run, HF and vLLM: the run's own process decodes every token, vLLM's worker would
    detokenize every top-k token of every step (it no longer does: parity-ui never reads vLLM's text)."""
    folder = with_config(model, tmp_path / "m", clean_up_tokenization_spaces=True)
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=8", "ignore_eos=true"])
    with caught() as seen:
        run = service.run(RunRequest(model=str(folder), prompts=[PromptSpec(text=TEXT)], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    assert not [m for m in seen if WARNING in m], seen
    logs = {w.label: Path(w.log_path).read_text(errors="replace") for w in service.pool.workers.values()
            if w.log_path}
    assert {"hf", "vllm"} <= set(logs), list(logs)
    assert not [name for name, text in logs.items() if WARNING in text], \
        {name: [ln for ln in text.splitlines() if WARNING in ln] for name, text in logs.items()}
    assert TEXT in run.prompts[0].prompt_text
