"""An RL run's own rollouts, read from its dump: one `RolloutRow` per sample (prompt ids, response
ids, the rollout engine's logprobs, the trainer's when recorded, the loss mask, the sampling
settings, the policy version), whatever framework wrote it. Streamed: rows are yielded one at a
time, never the whole file (a .pt pickle is the exception: torch loads it whole; slime writes one
per rollout step).

Formats (`FORMATS`; `--format auto` detects them, `describe_formats()` lists what each needs), each
read with the field names its framework writes (checked against the framework's source):

- "parity": parity-ui's own rollout format, jsonl or parquet, one row per sample (docs/rollouts.md):
  prompt_ids, response_ids, rollout_logprobs, trainer_logprobs, loss_mask, sampling, policy_version,
  routed_experts ([prompt + response - 1 positions][layers][top_k] expert ids, as vLLM returns them).
- "nemo-rl": NeMo-RL's `train_data_step{N}.jsonl` (nemo_rl/algorithms/grpo.py, the log_data block):
  token_ids (prompt + response, padded to the batch), input_lengths, token_loss_mask,
  sample_loss_mask, generation_logprobs (rollout engine), prev_logprobs (trainer recompute), content,
  rewards, advantages. Every per-token column is aligned to token_ids with the logprob of token i at
  position i (NeMo-RL prepends a 0 for the first token); the response starts at the first position
  whose token_loss_mask is 1.
- "verl": verl's `trainer.rollout_data_dir` `{step}.jsonl` (ray_trainer.py `_dump_generations`):
  input, output (decoded text, skip_special_tokens=True), gts, score, step. No ids and no logprobs:
  the ids are reconstructed with the model's tokenizer, and rows whose text does not survive
  decode -> encode are named.
- "slime": slime / miles `--save-debug-rollout-data rollout_{id}.pt`: torch.save of
  dict(rollout_id, samples=[Sample.to_dict()]) (slime/ray/rollout.py, slime/utils/types.py):
  tokens (prompt + response), response_length, loss_mask and rollout_log_probs (response length),
  weight_versions, rollout_routed_experts (int32 [len(tokens) - 1, num_layers, moe_router_topk]: slime's
  and miles' utils/types.py reshape SGLang's return so), status, reward, prompt, response. A pickle: loaded with
  torch.load(weights_only=True) (plain containers only, no code runs); a file that needs more is
  refused unless the user passes trust_pickle (unpickling runs code the file names).

`preflight(rows, ...)` checks the replay traps before any engine loads (ids outside the vocabulary,
the shift convention, tokens after EOS, a loss mask of the wrong length, several policy versions,
logprobs recorded at T != 1 or in processed mode) as a streaming pass.

May import: core (the package's rule).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.types import Finding
from . import slime_dump

# The row types live in rollout_rows (the framework readers import them, and this module them): read from here too.
from .rollout_rows import BadRow, DumpError, RolloutRow, floats, ints, jsonl_records, routes_array
from .step_dumps import detect_step_format, nemo_unbatched, open_step

FORMATS = ("parity", "nemo-rl", "verl", "slime", "prime-rl", "verl-dp")

# What each format needs (required) and reads when present (optional): shown for an unknown format.
FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "parity": (
        ("prompt_ids", "response_ids"),
        ("rollout_logprobs", "trainer_logprobs", "loss_mask", "sampling", "policy_version", "routed_experts", "id"),
    ),
    "nemo-rl": (
        ("token_ids", "input_lengths", "token_loss_mask"),
        ("generation_logprobs", "prev_logprobs", "sample_loss_mask", "content", "rewards", "advantages"),
    ),
    "verl": (("input", "output"), ("gts", "score", "step")),
    "prime-rl": (
        ("schema_version", "token_ids", "loss_mask", "inference_logprobs", "trainer_logprobs"),
        ("step", "export_step", "rank", "micro_step", "run_id", "env_name", "position_ids"),
    ),
    "verl-dp": (
        ("batch.prompts", "batch.responses", "batch.attention_mask"),
        ("batch.response_mask", "batch.rollout_log_probs", "batch.routed_experts", "meta.json global_steps"),
    ),
    "slime": (
        ("samples[].tokens", "samples[].response_length"),
        (
            "samples[].loss_mask",
            "samples[].rollout_log_probs",
            "samples[].weight_versions",
            "samples[].rollout_routed_experts",
            "samples[].status",
            "samples[].rollout_top_p_token_ids / _offsets",
            "samples[].prefix_cache_info",
            "samples[].spec_info",
            "train_data/{id}.pt samples[].log_probs (train dump v2, joined on sample_index)",
        ),
    ),
}
FORMAT_NAMES = {
    "parity": "parity-ui rollout format",
    "nemo-rl": "NeMo-RL train_data_step*.jsonl",
    "verl": "verl rollout_data_dir jsonl (text only)",
    "slime": "slime / miles rollout_{id}.pt",
    "prime-rl": "prime-rl token_exports/step_N/rank_R.jsonl",
    "verl-dp": "verl rollout skip dump <step>/gen_batch.dp (a DataProto pickle)",
}
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
LOGPROB_SLACK = 1e-3


def describe_formats() -> str:
    """Every supported format and the fields it needs, one line each."""
    lines = []
    for f in FORMATS:
        req, opt = FIELDS[f]
        lines.append(f"  --format {f}: {FORMAT_NAMES[f]}; needs {', '.join(req)}; reads {', '.join(opt)}")
    return "\n".join(lines)


@dataclass
class RolloutDump:
    """An opened dump: its format and a way to stream its rows (each call to `rows()` reads the file
    again from the start; `bad` collects rows skipped with on_bad="skip")."""

    path: str
    format: str
    rows_fn: Callable[[], Iterator[RolloutRow]]
    bad: list[BadRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def rows(self) -> Iterator[RolloutRow]:
        self.bad.clear()
        return self.rows_fn()

    def describe(self) -> str:
        return f"{self.path} ({FORMAT_NAMES[self.format]})"


# -- detection ---------------------------------------------------------------------------------------


def _first_json(path: Path) -> dict[str, Any] | None:
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    obj = json.loads(raw)
                except ValueError:
                    return None
                return obj if isinstance(obj, dict) else None
    return None


def _format_of_keys(keys: set[str]) -> str | None:
    if {"prompt_ids", "response_ids"} <= keys:
        return "parity"
    if "token_ids" in keys and ("token_loss_mask" in keys or "generation_logprobs" in keys):
        return "nemo-rl"
    if {"input", "output"} <= keys:
        return "verl"
    if {"schema_version", "inference_logprobs", "trainer_logprobs"} <= keys:
        return "prime-rl"
    return None


def detect_format(path: str | Path) -> str:
    """The dump's format from its name and first row. Raises DumpError listing the formats and the
    fields each needs."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"no rollout dump at {p}", "give the path of a .jsonl, .parquet or .pt dump")
    step_fmt = detect_step_format(p)  # a step of prime-rl's or verl's: a directory or gen_batch.dp
    if step_fmt is not None:
        return step_fmt
    suffix = p.suffix.lower()
    if suffix in (".pt", ".pth", ".pkl"):
        return "slime"
    keys: set[str] = set()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        keys = set(pq.ParquetFile(p).schema_arrow.names)
    elif suffix in (".jsonl", ".json"):
        first = _first_json(p)
        keys = set(first) if first else set()
    fmt = _format_of_keys(keys)
    if fmt is None:
        raise DumpError(
            f"{p.name}: not a rollout dump parity-ui knows (its fields: {', '.join(sorted(keys)) or 'none readable'})",
            "write it in parity-ui's rollout format (docs/rollouts.md), or name the format; "
            f"supported:\n{describe_formats()}",
        )
    return fmt


