"""Prompt files (parse and every rejection), then encoding with a real tokenizer: one BOS, always."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from parity_ui.inputs import prompts
from parity_ui.core.errors import PromptError
from parity_ui.inputs.prompts import PromptSpec, PromptTokenizer, parse_prompt_bytes, read_prompt_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from tiny_models import build_tokenizer  # noqa: E402


def rejected(data: bytes, filename: str) -> PromptError:
    with pytest.raises(PromptError) as info:
        parse_prompt_bytes(data, filename)
    assert info.value.fix, "every prompt error must say how to fix it"
    return info.value


# --- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["p.txt", "p.md", "P.TXT"])
def test_text_file_is_one_prompt(name):
    text = "def main(args):\n    return 0\n\nsecond paragraph, same prompt\n"
    assert parse_prompt_bytes(text.encode(), name) == [PromptSpec(text=text)]


def test_jsonl_prompts_and_messages_skip_blank_lines():
    lines = [
        json.dumps({"prompt": "first"}),
        "",
        "   ",
        json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "héllo", "name": "dropped"}]}),
        json.dumps({"prompt": "third", "id": 3}),
    ]
    specs = parse_prompt_bytes("\n".join(lines).encode(), "p.jsonl")
    assert specs == [
        PromptSpec(text="first"),
        PromptSpec(messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]),
        PromptSpec(text="third"),
    ]


def test_wrong_file_type():
    err = rejected(b"%PDF-1.7", "paper.pdf")
    assert "'.pdf'" in err.message and ".txt" in err.fix and ".jsonl" in err.fix


def test_file_too_large(monkeypatch):
    monkeypatch.setattr(prompts, "MAX_PROMPT_FILE_BYTES", 2 * 2**20)
    err = rejected(b"x" * (2 * 2**20 + 1), "big.txt")
    assert "2 MiB limit" in err.message and "split" in err.fix


def test_not_utf8():
    err = rejected("café".encode("latin-1"), "p.txt")
    assert "not UTF-8" in err.message and "byte 3" in err.message and "UTF-8" in err.fix


def test_invalid_json_line_names_the_line():
    data = b'{"prompt": "ok"}\n\n{"prompt": "unterminated\n'
    err = rejected(data, "p.jsonl")
    assert "p.jsonl line 3" in err.message and "not valid JSON" in err.message


@pytest.mark.parametrize("line", ['{"text": "hi"}', '{"prompt": 42}', '"just a string"', "[1, 2]"])
def test_line_without_prompt_or_messages(line):
    err = rejected(line.encode(), "p.jsonl")
    assert "line 1" in err.message and "'prompt'" in err.message and "'messages'" in err.message


@pytest.mark.parametrize("messages", [
    [],
    "hello",
    [{"role": "user"}],
    [{"role": "user", "content": 5}],
    ["user: hi"],
])
def test_bad_messages(messages):
    err = rejected(json.dumps({"messages": messages}).encode(), "p.jsonl")
    assert "line 1" in err.message and "message" in err.message and '"role"' in err.fix


@pytest.mark.parametrize("data, name", [(b"", "p.txt"), (b"  \n\t\n", "p.md"), (b"\n\n", "p.jsonl")])
def test_empty_file(data, name):
    err = rejected(data, name)
    assert "empty" in err.message or "no prompts" in err.message


def test_read_prompt_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n', encoding="utf-8")
    assert read_prompt_file(path) == [PromptSpec(text="a"), PromptSpec(text="b")]


def test_read_missing_file(tmp_path):
    with pytest.raises(PromptError) as info:
        read_prompt_file(tmp_path / "nope.txt")
    assert "not found" in info.value.message and "--prompt-file" in info.value.fix


def test_read_too_large_file(tmp_path, monkeypatch):
    monkeypatch.setattr(prompts, "MAX_PROMPT_FILE_BYTES", 10)
    path = tmp_path / "p.txt"
    path.write_text("x" * 11)
    with pytest.raises(PromptError, match="limit"):
        read_prompt_file(path)


def test_excerpt():
    assert PromptSpec(text="a\n  b").excerpt() == "a b"
    assert PromptSpec(messages=[{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]).excerpt() \
        == "hi | yo"
    assert PromptSpec(text="x" * 100).excerpt(10) == "x" * 9 + "…"


# --- encoding with a real tokenizer ---------------------------------------------------------


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tok(tok_dir) -> PromptTokenizer:
    return PromptTokenizer(str(tok_dir))


@pytest.fixture
def plain_tok(tok_dir) -> PromptTokenizer:
    t = PromptTokenizer(str(tok_dir))
    t.tok.chat_template = None
    return t


def bos_count(tok: PromptTokenizer, ids: list[int]) -> int:
    return ids.count(tok.tok.bos_token_id)


def test_plain_text_gets_exactly_one_bos(tok):
    enc = tok.encode(PromptSpec(text="def main(args):"), chat=False)
    assert enc.token_ids[0] == tok.tok.bos_token_id
    assert bos_count(tok, enc.token_ids) == 1
    assert enc.text.startswith("<s>") and enc.text.endswith("def main(args):")


@pytest.mark.parametrize("spec, chat", [
    (PromptSpec(text="def main(args):"), True),
    (PromptSpec(messages=[{"role": "user", "content": "def main(args):"}]), False),
    (PromptSpec(messages=[{"role": "user", "content": "def main(args):"}]), True),
])
def test_chat_gets_exactly_one_bos(tok, spec, chat):
    enc = tok.encode(spec, chat=chat)
    assert enc.token_ids[0] == tok.tok.bos_token_id
    assert bos_count(tok, enc.token_ids) == 1
    assert "<|user|>" in enc.text and enc.text.rstrip().endswith("<|assistant|>")


def test_the_double_bos_trap_is_real(tok):
    # What the test above guards against: tokenizing the templated text with special tokens on.
    text = tok.tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert bos_count(tok, tok.tok(text, add_special_tokens=True)["input_ids"]) == 2


def test_count_matches_encode(tok):
    spec = PromptSpec(text="import os")
    assert tok.count(spec, chat=False) == len(tok.encode(spec, chat=False).token_ids)


@pytest.mark.parametrize("spec", [PromptSpec(text=""), PromptSpec(text="  \n"), PromptSpec()])
def test_empty_prompt(tok, spec):
    with pytest.raises(PromptError, match="empty"):
        tok.encode(spec, chat=False)


def test_messages_without_chat_template(plain_tok):
    with pytest.raises(PromptError, match="no chat template") as info:
        plain_tok.encode(PromptSpec(messages=[{"role": "user", "content": "hi"}]), chat=False)
    assert "plain text" in info.value.fix


def test_chat_true_without_chat_template(plain_tok):
    assert plain_tok.has_chat_template is False
    with pytest.raises(PromptError, match="chat=true") as info:
        plain_tok.encode(PromptSpec(text="hi"), chat=True)
    assert "chat: false" in info.value.fix


def test_token_text_decodes_single_ids(tok):
    ids = tok.encode(PromptSpec(text="return value"), chat=False).token_ids
    assert tok.token_text(tok.tok.bos_token_id) == "<s>"
    assert "".join(tok.token_text(i) for i in ids[1:]) == "return value"
    assert tok.token_text(ids[1]) == tok.tok.decode([ids[1]])
    assert tok.token_text(ids[1]) == tok.token_text(ids[1])  # cached


def test_eos_token_ids(tok):
    assert tok.eos_token_ids == [tok.tok.convert_tokens_to_ids("</s>")]


def test_a_byte_token_shows_its_bytes_where_its_text_cannot(tok):
    """A byte-level BPE splits a character it never saw into byte pieces that decode to U+FFFD on
    their own: the raw bytes are what a person needs to see."""
    ids = tok.encode(PromptSpec(text="naïve €"), chat=False).token_ids[1:]
    pieces = [(tok.token_text(i), tok.token_raw(i), tok.token_bytes(i)) for i in ids]
    lossy = [(t, raw) for t, raw, _ in pieces if "\ufffd" in t]
    assert lossy, pieces  # the tiny tokenizer never saw '€' as one token
    assert all(raw and all(c in "0123456789abcdef" for c in raw) for _, raw in lossy)
    assert b"".join(b for _, _, b in pieces) == "naïve €".encode("utf-8")  # the bytes add up to the text
    clean = [t for t, raw, _ in pieces if raw is None]
    assert clean and all("\ufffd" not in t for t in clean)


def test_sentencepiece_byte_fallback_pieces_are_read_as_bytes(tok, monkeypatch):
    monkeypatch.setattr(tok.tok, "convert_ids_to_tokens", lambda i: {5: "<0xE2>", 6: "\u2581hi"}[i])
    assert tok.token_bytes(5) == b"\xe2"
    assert tok.token_bytes(6) == b" hi"


def test_prompts_as_given_for_a_run_that_failed_before_reading_them():
    from parity_ui.inputs.prompts import prompts_as_given

    assert prompts_as_given("hi", ["a.png", "dir/b.png"]) == [PromptSpec(text="hi [image a.png] [image dir/b.png]")]
    assert prompts_as_given("", []) == [PromptSpec(text="")]
    read = [PromptSpec(text="one"), PromptSpec(messages=[{"role": "user", "content": "two"}])]
    assert prompts_as_given("the text box", ["x.png"], read) == read  # a prompt file read wins
    assert prompts_as_given(None, prompt_file="p.jsonl") == [PromptSpec(text="(prompt file p.jsonl)")]
    assert prompts_as_given("hi", [], []) == [PromptSpec(text="hi")]  # no file prompts: the text
