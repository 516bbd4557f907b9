"""ParityService.run: prepare, start every side, generate, compare each side with the reference,
store. The CLI and the app call only this.

Every run is stored when it starts (status "running"), flushed with the tokens streamed so far
while it generates, and stored again when it ends, also when it fails: a bad config, a missing
model or a crashed engine becomes a run with status "error", its message, and whatever was
produced before the failure.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from typing import Any

from .compare import compare
from .crossscore import cross_score
from .engines.base import CaptureRequest, GenerateRequest, InputCheck, LoadRequest, Problem, ScoreRequest
from .errors import CancelledError, EngineError, ParityError
from .explain import explain
from .hardware import on_gpu
from .mapping import mapping_table, resolve
from .models import describe_model
from .prepare import Prepared, RunRequest, SidePlan, likely_workers, plan_side, prepare
from .prompts import PromptSpec, PromptTokenizer, tokenizer_for
from .runlog import EventCallback, RunEvent, finish, new_run, phase, record_failure
from .settings import differing
from .store import new_run_id, open_db, save_images, save_run
from .types import EngineInfo, Finding, ModelInfo, Run, SideInfo, SideResult, TokenStep
from .window_check import settle_sliding_window
from .workers import EnginePool, EngineWorker, Loaded

__all__ = ["ParityService", "RunRequest", "RunEvent"]

FLUSH_S = 3.0  # store the tokens streamed so far at most this often while generating


class CapabilityError(ParityError):
    """A side's engine cannot run this setup; found before the weights load."""

    code = "capability"


