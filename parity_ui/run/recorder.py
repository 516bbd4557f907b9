"""A run's record in the store while it is made: written as it happens, in parts that do not grow
with the run.

The run is written when it starts (status "running": a killed process leaves a trace), again when
its prompts are prepared, while a side streams (every FLUSH_S: the run's row and the rows of the
prompts that got tokens since the last flush, nothing else), as each side's results and each
prompt's comparisons are made, and when it ends, also when it fails. A flush therefore costs the
same at 10 prompts and at 10,000 (bench/flush.py measures it).

Every token a side streams is decoded once, here, with the run's ONE tokenizer; the final results
reuse those steps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlite_utils import Database

from ..core.errors import CancelledError, ParityError
from ..core.pooled import PairSample
from ..core.runlog import EventCallback, RunEvent, finish, record_failure, this_owner
from ..core.types import EngineInfo, PromptResult, Run, SideInfo, SideResult, StepColumns, TokenStep
from ..inputs.prompts import PromptTokenizer
from ..store.runs import (
    forget_run,
    save_comparisons,
    save_images,
    save_prompt_rows,
    save_run_row,
    save_side_result,
)
from ..store.workloads import save_chunk
from .plan import Prepared, SidePlan

FLUSH_S = 3.0  # store the tokens streamed so far at most this often while generating


class RunRecorder:
    """Writes one run. Thread-safe: a side's tokens arrive on its pipeline's thread."""

    def __init__(self, db: Database, run: Run):
        self.db, self.run = db, run
        self._write = threading.Lock()
        self._t0 = time.perf_counter()
        self._last_flush = time.monotonic()
        self._dirty: set[tuple[str, int]] = set()  # (side, prompt index) streamed since the last flush
        self._partial: dict[str, dict[int, list[TokenStep]]] = {}  # side -> prompt index -> steps so far
        self._earlier_ms = 0  # a resumed run's time before this process took it up

    # -- the run's parts ------------------------------------------------------------------------------

    def begin(self, prompts: list[Any] | None = None) -> None:
        """Store the run as it starts, with its prompts as given (and their images)."""
        with self._write, self.db.atomic():
            save_run_row(self.db, self.run)
            save_prompt_rows(self.db, self.run)
            if prompts:
                save_images(self.db, self.run.id, prompts)

    def resume(self) -> None:
        """Take up a stored run again: running, owned by this process, its error cleared."""
        self.run.status, self.run.error, self.run.error_code = "running", None, None
        self.run.owner = this_owner()
        self._earlier_ms = self.run.duration_ms or 0
        self.save_header()

    def keep_chunk(
        self, results: list[SideResult], prompts: list[PromptResult], samples: dict[str, list[PairSample]]
    ) -> None:
        """A workload chunk's rows (its results, its prompts' comparisons, its pair samples), in one
        transaction that none of the recorder's own writes interleaves."""
        with self._write, self.db.atomic():
            save_chunk(self.db, self.run.id, results, prompts, samples)

    def save_header(self) -> None:
        """The run's own row: status, figures, sides, warnings, timings."""
        with self._write:
            save_run_row(self.db, self.run)

    def prepared(self, prep: Prepared) -> None:
        """The run as prepared: its model, warnings, sides (as asked) and each prompt's ids."""
        run = self.run
        run.model = prep.model
        run.warnings = prep.warnings
        run.sides = [side_info(p, reference=i == 0) for i, p in enumerate(prep.sides)]
        for j, (i, enc) in enumerate(zip(prep.kept, prep.prompts)):
            pr = run.prompts[i]
            pr.prompt_text, pr.prompt_token_ids = enc.text, enc.token_ids
            if prep.config.chat and pr.messages is None and enc.spec.text is not None and not enc.images:
                pr.messages = [{"role": "user", "content": enc.spec.text}]  # what the template got
            for k, meta in enumerate(pr.images):  # each side's image token count for this image
                meta["tokens"] = {p.name: prep.prompts_of(p.name)[j].image_tokens[k] for p in prep.sides}
                meta["pixels"] = {p.name: prep.prompts_of(p.name)[j].pixels for p in prep.sides}
        with self._write, self.db.atomic():
            save_run_row(self.db, run)
            save_prompt_rows(self.db, run)

    def keep_prompts(self) -> None:
        """The run's row and its prompts' rows as they now stand (a run that fills its prompts' token
        ids itself, without a Prepared: a recorded-only replay)."""
        with self._write, self.db.atomic():
            save_run_row(self.db, self.run)
            save_prompt_rows(self.db, self.run)

    def loaded(self, side: str, engine: EngineInfo, load_s: float) -> None:
        """A side's engine as it loaded: versions, device, dtype and its resolved settings."""
        info = self.run.side(side)
        if info is not None:
            fill_side_info(info, engine, load_s)

    def keep(self, results: list[SideResult]) -> None:
        """Results made outside a stream (a probe's, a trial's): into the run and the store."""
        with self._write, self.db.atomic():
            for res in results:
                self.run.prompts[res.prompt_index].results[res.side] = res
                save_side_result(self.db, self.run.id, res)

    def compared(self, prompts: list[PromptResult]) -> None:
        """The prompts' comparisons (each side against the reference), in one transaction."""
        with self._write, self.db.atomic():
            for prompt in prompts:
                save_comparisons(self.db, self.run.id, prompt)

    # -- a side's stream --------------------------------------------------------------------------------

    def stream(self, side: str, tok: PromptTokenizer, emit: EventCallback) -> TokenStream:
        self._partial[side] = {}
        return TokenStream(self, side, tok, emit)

    def _streamed(self, side: str, i: int, step: TokenStep) -> None:
        self._partial[side].setdefault(i, []).append(step)
        with self._write:
            self._dirty.add((side, i))
        if time.monotonic() - self._last_flush > FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """The run's row and the partial rows streamed since the last flush, in one transaction."""
        with self._write, self.db.atomic():
            dirty, self._dirty = self._dirty, set()
            self._last_flush = time.monotonic()
            save_run_row(self.db, self.run)
            for side, i in sorted(dirty):
                save_side_result(self.db, self.run.id, self._partial_result(side, i, None))

    def _partial_result(self, side: str, i: int, error: ParityError | None) -> SideResult:
        steps = list(self._partial.get(side, {}).get(i, []))
        ids = [s.token_id for s in steps]
        reason = "cancelled" if isinstance(error, CancelledError) else ("error" if error else None)
        return SideResult(
            side=side,
            prompt_index=i,
            steps=steps,
            token_ids=ids,
            finish_reason=reason,
            error=str(error) if error else None,
        )

    def keep_partial(self, side: str, tok: PromptTokenizer, error: ParityError) -> None:
        """A side that failed mid-stream: what it made before the failure is often where the story is."""
        results = [self._partial_result(side, i, error) for i in range(len(self.run.prompts))]
        for r in results:
            r.text = tok.decode(r.token_ids)
        with self._write:
            self._dirty = {d for d in self._dirty if d[0] != side}
        self.keep(results)

    def finished_side(self, side: str, results: list[SideResult], tok: PromptTokenizer, load_s: float) -> None:
        """A side's final results: decoded (reusing the streamed steps), into the run and the store."""
        streamed = self._partial.pop(side, {})
        for res in results:
            res.side = side
            res.timings.load_s = load_s
            if isinstance(res.steps, StepColumns):  # as a worker sends them: texts from the tokenizer's cache
                decode_columns(tok, res.steps)
            else:
                seen = streamed.get(res.prompt_index, [])
                res.steps = [_decoded(tok, s, seen[i] if i < len(seen) else None) for i, s in enumerate(res.steps)]
            res.text = tok.decode(res.token_ids)
        with self._write:
            self._dirty = {d for d in self._dirty if d[0] != side}
            self._last_flush = time.monotonic()
        self.keep(results)

    # -- the end ----------------------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        record_failure(self.run, exc)

    def forget(self) -> None:
        """The run was refused before anything ran: its rows go (nothing stored)."""
        with self._write:
            forget_run(self.db, self.run.id)

    def finish(self) -> None:
        """Stamp the duration, release the run (owner none) and write its row."""
        finish(self.run, self._t0)
        self.run.duration_ms = (self.run.duration_ms or 0) + self._earlier_ms
        self.save_header()


