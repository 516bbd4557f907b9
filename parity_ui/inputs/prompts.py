"""Prompts: read them (text, JSONL), apply the chat template ONCE, tokenize ONCE.

Both engines receive the token ids made here, so neither tokenizes again: no second BOS, no
template applied twice, no tokenizer-version drift between the engines.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from ..core.errors import PromptError
from . import light_tokenizer
from .images import MAX_IMAGES_PER_PROMPT, ImageInput, decode_image, read_image

MAX_PROMPT_FILE_BYTES = 50 * 2**20


def check_upload_size(name: str, size: int, what: str = "prompt file") -> None:
    """Raise PromptError naming the file's size, the app's limit and what to do instead (the CLI,
    which reads a file of any size from disk) when an upload is over MAX_PROMPT_FILE_BYTES."""
    if size > MAX_PROMPT_FILE_BYTES:
        raise PromptError(
            f"{what} {name!r} is {size / 2**20:.1f} MiB, over the app's "
            f"{MAX_PROMPT_FILE_BYTES // 2**20} MiB upload limit",
            "run it from the command line: parity compare --model MODEL --prompt-file FILE "
            "(no size limit there), or upload a smaller selection of it",
        )


PROMPT_FILE_TYPES = (".txt", ".md", ".jsonl")


@dataclass
class PromptSpec:
    """One prompt as the user gave it: plain text, or chat messages; with images, if any.

    With images, a message's content may be a list of parts: {"type": "text", "text": ...} and
    {"type": "image", "name": ...}, the k-th image part standing for `images[k]`. A text prompt with
    images gets its images first, then the text, in one user message (the chat template places them)."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    images: list[ImageInput] = field(default_factory=list)
    # Ids given as they are (an RL dump's prompt, replayed): used verbatim, no template, nothing added;
    # `text` is then only what they decode to, for people.
    token_ids: list[int] | None = None

    def excerpt(self, n: int = 80) -> str:
        s = (
            self.text
            if self.text is not None
            else " | ".join(content_text(m.get("content", "")) for m in self.messages or [])
        )
        if self.images:
            s = f"[{len(self.images)} image{'s' if len(self.images) > 1 else ''}] " + s
        s = " ".join(s.split())
        return s if len(s) <= n else s[: n - 1] + "…"

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages the chat template gets: image parts as {"type": "image"} (the processor adds the
        pixels), a text prompt with images as one user message, images first."""
        if self.messages is not None:
            return [
                {
                    "role": m["role"],
                    "content": m["content"]
                    if isinstance(m["content"], str)
                    else [
                        {"type": "image"} if p.get("type") == "image" else {"type": "text", "text": p.get("text", "")}
                        for p in m["content"]
                    ],
                }
                for m in self.messages
            ]
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in self.images]
        return [{"role": "user", "content": parts + [{"type": "text", "text": self.text or ""}]}]


def content_text(content: Any) -> str:
    """A message's content as text: image parts as [image NAME]."""
    if isinstance(content, str):
        return content
    return " ".join(
        p.get("text", "") if p.get("type") == "text" else f"[image {p.get('name', '')}]".replace(" ]", "]")
        for p in content
        if isinstance(p, dict)
    )


@dataclass
class EncodedPrompt:
    spec: PromptSpec
    token_ids: list[int]
    text: str  # exactly what the ids decode to (template included)
    # Image prompts: the ids above hold each image's placeholder expanded to `image_tokens[k]` image
    # tokens by the run's ONE processor, with these resize settings.
    image_tokens: list[int] = field(default_factory=list)
    image_grids: list[list[int]] = field(default_factory=list)  # [t, h, w] patches per image
    pixels: dict[str, int] | None = None  # {"min_pixels", "max_pixels"} the ids were made with

    @property
    def images(self) -> list[ImageInput]:
        return self.spec.images


_PARTS_FIX = (
    'content is a string, or a list of parts: {"type": "text", "text": "..."} and '
    '{"type": "image", "path": "picture.png"} (relative to the prompt file\'s folder)'
)