class ParityService:
    """Owns the warm side workers and the run database. One run at a time (a lock)."""

    def __init__(self, db_path: str | None = None, pool: EnginePool | None = None):
        self.db_path = db_path
        self.db = open_db(db_path)
        self.pool = pool or EnginePool()
        self._lock = threading.Lock()
        self._gpu: bool | None = None
        self._workers: dict[str, EngineWorker] = {}  # side name -> worker, for the prepared run

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

    # -- running ------------------------------------------------------------------------------

    def cancel(self) -> None:
        self.pool.cancel()

    def run(self, req: RunRequest, on_event: EventCallback | None = None) -> Run:
        """Run every side, compare, store. Always returns the stored Run; never raises for a user
        or engine error (the run's status is then "error" with the message)."""
        emit = on_event or (lambda e: None)
        with self._lock:
            self.pool.reset_cancel()  # a Stop pressed before this run began is not for it
            return self._run_locked(req, emit)

    def _run_locked(self, req: RunRequest, emit: EventCallback) -> Run:
        t0 = time.perf_counter()
        run = new_run(new_run_id(), req.model, req.config.to_dict(), req.prompts, kind=req.kind,
                      group_id=req.group_id)
        attach_images(run, req.prompts)
        save_run(self.db, run)  # recorded when it starts: a killed process leaves a trace
        save_images(self.db, run.id, req.prompts)
        try:
            emit(RunEvent("status", "preparing: model, tokenizer, config, sides"))
            with phase(run, "prepare"):
                self._head_start(req)
                prep = self.prepare(req)
            self._fill_prepared(run, prep)
            if generate_while_loading(prep):
                self._load_and_generate(prep, run, emit)
            else:
                self.start_sides(prep, run, emit)
                self._generate(prep, run, emit)
            self._finish(prep, run, emit)
            run.status = "ok" if run.identical else "diverged"
        except BaseException as e:  # noqa: BLE001 - stored, then re-raised only for Ctrl-C
            self.pool.drop_spares()  # workers started ahead for a run that failed before taking them
            record_failure(run, e)
            if not isinstance(e, Exception):
                self._store(run, t0)
                raise
        self._store(run, t0)
        emit(RunEvent("status", f"stored run {run.id}: {run.status}"))
        return run

    def _store(self, run: Run, t0: float) -> None:
        with phase(run, "store"):
            finish(run, t0)
            save_run(self.db, run)

    def _head_start(self, req: RunRequest) -> None:
        """Start the workers the run will most likely need before preparing it: their engines'
        imports (torch, vLLM: the longest part of a cold start) then run while this process loads
        the tokenizer. start_sides takes them; a wrong guess is dropped."""
        for side, engine, python, env in likely_workers(req, self.on_gpu):
            self.pool.prestart(side, engine, python, env)

    @staticmethod
    def _fill_prepared(run: Run, prep: Prepared) -> None:
        run.model = prep.model
        run.warnings = prep.warnings
        run.sides = [side_info(p, reference=i == 0) for i, p in enumerate(prep.sides)]
        for pr, enc in zip(run.prompts, prep.prompts):
            pr.prompt_text, pr.prompt_token_ids = enc.text, enc.token_ids
            if prep.config.chat and pr.messages is None and enc.spec.text is not None and not enc.images:
                pr.messages = [{"role": "user", "content": enc.spec.text}]  # what the template got
            for k, meta in enumerate(pr.images):  # each side's image token count for this image
                meta["tokens"] = {p.name: prep.prompts_of(p.name)[pr.index].image_tokens[k] for p in prep.sides}
                meta["pixels"] = {p.name: prep.prompts_of(p.name)[pr.index].pixels for p in prep.sides}

    # -- starting the sides ---------------------------------------------------------------------

    def start_sides(self, prep: Prepared, run: Run | None = None, emit: EventCallback | None = None) -> dict[str, Loaded]:
        """Start (or reuse) every side's worker, check what each engine can run BEFORE any weights
        load, then load. Raises CapabilityError naming every side that cannot run, EngineError."""
        emit = emit or (lambda e: None)
        unique = self._start_workers(prep, run, emit)
        loaded: dict[str, Loaded] = {}
        gpu_lock = threading.Lock()

        def load(p: SidePlan) -> None:
            loaded[p.load_key] = self._load(p, prep, emit, gpu_lock)

        with phase(run, "load") if run is not None else nullcontext(), ThreadPoolExecutor(max(len(unique), 1)) as ex:
            for f in [ex.submit(load, p) for p in unique]:
                f.result()  # re-raises the first EngineError
        by_side = {p.name: loaded[p.load_key] for p in prep.sides}
        self._check_inputs(prep, run)
        if run is not None:
            for info, p in zip(run.sides, prep.sides):
                fill_side_info(info, by_side[p.name].info, by_side[p.name].load_s)
        if self.pool.cancelled:
            raise CancelledError("the run was stopped while the sides were loading", "")
        return by_side

    def _start_workers(self, prep: Prepared, run: Run | None, emit: EventCallback) -> list[SidePlan]:
        """Start (or reuse) every side's worker and run the capability check on the cold ones.
        Returns one plan per distinct setup (sides with the same setup share one worker)."""
        timed = (lambda name: phase(run, name)) if run is not None else (lambda name: nullcontext())
        unique = self._assign_workers(prep)
        cold = [p for p in unique if self._workers[p.name].info is None]
        if cold:
            emit(RunEvent("status", "starting " + ", ".join(p.name for p in cold)))
        with timed("start"), ThreadPoolExecutor(max(len(cold), 1)) as ex:
            list(ex.map(lambda p: self._workers[p.name].ensure_started(), cold))
        with timed("check"), ThreadPoolExecutor(max(len(cold), 1)) as ex:
            checked = list(ex.map(lambda p: (p, self._check(p)), cold))
        self._raise_capability(checked, run)
        if cold:
            emit(RunEvent("status", "loading " + ", ".join(p.name for p in cold) + " (warm sides are reused)"))
        return unique

    def _assign_workers(self, prep: Prepared) -> list[SidePlan]:
        """Give every side its worker: a warm one, one started ahead, or a new one (not started).
        Returns one plan per distinct setup (sides with the same setup share one worker)."""
        keys = {p.name: p.load_key for p in prep.sides}
        self.pool.retain(set(keys.values()))  # free what this run does not need before loading
        self._workers = {p.name: self.pool.worker(keys[p.name], p.name, p.kind.engine, p.python, p.worker_env)
                         for p in prep.sides}
        self.pool.drop_spares()  # started ahead for a setup the run did not end up with
        return list({keys[p.name]: p for p in prep.sides}.values())

    def _load(self, p: SidePlan, prep: Prepared, emit: EventCallback, gpu_lock: threading.Lock) -> Loaded:
        """Load one setup's engine in its worker (a warm worker answers at once)."""
        w = self._workers[p.name]
        if w.info is not None:
            return Loaded(w.info, 0.0)
        # vLLM measures free GPU memory while it starts: two of them on one machine start one at a time.
        serial = gpu_lock if prep.resolved.on_gpu and p.kind.gpu_memory == "share" else nullcontext()
        with serial:
            t = time.perf_counter()
            w.info = w.request("load", self._load_request(p), timeout=w.load_timeout, what="loading the model",
                               on_progress=lambda m, name=p.name: emit(RunEvent("status", f"{name}: {m}", side=name)))
            took = time.perf_counter() - t
        emit(RunEvent("status", f"{p.name}: loaded in {took:.1f} s", side=p.name))
        return Loaded(w.info, took)

    def _load_and_generate(self, prep: Prepared, run: Run, emit: EventCallback) -> None:
        """Each setup goes its own way: its worker starts, its engine is checked, loads, and
        generates as soon as it has loaded, while slower setups still start or load (a GPU run: the
        HF reference is often done before vLLM has started). A side whose check fails stops the
        run as in the serial path, only without waiting for the other checks; a side loaded by
        then stays warm for the next run. Sides still generate one at a time, so no side's
        per-token timings include another side's generation; they may include another side's
        start, which the run's warnings say. Phases are wall-clock milestones over all sides:
        every worker started, every check done, every side loaded, then "generate" to the end."""
        unique = self._assign_workers(prep)
        gpu_lock, generating = threading.Lock(), threading.Lock()
        t0 = time.perf_counter()
        at: dict[str, list[float]] = {"start": [], "check": [], "load": []}
        early: list[str] = []  # sides that generated while another still loaded
        flush = [time.monotonic()]
        cold = [p.name for p in unique if self._workers[p.name].info is None]
        if cold:
            emit(RunEvent("status", "starting " + ", ".join(cold) + "; each generates once it has loaded"))

        def pipeline(p: SidePlan) -> None:
            w = self._workers[p.name]
            if w.info is None:
                w.ensure_started()
                at["start"].append(time.perf_counter())
                self._raise_capability([(p, self._check(p))], run)
                at["check"].append(time.perf_counter())
            if self.pool.cancelled:  # another side's check failed, or Stop: load nothing more
                raise CancelledError("the run was stopped while the sides were loading", "")
            got = self._load(p, prep, emit, gpu_lock)
            at["load"].append(time.perf_counter())
            mine = [s for s in prep.sides if s.load_key == p.load_key]
            for s in mine:
                fill_side_info(next(i for i in run.sides if i.name == s.name), got.info, got.load_s)
            self._check_inputs(prep, run, mine)
            for s in mine:
                with generating:
                    if self.pool.cancelled:
                        raise CancelledError("the run was stopped while the sides were loading", "")
                    if len(at["load"]) < len(unique):
                        early.append(s.name)
                    self._generate_side(prep, run, emit, s, flush)

        ours = []  # whether this run set the cancel flag (a failure), not the user's Stop

        def stop_the_others() -> None:
            if not self.pool.cancelled:
                ours.append(True)
                self.pool.cancel()  # generating sides stop at their next token, loading ones before loading
            for p in unique:  # a worker still importing its libraries would make the run wait for that
                if self._workers[p.name].starting:
                    self._workers[p.name].abandon()

        errors: list[BaseException] = []
        try:
            with ThreadPoolExecutor(len(unique)) as ex:
                futures = [ex.submit(pipeline, p) for p in unique]
                try:
                    for f in as_completed(futures):
                        if f.exception() is not None:
                            if not errors:
                                stop_the_others()  # rather than finish a run that failed
                            errors.append(f.exception())
                except BaseException:
                    stop_the_others()  # Ctrl-C: before the executor waits for the sides
                    raise
        finally:
            if ours:
                self.pool.reset_cancel()  # it stopped this run's other sides; the next request is not stopped
            marks = [t0]
            for name in ("start", "check", "load"):
                marks.append(max(at[name], default=marks[-1]))
                run.timings[name] = round(marks[-1] - marks[-2], 4)
            run.timings["generate"] = round(time.perf_counter() - marks[-1], 4)
        if errors:
            raise errors[0]  # the first failure; the others followed from stopping the run
        if early:
            late = [p.name for p in prep.sides if p.name not in early]
            run.warnings.append(Finding(
                code="generated-while-loading", severity="info",
                message=f"{' and '.join(early)} generated while {' and '.join(late)} was still loading: the first "
                        f"answer came sooner, and the per-token timings of {' and '.join(early)} were taken beside "
                        f"that start",
                fix="for per-token timings of each side alone, --set generate_while_loading=never"))

    def _check_inputs(self, prep: Prepared, run: Run | None, sides: list[SidePlan] | None = None) -> None:
        """Sides that tokenize on their own (servers) must see the run's ids and fit its length."""
        sides = prep.sides if sides is None else sides
        if not any(p.kind.tokenizes_itself for p in sides):
            return
        texts = [e.text for e in prep.prompts]
        req = InputCheck(texts=texts, text_ids=[prep.tokenizer.ids_of_text(t) for t in texts],
                         ids=[e.token_ids for e in prep.prompts], max_new_tokens=prep.config.max_new_tokens)
        checked = [(p, self._workers[p.name].request("check_input", req, timeout=600,
                                                     what="checking the prompts against the server"))
                   for p in sides if p.kind.tokenizes_itself]
        self._raise_capability(checked, run, "found before generating")

    @staticmethod
    def _load_request(p: SidePlan) -> LoadRequest:
        return LoadRequest(kind=p.kind.name, model_path=p.model.path, args=p.load_args())

    def _check(self, p: SidePlan) -> list[Problem]:
        return self._workers[p.name].request("check", self._load_request(p), timeout=300,
                                             what="checking what it can run")

    @staticmethod
    def _raise_capability(checked: list[tuple[SidePlan, list[Problem]]], run: Run | None,
                          when: str = "found before loading the model") -> None:
        errors = []
        for p, problems in checked:
            for pb in problems:
                if pb.severity == "error":
                    errors.append((p, pb))
                elif run is not None:
                    run.warnings.append(Finding(code=pb.code, severity="warning", side=p.name,
                                                message=f"side {p.name}: {pb.message}", fix=pb.fix))
        if errors:
            msg = "; ".join(f"side {p.name} ({p.kind.label}): {pb.message}" for p, pb in errors)
            fixes = "; ".join(dict.fromkeys(pb.fix for _, pb in errors))
            raise CapabilityError(f"{msg} ({when})", fixes)

    # -- generating ---------------------------------------------------------------------------

    def _generate(self, prep: Prepared, run: Run, emit: EventCallback) -> None:
        flush = [time.monotonic()]
        with phase(run, "generate"):
            for plan in prep.sides:
                self._generate_side(prep, run, emit, plan, flush)

    def _generate_side(self, prep: Prepared, run: Run, emit: EventCallback, plan: SidePlan,
                       last_flush: list[float]) -> None:
        """One side's generation of every prompt, streamed as events, flushed to the store every
        FLUSH_S (`last_flush`, shared by the run's sides), stored when done."""
        name = plan.name
        ids = [p.token_ids for p in prep.prompts_of(name)]
        emit(RunEvent("status", f"{name}: generating {len(ids)} prompt(s)", side=name))
        greq = GenerateRequest(prompts=ids, sampling=plan.args.sampling, batch_size=prep.config.batch_size,
                               logprobs=max(prep.config.logprobs, 1), **image_inputs(prep, name))
        partial: dict[int, list[TokenStep]] = {}

        def on_token(payload: Any) -> None:
            i, step = payload
            decode_step(prep.tokenizer, step)
            partial.setdefault(i, []).append(step)
            emit(RunEvent("token", side=name, prompt_index=i, step=step))
            if time.monotonic() - last_flush[0] > FLUSH_S:
                last_flush[0] = time.monotonic()
                self._keep_partial(prep, run, name, partial, None)
                save_run(self.db, run)

        try:
            results: list[SideResult] = self._workers[name].request("generate", greq, on_token)
        except ParityError as e:
            # Keep what was streamed before the failure: it is often where the story is.
            self._keep_partial(prep, run, name, partial, e)
            raise
        load_s = next(s.load_s for s in run.sides if s.name == name)
        for res in results:
            res.side = name
            res.timings.load_s = load_s
            decode_result(prep.tokenizer, res)
            run.prompts[res.prompt_index].results[name] = res
        save_run(self.db, run)  # a process killed from here on leaves this side's tokens
        last_flush[0] = time.monotonic()
        emit(RunEvent("side_done", f"{name} done", side=name))

    @staticmethod
    def _keep_partial(prep: Prepared, run: Run, name: str, partial: dict[int, list[TokenStep]],
                      error: ParityError | None) -> None:
        reason = "cancelled" if isinstance(error, CancelledError) else ("error" if error else None)
        for i, pr in enumerate(run.prompts):
            steps = list(partial.get(i, []))
            ids = [s.token_id for s in steps]
            pr.results[name] = SideResult(side=name, prompt_index=i, steps=steps, token_ids=ids,
                                          text=prep.tokenizer.decode(ids), finish_reason=reason,
                                          error=str(error) if error else None)

    # -- comparing -----------------------------------------------------------------------------

    def _finish(self, prep: Prepared, run: Run, emit: EventCallback) -> None:
        ref = prep.reference.name
        others = [p.name for p in prep.sides[1:]]
        with phase(run, "compare"):
            for pr in run.prompts:
                pr.comparisons = [compare(pr.results[ref], pr.results[b]) for b in others
                                  if ref in pr.results and b in pr.results]
        can_score = {p.name for p in prep.sides if p.kind.can_score}
        if prep.config.cross_score:
            emit(RunEvent("status", "cross-scoring: teacher-forced, each side against the reference"))
            with phase(run, "cross_score"):
                if any(pr.images for pr in run.prompts):  # teacher forcing does not carry images (yet)
                    run.warnings.append(Finding(
                        code="image-no-cross-score", severity="info",
                        message="cross-scoring (teacher forcing) was skipped for the image prompts: it does not "
                                "pass the images to the engines yet", fix="compare the streams; --set cross_score=false "
                                                                          "silences this"))
                for pr in run.prompts:
                    for c in pr.comparisons:
                        if pr.images:
                            continue
                        try:
                            c.cross_scores = cross_score(self.score, c, pr.prompt_token_ids, pr.results,
                                                         max(prep.config.logprobs, 1), can_score)
                        except Exception as e:  # noqa: BLE001 - the comparison already stands
                            c.cross_scores = {"error": f"{type(e).__name__}: {e}"}
        with phase(run, "explain"):
            for pr in run.prompts:
                for c in pr.comparisons:
                    c.explanation = explain(c, pr.results.get(c.a), pr.results.get(c.b), prep.config,
                                            differing(run.sides, c.a, c.b))
            settle_sliding_window(run)  # a guess made before loading, replaced by what the run measured

    def record_failure(self, model: str, prompts: list[PromptSpec], config: dict[str, Any], error: ParityError,
                       kind: str = "compare", group_id: str | None = None) -> Run:
        """Store a run that failed before it could be prepared (a bad config or prompt file)."""
        run = new_run(new_run_id(), model, config, prompts, kind=kind, group_id=group_id)
        record_failure(run, error)
        run.owner = None
        with self._lock:
            save_run(self.db, run)
        return run

    # -- raw generation for determinism probes (parity_ui.probes) --------------------------------

    def generate_ids(self, prep: Prepared, side: str, prompts: list[list[int]], batch_size: int,
                     emit: EventCallback | None = None) -> list[SideResult]:
        """Start (or reuse) the sides of `prep`, generate `prompts` on one side in batches of
        `batch_size`; nothing is compared or stored. Raises EngineError."""
        with self._lock:
            self.pool.reset_cancel()
            self.start_sides(prep, None, emit)
            plan = prep.side(side)
            req = GenerateRequest(prompts=prompts, sampling=plan.args.sampling, batch_size=batch_size, logprobs=1,
                                  stream=False)
            results = self._workers[side].request("generate", req)
            for r in results:
                r.side = side
            return results

    def loaded_info(self, side: str) -> EngineInfo | None:
        w = self._workers.get(side)
        return w.info if w is not None else None

    # -- teacher forcing and layer capture (parity_ui.crossscore, parity_ui.layers) ------------

    def score(self, side: str, prompt: list[int], continuation: list[int], logprobs: int) -> list[TokenStep]:
        return self._workers[side].request("score", ScoreRequest(prompt, continuation, logprobs))

    def capture_sides(self, prep: Prepared, requests: list[tuple[str, CaptureRequest]],
                      emit: EventCallback | None = None) -> list[dict[str, Any]]:
        """Start (or reuse) the sides of `prep` and run each capture request in order
        (parity_ui.layers). Raises EngineError."""
        emit = emit or (lambda e: None)
        with self._lock:
            self.pool.reset_cancel()
            self.start_sides(prep, None, emit)
            out = []
            for side, req in requests:
                emit(RunEvent("status", f"{side}: capturing {len(req.positions)} position(s) of every layer"
                                        + (" (noise-floor run)" if req.noise_eps else ""), side=side))
                out.append(self.capture(side, req))
            return out

    def capture(self, side: str, req: CaptureRequest) -> dict[str, Any]:
        worker = self._workers.get(side)
        if worker is None:
            raise EngineError(f"side {side} is not running", "start the sides first")
        return worker.request("capture", req, what="capturing layer activations")

    def close(self) -> None:
        self.pool.close()


