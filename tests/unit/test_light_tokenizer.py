"""Issue 33 item 4: a tokenizer verified equal to transformers' loads without transformers (and torch),
so a fresh CLI process tokenizes its prompts in a fraction of a second; one that differs keeps
transformers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity_ui.inputs import light_tokenizer as lt
from parity_ui.inputs.prompts import PromptSpec, PromptTokenizer
from tiny_models import build_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    a = tmp_path_factory.mktemp("tok-a")
    build_tokenizer(a)
    b = tmp_path_factory.mktemp("tok-b")
    build_tokenizer(b, vocab_size=700)
    return str(a), str(b)


def test_the_light_tokenizer_answers_as_transformers_does(folders, cache):
    from transformers import AutoTokenizer

    folder = folders[0]
    full, light = AutoTokenizer.from_pretrained(folder), lt.LightTokenizer(folder)
    assert lt.candidate(folder)
    assert lt.differences(light, full) == []
    chat = [{"role": "user", "content": "Give me a brief explanation of gravity."}]
    assert light.apply_chat_template(chat, add_generation_prompt=True) == \
        full.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    text = "def f(x):\n    return x ** 2  # ünïcödé"
    assert light(text)["input_ids"] == full(text)["input_ids"]
    assert light.decode(light(text)["input_ids"]) == full.decode(full(text)["input_ids"], clean_up_tokenization_spaces=False)


def test_a_tokenizer_that_differs_is_named_and_keeps_transformers(folders, cache):
    from transformers import AutoTokenizer

    a, b = folders
    diffs = lt.differences(lt.LightTokenizer(a), AutoTokenizer.from_pretrained(b))  # another vocabulary
    assert diffs and any(d.startswith("len") for d in diffs)
    # A verdict "differs" is kept, and the next load goes through transformers.
    fp = lt.fingerprint(a)
    (cache / "tokenizer-checks").mkdir(parents=True)
    (cache / "tokenizer-checks" / f"{fp}.json").write_text(json.dumps({"equal": False}))
    assert not lt.verified(a)
    assert PromptTokenizer(a).light is False


def test_the_first_load_verifies_and_the_next_is_light(folders, cache):
    folder = folders[0]
    assert not lt.verified(folder)
    first = PromptTokenizer(folder)
    assert first.light is False and lt.verified(folder)  # verified while transformers was loaded anyway
    second = PromptTokenizer(folder)
    assert second.light is True
    spec = PromptSpec(text="Name a prime.")
    for chat in (True, False):
        assert second.encode(spec, chat).token_ids == first.encode(spec, chat).token_ids
        assert second.encode(spec, chat).text == first.encode(spec, chat).text
    assert second.eos_token_ids == first.eos_token_ids and len(second.tok) == len(first.tok)
    ids = first.encode(spec, True).token_ids
    assert [second.token_text(i) for i in ids] == [first.token_text(i) for i in ids]
    assert [second.token_bytes(i) for i in ids] == [first.token_bytes(i) for i in ids]


def test_a_changed_tokenizer_file_asks_for_a_new_verification(folders, cache, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(folders[0], folder)
    PromptTokenizer(str(folder))
    assert lt.verified(str(folder))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages[0]['content'] }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not lt.verified(str(folder))


def test_trust_remote_code_never_takes_the_light_path(folders, cache):
    folder = folders[0]
    PromptTokenizer(folder)
    assert PromptTokenizer(folder, trust_remote_code=True).light is False


def test_a_fresh_process_tokenizes_without_importing_transformers_or_torch(folders, cache):
    folder = folders[0]
    PromptTokenizer(folder)  # verifies
    code = ("import sys; from parity_ui.inputs.prompts import PromptSpec, tokenizer_for, import_tokenizers_ahead; "
            f"assert import_tokenizers_ahead({folder!r}) is None; "
            f"t = tokenizer_for({folder!r}); ids = t.encode(PromptSpec(text='hi there'), True).token_ids; "
            "print(len(ids), t.light, 'transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PARITY_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    n, light, transformers, torch = out.stdout.split()
    assert int(n) > 0 and (light, transformers, torch) == ("True", "False", "False")


def test_a_fresh_process_tokenizes_at_once_and_verifies_in_another_process(folders, cache):
    """Issue 44: the first use of a tokenizer in a process without transformers does not wait for
    transformers' import: the light tokenizer answers, a verification runs in another process, and the
    run settles its verdict before an engine is handed a token (this process never imports torch)."""
    folder = folders[0]
    assert not lt.verified(folder)
    code = ("import sys, time; from parity_ui.inputs.prompts import PromptSpec, tokenizer_for, settle_tokenizers; "
            f"t0 = time.perf_counter(); t = tokenizer_for({folder!r}); "
            "ids = t.encode(PromptSpec(text='Name a prime.'), True).token_ids; took = time.perf_counter() - t0; "
            "pending = t.pending is not None; settle_tokenizers(); "
            "print(len(ids), t.light, pending, t.pending is None, 'transformers' in sys.modules, "
            "'torch' in sys.modules, round(took, 2))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PARITY_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    n, light, pending, settled, transformers, torch, took = out.stdout.split()
    assert int(n) > 0 and (light, pending, settled) == ("True", "True", "True")
    assert (transformers, torch) == ("False", "False")
    assert lt.verified(folder)  # the other process kept its verdict: equal
    assert PromptTokenizer(folder).encode(PromptSpec(text="Name a prime."), True).token_ids == \
        PromptTokenizer(folder, trust_remote_code=True).encode(PromptSpec(text="Name a prime."), True).token_ids


class _Verdict:
    """A verification that 'ran elsewhere' and kept the given verdict."""

    def __init__(self, model_path: str, equal: bool = False):
        self.model_path = model_path
        fp = lt.fingerprint(model_path)
        path = lt._verdict_path(fp)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"equal": equal, "model": model_path, "differences": ["made up by the test"]}))

    def wait(self, timeout: float = 600.0):
        return None

    def done(self) -> bool:
        return False  # still running, as far as the encodes before settle_tokenizers() know


def test_a_verdict_that_differs_hands_over_to_transformers_when_the_run_s_ids_agree(folders, cache, monkeypatch):
    import parity_ui.inputs.prompts as prompts

    folder = folders[0]
    monkeypatch.setattr(prompts, "_transformers_imported", lambda: False)
    monkeypatch.setattr(lt, "Verification", _Verdict)
    tok = PromptTokenizer(folder)
    assert tok.light and tok.pending is not None
    spec = PromptSpec(text="Name a prime.")
    ids = tok.encode(spec, True).token_ids
    prompts.settle_tokenizers()
    assert tok.pending is None and tok.light is False  # transformers' tokenizer from now on
    assert tok.encode(spec, True).token_ids == ids
    assert prompts._pending == []


def test_a_verdict_that_differs_on_the_run_s_own_prompt_ids_stops_the_run_with_the_fix(folders, cache, monkeypatch):
    import parity_ui.inputs.prompts as prompts
    from parity_ui.core.errors import PromptError

    folder = folders[0]
    monkeypatch.setattr(prompts, "_transformers_imported", lambda: False)
    monkeypatch.setattr(lt, "Verification", _Verdict)
    tok = PromptTokenizer(folder)
    spec = PromptSpec(text="Name a prime.")
    ids = tok.encode(spec, True).token_ids
    tok._encoded[-1] = (spec, True, ids + [7])  # as if the light tokenizer had made another id
    with pytest.raises(PromptError) as e:
        prompts.settle_tokenizers()
    assert "other token ids than transformers" in str(e.value) and "run again" in e.value.fix


def test_a_verdict_that_came_in_is_settled_by_the_next_encode_and_nothing_more_is_kept(folders, cache, monkeypatch):
    """A long-lived process (the app) that tokenizes without running: once the other process is done,
    the next encode settles it, so the prompts encoded meanwhile are not kept for ever."""
    import parity_ui.inputs.prompts as prompts

    class Done(_Verdict):
        def __init__(self, model_path: str):
            super().__init__(model_path, equal=True)

        def done(self) -> bool:
            return True

    monkeypatch.setattr(prompts, "_transformers_imported", lambda: False)
    monkeypatch.setattr(lt, "Verification", Done)
    tok = PromptTokenizer(folders[0])
    assert tok.pending is not None
    tok.encode(PromptSpec(text="Name a prime."), True)
    assert tok.pending is None and tok._encoded == [] and tok.light  # verified equal: light it stays
