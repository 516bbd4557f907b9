"""A tokenizer whose tokenizer_config.json asks for clean_up_tokenization_spaces (GGUF conversions write
it): parity-ui decodes tokens as they are, so it neither strips spaces before punctuation nor makes
transformers print "Ignoring clean_up_tokenization_spaces=True for BPE tokenizer ..." into a run.
The real run (HF and vLLM workers' logs) is tests/engines/test_clean_up_spaces_engines.py."""
from __future__ import annotations

from pathlib import Path

from clean_up_models import TEXT, WARNING, caught, model, with_config  # noqa: F401  (model: a fixture)
from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest, prepare
from parity_ui.inputs.prompts import PromptSpec, decode_as_is
from parity_ui.run.recorder import decode_result
from parity_ui.core.types import SideResult, TokenStep


def _prepare(model: Path):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=8"])
    return prepare(RunRequest(model=str(model), prompts=[PromptSpec(text=TEXT)], config=cfg), False)


def test_a_default_prepare_and_decoding_print_no_clean_up_warning(model, tmp_path):
    folder = with_config(model, tmp_path / "m", clean_up_tokenization_spaces=True)
    with caught() as seen:
        prep = _prepare(folder)
        ids = prep.prompts[0].token_ids
        res = SideResult(side="hf", prompt_index=0, token_ids=ids,
                         steps=[TokenStep(position=i, token_id=t, text="", logprob=-0.5, rank=1) for i, t in enumerate(ids)])
        decode_result(prep.tokenizer, res)  # what the service does with every side's tokens
    assert not [m for m in seen if WARNING in m], seen
    assert res.text == prep.prompts[0].text and TEXT in res.text
    from transformers import AutoTokenizer

    with caught() as seen:  # the control: transformers' own default decode does print it
        AutoTokenizer.from_pretrained(folder).decode(ids)
    assert [m for m in seen if WARNING in m], "this tokenizer config no longer triggers the warning"


def test_decoding_keeps_the_spaces_a_clean_up_would_strip(model, tmp_path):
    """Told to clean up even a BPE tokenizer's output, transformers' default decode rewrites ' ,' as ','
    and "do n't" as "don't": parity-ui shows the tokens' own text."""
    folder = with_config(model, tmp_path / "m", clean_up_tokenization_spaces=True,
                          clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True)
    prep = _prepare(folder)
    tok, enc = prep.tokenizer, prep.prompts[0]
    assert TEXT in enc.text and TEXT in tok.decode(enc.token_ids)
    assert "".join(tok.token_text(t) for t in enc.token_ids) == tok.decode(enc.token_ids)
    from transformers import AutoTokenizer

    # The control: transformers' default decode of this config cleans up (the run's tokenizer may be the
    # light one, verified equal on what parity-ui asks, which never cleans up).
    cleaned = AutoTokenizer.from_pretrained(folder).decode(enc.token_ids)
    assert TEXT not in cleaned and "Hello, world." in cleaned
    assert decode_as_is(tok.tok, enc.token_ids) == enc.text