# -- records -----------------------------------------------------------------------------------

def generate_while_loading(prep: Prepared) -> bool:
    """Whether a side that has loaded generates while others still load (config
    generate_while_loading): on a GPU by default, where the sides do not compete for the same cores."""
    choice = prep.config.generate_while_loading
    return len(prep.sides) > 1 and (choice == "always" or (choice == "gpu" and prep.resolved.on_gpu))


def image_inputs(prep: Prepared, side: str) -> dict[str, Any]:
    """A GenerateRequest's image fields for `side`: each prompt's images as plain bytes, the placeholder
    id and the side's resize settings (the same ones its expected ids were made with)."""
    if not prep.has_images:
        return {}
    prompts = prep.prompts_of(side)
    px = next((e.pixels for e in prompts if e.pixels), None)
    return {"images": [[{"name": i.name, "data": i.data, "sha256": i.sha256} for i in e.images] for e in prompts],
            "image_token_id": prep.image_token_id, "image_pixels": px}


def attach_images(run: Run, prompts: list[PromptSpec]) -> None:
    """Record each prompt's images (name, hash, size) with the run; the bytes are stored apart."""
    for pr, spec in zip(run.prompts, prompts):
        pr.images = [img.meta() for img in getattr(spec, "images", None) or []]
        if spec.images and not pr.prompt_text and spec.text:
            pr.prompt_text = spec.text