class TokenStream:
    """One side's tokens as they stream: decoded once, shown live, flushed to the store."""

    def __init__(self, rec: RunRecorder, side: str, tok: PromptTokenizer, emit: EventCallback):
        self.rec, self.side, self.tok, self.emit = rec, side, tok, emit

    def __call__(self, i: int, step: TokenStep) -> None:
        decode_step(self.tok, step)
        self.emit(RunEvent("token", side=self.side, prompt_index=i, step=step))
        self.rec._streamed(self.side, i, step)


def side_info(p: SidePlan, reference: bool) -> SideInfo:
    return SideInfo(
        name=p.name,
        kind=p.kind.name,
        reference=reference,
        options=p.spec.all_options(),
        model_path=p.model.path,
        python=p.spec.python,
        dtype=p.dtype,
    )


def fill_side_info(info: SideInfo, engine: EngineInfo, load_s: float) -> None:
    info.version, info.device, info.dtype = engine.version, engine.device, engine.dtype
    info.versions = dict(engine.versions)
    info.resolved = dict(engine.resolved)
    info.load_s = round(load_s, 3)


def decode_step(tok: PromptTokenizer, step: TokenStep) -> None:
    """Fill texts (and bytes where the text cannot show them) with the ONE tokenizer."""
    step.text = tok.token_text(step.token_id)
    step.raw = tok.token_raw(step.token_id)
    step.top = [type(t)(t.token_id, t.logprob, tok.token_text(t.token_id), tok.token_raw(t.token_id)) for t in step.top]


