"""A workload's input: its prompts, read from a .jsonl or a .parquet file, streamed.

A workload file may be far larger than memory (a training set's prompts), so it is never read whole:
a .jsonl file line by line, a .parquet file in record batches of the one column that holds the prompt.
What is kept is what was selected: the first N prompts (`limit`), a uniform random N (`sample`, one
streaming pass of reservoir sampling, reproducible from `seed`), or all of them up to `max_prompts`.

Each row becomes a `PromptSpec` through the same code as a prompt file's line
(`prompts.prompt_from_object`), so a workload's prompt and a prompt file's prompt are checked alike.
The value of the prompt field is text (a string) or chat messages (a list of {role, content}): the
shapes of the prompt column of verl's and TRL's Parquet datasets, and of parity-ui's own JSONL lines.

A broken line or a row with no usable prompt either stops the read (`on_bad="stop"`: a PromptError
naming the file, the line or row and what was wrong) or is skipped, counted and named
(`on_bad="skip"`). Problems of the whole file (a missing column, a column of numbers, an unknown file
type, a file over the size limit, no prompts at all) always raise.

pyarrow is imported only when a .parquet file is read.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..core.errors import PromptError
from .prompts import PromptSpec, prompt_from_object

WORKLOAD_FILE_TYPES = (".jsonl", ".parquet")
# Auto-detection looks for these, in this order (parity-ui's own "prompt"/"messages" first).
CANDIDATE_FIELDS = ("prompt", "messages", "text", "question", "input")
MAX_WORKLOAD_PROMPTS = 100_000  # prompts held at once without limit/sample; more must be chosen
MAX_LINE_BYTES = 16 * 2**20  # one JSONL line; a longer one is a bad line (and is never held whole)
BAD_ROWS_KEPT = 20  # skipped rows named in the result; all are counted
PARQUET_BATCH_ROWS = 1024
# Read Parquet pages through a buffer of this size rather than a row group's whole column chunk at once
# (pyarrow's default), so a file written as one huge row group still streams.
PARQUET_READ_BUFFER = 2**20
IMAGE_COLUMNS = ("images", "image")

OnBad = Literal["stop", "skip"]

_JSONL_FIX = 'one JSON object a line, e.g. {"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}]}'
_VALUE_FIX = (
    'the prompt field must hold text (a string) or chat messages (a list of {"role", "content"}); '
    "name the field that does"
)


@dataclass
class BadRow:
    """A line or row that gave no prompt. `number`: the line number (1-based) in a .jsonl file, the row
    index (0-based, as pandas and datasets count) in a .parquet file."""

    number: int
    where: str  # "name.jsonl line 7", "name.parquet row 6"
    message: str  # what was wrong, the `where` included


@dataclass
class SourcePrompt:
    """One prompt as the reader yields it, with the line (JSONL, 1-based) or row (Parquet, 0-based)
    it came from."""

    number: int
    spec: PromptSpec


@dataclass
class Workload:
    """The prompts selected from a workload file, in file order, and how they were chosen."""

    prompts: list[PromptSpec]
    numbers: list[int]  # each prompt's line (JSONL, 1-based) or row (Parquet, 0-based)
    source: str  # the file's path as given
    format: str  # "jsonl" or "parquet"
    field: str  # the field or column the prompts came from ("prompt, messages" when lines used both)
    total_rows: int  # lines (non-blank) or rows read, usable or not
    usable_rows: int  # of those, the ones that gave a prompt (before sampling)
    skipped_count: int
    skipped: list[BadRow]  # the first BAD_ROWS_KEPT of them
    limit: int | None
    sampled: bool
    seed: int | None  # the sample's seed; None when not sampled
    read_to_end: bool  # False when `limit` stopped the read before the file's end
    content_hash: str  # prompts_hash(prompts): equal hashes, equal prompts in the same order

    def describe(self) -> str:
        """One line for a log or the page: how many prompts, from where, chosen how, what was skipped."""
        n = len(self.prompts)
        how = (
            f"{n:,} of {self.usable_rows:,} prompts (a random sample, seed {self.seed})"
            if self.sampled
            else f"the first {n:,} prompts"
            if not self.read_to_end
            else f"all {n:,} prompts"
        )
        text = f"{how} from {Path(self.source).name} (field {self.field!r})"
        if self.skipped_count:
            text += (
                f"; {self.skipped_count:,} {'line' if self.format == 'jsonl' else 'row'}"
                f"{'s' if self.skipped_count > 1 else ''} skipped"
            )
        return text

    def record(self, upload_name: str | None = None) -> dict[str, Any]:
        """How the prompts were chosen, stored with the run (WorkloadOptions.source). An upload is
        recorded by its name: its temporary path means nothing later."""
        where = {"path": upload_name, "uploaded": True} if upload_name else {"path": str(self.source)}
        return {
            **where,
            "format": self.format,
            "field": self.field,
            "rows": self.total_rows,
            "prompts": len(self.prompts),
            "sampled": self.sampled,
            "seed": self.seed,
            "limit": self.limit,
            "skipped_rows": self.skipped_count,
            "content_hash": self.content_hash,
            "description": self.describe(),
        }


def canonical_prompt(spec: PromptSpec) -> dict[str, Any]:
    """The prompt as plain JSON data: its text or messages, and its images by content hash."""
    return {"text": spec.text, "messages": spec.messages, "images": [img.sha256 for img in spec.images]}


def prompts_hash(specs: Iterable[PromptSpec]) -> str:
    """sha256 (hex) over the prompts' canonical JSON, one line each (sorted keys, no spaces, ASCII
    escapes): the same prompts in the same order give the same hash, whichever file they came from."""
    h = hashlib.sha256()
    for spec in specs:
        h.update(json.dumps(canonical_prompt(spec), sort_keys=True, separators=(",", ":")).encode("ascii"))
        h.update(b"\n")
    return h.hexdigest()


class WorkloadReader:
    """Streams a workload file's prompts in file order, holding one line or one record batch at a time.

    The file's own problems raise PromptError here, before any row is read: not found, an unknown type,
    over `max_bytes`, not Parquet, a missing column (the columns that exist are listed), a column of
    neither text nor messages, an image column (unless `ignore_images`). A .jsonl file's first object
    is checked like a schema when iteration reaches it (a missing key raises, whatever `on_bad`).
    Iterating again reads the file again; the counts describe the latest pass."""

    def __init__(
        self,
        path: str | Path,
        *,
        field: str | None = None,
        on_bad: OnBad = "stop",
        max_bytes: int | None = None,
        ignore_images: bool = False,
    ):
        self.path = Path(path)
        name = self.path.name
        if on_bad not in ("stop", "skip"):
            raise PromptError(f"on_bad is {on_bad!r}", 'give "stop" (raise at the first bad row) or "skip"')
        if field is not None and (not isinstance(field, str) or not field):
            raise PromptError(f"the prompt field {field!r} is not a name", "name a key or column, e.g. prompt")
        suffix = self.path.suffix.lower()
        if suffix not in WORKLOAD_FILE_TYPES:
            raise PromptError(
                f"workload file {name!r} has type {suffix or '(none)'!r}",
                "give a .jsonl file (one JSON object a line) or a .parquet file",
            )
        if not self.path.is_file():
            raise PromptError(f"workload file {str(self.path)!r} not found", "check the path")
        size = self.path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise PromptError(
                f"workload file {name!r} is {size / 2**20:.1f} MiB, over the "
                f"{max_bytes / 2**20:g} MiB limit for an upload",
                "give the file's path on this machine instead of uploading it, or upload a smaller selection of it",
            )
        self.format = suffix[1:]
        self.on_bad: OnBad = on_bad
        self.requested_field = field
        self.ignore_images = ignore_images
        self.column: str | None = None  # Parquet: the column read, decided now
        self._reset()
        if self.format == "parquet":
            self.column = self._check_parquet()

    def _reset(self) -> None:
        self.total_rows = 0
        self.skipped_count = 0
        self.skipped: list[BadRow] = []
        self.fields_used: dict[str, int] = {}

    @property
    def field(self) -> str:
        """The field or column the prompts came from so far (lines may use both prompt and messages)."""
        if self.column is not None:
            return self.column
        return ", ".join(self.fields_used) or (self.requested_field or "")

    def __iter__(self) -> Iterator[SourcePrompt]:
        self._reset()
        return self._parquet_rows() if self.format == "parquet" else self._jsonl_rows()

    # --- rows -------------------------------------------------------------------------------

    def _bad(self, number: int, where: str, err: PromptError) -> None:
        """Stop (re-raise) or count and, for the first few, name the row."""
        if self.on_bad == "stop":  # the way on past it, beside the row's own fix
            raise PromptError(
                err.message,
                f'{err.fix}; or skip such rows and count them (--on-bad skip, on_bad="skip")'
                if err.fix
                else "skip such rows and count them (--on-bad skip)",
            )
        self.skipped_count += 1
        if len(self.skipped) < BAD_ROWS_KEPT:
            self.skipped.append(BadRow(number, where, err.message))

    def _spec(self, value: Any, key: str, where: str, images: Any = None) -> PromptSpec:
        """The field's value as a prompt. PromptError when it is empty or neither text nor messages."""
        if value is None:
            raise PromptError(f"{where}: {key!r} is empty (null)", _VALUE_FIX)
        if isinstance(value, str):
            if not value.strip():
                raise PromptError(f"{where}: {key!r} is an empty string", "give the prompt's text")
            obj: dict[str, Any] = {"prompt": value}
        elif isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
            obj = {"messages": value}
        else:
            raise PromptError(f"{where}: {key!r} holds {_describe(value)}, neither text nor chat messages", _VALUE_FIX)
        if images is not None:
            obj["images"] = images
        spec = prompt_from_object(obj, where, self.path.parent)
        self.fields_used[key] = self.fields_used.get(key, 0) + 1
        return spec

    def _jsonl_rows(self) -> Iterator[SourcePrompt]:
        name, requested = self.path.name, self.requested_field
        seen_object = False
        with self.path.open("rb") as f:
            n = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                n += 1
                where = f"{name} line {n}"
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass  # the rest of the line, read piece by piece and dropped
                    self.total_rows += 1
                    self._bad(
                        n,
                        where,
                        PromptError(
                            f"{where} is over {MAX_LINE_BYTES // 2**20} MiB",
                            "a prompt that long is not a prompt; check the file",
                        ),
                    )
                    continue
                if n == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]
                if not raw.strip():
                    continue
                self.total_rows += 1
                try:
                    try:
                        obj = json.loads(raw.decode("utf-8"))
                    except UnicodeDecodeError as e:
                        raise PromptError(
                            f"{where} is not UTF-8 text (byte {e.start})", "re-save the file as UTF-8"
                        ) from None
                    except json.JSONDecodeError as e:
                        raise PromptError(
                            f"{where} is not valid JSON: {e.msg} (column {e.colno})", _JSONL_FIX
                        ) from None
                    if not isinstance(obj, dict):
                        raise PromptError(f"{where} is {_describe(obj)}, not a JSON object", _JSONL_FIX)
                    key = requested or next((k for k in CANDIDATE_FIELDS if obj.get(k) is not None), None)
                    if not seen_object:
                        seen_object = True
                        _check_first_object(obj, requested, key, where)  # raises whatever on_bad
                    if key is None or key not in obj:
                        raise PromptError(
                            f"{where} has no {_fields_text(requested)}; its keys: {_names(obj)}", _JSONL_FIX
                        )
                    spec = self._spec(obj[key], key, where, obj.get("images"))
                except _FileProblem:
                    raise
                except PromptError as e:
                    self._bad(n, where, e)
                    continue
                yield SourcePrompt(n, spec)

    def _check_parquet(self) -> str:
        """The column to read. PromptError when the file is not Parquet, or has no usable column."""
        pq = _pyarrow_parquet()
        import pyarrow as pa

        name = self.path.name
        try:
            pf = pq.ParquetFile(self.path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... on a bad file
            raise PromptError(
                f"{name} is not a Parquet file pyarrow can read ({type(e).__name__}: {str(e)[:200]})",
                "give a .parquet file (e.g. written by datasets or pandas), or a .jsonl file",
            ) from None
        try:
            schema = pf.schema_arrow
        finally:
            pf.close()
        names = list(schema.names)
        requested = self.requested_field
        if requested is not None and requested not in names:
            raise PromptError(
                f"{name} has no column {requested!r}; its columns: {', '.join(names) or '(none)'}",
                "name the column that holds the prompt",
            )
        column = requested or next((c for c in CANDIDATE_FIELDS if c in names), None)
        if column is None:
            raise PromptError(
                f"{name} has none of the prompt columns {', '.join(CANDIDATE_FIELDS)}; its "
                f"columns: {', '.join(names) or '(none)'}",
                "name the column that holds the prompt",
            )
        t = schema.field(column).type
        if pa.types.is_dictionary(t):  # e.g. a pandas categorical: judged by its values
            t = t.value_type
        texty = (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t)
        )
        listy = (
            pa.types.is_list(t) or pa.types.is_large_list(t) or getattr(pa.types, "is_list_view", lambda _: False)(t)
        )
        if not (texty or listy or pa.types.is_null(t)):
            raise PromptError(
                f"{name} column {column!r} holds {t} (from row 0 on), neither text nor chat messages", _VALUE_FIX
            )
        present = [c for c in IMAGE_COLUMNS if c in names]
        if present and not self.ignore_images:
            raise PromptError(
                f"{name} has an image column ({present[0]!r}); images in a .parquet workload are not read yet",
                "give the prompts as a .jsonl file with image paths, or set ignore_images to run the text alone",
            )
        return column

    def _parquet_rows(self) -> Iterator[SourcePrompt]:
        pq = _pyarrow_parquet()
        name, column = self.path.name, self.column
        assert column is not None
        pf = pq.ParquetFile(self.path, buffer_size=PARQUET_READ_BUFFER, pre_buffer=False)
        try:
            row = 0
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[column], use_threads=False):
                for value in batch.column(0).to_pylist():
                    where = f"{name} row {row}"
                    self.total_rows += 1
                    try:
                        spec = self._spec(value, column, where)
                    except PromptError as e:
                        self._bad(row, where, e)
                    else:
                        yield SourcePrompt(row, spec)
                    row += 1
        finally:
            pf.close()