def side_info(p: SidePlan, reference: bool) -> SideInfo:
    return SideInfo(name=p.name, kind=p.kind.name, reference=reference, options=p.spec.all_options(),
                    model_path=p.model.path, python=p.spec.python, dtype=p.dtype)


def fill_side_info(info: SideInfo, engine: EngineInfo, load_s: float) -> None:
    info.version, info.device, info.dtype = engine.version, engine.device, engine.dtype
    info.versions = dict(engine.versions)
    info.resolved = dict(engine.resolved)
    info.load_s = round(load_s, 3)


def decode_step(tok: PromptTokenizer, step: TokenStep) -> None:
    """Fill texts (and bytes where the text cannot show them) with the ONE tokenizer."""
    step.text = tok.token_text(step.token_id)
    step.raw = tok.token_raw(step.token_id)
    step.top = [type(t)(t.token_id, t.logprob, tok.token_text(t.token_id), tok.token_raw(t.token_id))
                for t in step.top]


def decode_result(tok: PromptTokenizer, res: SideResult) -> None:
    res.text = tok.decode(res.token_ids)
    for s in res.steps:
        decode_step(tok, s)


__all__ += ["generate_while_loading", "image_inputs", "attach_images", "CapabilityError", "plan_side", "side_info", "fill_side_info", "decode_step", "decode_result"]