def _check_messages(
    messages: Any, where: str, base: Path | None = None, images: list[ImageInput] | None = None
) -> list[dict[str, Any]]:
    """Chat messages, checked. Image parts' files are read (into `images`) and replaced by their name."""
    if not isinstance(messages, list) or not messages:
        raise PromptError(
            f"{where}: 'messages' must be a non-empty list", 'write {"messages": [{"role": "user", "content": "..."}]}'
        )
    out: list[dict[str, Any]] = []
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), (str, list))
        ):
            raise PromptError(
                f"{where}: each message needs a string 'role' and 'content'", 'write {"role": "user", "content": "..."}'
            )
        if isinstance(m["content"], str):
            out.append({"role": m["role"], "content": m["content"]})
            continue
        parts: list[dict[str, Any]] = []
        for part in m["content"]:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind in ("image", "image_url") and isinstance(part.get("path", part.get("image")), str):
                if images is None:
                    raise PromptError(f"{where}: image parts are not allowed here", "give text content")
                img = read_image(part.get("path", part.get("image")), base)
                images.append(img)
                parts.append({"type": "image", "name": img.name, "sha256": img.sha256})
            else:
                raise PromptError(
                    f"{where}: a content part must be a text or an image part (got {str(part)[:80]})", _PARTS_FIX
                )
        out.append({"role": m["role"], "content": parts})
    return out


def _check_image_count(images: list[ImageInput], where: str) -> None:
    if len(images) > MAX_IMAGES_PER_PROMPT:
        raise PromptError(
            f"{where} has {len(images)} images; parity-ui takes at most {MAX_IMAGES_PER_PROMPT} a prompt",
            "split the prompt, or attach fewer images",
        )


def prompt_from_object(obj: Any, where: str, base: Path | None = None) -> PromptSpec:
    """One JSONL line's object as a prompt: {"prompt": "..."} (with {"images": [paths]}) or
    {"messages": [...]} (image parts in the messages; their files are read from `base`).
    PromptError naming `where` and the fix when the object is neither, or a message or image is bad."""
    images: list[ImageInput] = []
    extra = obj.get("images", []) if isinstance(obj, dict) else []
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise PromptError(f"{where}: 'images' must be a list of file paths", 'e.g. "images": ["cat.png"]')
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        images += [read_image(x, base) for x in extra]
        _check_image_count(images, where)
        return PromptSpec(text=obj["prompt"], images=images)
    if isinstance(obj, dict) and "messages" in obj:
        if extra:
            raise PromptError(f"{where}: with 'messages', put the images in the messages", _PARTS_FIX)
        messages = _check_messages(obj["messages"], where, base, images)
        _check_image_count(images, where)
        return PromptSpec(messages=messages, images=images)
    raise PromptError(
        f"{where} has neither a string 'prompt' nor 'messages'", 'write {"prompt": "..."} or {"messages": [...]}'
    )


