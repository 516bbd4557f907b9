"""run_parity: prepare, generate on both engines, compare, store. The CLI and the app call only this.

Every run is stored, including one that fails: a bad config, a missing model or a crashed engine
becomes a run with status "error", its message, and whatever was produced before the failure.
"""
from __future__ import annotations

import platform
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from . import __version__
from .compare import compare_streams
from .crossscore import cross_score_run
from .explain import explain_prompt
from .preflight import run_preflight
from .config import ParityConfig
from .engines.base import GenerateRequest, LoadRequest, ScoreRequest
from .errors import CancelledError, ParityError, PromptError
from .mapping import HfArgs, Resolved, VllmArgs, mapping_table, resolve, to_hf, to_vllm
from .models import describe_model
from .prompts import EncodedPrompt, PromptSpec, PromptTokenizer, tokenizer_for
from .store import new_run_id, open_db, save_run
from .types import EngineResult, Finding, ModelInfo, PromptResult, Run, TokenStep
from .workers import EnginePool, load_key


@dataclass
class RunRequest:
    model: str
    prompts: list[PromptSpec]
    config: ParityConfig
    trust_remote_code: bool = False
    group_id: str | None = None
    kind: str = "compare"


@dataclass
class RunEvent:
    """Progress for a live view: status lines, and each token as an engine makes it."""

    kind: str  # "status" | "token" | "engine_done"
    message: str = ""
    engine: str | None = None
    prompt_index: int | None = None
    step: TokenStep | None = None


EventCallback = Callable[[RunEvent], None]


@dataclass
class Prepared:
    model: ModelInfo
    tokenizer: PromptTokenizer
    prompts: list[EncodedPrompt]
    resolved: Resolved
    vllm: VllmArgs
    hf: HfArgs
    max_context: int | None
    warnings: list[Finding] = field(default_factory=list)


def _on_gpu() -> bool:
    """An NVIDIA GPU is present, checked without importing torch or initialising CUDA here."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def max_context(cfg: ParityConfig, model: ModelInfo) -> int | None:
    """The context both engines can serve: max_model_len, else the model's, scaled by RoPE."""
    if cfg.max_model_len is not None:
        return cfg.max_model_len
    if model.max_position_embeddings is None:
        return None
    rope = cfg.rope_scaling or model.rope_scaling or {}
    factor = float(rope.get("factor", 1.0)) if rope.get("rope_type", rope.get("type")) in (
        "linear", "dynamic", "yarn") else 1.0
    return int(model.max_position_embeddings * factor)


