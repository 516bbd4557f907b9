"""The model's tokenizer without transformers: `tokenizers` and jinja2 only, trusted per tokenizer once
transformers has been shown to give the same ids.

Why: `from transformers import AutoTokenizer` imports torch and most of transformers (4-8 s on 2 cores,
~10 s on the GPU machine) before a CLI command can tokenize one prompt, and every `parity compare` paid
it before any worker started (issue 33 item 4). The engines never see this tokenizer -- they get token
ids -- so it only has to make the SAME ids and text as transformers would. That is not assumed: the
first time a tokenizer is used, transformers loads it as before and `verify()` compares the two on a
probe set (plain text with and without special tokens, the chat template with and without a system
turn, decoding, pieces, the special tokens); the verdict is kept in the cache, keyed by the tokenizer's
files and the transformers version. Only a tokenizer verified equal is used this way afterwards; one
that differs (a Python tokenizer class that rewrites the post-processor, say) keeps transformers.

The subset of the transformers tokenizer API parity-ui uses is implemented: calling it on text,
decode, convert_ids_to_tokens, apply_chat_template (rendered exactly as transformers renders it:
the same sandboxed jinja2 environment, filters and globals), the special tokens, len().

The first verification of a tokenizer needs transformers, and importing it cold took 15.2 s on the
GPU machine, all of it before any worker started (issue 44). A process that has not imported
transformers yet therefore verifies in another process (`Verification`: `python -m
parity_ui.inputs.light_tokenizer FOLDER`) while it goes on with the light tokenizer, and the run
settles the verdict before any engine is handed a token (parity_ui.inputs.prompts.settle_tokenizers).

"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from ..core.paths import cache_dir

# The files that decide a tokenizer's behaviour: a change to any of them asks for a new verification.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
)
# Classes known to be tokenizer.json plus configuration (no Python-side encoding rules). Anything else,
# and any trust_remote_code tokenizer, keeps transformers without trying.
LIGHT_CLASSES = {
    "PreTrainedTokenizerFast",
    "TokenizersBackend",
    "GPT2Tokenizer",
    "GPT2TokenizerFast",
    "Qwen2Tokenizer",
    "Qwen2TokenizerFast",
    "LlamaTokenizer",
    "LlamaTokenizerFast",
    "Qwen3Tokenizer",
    "GemmaTokenizer",
    "GemmaTokenizerFast",
    None,
}
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

_PROBE_TEXTS = (
    "Give me a brief explanation of gravity.",
    "  leading spaces, tabs\tand\nnew lines  ",
    "Ünïcödé, 中文, emoji 🙂 and code: def f(x): return x**2",
    "",
)
_PROBE_CHATS = (
    [{"role": "user", "content": "Give me a brief explanation of gravity."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another?"},
    ],
)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def fingerprint(model_path: str) -> str | None:
    """The tokenizer files' hash plus the transformers version: what a verdict is valid for. None when
    the folder has no tokenizer.json (nothing light can load)."""
    folder = Path(model_path)
    if not (folder / "tokenizer.json").is_file():
        return None
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    try:
        h.update(metadata.version("transformers").encode())
    except metadata.PackageNotFoundError:
        return None
    return h.hexdigest()[:32]


def _verdict_path(fp: str) -> Path:
    return cache_dir() / "tokenizer-checks" / f"{fp}.json"


def verified(model_path: str) -> bool:
    """Whether this tokenizer (its files, this transformers) was verified equal to transformers'."""
    fp = fingerprint(model_path)
    if fp is None:
        return False
    try:
        return json.loads(_verdict_path(fp).read_text()).get("equal") is True
    except (OSError, ValueError):
        return False


def candidate(model_path: str) -> bool:
    """Whether a light tokenizer may be tried for this folder at all (a tokenizer.json, a known class)."""
    folder = Path(model_path)
    if not (folder / "tokenizer.json").is_file():
        return False
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    return cfg.get("tokenizer_class") in LIGHT_CLASSES and not cfg.get("auto_map")