# -- opening -------------------------------------------------------------------------------------------


def open_dump(
    path: str | Path,
    fmt: str = "auto",
    *,
    tokenizer: Any = None,
    trust_pickle: bool = False,
    on_bad: str = "stop",
    chat_template: bool = False,
) -> RolloutDump:
    """The dump at `path` in format `fmt` ("auto": detected). `tokenizer` (an HF tokenizer) is needed
    for verl's text-only rows. Raises DumpError for an unknown format, a refused pickle, or a file
    that is not there."""
    p = Path(path)
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt not in FORMATS:
        raise DumpError(f"unknown rollout format {fmt!r}", f"use one of:\n{describe_formats()}")
    if not p.exists():
        raise DumpError(f"no rollout dump at {p}", "give the path of a .jsonl, .parquet or .pt dump")
    if on_bad not in ("stop", "skip"):
        raise DumpError(f"on_bad is {on_bad!r}", "use stop or skip")
    dump = RolloutDump(str(p), fmt, rows_fn=lambda: iter(()))
    if fmt in ("prime-rl", "verl-dp"):  # a step of theirs: its own module (all ranks joined; a pickle refused)
        step = open_step(fmt, p, trust_pickle=trust_pickle)
        dump.path, dump.notes = step.path, step.notes
        dump.rows_fn = lambda: _guarded(dump, on_bad, step.records(), step.make)
        return dump
    if fmt == "parity":
        dump.rows_fn = lambda: _guarded(dump, on_bad, _parity_records(p), _parity_row)
    elif fmt == "nemo-rl":
        # NeMo-RL writes each field as a one-row batch
        dump.rows_fn = lambda: _guarded(dump, on_bad, nemo_unbatched(jsonl_records(p)), _nemo_row)
    elif fmt == "verl":
        if tokenizer is None:
            raise DumpError(
                "a verl dump holds text only and needs the model's tokenizer to rebuild the ids",
                "pass the model (--model) whose tokenizer the run used",
            )
        dump.notes.append(
            "verl's dump holds decoded text only (skip_special_tokens=True): the ids are "
            "reconstructed with the model's tokenizer"
            + (" and chat template" if chat_template else "")
            + ", not read; there are no recorded logprobs"
        )
        dump.rows_fn = lambda: _guarded(
            dump, on_bad, jsonl_records(p), lambda rec, i, w: _verl_row(rec, i, w, tokenizer, chat_template)
        )
    else:
        samples = _load_pickle(p, trust_pickle)
        joined = slime_dump.join_train_dump(
            p, samples, trust_pickle, dump.notes
        )  # the trainer's logprobs, where dumped
        dump.rows_fn = lambda: _guarded(
            dump, on_bad, ((i, f"sample {i}", (s, t)) for i, (s, t) in enumerate(joined)), slime_dump.sample_row
        )
    return dump


