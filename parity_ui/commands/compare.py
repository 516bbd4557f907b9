"""A comparison's steps inside its recording: prepare, bring up every side and let each generate
(parity_ui.run.pipeline decides when), then compare each side with the reference, cross-score and
explain. The measures (parity_ui.measures: routes, the full distribution, kept mass) are called at
their fixed points; none is named here. ParityService.run calls it; the recorder stores every step as
it is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import measures
from ..analysis.compare import compare
from ..analysis.crossscore import cross_score, cross_scores, directions, to_score
from ..analysis.explain import explain
from ..analysis.window_check import settle_sliding_window
from ..core.errors import ParityError
from ..core.findings import CrossScores
from ..core.requests import GenerateRequest, InputCheck, ScoreRequest
from ..core.runlog import EventCallback, RunEvent, phase
from ..core.settings import differing
from ..core.types import Comparison, Finding, Run, TokenStep
from ..measures import Active, PairSeen, Plan, ScoreAsk
from ..run.pipeline import Sides
from ..run.plan import Prepared, RunRequest, SidePlan
from ..run.recorder import RunRecorder
from ..run.sideset import SideSet

if TYPE_CHECKING:
    from .service_api import Service


def compare_sides(service: Service, rec: RunRecorder, req: RunRequest, emit: EventCallback) -> None:
    """Fill `rec.run` with every side's tokens, the comparisons and their explanations. Raises
    ParityError (stored by the recording around it)."""
    run = rec.run
    emit(RunEvent("status", "preparing: model, tokenizer, config, sides"))
    with phase(run, "prepare"):
        service.head_start(req)
        prep = service.prepare(req)
    rec.prepared(prep)
    active = measures.start(Plan(prep, "compare", run))  # their preflight's findings go with the run's

    def generate(sides: Sides, p: SidePlan) -> None:
        generate_side(sides, p, prep, rec, emit, active)

    with service.sides(
        prep.sides,
        gpu=prep.resolved.on_gpu,
        gated=not generate_while_loading(prep),
        emit=emit,
        inputs=lambda: input_check(prep),
        then=generate,
        on_loaded=lambda p, got: rec.loaded(p.name, got.info, got.load_s),
        findings=run.warnings,
        timings=run.timings,
    ) as sides:
        if sides.generated_early:
            early = sides.generated_early
            late = [p.name for p in prep.sides if p.name not in early]
            run.warnings.append(
                Finding(
                    code="generated-while-loading",
                    severity="info",
                    message=f"{' and '.join(early)} generated while {' and '.join(late)} was still loading: the first "
                    f"answer came sooner, and the per-token timings of {' and '.join(early)} were taken beside "
                    f"that start",
                    fix="for per-token timings of each side alone, --set generate_while_loading=never",
                )
            )
        try:
            finish_comparisons(prep, rec, sides, emit, active)
        finally:
            active.close()
    run.status = "ok" if run.identical else "diverged"


def generate_while_loading(prep: Prepared) -> bool:
    """Whether a side that has loaded generates while others still load (config
    generate_while_loading): on a GPU by default, where the sides do not compete for the same cores."""
    choice = prep.config.generate_while_loading
    return len(prep.sides) > 1 and (choice == "always" or (choice == "gpu" and prep.resolved.on_gpu))


def input_check(prep: Prepared) -> InputCheck:
    """What a side that tokenizes on its own (a server) must agree with before generating."""
    texts = [e.text for e in prep.prompts]
    return InputCheck(
        texts=texts,
        text_ids=[prep.tokenizer.ids_of_text(t) for t in texts],
        ids=[e.token_ids for e in prep.prompts],
        max_new_tokens=prep.config.max_new_tokens,
    )


def generate_side(
    sides: SideSet, p: SidePlan, prep: Prepared, rec: RunRecorder, emit: EventCallback, active: Active | None = None
) -> None:
    """One side's generation of every prompt, streamed as events and flushed to the store as it
    goes; its results stored when done, or what it made before a failure."""
    ids = [e.token_ids for e in prep.prompts_of(p.name)]
    emit(RunEvent("status", f"{p.name}: generating {len(ids)} prompt(s)", side=p.name))
    greq = GenerateRequest(
        prompts=ids,
        sampling=p.args.sampling,
        batch_size=p.spec.batch_size(prep.config.batch_size),
        logprobs=max(prep.config.logprobs, 1),
        **image_inputs(prep, p.name),
        **(active.generate_fields(p.name, range(len(ids))) if active is not None else {}),
    )
    try:
        results = sides.generate(p.name, greq, rec.stream(p.name, prep.tokenizer, emit))
    except ParityError as e:
        rec.keep_partial(p.name, prep.tokenizer, e)
        raise
    rec.finished_side(p.name, results, prep.tokenizer, sides.loaded[p.name].load_s)
    emit(RunEvent("side_done", f"{p.name} done", side=p.name))


def finish_comparisons(
    prep: Prepared, rec: RunRecorder, sides: SideSet, emit: EventCallback, active: Active | None = None
) -> None:
    """Each side against the reference on every prompt, each pair harvested by the measures, cross-scored
    and explained, stored."""
    run = rec.run
    active = active if active is not None else measures.Active({})
    ref, others = prep.reference.name, [p.name for p in prep.sides[1:]]
    with phase(run, "compare"):
        for pr in run.prompts:
            pr.comparisons = [
                compare(pr.results[ref], pr.results[b]) for b in others if ref in pr.results and b in pr.results
            ]
            for c in pr.comparisons:
                active.harvest(PairSeen(c.b, c, pr.results[c.a], pr.results[c.b], pr.index))
    changed = active.after_compare(sides, run, emit)  # the measures' own engine calls (routes), each timed
    if changed:
        rec.keep(changed)
    if prep.config.cross_score:
        emit(RunEvent("status", "cross-scoring: teacher-forced, each side against the reference"))
        with phase(run, "cross_score"):
            _cross_score(prep, run, sides, active)
    with phase(run, "explain"):
        for pr in run.prompts:
            for c in pr.comparisons:
                c.explanation = explain(
                    c, pr.results.get(c.a), pr.results.get(c.b), prep.config, differing(run.sides, c.a, c.b)
                )
        settle_sliding_window(run)  # a guess made before loading, replaced by what the run measured
    rec.compared(run.prompts)


def _cross_score(prep: Prepared, run: Run, sides: SideSet, active: Active) -> None:
    can_score = {p.name for p in prep.sides if p.kind.can_score}
    # Scorers that give a row the same bits in any grouping (HF) score all of their rows in one call,
    # packed into forwards by their engine; the others one row a call, as their batch could move them.
    batched = {p.name for p in prep.sides if p.kind.can_score and p.kind.scores_rows_alone}
    k = max(prep.config.logprobs, 1)
    now: dict[str, Any] = {}  # the comparison and prompt being cross-scored (what a measure asks of it)

    def score(side: str, prompt: list[int], continuation: list[int], logprobs: int) -> list[TokenStep]:
        c = now["c"]
        ask = ScoreAsk(scorer=side, of=c.b if side == c.a else c.a, j=now["i"], role="cross", c=c)
        steps = sides.score(side, ScoreRequest(prompt, continuation, logprobs, **active.score_fields(ask)))
        active.on_scored(ask, steps)
        return steps

    if any(pr.images for pr in run.prompts):  # teacher forcing does not carry images (yet)
        run.warnings.append(
            Finding(
                code="image-no-cross-score",
                severity="info",
                message="cross-scoring (teacher forcing) was skipped for the image prompts: it does not "
                "pass the images to the engines yet",
                fix="compare the streams; --set cross_score=false silences this",
            )
        )
    at = {
        i: j for j, i in enumerate(getattr(prep, "kept", None) or [])
    }  # a run prompt's place in the generate requests (its rows file)
    ahead = _batched_scores(run, sides, active, at, k, batched)
    for n, pr in enumerate(run.prompts):
        if pr.images:
            continue
        for c in pr.comparisons:
            now.update(c=c, i=at.get(n, n))
            try:
                mine = ahead.get(id(c))
                if isinstance(mine, Exception):
                    raise mine
                if mine is not None:  # scored in its scorer's one call: the other direction here
                    rest = {d for d in directions(c, pr.results, can_score) if d not in mine}
                    for gen, scorer in rest:
                        if to_score(pr.results.get(gen)):
                            mine[(gen, scorer)] = score(scorer, pr.prompt_token_ids, pr.results[gen].token_ids, k)
                    c.cross_scores = cross_scores(c, pr.results, can_score, mine)
                else:
                    c.cross_scores = cross_score(score, c, pr.prompt_token_ids, pr.results, k, can_score)
            except Exception as e:  # noqa: BLE001 - the comparison already stands
                c.cross_scores = CrossScores(error=f"{type(e).__name__}: {e}")


def _batched_scores(
    run: Run, sides: SideSet, active: Active, at: dict[int, int], k: int, batched: set[str]
) -> dict[int, Any]:
    """The directions whose scorer is in `batched`, every prompt's in one score_batch call per scorer:
    {id(comparison): {(generator, scorer): steps}}, or {id(comparison): the exception} where that
    scorer's call failed (each comparison then records it, as one call per row did). The active
    measures are asked and told of each row as `score` in _cross_score does for one row a call."""
    asks: dict[str, list[tuple[Comparison, str, ScoreAsk, ScoreRequest]]] = {}
    for n, pr in enumerate(run.prompts):
        if pr.images:
            continue
        for c in pr.comparisons:
            for gen, scorer in directions(c, pr.results, batched):
                res = pr.results.get(gen)
                if res is not None and to_score(res):
                    ask = ScoreAsk(scorer=scorer, of=gen, j=at.get(n, n), role="cross", c=c)
                    req = ScoreRequest(pr.prompt_token_ids, res.token_ids, k, **active.score_fields(ask))
                    asks.setdefault(scorer, []).append((c, gen, ask, req))
    out: dict[int, Any] = {}
    for scorer, items in asks.items():
        try:
            got = sides.score_batch(scorer, [req for _, _, _, req in items])
            if len(got) < len(items):
                raise RuntimeError(f"{scorer} scored {len(got)} of {len(items)} sequences (stopped)")
        except Exception as e:  # noqa: BLE001 - each comparison records it
            for c, _, _, _ in items:
                out[id(c)] = e
            continue
        for (c, gen, ask, _), steps in zip(items, got):
            if isinstance(out.get(id(c)), Exception):
                continue
            out.setdefault(id(c), {})[(gen, scorer)] = steps
            active.on_scored(ask, steps)
    return out


def image_inputs(prep: Prepared, side: str) -> dict[str, Any]:
    """A GenerateRequest's image fields for `side`: each prompt's images as plain bytes, the placeholder
    id and the side's resize settings (the same ones its expected ids were made with)."""
    if not prep.has_images:
        return {}
    prompts = prep.prompts_of(side)
    px = next((e.pixels for e in prompts if e.pixels), None)
    return {
        "images": [[{"name": i.name, "data": i.data, "sha256": i.sha256} for i in e.images] for e in prompts],
        "image_token_id": prep.image_token_id,
        "image_pixels": px,
    }