def _decoded(tok: PromptTokenizer, final: TokenStep, streamed: TokenStep | None) -> TokenStep:
    """A final step with its texts, decoding nothing twice: an engine that streams whole steps
    (vLLM) streamed this very step, decoded then; one that streams bare tokens first (HF: the
    logprobs come at the end) had its token decoded then, and only the top-k is left."""
    if streamed is None or streamed.token_id != final.token_id:
        decode_step(tok, final)
        return final
    if streamed.logprob == final.logprob and [t.token_id for t in streamed.top] == [t.token_id for t in final.top]:
        return streamed
    final.text, final.raw = streamed.text, streamed.raw
    final.top = [
        type(t)(t.token_id, t.logprob, tok.token_text(t.token_id), tok.token_raw(t.token_id)) for t in final.top
    ]
    return final


def decode_columns(tok: PromptTokenizer, cols: StepColumns) -> None:
    """Fill a column store's texts (and the bytes where a text cannot show them) in place."""
    raw = tok.token_raw
    cols.text = tok.texts(cols.token_id)
    cols.top_text = tok.texts(cols.top_token_id)
    # token_raw is None unless the text shows U+FFFD: asked only there.
    cols.raw = {i: r for i, s in enumerate(cols.text) if "\ufffd" in s and (r := raw(cols.token_id[i]))}
    cols.top_raw = {i: r for i, s in enumerate(cols.top_text) if "\ufffd" in s and (r := raw(cols.top_token_id[i]))}
    cols._built = {}


def decode_result(tok: PromptTokenizer, res: SideResult) -> None:
    res.text = tok.decode(res.token_ids)
    if isinstance(res.steps, StepColumns):
        decode_columns(tok, res.steps)
        return
    for s in res.steps:
        decode_step(tok, s)
