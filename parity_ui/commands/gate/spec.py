"""A gate spec: the YAML file `parity check SPEC` reads, and its validation.

```yaml
defaults:                        # optional: keys every case starts from (a case's own win)
  model: demo
  config: {max_new_tokens: 32}
cases:
  - name: fp32-vllm              # letters, digits, . _ -; unique
    model: ${GATE_MODEL:-demo}   # 'demo', a folder or an HF id; ${VAR} / ${VAR:-default} from the environment
    sides_preset: fp32-reference # or sides: [{name: ref, kind: hf, dtype: float32}, {name: b, kind: vllm}]
    prompts: {file: prompts.jsonl, field: prompt, limit: 16}   # or sample: N, seed: S; or texts: [...]
    config: {max_new_tokens: 64}  # canonical config keys (a side's options under its name)
    mode: free                    # free | scored
    floor: batch                  # auto | batch | order | kernel | none
    check_sides: [vllm]           # default: every side but the reference
    thresholds:
      share_identical: 0.5        # >=
      abs_dlogp_p99: 0.1          # <=
      within_floor: 2.0           # every figure within 2x the reference's own noise (or {figure: factor})
    baseline:                     # optional: no worse than a stored run
      run: last-pass              # or a run id
      slack: {abs_dlogp_p99: 20%, share_identical: 0.05}
    control:                      # a perturbation the thresholds MUST fail
      set: {vllm.dtype: float16}  # config keys, or:
      perturb: {layer: 0, scale: 0.1}   # the checked sides on a copy of the model, one layer's weights noised
  - name: zero                    # an invariance audit (parity audit): judged at zero, no thresholds
    model: demo
    sides: [{name: b, kind: vllm, enable_prefix_caching: true}]   # one side is enough
    audit: {axes: [replay, batch, prefix], batch: 8}               # or audit: true (every axis, built-in prompts)
  - name: weights-after-update   # a weight-sync case (parity weights, issue 41): no prompts, no thresholds
    model: ./step-200            # the checkpoint the engine must serve after the update
    weights: {from: ./step-100, sleep: 1, update_path: auto, probe_tokens: 256}   # or {url: http://...:8000/v1}
    control: {skip: 'layers[.]0[.]mlp[.]down_proj'}   # a tensor left out of the push: the case MUST fail
```
A weights case passes when every tensor equals the fresh load and the probe is at the floor.

`load_spec(path)` reads and checks the structure (keys, types, metrics, names) and raises SpecError
listing every problem with the case and the LINE. What needs the machine (the model, the prompt
file, a baseline run, an interpreter) is checked by `parity_ui.commands.gate.check.prepare_cases` before
anything runs. Nothing here touches an engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from ...core.config import SIDE_PRESETS
from ...core.errors import ParityError
from ...core.pooled import FLOOR_FIGURE_NAMES, NOT_IDENTICAL
from ...core.workload_record import FLOORS, MODES
from .metrics import METRIC_ALIASES, METRICS, WITHIN_FLOOR
from .yamlnodes import Map, Seq, YamlReadError, read_yaml

SPEC_KEYS = ("version", "defaults", "cases")
CASE_KEYS = (
    "name",
    "model",
    "sides",
    "sides_preset",
    "prompts",
    "config",
    "mode",
    "floor",
    "floor_batch_size",
    "trust_remote_code",
    "check_sides",
    "thresholds",
    "baseline",
    "control",
    "replay",
    "audit",
    "weights",
)
AUDIT_KEYS = ("axes", "batch", "prompts", "longest", "control_setting", "control_set", "seed")
# What an audit case may not have: it is judged at zero, by its own control.
# Metrics of the token streams' identity: on a replay (forced tokens) they hold by construction.
SEQUENCE_METRICS = ("share_identical", "identical_wilson_lower", "median_first_divergence")
NOT_WITH_AUDIT = ("thresholds", "baseline", "control", "replay", "mode", "floor", "floor_batch_size", "check_sides")
PROMPT_KEYS = ("file", "field", "limit", "sample", "seed", "texts")
REPLAY_KEYS = ("file", "format", "limit", "policy_version")
REPLAY_FORMATS = ("auto", "parity", "nemo-rl", "verl", "slime")
BASELINE_KEYS = ("run", "slack")
CONTROL_KEYS = ("set", "perturb", "skip", "zero")
WEIGHTS_KEYS = (
    "from",
    "url",
    "served_model",
    "skip",
    "zero",
    "sleep",
    "update_path",
    "probe",
    "probe_tokens",
    "probe_sequences",
    "dtype",
)
# keys a weights case cannot have: it runs no prompts and has its own two checks
NOT_IN_WEIGHTS = (
    "sides",
    "sides_preset",
    "prompts",
    "config",
    "mode",
    "floor",
    "floor_batch_size",
    "thresholds",
    "baseline",
    "check_sides",
    "replay",
)
PERTURB_KEYS = ("sides", "layer", "scale", "seed")
LAST_PASS = "last-pass"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")
FLOOR_FACTOR_NAMES = (*FLOOR_FIGURE_NAMES, NOT_IDENTICAL)


@dataclass
class Problem:
    line: int | None
    case: str | None
    message: str
    fix: str = ""

    def text(self, path: str) -> str:
        where = f"{path}:{self.line}" if self.line else path
        who = f" case {self.case!r}:" if self.case else ""
        return f"{where}:{who} {self.message}" + (f" Fix: {self.fix}" if self.fix else "")


class SpecError(ParityError):
    """The spec does not validate: every problem found, each with its line and case."""

    code = "spec"

    def __init__(self, path: str, problems: list[Problem]):
        self.path, self.problems = path, problems
        head = f"the gate spec {path} has {len(problems)} problem{'s' if len(problems) > 1 else ''}"
        super().__init__(head + ":\n" + "\n".join("  " + p.text(path) for p in problems))

    def __str__(self) -> str:
        return self.message


@dataclass
class Threshold:
    metric: str  # a METRICS name, or WITHIN_FLOOR
    limit: float | None  # the metric's limit; WITHIN_FLOOR: the tolerance k (None when per figure)
    line: int
    figures: dict[str, float] = field(default_factory=dict)  # WITHIN_FLOOR per figure: name -> factor

    def label(self) -> str:
        if self.metric == WITHIN_FLOOR:
            if self.figures:
                return "within the noise floor (" + ", ".join(f"{k} {v:g}x" for k, v in self.figures.items()) + ")"
            return f"within {self.limit:g}x the noise floor"
        return f"{self.metric} {METRICS[self.metric].op} {self.limit:g}"


@dataclass
class Slack:
    metric: str
    amount: float
    relative: bool  # amount is a fraction of the baseline's value ("20%" -> 0.2)
    line: int

    def label(self) -> str:
        return f"{self.amount * 100:g}%" if self.relative else f"{self.amount:g}"


@dataclass
class BaselineSpec:
    run: str  # a run id, or LAST_PASS
    slack: list[Slack]
    line: int


@dataclass
class PerturbSpec:
    sides: list[str] | None  # default: the case's checked sides
    layer: int | None  # default: the middle layer
    scale: float  # noise std as a fraction of each weight's std
    seed: int
    line: int


@dataclass
class ControlSpec:
    set: dict[str, Any]  # config keys (dotted: SIDE.option) -> value
    perturb: PerturbSpec | None
    line: int
    weights: dict[str, str] = field(default_factory=dict)  # a weights case's planted fault: skip / zero -> REGEX

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.set.items()]
        parts += [f"the push with {k} {v!r}" for k, v in self.weights.items()]
        if self.perturb is not None:
            p = self.perturb
            layer = "the middle layer" if p.layer is None else f"layer {p.layer}"
            parts.append(
                f"{'/'.join(p.sides) if p.sides else 'the checked sides'} on a copy of the model "
                f"with {layer}'s weights noised ({p.scale:g} x their std)"
            )
        return "; ".join(parts)


@dataclass
class PromptsSpec:
    file: str | None  # resolved against the spec's folder
    field: str | None
    limit: int | None
    sample: int | None
    seed: int
    texts: list[str] | None
    line: int


@dataclass
class ReplaySpec:
    """A case that replays an RL run's rollout dump (parity_ui.commands.replay) instead of prompts:
    its thresholds judge the replay's pairs ("recorded": the run's own mismatch, or an engine re-run)."""

    file: str  # resolved against the spec's folder
    format: str
    limit: int | None
    policy_version: str | None
    line: int


@dataclass
class AuditSpec:
    """A case that audits its sides (parity_ui.commands.audit): passes only at zero, every applicable
    axis identical and the planted control detected."""

    axes: list[str] | None  # None: every axis
    batch: int | None
    prompts: int  # the built-in set's size (when the case names no prompts)
    longest: int
    control_setting: bool
    control_set: str | None
    seed: int
    line: int


@dataclass
class WeightsSpec:
    """A weight-sync case (parity_ui.commands.weights): the engine starts from `start_from` (or is a
    server at `url`) and must serve the case's model; its checks are "every tensor equal" and "the
    probe at the noise floor"."""

    start_from: str | None  # resolved against the spec's folder
    url: str | None
    served_model: str | None
    skip: str | None
    zero: str | None
    sleep: int
    update_path: str
    probe: bool
    probe_tokens: int
    probe_sequences: int
    dtype: str
    line: int