def _utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class ParityService:
    """Owns the warm engine workers and the run database. One run at a time (a lock)."""

    def __init__(self, db_path: str | None = None, pool: EnginePool | None = None):
        self.db_path = db_path
        self.db = open_db(db_path)
        self.pool = pool or EnginePool()
        self._lock = threading.Lock()
        self._gpu: bool | None = None

    @property
    def on_gpu(self) -> bool:
        if self._gpu is None:
            self._gpu = _on_gpu()
        return self._gpu

    # -- preparation (no engine involved) ---------------------------------------------------

    def describe(self, model: str, trust_remote_code: bool = False) -> ModelInfo:
        return describe_model(model, trust_remote_code=trust_remote_code)

    def prepare(self, req: RunRequest) -> Prepared:
        """Resolve the model, tokenize every prompt once, check lengths, map the config.
        Raises ParityError (ModelError, PromptError, ConfigError) with a fix."""
        if not req.prompts:
            raise PromptError("no prompt was given", "type a prompt or upload a prompt file")
        model = describe_model(req.model, trust_remote_code=req.trust_remote_code)
        tok = tokenizer_for(model.path, req.trust_remote_code)
        cfg = req.config
        encoded = [tok.encode(p, cfg.chat) for p in req.prompts]
        limit = max_context(cfg, model)
        if limit is not None:
            for i, e in enumerate(encoded):
                need = len(e.token_ids) + cfg.max_new_tokens
                if need > limit:
                    raise PromptError(
                        f"prompt {i} has {len(e.token_ids)} tokens; with max_new_tokens={cfg.max_new_tokens} "
                        f"it needs {need} positions, over the context of {limit}",
                        "shorten the prompt, lower max_new_tokens, or extend the context with "
                        "max_model_len and rope_scaling (e.g. the 'long context 9k' preset)")
        resolved = resolve(cfg, model, tok.eos_token_ids, self.on_gpu)
        prepared = Prepared(model=model, tokenizer=tok, prompts=encoded, resolved=resolved,
                            vllm=to_vllm(cfg, resolved), hf=to_hf(cfg, resolved), max_context=limit)
        prepared.warnings = self._preflight(prepared, cfg)
        return prepared

    def _preflight(self, prepared: Prepared, cfg: ParityConfig) -> list[Finding]:
        return run_preflight(prepared, cfg)

    def mapping(self, model: str, cfg: ParityConfig, trust_remote_code: bool = False) -> list[Any]:
        info = describe_model(model, trust_remote_code=trust_remote_code)
        tok = tokenizer_for(info.path, trust_remote_code)
        return mapping_table(cfg, resolve(cfg, info, tok.eos_token_ids, self.on_gpu))

    # -- running ------------------------------------------------------------------------------

    def cancel(self) -> None:
        self.pool.cancel()

    def run(self, req: RunRequest, on_event: EventCallback | None = None) -> Run:
        """Run both engines, compare, store. Always returns the stored Run; never raises for a
        user or engine error (the run's status is then "error" with the message)."""
        emit = on_event or (lambda e: None)
        with self._lock:
            self.pool.reset_cancel()  # a Stop pressed before this run began is not for it
            return self._run_locked(req, emit)

    def _run_locked(self, req: RunRequest, emit: EventCallback) -> Run:
        t0 = time.perf_counter()
        run = Run(id=new_run_id(), created_utc=_utcnow(), model=ModelInfo(name=req.model, path=""),
                  config=req.config.to_dict(), status="error", group_id=req.group_id, kind=req.kind,
                  versions={"parity_ui": __version__, "python": platform.python_version()})
        run.prompts = [PromptResult(index=i, prompt_text=p.text or "", prompt_token_ids=[], messages=p.messages)
                       for i, p in enumerate(req.prompts)]
        try:
            emit(RunEvent("status", "preparing: model, tokenizer, config"))
            prep = self.prepare(req)
            run.model = prep.model
            run.warnings = prep.warnings
            for pr, enc in zip(run.prompts, prep.prompts):
                pr.prompt_text, pr.prompt_token_ids = enc.text, enc.token_ids
                if req.config.chat and pr.messages is None and enc.spec.text is not None:
                    pr.messages = [{"role": "user", "content": enc.spec.text}]  # what the template got
            self._generate(prep, req.config, run, emit)
            self._finish(prep, req.config, run)
            run.status = "ok" if run.identical else "diverged"
        except CancelledError as e:
            run.status, run.error, run.error_code = "cancelled", str(e), e.code
        except ParityError as e:
            run.status, run.error, run.error_code = "error", str(e), e.code
        except Exception as e:  # an internal bug: still stored and reported, never a dead app
            run.status, run.error, run.error_code = "error", f"internal error: {type(e).__name__}: {e}", "internal"
            traceback.print_exc(file=sys.stderr)
        run.duration_ms = int((time.perf_counter() - t0) * 1000)
        save_run(self.db, run)
        emit(RunEvent("status", f"stored run {run.id}: {run.status}"))
        return run

    def _load_both(self, prep: Prepared, emit: EventCallback) -> tuple[dict[str, float], dict[str, Any]]:
        """Load (or reuse) both workers concurrently: vLLM's start dominates, HF's hides under it."""
        specs = {
            "vllm": (load_key(prep.model.path, prep.vllm.llm, prep.vllm.env),
                     LoadRequest(prep.vllm, prep.model.path, prep.vllm.env)),
            "hf": (load_key(prep.model.path, prep.hf.load, prep.hf.config_overrides, prep.hf.device,
                            prep.hf.keep_model_generation_config),
                   LoadRequest(prep.hf, prep.model.path)),
        }
        emit(RunEvent("status", "loading models (warm workers are reused)"))
        with ThreadPoolExecutor(2) as ex:
            futs = {name: ex.submit(self.pool.workers[name].ensure_loaded, *spec) for name, spec in specs.items()}
            loaded = {name: f.result() for name, f in futs.items()}  # re-raises the first EngineError
        return {name: le.load_s for name, le in loaded.items()}, {name: le.info for name, le in loaded.items()}

    def _generate(self, prep: Prepared, cfg: ParityConfig, run: Run, emit: EventCallback) -> None:
        load_s, infos = self._load_both(prep, emit)
        if self.pool.cancelled:
            raise CancelledError("the run was stopped while the models were loading", "")
        run.engines = infos
        run.device = infos["vllm"].device
        run.versions.update({"vllm": infos["vllm"].version, "transformers": infos["hf"].version,
                             "torch": infos["hf"].torch_version})
        ids = [p.token_ids for p in prep.prompts]
        for name in ("vllm", "hf"):
            emit(RunEvent("status", f"{name}: generating {len(ids)} prompt(s)", engine=name))
            sampling = prep.vllm.sampling if name == "vllm" else prep.hf.generate
            greq = GenerateRequest(prompts=ids, sampling=sampling, batch_size=cfg.batch_size,
                                   logprobs=max(cfg.logprobs, 1))

            partial: dict[int, list[TokenStep]] = {}

            def on_token(payload: Any, name: str = name) -> None:
                i, step = payload
                step.text = prep.tokenizer.token_text(step.token_id)
                partial.setdefault(i, []).append(step)
                emit(RunEvent("token", engine=name, prompt_index=i, step=step))

            try:
                results: list[EngineResult] = self.pool.workers[name].request("generate", greq, on_token)
            except ParityError as e:
                # Keep what was streamed before the failure: it is often where the story is.
                for i, pr in enumerate(run.prompts):
                    steps = partial.get(i, [])
                    setattr(pr, name, EngineResult(
                        engine=name, prompt_index=i, steps=steps, token_ids=[s.token_id for s in steps],
                        text=prep.tokenizer.decode([s.token_id for s in steps]),
                        finish_reason="cancelled" if isinstance(e, CancelledError) else "error", error=str(e)))
                raise
            for res in results:
                res.timings.load_s = load_s[name]
                self._decode(prep.tokenizer, res)
                setattr(run.prompts[res.prompt_index], name, res)
            emit(RunEvent("engine_done", f"{name} done", engine=name))

    @staticmethod
    def _decode(tok: PromptTokenizer, res: EngineResult) -> None:
        res.text = tok.decode(res.token_ids)
        for s in res.steps:
            s.text = tok.token_text(s.token_id)
            for t in s.top:
                object.__setattr__(t, "text", tok.token_text(t.token_id))

    def _finish(self, prep: Prepared, cfg: ParityConfig, run: Run) -> None:
        for pr in run.prompts:
            if pr.vllm is not None and pr.hf is not None:
                pr.comparison = compare_streams(pr.vllm, pr.hf)
        if cfg.cross_score:
            cross_score_run(self.score, run, max(cfg.logprobs, 1))
        for pr in run.prompts:
            if pr.comparison is not None:
                pr.explanation = explain_prompt(pr, cfg)

    def record_failure(self, model: str, prompts: list[PromptSpec], config: dict[str, Any],
                       error: ParityError, kind: str = "compare") -> Run:
        """Store a run that failed before it could be prepared (a bad config or prompt file)."""
        run = Run(id=new_run_id(), created_utc=_utcnow(), model=ModelInfo(name=model, path=""),
                  config=config, status="error", error=str(error), error_code=error.code, kind=kind,
                  versions={"parity_ui": __version__, "python": platform.python_version()},
                  prompts=[PromptResult(index=i, prompt_text=p.text or "", prompt_token_ids=[], messages=p.messages)
                           for i, p in enumerate(prompts)])
        with self._lock:
            save_run(self.db, run)
        return run

    # -- raw generation for determinism probes (used by parity_ui.probes) ---------------------

    def generate_ids(self, prep: Prepared, engine: str, prompts: list[list[int]], batch_size: int,
                     emit: EventCallback | None = None) -> tuple[list[EngineResult], dict[str, Any]]:
        """Load (or reuse) both workers for `prep`, generate `prompts` on one engine in batches of
        `batch_size`; nothing is compared or stored. Returns the results and both EngineInfos.
        Raises EngineError."""
        with self._lock:
            _, infos = self._load_both(prep, emit or (lambda e: None))
            sampling = prep.vllm.sampling if engine == "vllm" else prep.hf.generate
            req = GenerateRequest(prompts=prompts, sampling=sampling, batch_size=batch_size, logprobs=1,
                                  stream=False)
            return self.pool.workers[engine].request("generate", req), infos

    # -- teacher forcing (used by parity_ui.crossscore) ---------------------------------------

    def score(self, engine: str, prompt: list[int], continuation: list[int], logprobs: int) -> list[TokenStep]:
        return self.pool.workers[engine].request("score", ScoreRequest(prompt, continuation, logprobs))

    def close(self) -> None:
        self.pool.close()
