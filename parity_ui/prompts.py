"""Prompts: read them (text, JSONL), apply the chat template ONCE, tokenize ONCE.

Both engines receive the token ids made here, so neither tokenizes again: no second BOS, no
template applied twice, no tokenizer-version drift between the engines.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import PromptError

MAX_PROMPT_FILE_BYTES = 50 * 2**20
PROMPT_FILE_TYPES = (".txt", ".md", ".jsonl")


@dataclass
class PromptSpec:
    """One prompt as the user gave it: plain text, or chat messages."""

    text: str | None = None
    messages: list[dict[str, str]] | None = None

    def excerpt(self, n: int = 80) -> str:
        s = self.text if self.text is not None else " | ".join(m.get("content", "") for m in self.messages or [])
        s = " ".join(s.split())
        return s if len(s) <= n else s[: n - 1] + "…"


@dataclass
class EncodedPrompt:
    spec: PromptSpec
    token_ids: list[int]
    text: str  # exactly what the ids decode to (template included)


def _check_messages(messages: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: 'messages' must be a non-empty list",
                          'write {"messages": [{"role": "user", "content": "..."}]}')
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise PromptError(f"{where}: each message needs a string 'role' and 'content'",
                              'write {"role": "user", "content": "..."}')
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def parse_prompt_bytes(data: bytes, filename: str) -> list[PromptSpec]:
    """A .txt/.md file is one prompt; a .jsonl file one prompt a line ({"prompt"} or {"messages"})."""
    suffix = Path(filename).suffix.lower()
    if suffix not in PROMPT_FILE_TYPES:
        raise PromptError(f"prompt file {filename!r} has type {suffix or '(none)'!r}",
                          "use a .txt file (one prompt) or a .jsonl file (one prompt a line)")
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise PromptError(f"prompt file {filename!r} is {len(data) / 2**20:.1f} MiB, over the "
                          f"{MAX_PROMPT_FILE_BYTES // 2**20} MiB limit", "split it into smaller files")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptError(f"prompt file {filename!r} is not UTF-8 text (byte {e.start})",
                          "re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    if suffix == ".jsonl":
        specs = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{filename} line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptError(f"{where} is not valid JSON: {e.msg}",
                                  'one JSON object a line: {"prompt": "..."} or {"messages": [...]}') from None
            if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                specs.append(PromptSpec(text=obj["prompt"]))
            elif isinstance(obj, dict) and "messages" in obj:
                specs.append(PromptSpec(messages=_check_messages(obj["messages"], where)))
            else:
                raise PromptError(f"{where} has neither a string 'prompt' nor 'messages'",
                                  'write {"prompt": "..."} or {"messages": [...]}')
        if not specs:
            raise PromptError(f"prompt file {filename!r} holds no prompts", "add one JSON object a line")
        return specs
    if not text.strip():
        raise PromptError(f"prompt file {filename!r} is empty", "put the prompt text in the file")
    return [PromptSpec(text=text)]


def read_prompt_file(path: str | Path) -> list[PromptSpec]:
    p = Path(path)
    if not p.is_file():
        raise PromptError(f"prompt file {str(p)!r} not found", "check the path given to --prompt-file")
    if p.stat().st_size > MAX_PROMPT_FILE_BYTES:
        raise PromptError(f"prompt file {str(p)!r} is over the {MAX_PROMPT_FILE_BYTES // 2**20} MiB limit",
                          "split it into smaller files")
    return parse_prompt_bytes(p.read_bytes(), p.name)


class PromptTokenizer:
    """The model's own HF tokenizer, loaded once per model folder."""

    def __init__(self, model_path: str, trust_remote_code: bool = False):
        from transformers import AutoTokenizer  # lazy: pulls in torch (no CUDA is touched)

        self.tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self._decode_lock = threading.Lock()
        self._cache: dict[int, str] = {}

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.tok.eos_token_id
        return [eos] if isinstance(eos, int) else []

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def encode(self, spec: PromptSpec, chat: bool) -> EncodedPrompt:
        if spec.messages is not None:
            if not self.has_chat_template:
                raise PromptError("chat messages were given but the model has no chat template",
                                  "give plain text prompts, or pick a chat model")
            messages = spec.messages
        elif spec.text is None or not spec.text.strip():
            raise PromptError("the prompt is empty", "type or upload a prompt")
        else:
            messages = [{"role": "user", "content": spec.text}] if chat else None
        if messages is not None:
            if not self.has_chat_template:
                raise PromptError("chat=true but the model has no chat template",
                                  "set chat: false, or pick a model with a chat template")
            text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            # The template already wrote BOS and the special tokens: adding them again is the
            # classic double-BOS bug (vllm #9519).
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
        else:
            text = spec.text or ""
            ids = self.tok(text, add_special_tokens=True)["input_ids"]
        if not ids:
            raise PromptError("the prompt tokenizes to no tokens", "give a non-empty prompt")
        return EncodedPrompt(spec=spec, token_ids=list(ids), text=self.tok.decode(ids))

    def count(self, spec: PromptSpec, chat: bool) -> int:
        return len(self.encode(spec, chat).token_ids)

    def token_text(self, token_id: int) -> str:
        t = self._cache.get(token_id)
        if t is None:
            with self._decode_lock:
                t = self._cache[token_id] = self.tok.decode([token_id])
        return t

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


_tokenizer_lock = threading.Lock()


@lru_cache(maxsize=4)
def _tokenizer_for(model_path: str, trust_remote_code: bool) -> PromptTokenizer:
    return PromptTokenizer(model_path, trust_remote_code)


def tokenizer_for(model_path: str, trust_remote_code: bool = False) -> PromptTokenizer:
    """One tokenizer per model folder. Serialised: transformers' first import is not thread-safe."""
    with _tokenizer_lock:
        return _tokenizer_for(model_path, trust_remote_code)
