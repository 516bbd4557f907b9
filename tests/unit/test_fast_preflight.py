"""Issue 33 item 4: a preflight error that needs no weights (--chat on a model without a chat template)
is found from the model's files, before transformers and torch import and before any worker starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity_ui.core.errors import PromptError
from parity_ui.inputs.prompts import PromptSpec, check_chat_template, has_chat_template_file

ROOT = Path(__file__).resolve().parents[2]


def _folder(tmp_path: Path, template: str | None) -> Path:
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if template is not None:
        cfg["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_the_chat_template_is_read_from_the_files(tmp_path):
    assert has_chat_template_file(str(_folder(tmp_path / "a", "{{ x }}") if (tmp_path / "a").mkdir() is None else "")) is True
    (tmp_path / "b").mkdir()
    assert has_chat_template_file(str(_folder(tmp_path / "b", None))) is False
    (tmp_path / "b" / "chat_template.jinja").write_text("{{ x }}")
    assert has_chat_template_file(str(tmp_path / "b")) is True
    assert has_chat_template_file(str(tmp_path / "nothing-here")) is None  # cannot tell: the tokenizer decides


def test_chat_without_a_template_is_refused_with_the_tokenizers_words(tmp_path):
    folder = str(_folder(tmp_path, None))
    with pytest.raises(PromptError) as e:
        check_chat_template(folder, [PromptSpec(text="hi")], chat=True)
    assert e.value.message == "chat=true but the model has no chat template"
    with pytest.raises(PromptError):
        check_chat_template(folder, [PromptSpec(messages=[{"role": "user", "content": "hi"}])], chat=False)
    check_chat_template(folder, [PromptSpec(text="hi")], chat=False)  # plain text: fine


def test_a_fresh_process_refuses_it_without_importing_transformers(tmp_path):
    from tiny_models import build_model

    model = build_model(tmp_path / "m", "llama")
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    for extra in ("chat_template.jinja", "chat_template.json"):
        (model / extra).unlink(missing_ok=True)
    code = (f"import sys\nfrom parity_ui.core.config import build_config\nfrom parity_ui.run.prepare import prepare, "
            f"RunRequest\nfrom parity_ui.inputs.prompts import PromptSpec\ntry:\n    prepare(RunRequest(model={str(model)!r}, "
            f"prompts=[PromptSpec(text='hi')], config=build_config(None, ['chat=true'])), False)\nexcept Exception as e:\n"
            f"    print('REFUSED', e)\nprint('TRANSFORMERS', 'transformers' in sys.modules, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120).stdout
    assert "REFUSED chat=true but the model has no chat template" in out, out
    assert "TRANSFORMERS False False" in out, out