def _guarded(
    dump: RolloutDump, on_bad: str, records: Iterator[tuple[int, str, Any]], make: Callable[[Any, int, str], RolloutRow]
) -> Iterator[RolloutRow]:
    for i, where, rec in records:
        try:
            if isinstance(rec, BadRow):
                raise DumpError(rec.message, "")
            yield make(rec, i, where)
        except DumpError as e:
            if on_bad == "stop":
                raise DumpError(
                    f"{Path(dump.path).name}, {where}: {e.message}",
                    e.fix or "fix or drop that row, or pass --on-bad skip to skip it and count it",
                ) from None
            dump.bad.append(BadRow(where, e.message))


def _parity_records(p: Path) -> Iterator[tuple[int, str, Any]]:
    if p.suffix.lower() != ".parquet":
        yield from jsonl_records(p)
        return
    import pyarrow.parquet as pq

    i = 0
    for batch in pq.ParquetFile(p).iter_batches(batch_size=256):
        for rec in batch.to_pylist():
            yield i, f"row {i}", rec
            i += 1


# -- each format's row ---------------------------------------------------------------------------------


def _parity_row(rec: dict[str, Any], i: int, where: str) -> RolloutRow:
    missing = [k for k in FIELDS["parity"][0] if rec.get(k) is None]
    if missing:
        raise DumpError(f"no {', '.join(missing)}", "every row needs prompt_ids and response_ids (docs/rollouts.md)")
    sampling = rec.get("sampling")
    if sampling is not None and not isinstance(sampling, dict):
        raise DumpError("sampling is not an object", 'write sampling as {"temperature": 1.0, "top_p": 1.0, ...}')
    mask = rec.get("loss_mask")
    version = rec.get("policy_version")
    return RolloutRow(
        index=i,
        where=where,
        prompt_ids=ints(rec["prompt_ids"], "prompt_ids"),
        response_ids=ints(rec["response_ids"], "response_ids"),
        rollout_logprobs=floats(rec.get("rollout_logprobs"), "rollout_logprobs"),
        trainer_logprobs=floats(rec.get("trainer_logprobs"), "trainer_logprobs"),
        loss_mask=ints(mask, "loss_mask") if mask is not None else None,
        sampling=dict(sampling) if sampling else None,
        policy_version=None if version is None else str(version),
        has_routed_experts=rec.get("routed_experts") is not None,
        routed_experts=routes_array(rec.get("routed_experts"), "routed_experts"),
    )


