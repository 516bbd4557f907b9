"""ParityService: the one door to the engines and the run database. The CLI and the app call only
this.

It owns the warm side workers (parity_ui.run.workers.EnginePool) and the database, and hands out two
contexts every command is built from:

- `recording(...)`: a new run, stored when it starts, flushed as it is made and stored when it
  ends, whatever ends it (parity_ui.run.recorder). A bad config, a missing model or a crashed engine
  inside it becomes a run with status "error", its message, and whatever was produced before.
- `sides(plans)`: the side setups started, checked and loaded, answering typed verbs
  (parity_ui.run.pipeline.Sides). Nothing outlives the block but warm workers.

A comparison (`run`, parity_ui.commands.compare), a probe, a sweep point and a layer localisation are
each a few lines over those two. One command at a time: the service's lock.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .core.requests import InputCheck
from .run.hardware import on_gpu
from .core.mapping import mapping_table, resolve
from .inputs.models import describe_model
from .run.pipeline import CapabilityError, Loaded, Sides
from .run.plan import Prepared, RunRequest, SidePlan
from .run.prepare import likely_workers, prepare
from .inputs.prompts import PromptSpec, tokenizer_for
from .run.recorder import RunRecorder
from .core.runlog import EventCallback, RunEvent, new_run
from .store.runs import new_run_id, open_db, save_localisation
from .core.types import Finding, Localisation, ModelInfo, Run
from .run.workers import EnginePool

__all__ = ["ParityService", "RunRequest", "RunEvent", "CapabilityError", "attach_images"]


class ParityService:
    """Owns the warm side workers and the run database. One command at a time (a lock)."""

    def __init__(self, db_path: str | None = None, pool: EnginePool | None = None):
        self.db_path = db_path
        self.db = open_db(db_path)
        self.pool = pool or EnginePool()
        self._lock = threading.RLock()  # a command's sides() runs inside its own recording()
        self._gpu: bool | None = None

    @property
    def on_gpu(self) -> bool:
        if self._gpu is None:
            self._gpu = on_gpu()
        return self._gpu

    # -- preparation (no engine involved) ---------------------------------------------------

    def describe(self, model: str, trust_remote_code: bool = False) -> ModelInfo:
        return describe_model(model, trust_remote_code=trust_remote_code)

    def prepare(self, req: RunRequest) -> Prepared:
        return prepare(req, self.on_gpu)

    def mapping(self, model: str, cfg: Any, trust_remote_code: bool = False) -> list[Any]:
        info = describe_model(model, trust_remote_code=trust_remote_code)
        tok = tokenizer_for(info.path, trust_remote_code)
        return mapping_table(cfg, resolve(info, tok.eos_token_ids, self.on_gpu))

    def head_start(self, req: RunRequest) -> None:
        """Start the workers a run will most likely need before preparing it: their engines'
        imports (torch, vLLM: the longest part of a cold start) then run while this process loads
        the tokenizer. `sides()` takes them; a wrong guess is dropped."""
        for side, engine, python, env in likely_workers(req, self.on_gpu):
            self.pool.prestart(side, engine, python, env)

    # -- the two contexts every command is built from ------------------------------------------

    @contextmanager
    def recording(self, model: str, config: dict[str, Any], prompts: list[PromptSpec], *, kind: str = "compare",
                  group_id: str | None = None, resume: Run | None = None) -> Iterator[RunRecorder]:
        """A new run, stored as it starts (or `resume`, a stored run taken up again by this process).
        An Exception raised in the block becomes the run's status ("error", or "cancelled" on Stop)
        with its message, is stored, and does NOT propagate: read `rec.run.status`. Ctrl-C is stored
        as "interrupted", then raised. A Stop pressed before the block began is not for it."""
        with self._lock:
            self.pool.reset_cancel()
            if resume is not None:
                rec = RunRecorder(self.db, resume)
                rec.resume()
            else:
                rec = RunRecorder(self.db, new_run(new_run_id(), model, config, prompts, kind=kind, group_id=group_id))
                attach_images(rec.run, prompts)
                rec.begin(prompts)
            try:
                yield rec
            except BaseException as e:  # noqa: BLE001 - stored, then re-raised only for Ctrl-C
                self.pool.drop_spares()  # workers started ahead for a run that failed before taking them
                rec.fail(e)
                if not isinstance(e, Exception):
                    rec.finish()
                    raise
            rec.finish()

    @contextmanager
    def sides(self, plans: list[SidePlan], *, gpu: bool | None = None, gated: bool = True,
              emit: EventCallback | None = None, inputs: Callable[[], InputCheck] | None = None,
              then: Callable[[Sides, SidePlan], None] | None = None,
              on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
              findings: list[Finding] | None = None, timings: dict[str, float] | None = None) -> Iterator[Sides]:
        """Start, check and load every side of `plans` (parity_ui.run.pipeline: `gated` or not, `then`
        run for each side once it may generate), then yield them for typed verbs. `findings` and
        `timings` (a run's) receive the engines' warnings and the phases, also when starting fails.
        Raises CapabilityError, CancelledError, EngineError."""
        with self._lock:
            sides = Sides(self.pool, plans, gpu=self.on_gpu if gpu is None else gpu, gated=gated, emit=emit,
                          inputs=inputs, then=then, on_loaded=on_loaded, findings=findings, timings=timings)
            try:
                sides.start()
                yield sides
            except BaseException:
                self.pool.drop_spares()
                raise

    # -- commands -------------------------------------------------------------------------------

    def run(self, req: RunRequest, on_event: EventCallback | None = None) -> Run:
        """Run every side, compare, store. Always returns the stored Run; never raises for a user
        or engine error (the run's status is then "error" with the message)."""
        from .commands.compare import compare_sides

        emit = on_event or (lambda e: None)
        with self.recording(req.model, req.config.to_dict(), req.prompts, kind=req.kind,
                            group_id=req.group_id) as rec:
            compare_sides(self, rec, req, emit)
        emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status}"))
        return rec.run

    def record_failure(self, model: str, prompts: list[PromptSpec], config: dict[str, Any], error: Exception,
                       kind: str = "compare", group_id: str | None = None) -> Run:
        """Store a run that failed before it could be prepared (a bad config or prompt file)."""
        with self.recording(model, config, prompts, kind=kind, group_id=group_id) as rec:
            raise error
        return rec.run

    def localise(self, run: Run, prompt_index: int = 0, position: int | None = None,
                 pair: tuple[str, str] | str | None = None, emit: EventCallback | None = None) -> Localisation:
        """Where inside the model two sides of a stored run part (parity_ui.commands.layers), stored with the
        run, also when it cannot run (the stored localisation then says why and how to fix it)."""
        from .core.errors import ParityError
        from .commands.layers import failed, localise

        with self._lock:
            self.pool.reset_cancel()
            try:
                loc = localise(self, run, prompt_index, position, pair, emit)
            except ParityError as e:
                loc = failed(run, prompt_index, position, pair, e)
            return save_localisation(self.db, loc)

    def bisect(self, run_id: str, sides: tuple[str, str] | None = None, *, prompts: int = 8,
               max_trials: int | None = None, emit: EventCallback | None = None) -> Run:
        """Which setting is it (parity_ui.commands.setting_bisect): the smallest set of the two sides' differing settings
        whose flipping restores parity. Returns the stored bisect (kind "bisect", `run.bisect` its
        record; status ok / diverged / error / cancelled). Raises ParityError only for an unknown run id."""
        from .commands.setting_bisect import BisectRequest, bisect_run

        return bisect_run(self, BisectRequest(run_id, sides, prompts, max_trials), emit)

    def cancel(self) -> None:
        self.pool.cancel()

    def close(self) -> None:
        self.pool.close()


def attach_images(run: Run, prompts: list[PromptSpec]) -> None:
    """Record each prompt's images (name, hash, size) with the run; the bytes are stored apart."""
    for pr, spec in zip(run.prompts, prompts):
        pr.images = [img.meta() for img in getattr(spec, "images", None) or []]
        if spec.images and not pr.prompt_text and spec.text:
            pr.prompt_text = spec.text
