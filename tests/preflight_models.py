"""The models of the preflight tests (tests/unit/test_preflight.py and its engine run,
tests/engines/test_preflight_engines.py): one tiny model, and copies of it with edited JSON files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tiny_models import build_model

PROMPT = "def main(args):"
TRAP = {"do_sample": True, "temperature": 0.7, "top_k": 20, "repetition_penalty": 1.3}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("pre") / "base")


@pytest.fixture
def variant(base, tmp_path):
    """A copy of the base model with edited JSON files (no weights are read by preflight)."""
    def make(config: dict | None = None, generation: dict | None = None, template: str | None = None,
             drop: tuple[str, ...] = ()) -> Path:
        folder = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
        shutil.copytree(base, folder)
        for name, edit in (("config.json", config), ("generation_config.json", generation)):
            if edit is not None:
                data = json.loads((folder / name).read_text())
                for k, v in edit.items():
                    if v is None:
                        data.pop(k, None)
                    else:
                        data[k] = v
                (folder / name).write_text(json.dumps(data))
        if template is not None:
            (folder / "chat_template.jinja").write_text(template)
        for key in drop:
            data = json.loads((folder / "config.json").read_text())
            data.pop(key, None)
            (folder / "config.json").write_text(json.dumps(data))
        return folder
    return make