def _nemo_cut_error(tmask: list[int], n: int, total: int, start: int | None) -> DumpError:
    """Why a NeMo-RL row has no response inside its input_lengths, naming the field and the cut:
    NeMo-RL writes input_lengths as the unpadded prompt + response length, token_loss_mask 1 over
    the response (issue 46 item 7: a row whose input_lengths covered only the prompt read "marks no
    generated token after a prompt", naming neither)."""
    marked = [k for k, m in enumerate(tmask) if m]
    if start == 0:
        return DumpError(
            "token_loss_mask marks token 0, so no prompt comes before the response",
            "token_loss_mask is 0 over the prompt and 1 over the response tokens (NeMo-RL's own)",
        )
    if marked:  # the mask marks tokens, all of them at or past the cut
        return DumpError(
            f"input_lengths is {n}, but token_loss_mask marks no token before it (its first marked token is "
            f"token {marked[0]} of token_ids' {total}): input_lengths covers only the prompt. NeMo-RL writes "
            "there the unpadded prompt + response length",
            f"write input_lengths as the prompt + response length ({marked[-1] + 1} here, one past the last "
            "token token_loss_mask marks), or --on-bad skip to leave the row out",
        )
    return DumpError(
        f"token_loss_mask marks no token (all {len(tmask)} are 0): the row has no response to replay",
        "drop the row, or --on-bad skip to leave such rows out",
    )


def _nemo_row(rec: dict[str, Any], i: int, where: str) -> RolloutRow:
    missing = [k for k in FIELDS["nemo-rl"][0] if rec.get(k) is None]
    if missing:
        raise DumpError(
            f"no {', '.join(missing)} (a NeMo-RL train_data_step*.jsonl row has them)",
            "use the train_data_step*.jsonl of a NeMo-RL version that logs token_ids",
        )
    ids = ints(rec["token_ids"], "token_ids")
    n = int(rec["input_lengths"])
    if not 0 < n <= len(ids):
        raise DumpError(f"input_lengths {n} is outside token_ids' {len(ids)} tokens", "")
    tmask = ints(rec["token_loss_mask"], "token_loss_mask")
    if len(tmask) < n:
        raise DumpError(
            f"token_loss_mask has {len(tmask)} entries for {n} tokens (input_lengths)",
            "token_loss_mask must cover every token of token_ids",
        )
    start = next((k for k in range(n) if tmask[k]), None)
    if start is None or start == 0:
        raise _nemo_cut_error(tmask, n, len(ids), start)
    smask = rec.get("sample_loss_mask", 1)
    smask = 1 if smask is None else int(smask)

    def cut(v: Any, name: str) -> list[float] | None:
        col = floats(v, name)
        if col is None:
            return None
        if len(col) < n:
            raise DumpError(f"{name} has {len(col)} entries for {n} tokens", f"{name} must cover every token")
        return col[start:n]

    return RolloutRow(
        index=i,
        where=where,
        prompt_ids=ids[:start],
        response_ids=ids[start:n],
        rollout_logprobs=cut(rec.get("generation_logprobs"), "generation_logprobs"),
        trainer_logprobs=cut(rec.get("prev_logprobs"), "prev_logprobs"),
        loss_mask=[m * smask for m in tmask[start:n]],
        sampling=None,
    )


