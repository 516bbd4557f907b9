"""A fake engine kind for the unit tests of the code ABOVE the engines (the service, the pipeline, the
recorder, workloads, bisect, the gate): a deterministic arithmetic "model" in a real worker process,
so the service's flush, cancel, generate-while-loading, failure storage and recording paths run in
seconds. Tests register it (`registered()`); users never see it. Real-engine tests do not use it.

The "model": at each context the top-k next tokens and their logprobs are a fixed function of the
last four ids and the length. Options plant what a real engine would do: `shift` moves every logprob
(a numerical gap), `noise` varies it by position, `swap_at` makes the side pick its second choice at
one generated position (a divergence), `delay_ms` slows each token, `fail_at` crashes mid-stream,
`load_s`/`fail_load` slow or break the load, `refuse` fails the capability check; `flag`,
`ignored_flag` and `fail_with_flag` are settings for the bisect tests (reported, accepted but not
applied, incompatible with `flag`), and `registered_other()` adds a second kind with its own numerics.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity_ui.engines.base import (Engine, EngineFault, GenerateRequest, LoadRequest, Problem, ScoreRequest,
                                    append_step, make_step, result)
from parity_ui.core.kinds import SideOptions
from parity_ui.core.types import EngineInfo, SideResult, TokenStep
from parity_ui.core.validation import number_in, option

TESTS = str(Path(__file__).resolve().parent)
FIRST_ID = 8  # tiny_models.SPECIALS take ids 0-7: the fake never picks one (EOS only when asked)


@dataclass
class FakeOptions(SideOptions):
    shift: float = option(0.0, "added to every logprob (a numerical gap)", number_in(-10, 10))
    noise: float = option(0.0, "a gap that varies with the position, up to this many nats", number_in(0, 10))
    swap_at: int | None = option(None, "generated position where the side picks its second choice",
                                 number_in(0, 10**6, "an integer"))
    eos_at: int | None = option(None, "generated position where the side emits EOS", number_in(0, 10**6, "an integer"))
    delay_ms: float = option(0.0, "sleep after each token", number_in(0, 10**5))
    fail_at: int | None = option(None, "generated position where the engine crashes", number_in(0, 10**6, "an integer"))
    load_s: float = option(0.0, "how long the load takes", number_in(0, 3600))
    fail_load: bool = option(False, "the load raises")
    refuse: str | None = option(None, "the capability check refuses with this message")
    batch_noise: float = option(0.0, "a gap that appears only when prompts are batched (a batch-variant engine)",
                                number_in(0, 10))
    fail_after: int | None = option(None, "prompts this worker generates before it crashes", number_in(0, 10**6, "an integer"))
    flag: str | None = option(None, "a setting the engine reports resolved as it was given (bisect tests)")
    ignored_flag: str | None = option(None, "a setting the engine accepts but does not apply (a flag that does "
                                            "not take effect: bisect must report it)")
    fail_with_flag: bool = option(False, "the load fails when `flag` is set too (two settings that cannot go "
                                         "together: a bisect trial that fails)")
    route_flip_every: int | None = option(None, "MoE routes: every input position divisible by this routes layer 1 "
                                                "to another second expert, at a router near-tie (a route flip)",
                                          number_in(1, 10**6, "an integer"))
    replay_routes: str = option("off", "score again routing with the reference's recorded experts (ids, "
                                       "ids+weights): the fake's replayed logprobs drop its shift")
    draws: bool = option(False, "records each token's draw (kept set, its mass, the processed logprob), as a "
                                "shared-seed sampler does: the sampling family without a sampler")
    distribution: bool = option(False, "scoring puts the whole-distribution scalars (KL, TV, top-1/top-k) on "
                                       "each position, as a reference meeting full rows does")
    replay_noise: float = option(0.0, "every logprob moved by this much times the generate calls this worker made "
                                      "before (a GPU's run-to-run nondeterminism), unless deterministic",
                                 number_in(0, 10))
    deterministic: bool = option(False, "the kind's deterministic switch (Kind.can_deterministic): replay_noise off")


# The other fake kind's own numerics: every logprob moved by this much (an engine that differs by itself).
OTHER_ENGINE_SHIFT = 0.3


@dataclass
class OtherFakeOptions(FakeOptions):
    other_only: bool = option(False, "an option only the other fake kind has (bisect: part of the engine factor)")
    engine_shift: float = option(OTHER_ENGINE_SHIFT, "the other kind's own numerics (0: the fake's, so that only "
                                                     "its own options differ)", number_in(-10, 10))
    graphs_gap: float = option(0.0, "a gap only the other kind can make, like vLLM's CUDA graphs: a bisect against "
                                    "the fake flips it to 0", number_in(0, 10),
                               flip_to=0.0, flip_why="off, its plain path")


@dataclass
class FakeArgs:
    load: dict[str, Any]
    sampling: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    used: dict[str, Any] = field(default_factory=dict)


def to_fake(cfg: Any, side: Any, r: Any, model: Any) -> FakeArgs:
    o: FakeOptions = side.options
    load = {k: getattr(o, k) for k in ("shift", "noise", "swap_at", "eos_at", "delay_ms", "fail_at", "load_s",
                                        "fail_load", "refuse", "flag", "ignored_flag", "batch_noise", "fail_after",
                                        "fail_with_flag", "route_flip_every", "draws",
                                        "distribution", "replay_noise", "deterministic")}
    load["vocab_size"] = model.vocab_size or 1024
    load["dtype"] = o.dtype or cfg.dtype
    sampling = {"max_new_tokens": cfg.max_new_tokens, "ignore_eos": cfg.ignore_eos, "temperature": cfg.temperature,
                "eos_token_ids": list(r.eos_token_ids)}
    # The worker imports this module by name: the tests folder goes on its path.
    return FakeArgs(load=load, sampling=sampling, env={"PYTHONPATH": TESTS})


def fake_kind() -> Any:
    from parity_ui.core.kinds import Kind

    return Kind("fake", "fake engine (tests only)", FakeOptions, "fake_engine:FakeEngine", "", head_start=False,
                can_record_routes=True, can_replay_routes=True, can_deterministic=True)


class registered:
    """`with registered():` the fake kind exists (and is removed again after)."""

    def __enter__(self) -> None:
        from parity_ui.core.mapping import register_kind

        self._undo = register_kind(fake_kind(), to_fake)

    def __exit__(self, *exc: Any) -> None:
        self._undo()


class fake_service:
    """`with fake_service(db_path) as svc:` a ParityService over `db_path` with the fake kind registered
    (and `other`: the second fake kind too); closed, and the kinds removed, after."""

    def __init__(self, db_path: Any, other: bool = False):
        self.db_path, self.other = str(db_path), other

    def __enter__(self) -> Any:
        from parity_ui.service import ParityService  # not at import: engine workers import this module

        self._kinds = [registered()] + ([registered_other()] if self.other else [])
        for k in self._kinds:
            k.__enter__()
        self.service = ParityService(db_path=self.db_path)
        return self.service

    def __exit__(self, *exc: Any) -> None:
        self.service.close()
        for k in reversed(self._kinds):
            k.__exit__(*exc)


def to_other_fake(cfg: Any, side: Any, r: Any, model: Any) -> FakeArgs:
    args = to_fake(cfg, side, r, model)
    args.load["shift"] += side.options.engine_shift + side.options.graphs_gap
    args.load["other_only"] = side.options.other_only
    args.load["graphs_gap"] = side.options.graphs_gap
    return args


class registered_other:
    """`with registered_other():` a second fake kind, "fake-other": the same model with its own numerics
    (OTHER_ENGINE_SHIFT) and an option of its own, for what differs with the engine itself."""

    def __enter__(self) -> None:
        from parity_ui.core.kinds import Kind
        from parity_ui.core.mapping import register_kind

        self._undo = register_kind(Kind("fake-other", "another fake engine (tests only)", OtherFakeOptions,
                                        "fake_engine:FakeEngine", "", head_start=False, can_record_routes=True,
                                        can_replay_routes=True),
                                   to_other_fake)

    def __exit__(self, *exc: Any) -> None:
        self._undo()


def fake_model(folder: Path, vocab_size: int = 512, max_position_embeddings: int = 4096, moe: bool = False) -> Path:
    """A model folder with a real tokenizer and a config, but no weights: what prepare() reads (`moe`:
    the config names the fake's routes' shape, 8 experts, top-2, on both layers)."""
    from tiny_models import build_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder, vocab_size)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(tok),
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": max_position_embeddings, "torch_dtype": "float32",
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
        **({"num_experts": 8, "num_experts_per_tok": 2} if moe else {})}))
    return folder


class FakeEngine(Engine):
    kind = "fake"

    def check(self, req: LoadRequest) -> list[Problem]:
        refuse = req.args["load"]["refuse"]
        return [Problem("fake-refusal", refuse, "drop the fake side's refuse option")] if refuse else []

    def load(self, req: LoadRequest) -> EngineInfo:
        a = self.args = req.args["load"]
        time.sleep(a["load_s"])
        if a["fail_load"]:
            raise EngineFault("the fake engine was told to fail its load", "drop fail_load", fatal=True)
        if a.get("fail_with_flag") and a["flag"] is not None:
            raise EngineFault(f"the fake engine cannot load with flag={a['flag']} and fail_with_flag together",
                              "drop one of them", fatal=True)
        resolved = {k: a[k] for k in ("shift", "noise", "swap_at", "eos_at") if a[k]}
        if a["flag"] is not None:
            resolved["flag"] = a["flag"]
        if "graphs_gap" in a:  # the other kind reports its own option
            resolved["graphs_gap"] = a["graphs_gap"]
        if a.get("deterministic"):
            resolved["deterministic"] = "on"
        return EngineInfo(kind="fake", version="0", device="cpu (fake)", dtype=a["dtype"],
                          versions={"fake": "0", "pid": str(os.getpid())}, resolved=resolved)

    # -- the "model" ---------------------------------------------------------------------------------

    made = 0  # prompts this worker has generated (fail_after)
    calls = 0  # generate calls this worker has served (replay_noise)

    def _top(self, ctx: list[int], pos: int, k: int, batched: bool = False) -> list[tuple[int, float]]:
        a = self.args
        h = (len(ctx) * 7919 + sum((t + 1) * 31 ** j for j, t in enumerate(ctx[-4:]))) % 2**31
        span = a["vocab_size"] - FIRST_ID
        # 37 is prime: the k candidates are distinct for any vocabulary not a multiple of it.
        ids = [FIRST_ID + (h + 37 * r) % span for r in range(max(k, 2))]
        jitter = a["noise"] * (((h >> 3) % 13) - 6) / 6
        if batched:
            jitter -= a["batch_noise"] * ((h >> 5) % 5) / 4
        lps = [-(0.45 + 0.8 * i + 0.01 * (h % 7)) + a["shift"] + jitter for i in range(len(ids))]
        if a["swap_at"] is not None and pos == a["swap_at"]:
            ids[0], ids[1] = ids[1], ids[0]
        return list(zip(ids, lps))

    def generate(self, req: GenerateRequest, on_step: Any, should_stop: Any) -> list[SideResult]:
        a, s = self.args, req.sampling
        out = []
        drift = 0.0 if a.get("deterministic") else a.get("replay_noise", 0.0) * FakeEngine.calls
        FakeEngine.calls += 1
        for i, prompt in enumerate(req.prompts):
            if a["fail_after"] is not None and FakeEngine.made >= a["fail_after"]:
                raise RuntimeError(f"the fake engine crashed after {FakeEngine.made} prompts, as it was told to")
            FakeEngine.made += 1
            res = result(i, finish_reason="length")
            ctx, t0 = list(prompt), time.perf_counter()
            for pos in range(s["max_new_tokens"]):
                if should_stop():
                    res.finish_reason = "cancelled"
                    break
                if a["fail_at"] is not None and pos == a["fail_at"]:
                    raise RuntimeError(f"the fake engine crashed at token {pos}, as it was told to")
                top = self._top(ctx, pos, req.logprobs, batched=req.batch_size > 1)
                if drift:  # every logprob moved alike: the same tokens, other bits
                    top = [(t, x - drift) for t, x in top]
                token, lp = top[0]
                if a["eos_at"] is not None and pos == a["eos_at"] and s["eos_token_ids"]:
                    token, lp = s["eos_token_ids"][0], -0.01
                step = make_step(pos, token, lp, 1 if token == top[0][0] else None, top[:req.logprobs])
                if a.get("draws"):  # a fixed function of the context and the side's shift: pools are checkable
                    h = (len(ctx) * 7919 + token) % 97
                    step.kept, step.kept_mass = 2 + h % 5, 0.7 + 0.003 * h
                    step.processed_logprob = lp - math.log(step.kept_mass)
                    step.kept_hash = h % 11 if a["shift"] == 0 or h % 4 else -1  # a shifted side keeps another set now and then
                append_step(res, step, time.perf_counter() - t0)
                if req.stream:
                    on_step(i, step)
                ctx.append(token)
                if a["delay_ms"]:
                    time.sleep(a["delay_ms"] / 1000)
                if token in s["eos_token_ids"] and not s["ignore_eos"]:
                    res.finish_reason = "stop"
                    break
            res.timings.total_s = time.perf_counter() - t0
            out.append(res)
        return out

    # -- mixture-of-experts routes (2 MoE layers, 8 experts, top-2), a fixed function of the context --

    ROUTE_LAYERS, ROUTE_EXPERTS = [0, 1], 8

    def _route(self, ctx: list[int], pos: int, layer: int) -> tuple[list[int], float]:
        """Layer `layer`'s two experts at input position `pos` (ctx: the ids up to it) and its margin."""
        h = (len(ctx) * 7919 + sum((t + 1) * 31 ** j for j, t in enumerate(ctx[-4:]))) % 2**31
        e0 = (h >> (3 * layer)) % self.ROUTE_EXPERTS
        e1 = (e0 + 1 + (h >> 9) % (self.ROUTE_EXPERTS - 1)) % self.ROUTE_EXPERTS
        every = self.args.get("route_flip_every")
        if every and layer == 1 and pos % every == 0:
            e1 = next(e for e in ((e1 + d) % self.ROUTE_EXPERTS for d in range(1, 8)) if e != e0)
            return [e0, e1], 1e-4
        return [e0, e1], 0.05 + 0.01 * layer

    def routes(self, req: Any) -> Any:
        from parity_ui.core.routes import Routes

        ids, weights, margins = [], [], []
        for p in req.positions:
            for layer in self.ROUTE_LAYERS:
                experts, margin = self._route(req.ids[:p + 1], p, layer)
                ids += experts
                weights += [0.625, 0.375]
                margins.append(margin)
        return Routes(layers=list(self.ROUTE_LAYERS), top_k=2, num_experts=self.ROUTE_EXPERTS, ids=ids,
                      weights=weights, margins=margins, source="fake")

    def replay_routes(self, req: Any) -> list[SideResult]:
        """Scoring with recorded experts (req.score): the fake's logprobs without its own shift, as if
        routing had made the whole gap. Generating with them is not faked."""
        if not getattr(req, "score", None):
            raise EngineFault("the fake engine replays routes only when scoring", "use a scored workload")
        out = []
        for i, (item, routes) in enumerate(zip(req.score, req.routes)):
            if routes.top_k != 2 or list(routes.layers) != self.ROUTE_LAYERS:
                raise EngineFault("routes for another model", "replay routes recorded with the same model")
            shift, self.args["shift"] = self.args["shift"], 0.0
            try:
                steps = self.score(item)
            finally:
                self.args["shift"] = shift
            res = result(i, finish_reason="scored")
            res.token_ids, res.steps = list(item.continuation), steps
            out.append(res)
        return out

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        ctx, steps = list(req.prompt), []
        for pos, token in enumerate(req.continuation):
            top = self._top(ctx, pos, req.logprobs)
            ids = [t for t, _ in top]
            lp = dict(top).get(token, -12.0)
            steps.append(make_step(pos, token, lp, ids.index(token) + 1 if token in ids else len(ids) + 1,
                                   top[:req.logprobs]))
            if self.args.get("distribution"):  # the scalars a reference meeting the side's full rows computes
                h = (len(ctx) * 7919 + token) % 101
                s = steps[-1]
                s.kl, s.kl_rev, s.tv = 1e-4 * (1 + h), 1.1e-4 * (1 + h), 1e-3 * (1 + h % 17)
                s.top1, s.topk = int(h % 9 != 0), int(h % 23 != 0)
            ctx.append(token)
        return steps


class PreloadFailsEngine(FakeEngine):
    """An engine whose libraries cannot be imported ahead (tests/unit/test_fork_server.py): a worker
    started on its own says so in its log and answers; a fork server of it cannot start."""

    def preload(self) -> None:
        raise RuntimeError("this engine's libraries cannot be imported ahead")