@dataclass
class CaseSpec:
    name: str
    line: int
    model: str
    config: dict[str, Any]  # a ParityConfig's data, sides included (validated by prepare_cases)
    prompts: PromptsSpec
    mode: str = "free"
    floor: str = "auto"
    floor_batch_size: int = 8
    trust_remote_code: bool = False
    check_sides: list[str] | None = None
    thresholds: list[Threshold] = field(default_factory=list)
    baseline: BaselineSpec | None = None
    control: ControlSpec | None = None
    lines: dict[str, int] = field(default_factory=dict)  # key -> line (for errors found later)
    config_lines: dict[str, int] = field(default_factory=dict)  # config key -> line
    replay: ReplaySpec | None = None  # a replay case (its prompts are the dump's rows)
    audit: AuditSpec | None = None  # an audit case (its prompts: the case's, else the built-in set)
    weights: WeightsSpec | None = None  # a weight-sync case (no prompts, its own two checks)

    def line_of(self, key: str) -> int:
        return self.lines.get(key, self.line)


@dataclass
class GateSpec:
    path: str
    cases: list[CaseSpec]
    data: dict[str, Any]  # the spec as read (stored with the check)

    def case(self, name: str) -> CaseSpec:
        return next(c for c in self.cases if c.name == name)


def load_spec(path: str | Path, env: Mapping[str, str] | None = None) -> GateSpec:
    """Read and check a spec file. Raises SpecError naming every problem (case and line)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            str(p), [Problem(None, None, "file not found", "check the path given to parity check")]
        ) from None
    except (UnicodeDecodeError, IsADirectoryError) as e:
        raise SpecError(
            str(p), [Problem(None, None, f"cannot be read as UTF-8 text ({type(e).__name__})", "give a YAML file")]
        ) from None
    return parse_spec(text, str(p), base=p.parent, env=env)


def parse_spec(
    text: str, path: str = "spec", base: Path | None = None, env: Mapping[str, str] | None = None
) -> GateSpec:
    """As load_spec, from text; relative prompt files resolve against `base` (default: the cwd)."""
    try:
        doc = read_yaml(text, env)
    except YamlReadError as e:
        raise SpecError(path, [Problem(e.problem.line, None, e.problem.message)]) from None
    v = _Validator(path, base or Path("."))
    spec = v.spec(doc)
    if v.problems:
        raise SpecError(path, v.problems)
    return spec


class _Validator:
    def __init__(self, path: str, base: Path):
        self.path, self.base = path, base
        self.problems: list[Problem] = []
        self.case: str | None = None

    def bad(self, line: int | None, message: str, fix: str = "") -> None:
        self.problems.append(Problem(line, self.case, message, fix))

    def keys(self, m: Map, allowed: tuple[str, ...], what: str) -> None:
        for k in m:
            if k not in allowed:
                close = [a for a in allowed if a.replace("_", "") == k.replace("_", "").replace("-", "")]
                self.bad(
                    m.line_of(k),
                    f"unknown key {k!r} in {what}",
                    f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(allowed)}",
                )

    # -- the document ----------------------------------------------------------------------------------

    def spec(self, doc: Any) -> GateSpec:
        if not isinstance(doc, Map):
            self.bad(
                getattr(doc, "line", 1) or 1,
                "the spec must be a mapping with a 'cases' list",
                "start the file with 'cases:'",
            )
            return GateSpec(self.path, [], {})
        self.keys(doc, SPEC_KEYS, "the spec")
        if "version" in doc and doc["version"] != 1:
            self.bad(doc.line_of("version"), f"version {doc['version']!r} is not supported", "write version: 1")
        defaults = doc.get("defaults") or Map()
        if not isinstance(defaults, Map):
            self.bad(doc.line_of("defaults"), "defaults must be a mapping of case keys", "e.g. defaults: {model: demo}")
            defaults = Map()
        else:
            self.keys(defaults, tuple(k for k in CASE_KEYS if k != "name"), "defaults")
        cases = doc.get("cases")
        if not isinstance(cases, Seq) or not cases:
            self.bad(
                doc.line_of("cases") if "cases" in doc else doc.line,
                "the spec has no cases",
                "give a list: cases: [{name: ..., model: ..., prompts: ..., thresholds: ...}]",
            )
            return GateSpec(self.path, [], dict(doc))
        out: list[CaseSpec] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(cases):
            self.case = None
            if not isinstance(raw, Map):
                self.bad(cases.line_of(i), f"case {i + 1} must be a mapping", "e.g. - {name: fp32, model: demo, ...}")
                continue
            case = self.one_case(_with_defaults(raw, defaults), i)
            if case is None:
                continue
            if case.name in seen:
                self.bad(
                    case.line,
                    f"two cases are named {case.name!r} (the other on line {seen[case.name]})",
                    "give every case its own name",
                )
            seen[case.name] = case.line
            out.append(case)
        return GateSpec(self.path, out, _plain(doc))

    def one_case(self, m: Map, i: int) -> CaseSpec | None:
        name = m.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            self.bad(
                m.line_of("name"),
                f"case {i + 1} has {'no name' if name is None else f'the name {name!r}'}",
                "name: letters, digits, '.', '_' and '-' (at most 64), e.g. name: fp32-vllm",
            )
            name = f"#{i + 1}"
        self.case = name
        self.keys(m, CASE_KEYS, "a case")
        model = m.get("model")
        if not isinstance(model, str) or not model.strip():
            self.bad(
                m.line_of("model"),
                "has no model" if model is None else f"model {model!r} is not a name",
                "model: demo, a model folder, or an HF id",
            )
            model = ""
        if m.get("weights") is not None:
            return self.weights_case(m, name, model)
        config = self.config(m)
        audit = self.audit(m) if m.get("audit") not in (None, False) else None
        if audit is not None:
            for key in NOT_WITH_AUDIT:
                if key in m:
                    self.bad(
                        m.line_of(key),
                        f"an audit case has no {key}: it is judged at zero (every applicable axis identical) "
                        "against its own control",
                        f"drop {key}, or drop audit for a workload case",
                    )
        replay = self.replay(m) if m.get("replay") is not None else None
        if replay is not None and m.get("prompts") is not None:
            self.bad(
                m.line_of("prompts"), "has both prompts and replay", "a case replays a dump or runs prompts: keep one"
            )
        no_prompts = m.get("replay") is not None or (audit is not None and m.get("prompts") is None)
        prompts = self.prompts(m) if not no_prompts else PromptsSpec(None, None, None, None, 0, None, m.line)
        mode = self.choice(m, "mode", MODES, "free")
        floor = self.choice(m, "floor", FLOORS, "auto")
        fbs = self.integer(m, "floor_batch_size", 8, 1, 1024)
        trust = self.boolean(m, "trust_remote_code")
        check_sides = self.names(m, "check_sides")
        thresholds = self.thresholds(m, floor)
        if replay is not None:  # a replay's pairs score the dump's own tokens: every row is "identical"
            for t in thresholds:
                if t.metric in SEQUENCE_METRICS:
                    self.bad(
                        t.line,
                        f"{t.metric} cannot fail on a replay: the pairs teacher-force the dump's own tokens, so "
                        "every row is identical by construction",
                        "judge a replay by its logprob figures (abs_dlogp_p99, k3, outside_0.8_1.2, within_floor)",
                    )
        baseline = self.baseline(m)
        control = self.control(m)
        if not thresholds and baseline is None and audit is None:
            self.bad(
                m.line,
                "has no thresholds and no baseline: it cannot fail",
                "add thresholds: {share_identical: 0.9, abs_dlogp_p99: 0.1} or a baseline",
            )
        if prompts is None:
            return None
        if m.get("replay") is not None and replay is None:
            return None
        return CaseSpec(
            name=name,
            line=m.line,
            model=model.strip(),
            config=config,
            prompts=prompts,
            mode=mode,
            floor=floor,
            floor_batch_size=fbs,
            trust_remote_code=trust,
            check_sides=check_sides,
            thresholds=thresholds,
            baseline=baseline,
            control=control,
            lines=dict(m.lines),
            config_lines=dict(getattr(m.get("config"), "lines", {}) or {}),
            replay=replay,
            audit=audit,
        )

    def weights_case(self, m: Map, name: str, model: str) -> CaseSpec | None:
        """A weights case: its `weights` mapping and a control that plants a fault in the push."""
        for key in NOT_IN_WEIGHTS:
            if key in m:
                self.bad(
                    m.line_of(key),
                    f"a weights case takes no {key}: it runs no prompts, and its checks are every tensor equal "
                    "and the probe at the noise floor",
                    f"remove {key}, or make this a separate case",
                )
        w = m["weights"]
        if not isinstance(w, Map):
            self.bad(m.line_of("weights"), "weights must be a mapping", "weights: {from: ./step-100}")
            return None
        self.keys(w, WEIGHTS_KEYS, "weights")
        start, url = w.get("from"), w.get("url")
        if bool(start) == bool(url) or not isinstance(start or url, str):
            self.bad(
                w.line,
                "weights needs where the engine's weights come from: from (a checkpoint the engine starts from) "
                "or url (a running vLLM server), one of them",
                "weights: {from: ./step-100}",
            )
            return None
        for key in ("skip", "zero"):
            if w.get(key) is not None and not isinstance(w.get(key), str):
                self.bad(w.line_of(key), f"weights {key} must be a regex", f"{key}: 'layers\\.0\\.'")
        fp = Path(start.strip()).expanduser() if isinstance(start, str) else None
        local = fp if fp is None or fp.is_absolute() or str(start).strip() == "demo" else self.base / fp
        control = self.control(m, weights=True)
        return CaseSpec(
            name=name,
            line=m.line,
            model=model.strip(),
            config={},
            prompts=PromptsSpec(None, None, None, None, 0, None, m.line),
            trust_remote_code=self.boolean(m, "trust_remote_code"),
            control=control,
            lines=dict(m.lines),
            weights=WeightsSpec(
                start_from=str(local) if local is not None else None,
                url=url if isinstance(url, str) else None,
                served_model=w.get("served_model"),
                skip=w.get("skip"),
                zero=w.get("zero"),
                sleep=self.integer(w, "sleep", 0, 0, 2) or 0,
                update_path=self.choice(w, "update_path", ("auto", "load_weights", "reload"), "auto"),
                probe=self.boolean(w, "probe") if "probe" in w else True,
                probe_tokens=self.integer(w, "probe_tokens", 256, 1, 1_000_000) or 256,
                probe_sequences=self.integer(w, "probe_sequences", 8, 1, 10_000) or 8,
                dtype=str(w.get("dtype", "auto")),
                line=w.line,
            ),
        )

    # -- parts ------------------------------------------------------------------------------------------

    def config(self, m: Map) -> dict[str, Any]:
        cfg = m.get("config") or Map()
        if not isinstance(cfg, Map):
            self.bad(
                m.line_of("config"),
                "config must be a mapping of canonical config keys",
                "e.g. config: {max_new_tokens: 64, dtype: bfloat16}",
            )
            cfg = Map()
        data = _plain(cfg)
        if "sides" in data:
            self.bad(
                cfg.line_of("sides"),
                "the sides go in the case's own 'sides' (or 'sides_preset'), not in config",
                "move them up one level",
            )
        if "sides" in m and "sides_preset" in m:
            self.bad(m.line_of("sides_preset"), "has both sides and sides_preset", "keep one of them")
        elif "sides_preset" in m:
            preset = m["sides_preset"]
            if preset not in SIDE_PRESETS:
                self.bad(
                    m.line_of("sides_preset"),
                    f"sides_preset {preset!r} is not a preset",
                    f"one of: {', '.join(SIDE_PRESETS)}",
                )
            else:
                data["sides"] = [dict(s) for s in SIDE_PRESETS[preset]]
        elif "sides" in m:
            sides = m["sides"]
            if not isinstance(sides, Seq) or not all(isinstance(s, Map) for s in sides):
                self.bad(
                    m.line_of("sides"),
                    "sides must be a list of mappings with name and kind",
                    "e.g. sides: [{name: ref, kind: hf, dtype: float32}, {name: b, kind: vllm}]",
                )
            else:
                data["sides"] = [_plain(s) for s in sides]
        return data

    def prompts(self, m: Map) -> PromptsSpec | None:
        p = m.get("prompts")
        if p is None:
            self.bad(m.line, "has no prompts", "prompts: {file: prompts.jsonl, limit: 16} or prompts: {texts: [...]}")
            return None
        if isinstance(p, str):  # prompts: FILE
            p = Map({"file": p}, line=m.line_of("prompts"), lines={"file": m.line_of("prompts")})
        if not isinstance(p, Map):
            self.bad(
                m.line_of("prompts"),
                "prompts must be a file name or a mapping",
                "prompts: {file: prompts.jsonl, limit: 16}",
            )
            return None
        self.keys(p, PROMPT_KEYS, "prompts")
        file, texts = p.get("file"), p.get("texts")
        if (file is None) == (texts is None):
            self.bad(
                p.line,
                "prompts needs exactly one of file and texts",
                "file: a .jsonl or .parquet workload (relative to the spec), or texts: a list of prompts",
            )
            return None
        if file is not None and (not isinstance(file, str) or not file.strip()):
            self.bad(p.line_of("file"), f"prompts file {file!r} is not a path", "file: prompts.jsonl")
            return None
        if texts is not None and (
            not isinstance(texts, Seq) or not texts or not all(isinstance(t, str) and t.strip() for t in texts)
        ):
            self.bad(p.line_of("texts"), "texts must be a list of non-empty prompts", 'texts: ["Explain gravity."]')
            return None
        field_ = p.get("field")
        if field_ is not None and not isinstance(field_, str):
            self.bad(p.line_of("field"), f"field {field_!r} is not a name", "field: prompt")
        limit = self.integer(p, "limit", None, 1, 100_000)
        sample = self.integer(p, "sample", None, 1, 100_000)
        if limit is not None and sample is not None:
            self.bad(p.line_of("sample"), "prompts has both limit and sample", "keep one: limit N or sample N")
        seed = self.integer(p, "seed", 0, 0, 2**31)
        resolved = None
        if file is not None:
            fp = Path(file.strip()).expanduser()
            resolved = str(fp if fp.is_absolute() else self.base / fp)
        return PromptsSpec(
            file=resolved,
            field=field_ if isinstance(field_, str) else None,
            limit=limit,
            sample=sample,
            seed=seed,
            texts=list(texts) if texts is not None else None,
            line=p.line,
        )

    def replay(self, m: Map) -> ReplaySpec | None:
        r = m.get("replay")
        if isinstance(r, str):  # replay: FILE
            r = Map({"file": r}, line=m.line_of("replay"), lines={"file": m.line_of("replay")})
        if not isinstance(r, Map):
            self.bad(
                m.line_of("replay"),
                "replay must be a dump's file name or a mapping",
                "replay: {file: rollouts.jsonl, format: auto, limit: 64}",
            )
            return None
        self.keys(r, REPLAY_KEYS, "replay")
        file = r.get("file")
        if not isinstance(file, str) or not file.strip():
            self.bad(r.line_of("file"), f"replay file {file!r} is not a path", "replay: {file: rollouts.jsonl}")
            return None
        fmt = self.choice(r, "format", REPLAY_FORMATS, "auto")
        limit = self.integer(r, "limit", None, 1, 10_000_000)
        version = r.get("policy_version")
        fp = Path(file.strip()).expanduser()
        return ReplaySpec(
            file=str(fp if fp.is_absolute() else self.base / fp),
            format=fmt,
            limit=limit,
            policy_version=None if version is None else str(version),
            line=r.line,
        )

    def audit(self, m: Map) -> AuditSpec | None:
        a = m.get("audit")
        if a is True:
            a = Map(line=m.line_of("audit"))
        if not isinstance(a, Map):
            self.bad(
                m.line_of("audit"),
                "audit must be true or a mapping",
                "audit: true, or audit: {axes: [replay, batch, prefix], batch: 8}",
            )
            return None
        self.keys(a, AUDIT_KEYS, "audit")
        axes = a.get("axes")
        if axes is not None:
            from ..audit.axes import parse_axes

            try:
                if not isinstance(axes, (str, list)) or not all(isinstance(x, str) for x in axes):
                    raise ParityError(f"axes {axes!r} is not a list of axis names", "axes: [replay, batch]")
                axes = parse_axes(axes)
            except ParityError as e:
                self.bad(a.line_of("axes"), e.message, e.fix)
                axes = None
        control_set = a.get("control_set")
        if control_set is not None and not isinstance(control_set, str):
            self.bad(
                a.line_of("control_set"),
                f"control_set {control_set!r} is not OPTION=VALUE",
                "control_set: dtype=bfloat16",
            )
            control_set = None
        batch = self.integer(a, "batch", None, 2, 4096)
        return AuditSpec(
            axes=axes,
            batch=batch,
            prompts=self.integer(a, "prompts", 8, 1, 4096) or 8,
            longest=self.integer(a, "longest", 600, 16, 1_000_000) or 600,
            control_setting=self.boolean(a, "control_setting") or control_set is not None,
            control_set=control_set,
            seed=self.integer(a, "seed", 0, 0, 2**31) or 0,
            line=a.line,
        )

    def choice(self, m: Map, key: str, allowed: tuple[str, ...], default: str) -> str:
        v = m.get(key, default)
        if v not in allowed:
            self.bad(m.line_of(key), f"{key} {v!r} is not one of {', '.join(allowed)}", f"e.g. {key}: {default}")
            return default
        return v

    @overload
    def integer(self, m: Map, key: str, default: int, lo: int, hi: int) -> int: ...

    @overload
    def integer(self, m: Map, key: str, default: None, lo: int, hi: int) -> int | None: ...

    def integer(self, m: Map, key: str, default: int | None, lo: int, hi: int) -> int | None:
        """`key`'s whole number in [lo, hi]; `default` where it is absent or null (or wrong: said)."""
        v = m.get(key)
        if v is None:
            return default
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            self.bad(m.line_of(key), f"{key} is {v!r}, must be a whole number from {lo} to {hi}", f"e.g. {key}: {lo}")
            return default
        return v

    def boolean(self, m: Map, key: str) -> bool:
        v = m.get(key, False)
        if not isinstance(v, bool):
            self.bad(m.line_of(key), f"{key} is {v!r}, must be true or false", f"{key}: true")
            return False
        return v

    def names(self, m: Map, key: str) -> list[str] | None:
        v = m.get(key)
        if v is None:
            return None
        if isinstance(v, str):
            v = Seq([v], line=m.line_of(key), lines=[m.line_of(key)])
        if not isinstance(v, Seq) or not v or not all(isinstance(x, str) for x in v):
            self.bad(m.line_of(key), f"{key} must be a list of side names", f"{key}: [b]")
            return None
        return list(v)

    def number(self, v: Any, line: int, what: str, lo: float | None = None) -> float | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.bad(line, f"{what} is {v!r} ({type(v).__name__}), must be a number", f"e.g. {what.split()[-1]}: 0.1")
            return None
        if lo is not None and v < lo:
            self.bad(line, f"{what} is {v!r}, must be >= {lo:g}")
            return None
        return float(v)

    def thresholds(self, m: Map, floor: str) -> list[Threshold]:
        t = m.get("thresholds")
        if t is None:
            return []
        if not isinstance(t, Map):
            self.bad(
                m.line_of("thresholds"),
                "thresholds must be a mapping of metric to limit",
                "e.g. thresholds: {share_identical: 0.9, abs_dlogp_p99: 0.1}",
            )
            return []
        out = []
        for name, value in t.items():
            line = t.line_of(name)
            if name == WITHIN_FLOOR:
                if floor == "none":
                    self.bad(
                        line,
                        "within_floor needs the reference's noise floor, and floor is none",
                        "set floor: batch (or order, kernel, auto), or drop within_floor",
                    )
                if isinstance(value, Map):
                    figures = {}
                    for fig, factor in value.items():
                        if fig not in FLOOR_FACTOR_NAMES:
                            self.bad(
                                value.line_of(fig),
                                f"unknown floor figure {fig!r}",
                                f"figures: {', '.join(FLOOR_FACTOR_NAMES)}",
                            )
                            continue
                        f = self.number(factor, value.line_of(fig), f"within_floor factor of {fig}", 1.0)
                        if f is not None:
                            figures[fig] = f
                    if figures:
                        out.append(Threshold(WITHIN_FLOOR, None, line, figures))
                    elif not value:
                        self.bad(line, "within_floor names no figure", "within_floor: 1.5, or {abs_dlogp_p99: 2.0}")
                    continue
                k = self.number(value, line, "within_floor", 1.0)
                if k is not None:
                    out.append(Threshold(WITHIN_FLOOR, k, line))
                continue
            name = METRIC_ALIASES.get(name, name)  # kl: k1's name before schema 3
            if name not in METRICS:
                self.bad(line, f"unknown metric {name!r}", f"metrics: {', '.join([*METRICS, WITHIN_FLOOR])}")
                continue
            limit = self.number(value, line, f"threshold {name}")
            if limit is not None:
                out.append(Threshold(name, limit, line))
        return out

    def baseline(self, m: Map) -> BaselineSpec | None:
        b = m.get("baseline")
        if b is None:
            return None
        if isinstance(b, str):
            b = Map({"run": b}, line=m.line_of("baseline"), lines={"run": m.line_of("baseline")})
        if not isinstance(b, Map):
            self.bad(
                m.line_of("baseline"),
                "baseline must be a mapping",
                "baseline: {run: last-pass, slack: {abs_dlogp_p99: 20%}}",
            )
            return None
        self.keys(b, BASELINE_KEYS, "baseline")
        run = b.get("run")
        if not isinstance(run, str) or not run.strip():
            self.bad(
                b.line_of("run"),
                f"baseline run {run!r} is not a run id or {LAST_PASS}",
                f"run: {LAST_PASS} (this case's last passing run) or a run id from 'parity runs list'",
            )
            return None
        slack_raw = b.get("slack")
        if not isinstance(slack_raw, Map) or not slack_raw:
            self.bad(
                b.line_of("slack") if "slack" in b else b.line,
                "baseline needs slack: how much worse than it is allowed, per metric",
                "slack: {abs_dlogp_p99: 20%, share_identical: 0.05} (absolute, or a percentage of the baseline's value)",
            )
            return None
        slack = []
        for name, value in slack_raw.items():
            line = slack_raw.line_of(name)
            name = METRIC_ALIASES.get(name, name)
            if name not in METRICS:
                self.bad(line, f"unknown metric {name!r} in baseline slack", f"metrics: {', '.join(METRICS)}")
                continue
            if isinstance(value, str) and (pm := _PERCENT.match(value)):
                slack.append(Slack(name, float(pm.group(1)) / 100, True, line))
                continue
            amount = self.number(value, line, f"slack of {name}", 0.0)
            if amount is not None:
                slack.append(Slack(name, amount, False, line))
        return BaselineSpec(run=run.strip(), slack=slack, line=b.line_of("run"))

    def control(self, m: Map, weights: bool = False) -> ControlSpec | None:
        c = m.get("control")
        if c is None:
            return None
        if weights:
            return self.weights_control(c, m)
        if not isinstance(c, Map) or not c:
            self.bad(
                m.line_of("control"),
                "control must be a mapping with set and/or perturb",
                "control: {set: {b.dtype: bfloat16}} or control: {perturb: {layer: 0, scale: 0.1}}",
            )
            return None
        self.keys(c, CONTROL_KEYS, "control")
        sets = c.get("set") or Map()
        if not isinstance(sets, Map):
            self.bad(
                c.line_of("set"), "control set must be a mapping of config keys to values", "set: {b.dtype: bfloat16}"
            )
            sets = Map()
        perturb = None
        if "perturb" in c:
            p = c["perturb"]
            if p is True or p is None:
                p = Map(line=c.line_of("perturb"))
            if not isinstance(p, Map):
                self.bad(c.line_of("perturb"), "control perturb must be a mapping", "perturb: {layer: 0, scale: 0.1}")
            else:
                self.keys(p, PERTURB_KEYS, "control perturb")
                scale = self.number(p.get("scale", 0.1), p.line_of("scale"), "perturb scale", 0.0)
                perturb = PerturbSpec(
                    sides=self.names(p, "sides"),
                    layer=self.integer(p, "layer", None, 0, 10_000),
                    scale=scale if scale is not None else 0.1,
                    seed=self.integer(p, "seed", 0, 0, 2**31) or 0,
                    line=p.line,
                )
        for key in ("skip", "zero"):
            if key in c:
                self.bad(
                    c.line_of(key), f"control {key} plants a fault in a weights case's push", "use set or perturb here"
                )
        if not sets and perturb is None:
            self.bad(c.line, "control changes nothing", "give set: {SIDE.dtype: bfloat16} or perturb: {layer: 0}")
            return None
        return ControlSpec(set=_plain(sets), perturb=perturb, line=c.line)

    def weights_control(self, c: Any, m: Map) -> ControlSpec | None:
        """A weights case's control: tensors left out of the push (skip) or pushed as zeros (zero)."""
        if not isinstance(c, Map) or not any(k in c for k in ("skip", "zero")):
            self.bad(
                m.line_of("control"),
                "a weights case's control plants a fault in the push: skip or zero, a regex over tensor names",
                "control: {skip: 'layers\\.0\\.mlp\\.down_proj'}",
            )
            return None
        self.keys(c, ("skip", "zero"), "a weights case's control")
        planted = {k: c[k] for k in ("skip", "zero") if isinstance(c.get(k), str) and c[k]}
        if len(planted) != len([k for k in ("skip", "zero") if k in c]):
            self.bad(
                c.line, "control skip / zero must be a regex over tensor names", "control: {skip: 'layers\\.0\\.'}"
            )
        return ControlSpec(set={}, perturb=None, line=c.line, weights=planted) if planted else None


def _with_defaults(case: Map, defaults: Map) -> Map:
    """The case over the defaults: its own keys win; config, prompts and thresholds merge one level."""
    out = Map(defaults, line=case.line, lines=dict(defaults.lines))
    for k, v in case.items():
        if k in ("config", "prompts", "thresholds") and isinstance(v, Map) and isinstance(out.get(k), Map):
            merged = Map(out[k], line=v.line, lines=dict(out[k].lines))
            merged.update(v)
            merged.lines.update(v.lines)
            v = merged
        out[k] = v
        out.lines[k] = case.line_of(k)
    return out


def _plain(v: Any) -> Any:
    """Map/Seq as plain dicts and lists (for configs and storage)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v