def _verl_row(rec: dict[str, Any], i: int, where: str, tok: Any, chat_template: bool) -> RolloutRow:
    prompt, output = rec.get("input"), rec.get("output")
    if not isinstance(prompt, str) or not isinstance(output, str):
        raise DumpError("no input/output text (a verl rollout_data_dir row has both)", "")
    if chat_template:
        p_ids = list(
            tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True)
        )
        if p_ids and isinstance(p_ids[0], list):
            p_ids = p_ids[0]
        p_ids = [int(x) for x in (p_ids["input_ids"] if isinstance(p_ids, dict) else p_ids)]
    else:
        p_ids = list(tok(prompt, add_special_tokens=True)["input_ids"])
    r_ids = list(tok(output, add_special_tokens=False)["input_ids"])
    notes = []
    # What verl wrote is decode(ids, skip_special_tokens=True): the rebuilt ids must decode back to it.
    if not chat_template and tok.decode(p_ids, skip_special_tokens=True) != prompt:
        notes.append(
            "the input text does not decode back from its re-tokenised ids (it spells out special "
            "tokens or a chat template's markers, which verl's dump drops)"
        )
    if tok.decode(r_ids, skip_special_tokens=True) != output:
        notes.append(
            "the output text does not decode back from its re-tokenised ids (special tokens the "
            "model generated were dropped by the dump)"
        )
    joint = list(tok(prompt + output, add_special_tokens=True)["input_ids"]) if not chat_template else None
    if joint is not None and joint != p_ids + r_ids:
        notes.append(
            "the tokenizer merges across the prompt/response boundary, so the response's first ids "
            "are not the ones generated"
        )
    return RolloutRow(
        index=i,
        where=where,
        prompt_ids=p_ids,
        response_ids=r_ids,
        reconstructed=True,
        text_note="; ".join(notes) or None,
        policy_version=str(rec["step"]) if rec.get("step") is not None else None,
    )


