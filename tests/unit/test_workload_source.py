"""Workload files (.jsonl, .parquet): reading, field detection, limit, sampling, bad rows, every
rejection, the content hash, and that a large file is streamed (bounded memory), never read whole."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parity_ui.core.errors import PromptError
from parity_ui.inputs.prompts import PromptSpec, read_prompt_file
from parity_ui.inputs import workload_source as source
from parity_ui.inputs.workload_source import (BAD_ROWS_KEPT, WorkloadReader, canonical_prompt, load_workload,
                                       prompts_hash)

ROOT = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict], **kw) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, **kw)
    return path


def refused(fn, *args, **kw) -> PromptError:
    with pytest.raises(PromptError) as info:
        fn(*args, **kw)
    assert info.value.fix, "every workload error must say how to fix it"
    return info.value


def chat(i: int) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"question {i}?"}]


# --- reading ------------------------------------------------------------------------------


def test_jsonl_lines_as_read_prompt_file_reads_them(tmp_path):
    rows = [{"prompt": "first"}, {"messages": chat(1)}, {"prompt": "third", "id": 3}]
    path = write_jsonl(tmp_path / "w.jsonl", rows)
    w = load_workload(path)
    assert w.prompts == read_prompt_file(path)
    assert w.prompts[1] == PromptSpec(messages=chat(1))
    assert (w.format, w.field, w.numbers, w.total_rows, w.usable_rows) == ("jsonl", "prompt, messages", [1, 2, 3], 3, 3)
    assert (w.sampled, w.seed, w.limit, w.read_to_end, w.skipped_count) == (False, None, None, True, 0)
    assert w.source == str(path) and "all 3 prompts from w.jsonl" in w.describe()


def test_parquet_text_column(tmp_path):
    path = write_parquet(tmp_path / "w.parquet", [{"id": i, "prompt": f"p{i}"} for i in range(5)])
    w = load_workload(path)
    assert w.prompts == [PromptSpec(text=f"p{i}") for i in range(5)]
    assert (w.format, w.field, w.numbers, w.total_rows) == ("parquet", "prompt", [0, 1, 2, 3, 4], 5)


def test_parquet_messages_column_as_verl_writes_it(tmp_path):
    # verl's RL parquet: `prompt` is a list of {role, content} structs, beside reward and info columns.
    rows = [{"data_source": "gsm8k", "prompt": chat(i), "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}}
            for i in range(4)]
    path = write_parquet(tmp_path / "train.parquet", rows)
    assert pa.types.is_list(pq.read_schema(path).field("prompt").type)
    w = load_workload(path)
    assert w.field == "prompt" and w.prompts == [PromptSpec(messages=chat(i)) for i in range(4)]


def test_trl_conversational_prompt_in_jsonl(tmp_path):
    # TRL's conversational datasets: "prompt" holds the messages.
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": chat(0)}, {"prompt": chat(1)}])
    assert load_workload(path).prompts == [PromptSpec(messages=chat(0)), PromptSpec(messages=chat(1))]


def test_field_auto_detect_and_explicit(tmp_path):
    qs = [{"id": i, "question": f"q{i}", "answer": "42"} for i in range(3)]
    for path in (write_jsonl(tmp_path / "q.jsonl", qs), write_parquet(tmp_path / "q.parquet", qs)):
        w = load_workload(path)
        assert w.field == "question" and w.prompts[2] == PromptSpec(text="q2")
        # Named explicitly, a column is read even where a candidate field exists too.
        w = load_workload(path, field="answer")
        assert w.field == "answer" and w.prompts == [PromptSpec(text="42")] * 3
    # A dictionary-encoded column (a pandas categorical) is text too.
    path = tmp_path / "cat.parquet"
    pq.write_table(pa.table({"question": pa.array(["q0", "q1", "q0"]).dictionary_encode()}), path)
    assert load_workload(path).prompts == [PromptSpec(text="q0"), PromptSpec(text="q1"), PromptSpec(text="q0")]
    # "prompt" comes before "text" in the auto-detect order.
    path = write_parquet(tmp_path / "both.parquet", [{"text": "t", "prompt": "p"}])
    assert load_workload(path).prompts == [PromptSpec(text="p")]


def test_limit_reads_the_first_n_and_stops(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(10)) + "{broken\n")
    w = load_workload(path, limit=4)
    assert w.prompts == [PromptSpec(text=f"p{i}") for i in range(4)]
    assert (w.read_to_end, w.limit, w.total_rows) == (False, 4, 4)
    assert "the first 4 prompts" in w.describe()
    ppath = write_parquet(tmp_path / "w.parquet", [{"prompt": f"p{i}"} for i in range(10)])
    assert load_workload(ppath, limit=4).prompts == w.prompts
    assert load_workload(ppath, limit=50).read_to_end  # fewer rows than the limit: all, to the end


def test_sample_is_reproducible_and_seeds_differ(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": f"p{i}"} for i in range(200)])
    a, b = load_workload(path, sample=10, seed=7), load_workload(path, sample=10, seed=7)
    assert a.prompts == b.prompts and a.content_hash == b.content_hash
    assert (a.sampled, a.seed, a.usable_rows, len(a.prompts)) == (True, 7, 200, 10)
    assert a.numbers == sorted(a.numbers) and len(set(a.numbers)) == 10  # file order, no repeats
    assert all(p.text == f"p{n - 1}" for p, n in zip(a.prompts, a.numbers))
    others = {tuple(load_workload(path, sample=10, seed=s).numbers) for s in range(1, 6)}
    assert tuple(a.numbers) not in others and len(others) == 5
    assert load_workload(path, sample=500).prompts == load_workload(path).prompts  # more than there are: all
    assert "10 of 200 prompts (a random sample, seed 7) from w.jsonl (field 'prompt')" in a.describe()


def test_sample_is_uniform(tmp_path):
    # Reservoir sampling gives every prompt the same chance: 5 of 20 over 2000 seeds, each ~500 times.
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": f"p{i}"} for i in range(20)])
    counts = [0] * 20
    for seed in range(2000):
        for n in load_workload(path, sample=5, seed=seed).numbers:
            counts[n - 1] += 1
    assert sum(counts) == 10_000 and min(counts) > 400 and max(counts) < 600, counts


def test_same_file_as_jsonl_and_parquet_gives_the_same_prompts(tmp_path):
    for name, rows in (("text", [{"prompt": f"prompt {i} é ✓", "id": i} for i in range(300)]),
                       ("chat", [{"prompt": chat(i), "id": i} for i in range(300)])):
        j = load_workload(write_jsonl(tmp_path / f"{name}.jsonl", rows))
        p = load_workload(write_parquet(tmp_path / f"{name}.parquet", rows, row_group_size=64))
        assert j.prompts == p.prompts and len(j.prompts) == 300
        assert j.content_hash == p.content_hash
        js = load_workload(tmp_path / f"{name}.jsonl", sample=25, seed=3)
        ps = load_workload(tmp_path / f"{name}.parquet", sample=25, seed=3)
        assert js.prompts == ps.prompts and [n - 1 for n in js.numbers] == ps.numbers


def test_content_hash_is_sha256_of_canonical_json_and_stable(tmp_path):
    rows = [{"prompt": "a"}, {"messages": chat(0)}]
    w = load_workload(write_jsonl(tmp_path / "w.jsonl", rows))
    lines = [json.dumps({"images": [], "messages": None, "text": "a"}, separators=(",", ":")),
             json.dumps({"images": [], "messages": chat(0), "text": None}, sort_keys=True, separators=(",", ":"))]
    assert w.content_hash == hashlib.sha256("".join(x + "\n" for x in lines).encode()).hexdigest()
    assert canonical_prompt(w.prompts[0]) == {"text": "a", "messages": None, "images": []}
    assert load_workload(tmp_path / "w.jsonl").content_hash == w.content_hash
    assert prompts_hash(w.prompts[::-1]) != w.content_hash  # order counts
    assert prompts_hash([PromptSpec(text="a "), w.prompts[1]]) != w.content_hash


def test_ten_thousand_prompts_read_quickly(tmp_path):
    rows = [{"prompt": f"prompt number {i}: " + "word " * 30} for i in range(10_000)]
    for path in (write_jsonl(tmp_path / "w.jsonl", rows), write_parquet(tmp_path / "w.parquet", rows)):
        t0 = time.perf_counter()
        w = load_workload(path)
        elapsed = time.perf_counter() - t0
        assert len(w.prompts) == 10_000 and w.prompts[9999].text == rows[9999]["prompt"]
        assert elapsed < 5, f"{path.name}: {elapsed:.1f} s for 10,000 prompts"


def test_reader_streams_numbered_prompts_and_counts(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": 1}\n{"messages": [{"role": "user", "content": "b"}]}\n')
    reader = WorkloadReader(path, on_bad="skip")
    for _ in range(2):  # a second pass reads the file again, counting afresh
        items = list(reader)
        assert [(it.number, it.spec) for it in items] == \
            [(1, PromptSpec(text="a")), (4, PromptSpec(messages=[{"role": "user", "content": "b"}]))]
        assert (reader.total_rows, reader.skipped_count, reader.field) == (3, 1, "prompt, messages")
        assert reader.skipped[0].where == "w.jsonl line 3"


# --- bad rows -----------------------------------------------------------------------------


def bad_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_bytes(b'{"prompt": "ok 1"}\n{"prompt": "unterminated\n\n[1, 2]\n{"prompt": 42}\n'
                     b'{"prompt": ""}\n{"prompt": "caf\xe9"}\n{"messages": [{"role": "user"}]}\n{"prompt": "ok 2"}\n')
    return path


def test_bad_line_stops_naming_file_line_and_problem(tmp_path):
    err = refused(load_workload, bad_jsonl(tmp_path))
    assert "w.jsonl line 2" in err.message and "not valid JSON" in err.message


def test_bad_lines_skipped_are_counted_and_named(tmp_path):
    w = load_workload(bad_jsonl(tmp_path), on_bad="skip")
    assert w.prompts == [PromptSpec(text="ok 1"), PromptSpec(text="ok 2")] and w.numbers == [1, 9]
    assert (w.skipped_count, w.total_rows, w.usable_rows) == (6, 8, 2)
    assert [b.number for b in w.skipped] == [2, 4, 5, 6, 7, 8]
    msgs = [b.message for b in w.skipped]
    assert "not valid JSON" in msgs[0] and "not a JSON object" in msgs[1]
    assert "'prompt' holds int 42, neither text nor chat messages" in msgs[2]
    assert "empty string" in msgs[3] and "not UTF-8" in msgs[4] and "role" in msgs[5]
    assert all(b.where == f"w.jsonl line {b.number}" and b.where in b.message for b in w.skipped)
    assert "6 lines skipped" in w.describe()


def test_skipped_rows_all_counted_first_few_named(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("not json\n" * 50 + '{"prompt": "ok"}\n')
    w = load_workload(path, on_bad="skip")
    assert w.skipped_count == 50 and len(w.skipped) == BAD_ROWS_KEPT and w.prompts == [PromptSpec(text="ok")]


def test_parquet_bad_rows_stop_and_skip(tmp_path):
    path = write_parquet(tmp_path / "w.parquet", [{"prompt": "a"}, {"prompt": None}, {"prompt": "  "},
                                                 {"prompt": "d"}])
    err = refused(load_workload, path)
    assert "w.parquet row 1" in err.message and "null" in err.message
    w = load_workload(path, on_bad="skip")
    assert w.prompts == [PromptSpec(text="a"), PromptSpec(text="d")] and w.numbers == [0, 3]
    assert [b.number for b in w.skipped] == [1, 2] and w.skipped_count == 2


def test_too_long_line_is_a_bad_line_never_held_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "MAX_LINE_BYTES", 100)
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "' + "x" * 500 + '"}\n{"prompt": "c"}\n')
    w = load_workload(path, on_bad="skip")
    assert w.prompts == [PromptSpec(text="a"), PromptSpec(text="c")] and w.numbers == [1, 3]
    assert w.skipped[0].number == 2 and "over" in w.skipped[0].message
    assert "w.jsonl line 2" in refused(load_workload, path).message


def test_all_rows_bad_is_no_usable_prompt(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": 1}\n{"prompt": 2}\n')
    err = refused(load_workload, path, on_bad="skip")
    assert "no usable prompt" in err.message and "2 rows were skipped" in err.message and "line 1" in err.message


# --- the file's own problems --------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_empty_jsonl(tmp_path, content):
    path = tmp_path / "w.jsonl"
    path.write_bytes(content)
    assert "holds no prompts" in refused(load_workload, path).message


def test_empty_parquet(tmp_path):
    path = tmp_path / "w.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    assert "holds no prompts" in refused(load_workload, path).message


def test_missing_column_lists_the_columns(tmp_path):
    rows = [{"id": 1, "query": "q", "answer": "a"}]
    err = refused(load_workload, write_parquet(tmp_path / "w.parquet", rows), field="prompt_text")
    assert "no column 'prompt_text'" in err.message and "id, query, answer" in err.message
    err = refused(load_workload, tmp_path / "w.parquet")  # auto: none of the candidates
    assert "none of the prompt columns" in err.message and "id, query, answer" in err.message
    # In JSONL the first object stands for the schema: raised even when bad lines are skipped.
    path = write_jsonl(tmp_path / "w.jsonl", rows * 3)
    err = refused(load_workload, path, field="prompt_text", on_bad="skip")
    assert "w.jsonl line 1" in err.message and "no key 'prompt_text'" in err.message
    assert "id, query, answer" in err.message
    assert "none of the prompt keys" in refused(load_workload, path, on_bad="skip").message
    assert load_workload(path, field="query").prompts == [PromptSpec(text="q")] * 3


def test_unknown_extension_names_the_accepted(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("prompt\nhi\n")
    err = refused(load_workload, path)
    assert "'.csv'" in err.message and ".jsonl" in err.fix and ".parquet" in err.fix


def test_missing_file(tmp_path):
    assert "not found" in refused(load_workload, tmp_path / "nope.jsonl").message


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "w.parquet"
    path.write_text('{"prompt": "hi"}\n')
    assert "not a Parquet file" in refused(load_workload, path).message


def test_upload_size_limit(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "x" * 2000}] * 600)  # ~1.2 MB
    err = refused(load_workload, path, max_bytes=2**20)
    assert "over the 1 MiB limit for an upload" in err.message
    assert len(load_workload(path, max_bytes=2 * 2**20).prompts) == 600


def test_column_neither_text_nor_messages(tmp_path):
    path = write_parquet(tmp_path / "w.parquet", [{"prompt": i} for i in range(3)])
    err = refused(load_workload, path, on_bad="skip")  # the column's type is the file's problem
    assert "column 'prompt' holds int64" in err.message and "row 0" in err.message
    err = refused(load_workload, write_parquet(tmp_path / "l.parquet", [{"prompt": ["a", "b"]}]))
    assert "row 0" in err.message and "a list of str" in err.message
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "ok"}, {"prompt": {"a": 1}}])
    err = refused(load_workload, path)
    assert "w.jsonl line 2" in err.message and "holds dict" in err.message


def test_parquet_image_column_is_refused_unless_ignored(tmp_path):
    rows = [{"prompt": "what is in the picture?", "images": [{"bytes": b"\x89PNG", "path": "a.png"}]}]
    path = write_parquet(tmp_path / "w.parquet", rows)
    err = refused(load_workload, path)
    assert "image column ('images')" in err.message and "ignore_images" in err.fix
    assert load_workload(path, ignore_images=True).prompts == [PromptSpec(text="what is in the picture?")]


def test_options_checked(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    assert "both limit and sample" in refused(load_workload, path, limit=2, sample=2).message
    assert "limit is 0" in refused(load_workload, path, limit=0).message
    assert "sample is -1" in refused(load_workload, path, sample=-1).message
    assert "seed is" in refused(load_workload, path, sample=2, seed="x").message
    assert "on_bad is 'ignore'" in refused(load_workload, path, on_bad="ignore").message
    assert "over the 3 prompts" in refused(load_workload, path, limit=4, max_prompts=3).message


def test_more_prompts_than_max_needs_limit_or_sample(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    err = refused(load_workload, path, max_prompts=4)
    assert "more than 4 prompts" in err.message and "limit" in err.fix and "sample" in err.fix
    assert len(load_workload(path, max_prompts=5).prompts) == 5
    assert len(load_workload(path, sample=3, max_prompts=4).prompts) == 3


def test_core_imports_and_reads_jsonl_without_pyarrow(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "hi"}])
    write_parquet(tmp_path / "w.parquet", [{"prompt": "hi"}])
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
            "from parity_ui.core.errors import PromptError\n"
            "from parity_ui.inputs.workload_source import load_workload\n"
            f"assert load_workload({str(path)!r}).prompts[0].text == 'hi'\n"
            "try:\n"
            f"    load_workload({str(tmp_path / 'w.parquet')!r})\n"
            "except PromptError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "needs pyarrow" in out.stdout and "pip install pyarrow" in out.stdout


# --- bounded memory -----------------------------------------------------------------------


def random_text(n_rows: int, width: int) -> list[str]:
    # Incompressible text, so the Parquet file is as large as its prompts.
    blob = base64.b64encode(os.urandom(n_rows * width * 3 // 4 + 3)).decode()
    return [f"prompt {i} " + blob[i * width:(i + 1) * width] for i in range(n_rows)]


# Run in a fresh process: a child's ru_maxrss starts at its parent's peak, but /proc's VmHWM (the
# peak resident memory) is the child's own. The small file first faults in the code and the allocators'
# arenas, so what grows after it is what reading the big file holds.
_MEASURE = """
import json, sys
import pyarrow as pa
from parity_ui.inputs.workload_source import WorkloadReader, load_workload
def hwm():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
big, small, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
sum(1 for _ in WorkloadReader(small)); load_workload(small, sample=100, seed=1)
out = {"start": hwm(), "rows": 0}
for item in WorkloadReader(big):
    out["rows"] += 1
    if out["rows"] == rows // 10:
        out["tenth"] = hwm()