def parse_prompt_bytes(data: bytes, filename: str, base: Path | None = None) -> list[PromptSpec]:
    """A .txt/.md file is one prompt; a .jsonl file one prompt a line ({"prompt"} or {"messages"}, with
    {"images": [paths]} or image parts in the messages). `base`: the folder image paths start from."""
    suffix = Path(filename).suffix.lower()
    if suffix not in PROMPT_FILE_TYPES:
        raise PromptError(
            f"prompt file {filename!r} has type {suffix or '(none)'!r}",
            "use a .txt file (one prompt) or a .jsonl file (one prompt a line)",
        )
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise PromptError(
            f"prompt file {filename!r} is {len(data) / 2**20:.1f} MiB, over the "
            f"{MAX_PROMPT_FILE_BYTES // 2**20} MiB limit",
            "split it into smaller files",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptError(
            f"prompt file {filename!r} is not UTF-8 text (byte {e.start})",
            "re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8",
        ) from None
    if suffix == ".jsonl":
        specs = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{filename} line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptError(
                    f"{where} is not valid JSON: {e.msg}",
                    'one JSON object a line: {"prompt": "..."} or {"messages": [...]}',
                ) from None
            specs.append(prompt_from_object(obj, where, base))
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
        raise PromptError(
            f"prompt file {str(p)!r} is over the {MAX_PROMPT_FILE_BYTES // 2**20} MiB limit",
            "split it into smaller files",
        )
    return parse_prompt_bytes(p.read_bytes(), p.name, base=p.parent)


def decode_as_is(tok: Any, ids: list[int]) -> str:
    """`ids` as text exactly as the tokens spell it: special tokens kept, and no "clean-up" of the
    spaces. A tokenizer_config.json with clean_up_tokenization_spaces: true (GGUF conversions of Llama 3
    style tokenizers write it) would otherwise make transformers strip spaces before punctuation -- or,
    for a BPE tokenizer, skip that but print "Ignoring clean_up_tokenization_spaces=True for BPE
    tokenizer ..." on the first decode of every process (transformers 5.17+). parity-ui shows tokens as
    they are, so it never cleans up: asked explicitly, transformers neither cleans nor warns."""
    return tok.decode(ids, clean_up_tokenization_spaces=False)


def prompts_as_given(
    text: str | None,
    image_names: Sequence[str] = (),
    file_prompts: Sequence[PromptSpec] | None = None,
    prompt_file: str | None = None,
) -> list[PromptSpec]:
    """The prompts to store with a run that failed before its prompts could be read (an empty
    prompt, an image refused, a bad config): what the user gave, so the stored error row says
    what it was about. The CLI and the app both call this.

    `file_prompts` (a prompt file already read) win; else `text`, each image named after it as
    `[image NAME]` (`image_names` as the user named them: the CLI's paths as typed, an upload's
    file name); else a note naming `prompt_file` (a file that could not be read). Raises nothing."""
    if file_prompts:
        return list(file_prompts)
    if text is not None:
        return [PromptSpec(text=text + "".join(f" [image {name}]" for name in image_names))]
    return [PromptSpec(text=f"(prompt file {prompt_file or ''})")]


def has_chat_template_file(model_path: str) -> bool | None:
    """Whether a model folder has a chat template, read from its files without loading the tokenizer
    (transformers and torch take seconds to import): tokenizer_config.json's chat_template, or a
    chat_template.jinja / chat_template.json beside it. None when it cannot be told from the files
    (no tokenizer_config.json: a hub id, a processor-only folder)."""
    folder = Path(model_path)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        return bool(json.loads(cfg.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return None


def check_chat_template(model_path: str, prompts: Sequence[PromptSpec], chat: bool) -> None:
    """The chat-template refusals of PromptTokenizer.encode, made from the folder's files before any
    tokenizer loads: PromptError when chat is asked (or messages given) and the model has none."""
    if has_chat_template_file(model_path) is not False:
        return
    if any(p.messages is not None for p in prompts):
        raise PromptError(
            "chat messages were given but the model has no chat template",
            "give plain text prompts, or pick a chat model",
        )
    if chat and any(not p.images and p.text is not None and p.text.strip() for p in prompts):
        raise PromptError(
            "chat=true but the model has no chat template", "set chat: false, or pick a model with a chat template"
        )


class PromptTokenizer:
    """The model's own HF tokenizer, loaded once per model folder. Every decode goes through
    decode_as_is (no space clean-up, whatever the tokenizer's config says)."""

    def __init__(self, model_path: str, trust_remote_code: bool = False):
        # A tokenizer verified equal to transformers' loads without it (light_tokenizer: ~0.1 s instead
        # of the 4-10 s transformers and torch take to import); any other loads through transformers,
        # and the first load of a candidate verifies it for the next process.
        # A candidate not verified yet, in a process that has not imported transformers (a fresh CLI
        # process): the light tokenizer at once, verified in another process meanwhile; the run waits
        # for that verdict before any engine gets a token (settle, settle_tokenizers).
        light = not trust_remote_code and light_tokenizer.candidate(model_path)
        self.light = light and light_tokenizer.verified(model_path)
        self.model_path, self.trust_remote_code = model_path, trust_remote_code
        self.pending: light_tokenizer.Verification | None = None
        self._encoded: list[tuple[PromptSpec, bool, list[int]]] = []  # while pending: what was encoded
        if not self.light and light and not _transformers_imported():
            self.light = True
            self.tok: Any = light_tokenizer.LightTokenizer(model_path)
            self.pending = light_tokenizer.Verification(model_path)
            with _pending_lock:
                _pending.append(self)
        elif self.light:
            self.tok = light_tokenizer.LightTokenizer(model_path)
        else:
            self.tok = _transformers_tokenizer(model_path, trust_remote_code)
            if light:
                light_tokenizer.verify(model_path, self.tok)
        self._decode_lock = threading.Lock()
        self._cache: dict[int, str] = {}
        self._raw_cache: dict[int, str] = {}

    def settle(self) -> None:
        """Wait for a verification started in another process. Verified: nothing changes. Else (it
        differs, or could not run) transformers' tokenizer takes over, after it was checked to give
        every prompt encoded so far the same ids; PromptError when it does not (the run's prompts were
        tokenized wrong; the verdict is kept, so the next run tokenizes with transformers)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        why = pending.wait()
        if why is None and light_tokenizer.verified(self.model_path):
            self._encoded = []
            return
        full = _transformers_tokenizer(self.model_path, self.trust_remote_code)
        if why is not None:  # no verdict came back: verify here, now that transformers is loaded anyway
            light_tokenizer.verify(self.model_path, full)
        light, self.tok, self.light = self.tok, full, False
        with self._decode_lock:
            self._cache.clear()
            self._raw_cache.clear()
        for n, (spec, chat, ids) in enumerate(self._encoded):
            again = self.encode(spec, chat).token_ids
            if again != ids:
                self.tok = light  # what the run's prompts were made with, for what is left of this process
                raise PromptError(
                    f"the fast tokenizer parity-ui used for this model ({self.model_path}) gave prompt {n} "
                    f"other token ids than transformers' ({len(ids)} against {len(again)} tokens); a check "
                    "that ran beside the run found the two differ, and transformers' is used from now on",
                    "run again: the next run tokenizes with transformers",
                )
        self._encoded = []

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.tok.eos_token_id
        return [eos] if isinstance(eos, int) else []

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def encode(self, spec: PromptSpec, chat: bool) -> EncodedPrompt:
        if spec.token_ids is not None:
            if not spec.token_ids:
                raise PromptError("the prompt has no token ids", "give a non-empty prompt")
            return EncodedPrompt(spec=spec, token_ids=list(spec.token_ids), text=decode_as_is(self.tok, spec.token_ids))
        if spec.images:
            raise PromptError(
                "an image prompt reached the text tokenizer",
                "image prompts are encoded with the model's processor (VisionProcessor)",
            )
        messages: list[dict[str, Any]] | None
        if spec.messages is not None:
            if not self.has_chat_template:
                raise PromptError(
                    "chat messages were given but the model has no chat template",
                    "give plain text prompts, or pick a chat model",
                )
            messages = spec.messages
        elif spec.text is None or not spec.text.strip():
            raise PromptError("the prompt is empty", "type or upload a prompt")
        else:
            messages = [{"role": "user", "content": spec.text}] if chat else None
        if messages is not None:
            if not self.has_chat_template:
                raise PromptError(
                    "chat=true but the model has no chat template",
                    "set chat: false, or pick a model with a chat template",
                )
            text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            # The template already wrote BOS and the special tokens: adding them again is the
            # classic double-BOS bug (vllm #9519).
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
        else:
            text = spec.text or ""
            ids = self.tok(text, add_special_tokens=True)["input_ids"]
        if not ids:
            raise PromptError("the prompt tokenizes to no tokens", "give a non-empty prompt")
        if self.pending is not None and self.pending.done():
            self.settle()  # the verdict is in: settle now, and stop keeping what was encoded (a long-lived app)
        if self.pending is not None:
            self._encoded.append((spec, chat, list(ids)))
        return EncodedPrompt(spec=spec, token_ids=list(ids), text=decode_as_is(self.tok, ids))

    def ids_of_text(self, text: str) -> list[int]:
        """This tokenizer on `text` as written (special tokens spelled out, none added): what a
        server's /tokenize must also give."""
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def count(self, spec: PromptSpec, chat: bool) -> int:
        return len(self.encode(spec, chat).token_ids)

    def token_text(self, token_id: int) -> str:
        t = self._cache.get(token_id)
        if t is None:
            with self._decode_lock:
                t = self._cache[token_id] = decode_as_is(self.tok, [token_id])
        return t

    def texts(self, ids: Sequence[int]) -> list[str]:
        """token_text of every id: one cache lookup each at C speed (a workload decodes every position's
        top-k, ~10^5-10^6 ids a chunk); the tokenizer runs only for ids not seen yet."""
        out = list(map(self._cache.get, ids))
        if None not in out:
            return cast("list[str]", out)  # every id was cached: no None, checked just above
        return [t if t is not None else self.token_text(i) for t, i in zip(out, ids)]

    def decode(self, ids: list[int]) -> str:
        return decode_as_is(self.tok, ids)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes a token stands for (None when the tokenizer cannot say): byte-level BPE
        pieces through GPT-2's byte alphabet, SentencePiece byte-fallback pieces <0xNN>, else the
        piece's text as UTF-8 ('▁' is a space)."""
        piece = self.tok.convert_ids_to_tokens(int(token_id))
        if not isinstance(piece, str):
            return None
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        if self._byte_level and all(ch in _BYTE_DECODER for ch in piece):
            return bytes(_BYTE_DECODER[ch] for ch in piece)
        return piece.replace("\u2581", " ").encode("utf-8")

    def token_raw(self, token_id: int) -> str | None:
        """The token's bytes as hex when its text cannot show them (it decodes to U+FFFD: a piece of a
        multi-byte character); None otherwise, where the text is the bytes' UTF-8."""
        text = self.token_text(token_id)
        if "\ufffd" not in text:
            return None
        raw = self._raw_cache.get(token_id)
        if raw is None:
            with self._decode_lock:
                b = self.token_bytes(token_id)
                raw = self._raw_cache[token_id] = b.hex() if b is not None else ""
        return raw or None

    @property
    def _byte_level(self) -> bool:
        backend = getattr(self.tok, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        return "ByteLevel" in type(decoder).__name__ or "ByteLevel" in repr(decoder)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are written in."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_BYTE_DECODER = {ch: b for b, ch in _bytes_to_unicode().items()}
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_tokenizer_lock = threading.Lock()
_import_lock = threading.Lock()
_pending_lock = threading.Lock()
_settle_lock = threading.Lock()
_pending: list[PromptTokenizer] = []  # tokenizers whose verification runs in another process


def _transformers_imported() -> bool:
    """Whether this process imported transformers already (a verification here then costs ~0.1 s)."""
    return "transformers" in sys.modules


def _transformers_tokenizer(model_path: str, trust_remote_code: bool) -> Any:
    with _import_lock:  # transformers' first import is not thread-safe
        from transformers import AutoTokenizer  # lazy: pulls in torch (no CUDA is touched)

        return AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)


def settle_tokenizers() -> None:
    """Every tokenizer's verification that runs in another process, waited for (PromptTokenizer.settle):
    called before an engine is handed a token. Raises PromptError where a run's prompts were tokenized
    other than transformers would have."""
    with _settle_lock:  # a second caller waits for the first one's verdicts
        with _pending_lock:
            todo = list(_pending)
            _pending.clear()
        for tok in todo:
            tok.settle()


@lru_cache(maxsize=4)
def _tokenizer_for(model_path: str, trust_remote_code: bool) -> PromptTokenizer:
    return PromptTokenizer(model_path, trust_remote_code)


def import_tokenizers_ahead(model: str | None = None) -> threading.Thread | None:
    """Import transformers' tokenizer classes (and torch under them: seconds) in a daemon thread, so
    that a fresh process's other start-up work (the store, the model's config, the workers started
    ahead) overlaps it; a tokenizer load through transformers waits for it. Nothing is imported when
    `model` is a local folder (or the demo) whose tokenizer loads without transformers: the import would
    only take the CPU from the work that needs it."""
    if model is not None and _light_ready(model):
        return None  # a light tokenizer (verified, or verified in another process: PromptTokenizer)

    def go() -> None:
        with _import_lock:
            try:
                import transformers.models.auto.tokenization_auto  # noqa: F401
            except Exception:  # noqa: BLE001 - tokenizer_for reports it where it matters
                pass

    t = threading.Thread(target=go, name="parity-import-tokenizers", daemon=True)
    t.start()
    return t


def _light_ready(model: str) -> bool:
    """Whether `model` (as the user named it) is a local folder whose tokenizer loads light (a candidate:
    verified already, or verified in another process while this one goes on), found from the name
    alone: no download, no conversion, no hub lookup."""
    from .demo_model import DEMO_NAME, demo_model_dir

    if model in ("", DEMO_NAME):
        folder = demo_model_dir()
    else:
        folder = Path(model).expanduser()
    try:
        return folder.is_dir() and light_tokenizer.candidate(str(folder.resolve()))
    except OSError:
        return False


def tokenizer_for(model_path: str, trust_remote_code: bool = False) -> PromptTokenizer:
    """One tokenizer per model folder."""
    with _tokenizer_lock:
        return _tokenizer_for(model_path, trust_remote_code)


class VisionProcessor:
    """The model's own HF processor (AutoProcessor), loaded once per model folder: for image prompts it
    decides the text tokens, each image's token count and the resize, for every side."""

    def __init__(self, model_path: str, trust_remote_code: bool = False):
        from transformers import AutoProcessor  # lazy: pulls in torch

        try:
            self.proc = AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        except Exception as e:  # noqa: BLE001 - missing processor files, torchvision, remote code
            raise PromptError(
                f"the model's image processor cannot be loaded from {model_path} ({type(e).__name__}: {str(e)[:200]})",
                "the folder needs preprocessor_config.json (and the processor's files); "
                "some processors need torchvision or --trust-remote-code",
            ) from None
        ip = getattr(self.proc, "image_processor", None)
        if ip is None or not hasattr(self.proc, "image_token"):
            raise PromptError(f"{model_path} has no image processor", "pick a vision-language model")
        size = getattr(ip, "size", None) or {}
        self.min_pixels = int(getattr(ip, "min_pixels", None) or size.get("shortest_edge") or 56 * 56)
        self.max_pixels = int(getattr(ip, "max_pixels", None) or size.get("longest_edge") or 28 * 28 * 1280)
        self.patch_size = int(getattr(ip, "patch_size", 14) or 14)
        self.merge_size = int(getattr(ip, "merge_size", 2) or 2)
        tok = self.proc.tokenizer
        self.image_token_id = int(
            getattr(self.proc, "image_token_id", None) or tok.convert_tokens_to_ids(self.proc.image_token)
        )
        self.has_chat_template = bool(getattr(self.proc, "chat_template", None) or getattr(tok, "chat_template", None))

    @property
    def defaults(self) -> dict[str, int]:
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels}

    def template(self, spec: PromptSpec) -> str:
        if not self.has_chat_template:
            raise PromptError(
                "image prompts need the model's chat template (it places the image), and this model has none",
                "pick a chat vision-language model (e.g. a Qwen2.5-VL Instruct)",
            )
        return self.proc.apply_chat_template(spec.chat_messages(), tokenize=False, add_generation_prompt=True)

    def encode(self, spec: PromptSpec, pixels: dict[str, int]) -> EncodedPrompt:
        """The chat template applied once, then the processor: the ids with every image placeholder
        expanded to the image's tokens under `pixels` (min_pixels / max_pixels)."""
        text = self.template(spec)
        n_parts = text.count(self.proc.image_token)
        if n_parts != len(spec.images):
            raise PromptError(
                f"the chat template placed {n_parts} image(s) for {len(spec.images)} given",
                "the model's chat template does not place images where its processor expects "
                "them; use the model's own chat template",
            )
        pil = [decode_image(i.data) for i in spec.images]
        enc = self.proc(text=[text], images=pil, return_tensors="np", images_kwargs=dict(pixels))
        ids = [int(x) for x in enc["input_ids"][0]]
        grids = [[int(v) for v in g] for g in enc.get("image_grid_thw", [])]
        counts = [t * h * w // (self.merge_size**2) for t, h, w in grids]
        if ids.count(self.image_token_id) != sum(counts):
            raise PromptError(
                f"the processor made {ids.count(self.image_token_id)} image tokens for image grids "
                f"that need {sum(counts)}",
                "check the model's processor files",
            )
        return EncodedPrompt(
            spec=spec,
            token_ids=ids,
            text=decode_as_is(self.proc.tokenizer, ids),
            image_tokens=counts,
            image_grids=grids,
            pixels=dict(pixels),
        )


@lru_cache(maxsize=2)
def _vision_for(model_path: str, trust_remote_code: bool) -> VisionProcessor:
    return VisionProcessor(model_path, trust_remote_code)


def vision_for(model_path: str, trust_remote_code: bool = False) -> VisionProcessor:
    with _tokenizer_lock:
        return _vision_for(model_path, trust_remote_code)


def collapse_image_runs(ids: list[int], image_token_id: int | None) -> list[int]:
    """Each run of image tokens back to ONE placeholder: what vLLM takes (it expands it itself; ids
    already expanded would be expanded again, silently). No image token id: the ids as they are."""
    return [t for i, t in enumerate(ids) if not (t == image_token_id and i > 0 and ids[i - 1] == image_token_id)]