class _RecordType(type):
    """The type of PickledRecord's stand-ins: a class nested in an absent one (slime's Sample.Status)
    is pickled (protocol 2) as getattr(Sample, "Status"), so an attribute of a stand-in class is a
    stand-in class too."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        nested = _RecordType(attr, (PickledRecord,), {"_pickled_as": f"{cls._pickled_as}.{attr}"})
        setattr(cls, attr, nested)
        return nested


class PickledRecord(metaclass=_RecordType):
    """A stand-in for a class the pickle names that does not import here (slime's Sample on a machine
    without slime): its fields become attributes, read as any object's. Made per class name by
    `lenient_pickle` (issue 46 item 8: the user passed --trust-pickle; needing the framework too
    refused a file whose fields are all plain data)."""

    _pickled_as = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) == 1 and not kwargs:
            self.value = args[0]  # an Enum member pickled as Status("completed")
        elif args:
            self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            for part in state:
                if isinstance(part, dict):
                    self.__dict__.update(part)
        elif isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state

    def __repr__(self) -> str:
        return f"<{self._pickled_as} read as a record: {', '.join(self.__dict__)}>"


def lenient_pickle() -> Any:
    """A pickle module for torch.load whose unpickler imports each class the file names where it
    imports, and maps one that does not (its module absent: the framework is not installed here) to a
    PickledRecord. Unpickling still runs what the classes that do import run: only ever called when
    the user passed --trust-pickle."""
    import pickle
    import types

    records: dict[tuple[str, str], type] = {}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                key = (module, name)
                if key not in records:
                    records[key] = _RecordType(
                        name.rsplit(".", 1)[-1], (PickledRecord,), {"_pickled_as": f"{module}.{name}"}
                    )
                return records[key]

    mod = types.ModuleType("parity_lenient_pickle")
    mod.Unpickler = Unpickler  # type: ignore[attr-defined]
    mod.load = lambda f, **kw: Unpickler(f, **kw).load()  # type: ignore[attr-defined]
    mod.__dict__.update({k: getattr(pickle, k) for k in ("UnpicklingError", "HIGHEST_PROTOCOL", "dump", "dumps")})
    return mod


def _load_pickle(p: Path, trust_pickle: bool) -> list[Any]:
    """slime's torch.save(dict(rollout_id, samples)). weights_only=True first (plain containers and
    tensors only: no code runs); a file that needs any other class is refused without trust_pickle,
    and with it loaded whole, a class absent here read as a record (lenient_pickle)."""
    import pickle

    import torch

    try:
        data = torch.load(p, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError) as e:
        if not trust_pickle:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise DumpError(
                f"{p.name} is a pickle that a safe load refuses ({first}): loading it runs whatever "
                "code the file names, so parity-ui will not load it unasked",
                "if you trust the file (you wrote it), pass --trust-pickle; or convert it to "
                "parity-ui's rollout format (docs/rollouts.md)",
            ) from None
        try:  # the user said yes: its classes are imported where they exist, read as records where not
            data = torch.load(p, map_location="cpu", weights_only=False, pickle_module=lenient_pickle())
        except Exception as e2:  # noqa: BLE001 - a damaged file, or a class whose own code fails
            raise DumpError(
                f"{p.name} could not be unpickled ({type(e2).__name__}: {str(e2)[:200]})",
                "convert the dump to parity-ui's rollout format (docs/rollouts.md)",
            ) from None
    except EOFError:
        raise DumpError(f"{p.name} ends early (a truncated pickle)", "copy the whole file again") from None
    samples = slime_dump.sample_field(data, "samples") if not isinstance(data, list) else data
    if not isinstance(samples, (list, tuple)):
        raise DumpError(
            f"{p.name} holds no list of samples",
            "a slime --save-debug-rollout-data file holds dict(rollout_id=..., samples=[...])",
        )
    return list(samples)


# -- preflight: the replay traps, before any engine loads --------------------------------------------


@dataclass
class Preflight:
    rows: int = 0
    tokens: int = 0
    masked: int = 0
    with_logprobs: int = 0
    with_trainer: int = 0
    with_routes: int = 0
    reconstructed: int = 0
    versions: Counter = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    text_rows: list[tuple[str, str]] = field(default_factory=list)  # (where, why) rows whose text does not round-trip
    skipped: list[str] = field(default_factory=list)  # rows that could not be read, skipped (on_bad="skip")

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


def _nonfinite_name(x: float) -> str:
    return "NaN" if math.isnan(x) else ("-inf" if x < 0 else "+inf")


def _first(rows: list[str], n: int = 3) -> str:
    more = f" and {len(rows) - n} more" if len(rows) > n else ""
    return ", ".join(rows[:n]) + more


def preflight(
    rows: Iterator[RolloutRow],
    *,
    vocab_size: int | None,
    eos_ids: list[int] | tuple[int, ...] = (),
    limit: int | None = None,
    on_row: Callable[[RolloutRow], None] | None = None,
) -> Preflight:
    """One streaming pass over the rows: the traps as findings (severity "error" refuses the replay),
    each naming the rows and the fix. `on_row` sees each row (the caller keeps what it needs)."""
    pf = Preflight()
    vocab_bad: list[str] = []
    mask_bad: list[str] = []
    lp_len_bad: list[str] = []
    shifted: list[str] = []
    positive: list[str] = []
    nonfinite: list[str] = []  # rows with NaN / inf recorded logprobs on kept tokens: which, where
    nonfinite_tokens = 0
    after_eos: list[str] = []
    t_not_1: Counter = Counter()
    processed: Counter = Counter()
    no_sampling = 0
    eos = set(eos_ids)
    for row in rows:
        if limit is not None and pf.rows >= limit:
            break
        pf.rows += 1
        n = len(row.response_ids)
        pf.tokens += n
        if vocab_size is not None:
            bad = [t for t in row.prompt_ids + row.response_ids if t < 0 or t >= vocab_size]
            if bad:
                vocab_bad.append(f"{row.where} (id {bad[0]})")
        if row.loss_mask is not None and len(row.loss_mask) != n:
            mask_bad.append(f"{row.where} ({len(row.loss_mask)} for {n} tokens)")
        pf.masked += sum(1 for m in row.mask()[:n] if not m)
        for name, col in (("rollout", row.rollout_logprobs), ("trainer", row.trainer_logprobs)):
            if col is None:
                continue
            if len(col) != n:
                (shifted if abs(len(col) - n) == 1 else lp_len_bad).append(
                    f"{row.where} ({name}: {len(col)} logprobs for {n} tokens)"
                )
            elif any(x > LOGPROB_SLACK for x in col if not math.isnan(x)):
                positive.append(f"{row.where} ({name})")
            else:
                mask = row.mask()
                nonfinite_at = [
                    (i, x) for i, x in enumerate(col) if not math.isfinite(x) and (i >= len(mask) or mask[i])
                ]
                if nonfinite_at:
                    nonfinite_tokens += len(nonfinite_at)
                    shown = ", ".join(f"token {i} {_nonfinite_name(x)}" for i, x in nonfinite_at[:3])
                    more = f" and {len(nonfinite_at) - 3} more" if len(nonfinite_at) > 3 else ""
                    nonfinite.append(f"{row.where} ({name}: {shown}{more})")
        pf.with_logprobs += row.rollout_logprobs is not None
        pf.with_trainer += row.trainer_logprobs is not None
        pf.with_routes += row.has_routed_experts
        pf.reconstructed += row.reconstructed
        if row.text_note:
            pf.text_rows.append((row.where, row.text_note))
        pf.versions[row.policy_version] += 1
        if eos and any(t in eos for t in row.response_ids[:-1]):
            k = next(j for j, t in enumerate(row.response_ids[:-1]) if t in eos)
            if any(row.mask()[k + 1 :]):
                after_eos.append(f"{row.where} (EOS at token {k} of {n})")
        s = row.sampling
        if s is None:
            no_sampling += row.rollout_logprobs is not None
        else:
            t = s.get("temperature", 1.0)
            if t is not None and abs(float(t) - 1.0) > 1e-9:
                t_not_1[float(t)] += 1
            mode = s.get("logprobs_mode") or "raw_logprobs"
            if mode not in LOGPROBS_MODES:
                pf.findings.append(
                    Finding(
                        "replay-logprobs-mode",
                        "error",
                        f"{row.where}: logprobs_mode {mode!r} is not one of vLLM's",
                        f"use one of {', '.join(LOGPROBS_MODES)}",
                    )
                )
            elif mode != "raw_logprobs":
                processed[mode] += 1
        if on_row is not None:
            on_row(row)
    add = pf.findings.append
    if pf.rows == 0:
        add(Finding("replay-empty", "error", "the dump holds no row to replay", "check the file and --format"))
    if vocab_bad:
        add(
            Finding(
                "replay-vocab",
                "error",
                f"{len(vocab_bad)} rows hold token ids outside the model's vocabulary of "
                f"{vocab_size}: {_first(vocab_bad)}; the dump was written for another model or tokenizer",
                "replay it with the model (--model) the run trained",
            )
        )
    if mask_bad:
        add(
            Finding(
                "replay-mask-length",
                "error",
                f"{len(mask_bad)} rows have a loss mask whose length is not the response's: {_first(mask_bad)}",
                "write one loss_mask entry per response token (not per prompt+response token)",
            )
        )
    if shifted:
        add(
            Finding(
                "replay-shift",
                "error",
                f"{len(shifted)} rows have one logprob more or fewer than response "
                f"tokens: {_first(shifted)}. A logprob belongs to the token it scores (the logprob of response "
                "token i given the tokens before it), not to the position that predicts the next one",
                "write one logprob per response token, aligned to the token it scores",
            )
        )
    if lp_len_bad:
        add(
            Finding(
                "replay-logprob-length",
                "error",
                f"{len(lp_len_bad)} rows have logprobs whose length is not the response's: {_first(lp_len_bad)}",
                "write one logprob per response token",
            )
        )
    if positive:
        add(
            Finding(
                "replay-not-logprobs",
                "error",
                f"{len(positive)} rows have 'logprobs' above 0: "
                f"{_first(positive)}; these are not log-probabilities (logits? probabilities?)",
                "record log-probabilities (vLLM logprobs_mode raw_logprobs)",
            )
        )
    if nonfinite:
        add(
            Finding(
                "replay-nonfinite",
                "warning",
                f"{nonfinite_tokens} recorded logprobs of kept tokens are NaN or infinite, in {len(nonfinite)} "
                f"rows: {_first(nonfinite)}; those tokens are left out of every figure (a row counts only its "
                "finite tokens)",
                "record finite logprobs: a NaN is a failed computation, -inf a token the rollout engine's "
                "sampler had masked (check its top-k/top-p/min-p and logprobs_mode); or mask those tokens",
            )
        )
    if after_eos:
        add(
            Finding(
                "replay-after-eos",
                "warning",
                f"{len(after_eos)} rows have tokens after an EOS that the loss "
                f"mask keeps: {_first(after_eos)}; a run that stops at EOS never sampled them (padding?)",
                "mask the tokens after EOS (loss_mask 0), or cut the response at its EOS",
            )
        )
    named = [v for v in pf.versions if v is not None]
    if len(named) > 1:
        counts = ", ".join(f"{v}: {c}" for v, c in pf.versions.most_common(5) if v is not None)
        add(
            Finding(
                "replay-versions",
                "warning",
                f"the rows come from {len(named)} policy versions ({counts}); "
                "the replay scores every row with one checkpoint, so rows of other versions differ by "
                "training, not by numerics",
                "replay one version's rows at a time (--policy-version V)",
            )
        )
    if t_not_1:
        ts = ", ".join(f"T={t:g}: {c} rows" for t, c in t_not_1.items())
        add(
            Finding(
                "replay-temperature",
                "warning",
                f"the rollout logprobs were recorded at a temperature other than "
                f"1 ({ts}); the replayed sides score the raw distribution (T=1), so the recorded ones differ "
                "by the temperature, not by numerics",
                "record raw logprobs at T=1 (vLLM logprobs_mode "
                "raw_logprobs), or compare the trainer and the engine re-run only",
            )
        )
    if processed:
        ms = ", ".join(f"{m}: {c} rows" for m, c in processed.items())
        add(
            Finding(
                "replay-processed",
                "warning",
                f"the rollout logprobs are processed ({ms}: after temperature and "
                "top-k/top-p, renormalised over the kept tokens), the replayed sides' are raw: the ratio then "
                "carries log(kept mass)",
                "record with logprobs_mode raw_logprobs",
            )
        )
    if no_sampling and pf.rows:
        add(
            Finding(
                "replay-sampling-unknown",
                "info",
                f"{no_sampling} rows do not record their sampling settings; "
                "the recorded logprobs are taken to be raw at T=1",
                "write sampling.temperature and sampling.logprobs_mode (docs/rollouts.md)",
            )
        )
    if pf.rows and pf.with_logprobs < pf.rows:
        add(
            Finding(
                "replay-no-logprobs",
                "info",
                f"{pf.rows - pf.with_logprobs} of {pf.rows} rows have no recorded "
                "rollout logprobs: the recorded side is absent for them; the trainer and the engine re-run "
                "are still compared",
                "record the rollout engine's logprobs to compare against them",
            )
        )
    if pf.text_rows:
        add(
            Finding(
                "replay-text-roundtrip",
                "warning",
                f"{len(pf.text_rows)} text-only rows do not survive decode "
                f"-> encode: " + "; ".join(f"{w}: {why}" for w, why in pf.text_rows[:3]),
                "dump token ids (parity-ui's rollout format) instead of text",
            )
        )
    if pf.reconstructed:
        add(
            Finding(
                "replay-reconstructed",
                "info",
                f"the ids of {pf.reconstructed} rows were reconstructed from "
                "text with the model's tokenizer, not read from the run",
                "",
            )
        )
    return pf