def load_workload(
    path: str | Path,
    *,
    field: str | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    on_bad: OnBad = "stop",
    max_bytes: int | None = None,
    max_prompts: int = MAX_WORKLOAD_PROMPTS,
    ignore_images: bool = False,
) -> Workload:
    """Read a workload file's prompts: all of them, the first `limit`, or a uniform random `sample` of
    the usable ones (reproducible from `seed`), in file order, in one streaming pass.

    `field` names the key or column holding the prompt; None looks for prompt, messages, text, question,
    input (JSONL: in each line; Parquet: among the columns). `max_bytes` refuses a larger file (for
    uploads). Raises PromptError as WorkloadReader does, for a bad row when `on_bad="stop"`, for a
    file with no usable prompt, for bad limit/sample/seed, and when the file holds more than
    `max_prompts` prompts and neither limit nor sample was given."""
    if limit is not None and sample is not None:
        raise PromptError(
            "both limit and sample were given", "give one: limit N (the first N prompts) or sample N (a random N)"
        )
    for label, n in (("limit", limit), ("sample", sample)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise PromptError(f"{label} is {n!r}", f"give {label} as a whole number of prompts, 1 or more")
        if n is not None and n > max_prompts:
            raise PromptError(
                f"{label} {n:,} is over the {max_prompts:,} prompts a workload may hold",
                f"give {label} {max_prompts:,} or less",
            )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise PromptError(f"seed is {seed!r}", "give the sample's seed as a whole number")
    reader = WorkloadReader(path, field=field, on_bad=on_bad, max_bytes=max_bytes, ignore_images=ignore_images)
    picked: list[SourcePrompt] = []
    usable, read_to_end = 0, True
    rows = iter(reader)
    try:
        if sample is not None:
            # Reservoir sampling (Algorithm R): after k usable prompts, each is in the reservoir with
            # probability sample/k, so one pass over a file of unknown length gives a uniform sample.
            rng = random.Random(seed)
            for item in rows:
                if usable < sample:
                    picked.append(item)
                else:
                    j = rng.randrange(usable + 1)
                    if j < sample:
                        picked[j] = item
                usable += 1
            picked.sort(key=lambda it: it.number)
        else:
            for item in rows:
                usable += 1
                if len(picked) == max_prompts:
                    raise PromptError(
                        f"{reader.path.name} holds more than {max_prompts:,} prompts",
                        "choose some: limit N (the first N) or sample N (a random N)",
                    )
                picked.append(item)
                if limit is not None and len(picked) == limit:
                    read_to_end = False  # the rest is not read: a bad line after it does not matter
                    break
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
    if not picked:
        name = reader.path.name
        if reader.skipped_count:
            first = reader.skipped[0].message
            raise PromptError(
                f"{name} holds no usable prompt: all {reader.skipped_count:,} rows were skipped (the first: {first})",
                "fix the rows, or name the field that holds the prompt",
            )
        raise PromptError(
            f"workload file {name!r} holds no prompts",
            _JSONL_FIX if reader.format == "jsonl" else "give a .parquet file with rows",
        )
    specs = [it.spec for it in picked]
    return Workload(
        prompts=specs,
        numbers=[it.number for it in picked],
        source=str(path),
        format=reader.format,
        field=reader.field,
        total_rows=reader.total_rows,
        usable_rows=usable,
        skipped_count=reader.skipped_count,
        skipped=list(reader.skipped),
        limit=limit,
        sampled=sample is not None,
        seed=seed if sample is not None else None,
        read_to_end=read_to_end,
        content_hash=prompts_hash(specs),
    )


# --- helpers ------------------------------------------------------------------------------


class _FileProblem(PromptError):
    """A problem of the whole file found at a row: raised whatever on_bad says."""


def _check_first_object(obj: dict[str, Any], requested: str | None, key: str | None, where: str) -> None:
    """The first JSON object stands for the file's schema: a field it lacks is the file's problem."""
    if requested is not None and requested not in obj:
        raise _FileProblem(
            f"{where} (the first object) has no key {requested!r}; its keys: {_names(obj)}",
            "name the key that holds the prompt",
        )
    if key is None:
        raise _FileProblem(
            f"{where} (the first object) has none of the prompt keys "
            f"{', '.join(CANDIDATE_FIELDS)}; its keys: {_names(obj)}",
            "name the key that holds the prompt",
        )


def _fields_text(requested: str | None) -> str:
    return f"key {requested!r}" if requested else f"prompt key ({', '.join(CANDIDATE_FIELDS)})"


def _names(obj: dict[str, Any], n: int = 20) -> str:
    keys = [str(k) for k in obj]
    return ", ".join(keys[:n]) + (f", ... ({len(keys)} in all)" if len(keys) > n else "") if keys else "(none)"


def _describe(value: Any) -> str:
    """A value's type for a message: 'int 42', 'list of str', 'an empty list'."""
    if isinstance(value, list):
        if not value:
            return "an empty list"
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {'/'.join(kinds)}"
    return f"{type(value).__name__} {repr(value)[:60]}"


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptError(
            "reading a .parquet workload needs pyarrow, which is not installed",
            "pip install pyarrow (parity-ui lists it among its dependencies)",
        ) from None
    return pq