out["pass"] = hwm()
out["kept"] = len(load_workload(big, sample=100, seed=1).prompts)
out["end"] = hwm()
out["arrow_peak"] = pa.default_memory_pool().max_memory()
print(json.dumps(out))
"""


def assert_streamed(big: Path, small: Path, rows: int) -> None:
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(big), str(small), str(rows)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)
    size, mib = big.stat().st_size, 2**20
    assert m["rows"] == rows and m["kept"] == 100
    report = {k: f"{m[k] / mib:.0f} MiB" for k in ("start", "tenth", "pass", "end", "arrow_peak")}
    report["file"] = f"{size / mib:.0f} MiB"
    # Read whole, the file (or its prompts) would sit in memory: growth near its size, or more.
    assert m["end"] - m["start"] < size / 2, report
    # Once reading is under way, memory stays flat: the rows read are not held.
    assert m["pass"] - m["tenth"] < size / 4, report
    # pyarrow's own allocations: reading a row group's column chunk whole would show it here.
    assert m["arrow_peak"] < size / 6, report


def test_big_jsonl_is_streamed(tmp_path):
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    texts = random_text(200_000, 200)
    for path, part in ((big, texts), (small, texts[:2000])):
        with path.open("w") as f:
            f.writelines(json.dumps({"prompt": text, "id": 1}) + "\n" for text in part)
    assert big.stat().st_size > 40 * 2**20
    assert_streamed(big, small, 200_000)


def test_big_parquet_is_streamed(tmp_path):
    # One row group of ~60 MB: pyarrow's defaults read a row group's column chunk whole; the reader
    # must not.
    big, small = tmp_path / "big.parquet", tmp_path / "small.parquet"
    table = pa.table({"id": list(range(200_000)), "prompt": random_text(200_000, 300)})
    pq.write_table(table, big, row_group_size=len(table), compression="snappy")
    pq.write_table(table.slice(0, 2000), small)
    del table
    assert big.stat().st_size > 50 * 2**20
    assert_streamed(big, small, 200_000)