class LightTokenizer:
    """tokenizer.json through `tokenizers`, the chat template through jinja2: transformers' answers for
    the calls parity-ui makes, for a tokenizer verified to give them."""

    def __init__(self, model_path: str):
        from tokenizers import Tokenizer

        folder = Path(model_path)
        self.name_or_path = model_path
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        try:
            cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
        try:
            smap = json.loads((folder / "special_tokens_map.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            smap = {}
        self.special_tokens_map: dict[str, Any] = {}
        for key in SPECIAL_KEYS:
            text = _token_text(cfg.get(key)) or _token_text(smap.get(key))
            if text is not None:
                self.special_tokens_map[key] = text
        self.chat_template = _chat_template(folder, cfg)
        self.backend_tokenizer = self._tok

    # -- the special tokens
    def _id(self, key: str) -> int | None:
        text = self.special_tokens_map.get(key)
        return None if text is None else self._tok.token_to_id(text)

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens_map.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad_token")

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    # -- encoding and decoding
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self(text, add_special_tokens)["input_ids"]

    def decode(self, ids: Any, clean_up_tokenization_spaces: bool = False, skip_special_tokens: bool = False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("the light tokenizer never cleans up spaces (parity-ui shows tokens as they are)")
        if isinstance(ids, int):
            ids = [ids]
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if isinstance(tokens, str):
            return self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tokenize: bool = False, add_generation_prompt: bool = False, **kwargs: Any
    ) -> Any:
        if not self.chat_template:
            raise ValueError("the tokenizer has no chat template")
        text = _compiled(self.chat_template).render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text


def _chat_template(folder: Path, cfg: dict[str, Any]) -> str | None:
    """The template transformers would use: chat_template.jinja beside the config, else the config's
    own (a string; a list of named templates keeps its "default")."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        return named.get("default")
    return tpl if isinstance(tpl, str) else None


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """transformers' chat-template environment (utils/chat_template_utils._cached_compile_jinja_template),
    minus the assistant-mask tracker, which parity-ui never asks for: sandboxed, trim_blocks and
    lstrip_blocks, loop controls, its tojson (no HTML escaping), raise_exception and strftime_now."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def differences(light: Any, full: Any) -> list[str]:
    """Where the light tokenizer's answers differ from transformers' (`full`) on the probe set; [] when
    they agree on everything parity-ui asks."""
    out: list[str] = []

    def same(what: str, a: Any, b: Any) -> None:
        if a != b:
            out.append(f"{what}: light {str(a)[:80]!r} != transformers {str(b)[:80]!r}")

    same("len", len(light), len(full))
    for attr in ("bos_token", "eos_token", "bos_token_id", "eos_token_id"):
        same(attr, getattr(light, attr), getattr(full, attr))
    same("has chat template", bool(light.chat_template), bool(getattr(full, "chat_template", None)))
    texts = list(_PROBE_TEXTS)
    for special in (light.bos_token, light.eos_token):
        if special:
            texts.append(f"{special}spelled out{special} in text")
    for text in texts:
        for add in (True, False):
            a, b = light(text, add_special_tokens=add)["input_ids"], full(text, add_special_tokens=add)["input_ids"]
            same(f"ids of {text!r} (special tokens {add})", a, b)
            same(f"decode of {text!r}", light.decode(a), full.decode(b, clean_up_tokenization_spaces=False))
    if light.chat_template:
        for chat in _PROBE_CHATS:
            for gen in (True, False):
                try:
                    a = light.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
                except Exception as e:  # noqa: BLE001 - a template that raises must raise in both
                    a = f"raised {type(e).__name__}"
                try:
                    b = full.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
                except Exception as e:  # noqa: BLE001
                    b = f"raised {type(e).__name__}"
                same(f"chat template ({len(chat)} turns, generation prompt {gen})", a, b)
    n = len(full)
    sample = sorted({0, 1, 2, n // 3, n // 2, n - 2, n - 1} & set(range(n)))
    same("pieces", light.convert_ids_to_tokens(sample), full.convert_ids_to_tokens(sample))
    same(
        "decode of single ids",
        [light.decode([i]) for i in sample],
        [full.decode([i], clean_up_tokenization_spaces=False) for i in sample],
    )
    return out


def verify(model_path: str, full: Any) -> list[str]:
    """Compare a light tokenizer with transformers' `full` one for this folder and keep the verdict:
    the next process loads the light one only if they agreed. Returns the differences ([] = equal)."""
    fp = fingerprint(model_path)
    if fp is None or not candidate(model_path):
        return ["not a candidate"]
    try:
        diffs = differences(LightTokenizer(model_path), full)
    except Exception as e:  # noqa: BLE001 - a tokenizer the light path cannot read keeps transformers
        diffs = [f"the light tokenizer failed: {type(e).__name__}: {str(e)[:200]}"]
    path = _verdict_path(fp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"equal": not diffs, "model": model_path, "differences": diffs[:10]}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: the next process verifies again
    return diffs


class Verification:
    """verify() of one tokenizer folder in a process of its own (this interpreter, this parity_ui),
    started now and waited for by `wait`: the import of transformers (and torch) it needs then runs
    beside the caller's own work instead of before it. Its verdict lands in the cache, as verify()'s."""

    def __init__(self, model_path: str):
        self.model_path = model_path
        root = str(Path(__file__).resolve().parents[2])  # holds parity_ui/
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Fixed arguments only: the folder is a path the caller already opened, passed as one argument.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "parity_ui.inputs.light_tokenizer", model_path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )

    def done(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, timeout: float = 600.0) -> str | None:
        """Wait for the verdict; None when it was kept (read it with `verified`), else why none was."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return f"the verification took over {timeout:.0f} s"
        if self.proc.returncode != 0:
            return f"the verification failed: {(err or b'').decode(errors='replace').strip()[-300:]}"
        return None


def main(argv: list[str] | None = None) -> int:
    """Verify the tokenizer of one folder against transformers' and keep the verdict (Verification)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m parity_ui.inputs.light_tokenizer MODEL_FOLDER", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    diffs = verify(args[0], AutoTokenizer.from_pretrained(args[0], trust_remote_code=False))
    print("equal" if not diffs else "differs: " + "; ".join(diffs[:3]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
