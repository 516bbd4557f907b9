"""A tokenizer whose tokenizer_config.json asks for clean_up_tokenization_spaces (GGUF conversions write
it): parity-ui decodes tokens as they are, so it neither strips spaces before punctuation nor makes
transformers print "Ignoring clean_up_tokenization_spaces=True for BPE tokenizer ..." into a run."""
from __future__ import annotations

import json
import logging
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest, prepare
from parity_ui.inputs.prompts import PromptSpec, decode_as_is
from parity_ui.run.recorder import decode_result
from parity_ui.core.types import SideResult, TokenStep

WARNING = "clean_up_tokenization_spaces"
TEXT = "Hello , world . Is it ? Yes ! do n't"


def _with_config(src: Path, dst: Path, **keys) -> Path:
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}, indent=2))
    return dst


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("cleanup") / "llama", "llama")


@contextmanager
def caught():
    """Every transformers log record and Python warning inside, as text; transformers' warning_once
    forgotten first, so a warning printed earlier in this process can be printed (and seen) again."""
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.DEBUG)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            yield seen
        seen.extend(str(w.message) for w in ws)
    finally:
        logger.removeHandler(handler)


def _prepare(model: Path):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=8"])
    return prepare(RunRequest(model=str(model), prompts=[PromptSpec(text=TEXT)], config=cfg), False)


def test_a_default_prepare_and_decoding_print_no_clean_up_warning(model, tmp_path):
    folder = _with_config(model, tmp_path / "m", clean_up_tokenization_spaces=True)
    with caught() as seen:
        prep = _prepare(folder)
        ids = prep.prompts[0].token_ids
        res = SideResult(side="hf", prompt_index=0, token_ids=ids,
                         steps=[TokenStep(position=i, token_id=t, text="", logprob=-0.5, rank=1) for i, t in enumerate(ids)])
        decode_result(prep.tokenizer, res)  # what the service does with every side's tokens
    assert not [m for m in seen if WARNING in m], seen
    assert res.text == prep.prompts[0].text and TEXT in res.text
    with caught() as seen:  # the control: transformers' own default decode does print it
        prep.tokenizer.tok.decode(ids)
    assert [m for m in seen if WARNING in m], "this tokenizer config no longer triggers the warning"


def test_decoding_keeps_the_spaces_a_clean_up_would_strip(model, tmp_path):
    """Told to clean up even a BPE tokenizer's output, transformers' default decode rewrites ' ,' as ','
    and "do n't" as "don't": parity-ui shows the tokens' own text."""
    folder = _with_config(model, tmp_path / "m", clean_up_tokenization_spaces=True,
                          clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True)
    prep = _prepare(folder)
    tok, enc = prep.tokenizer, prep.prompts[0]
    assert TEXT in enc.text and TEXT in tok.decode(enc.token_ids)
    assert "".join(tok.token_text(t) for t in enc.token_ids) == tok.decode(enc.token_ids)
    cleaned = tok.tok.decode(enc.token_ids)  # the control: this config does clean up by default
    assert TEXT not in cleaned and "Hello, world." in cleaned
    assert decode_as_is(tok.tok, enc.token_ids) == enc.text


@pytest.mark.engines
def test_a_run_prints_no_clean_up_warning_in_the_tool_nor_in_the_workers_logs(service, model, tmp_path):
    """A real run, HF and vLLM: the run's own process decodes every token, vLLM's worker would
    detokenize every top-k token of every step (it no longer does: parity-ui never reads vLLM's text)."""
    folder = _with_config(model, tmp_path / "m", clean_up_tokenization_spaces=True)
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
