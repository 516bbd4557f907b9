"""The tokenizer folders of the clean_up_tokenization_spaces tests (tests/unit/test_clean_up_spaces.py and
tests/engines/test_clean_up_spaces_engines.py): a tiny model whose tokenizer_config.json asks for the
clean-up, and every transformers warning caught as text."""
from __future__ import annotations

import json
import logging
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

WARNING = "clean_up_tokenization_spaces"
TEXT = "Hello , world . Is it ? Yes ! do n't"


def with_config(src: Path, dst: Path, **keys) -> Path:
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}, indent=2))
    return dst


@pytest.fixture(scope="module")
def model(build_tiny):
    return build_tiny("llama")  # the session's tiny Llama: the tests change a copy (with_config)


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
