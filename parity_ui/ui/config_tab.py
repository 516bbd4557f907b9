"""Config tab: a form for the common canonical keys and a YAML editor for all of them, kept in
sync; validation errors next to the field; the mapping table; presets; load and save files.

The YAML text is the one source of truth: the form writes into it, and the Run button reads it.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr
import yaml

from ..core.config import PRESETS, ParityConfig, config_from_dict, decoding_text, parse_config_text
from ..core.errors import ConfigError, ParityError
from ..core.kinds import DTYPES
from ..render import cards

MAX_CONFIG_BYTES = 1 * 2**20
CONFIG_FILE_TYPES = (".yaml", ".yml", ".json")
# Where the app starts, where it differs from a bare CLI run (ParityConfig's defaults; everything
# else is the same). Chat on: the bundled demo is a chat model and the Compare tab opens on a
# question, which such a model answers as intended only through its template. The CLI keeps it off:
# it also runs raw-text prompt files and base models, and a changed default would change the ids of
# every scripted run. The page says so (the config line, the Config tab) instead of differing silently.
APP_DEFAULTS: dict[str, Any] = {"chat": True}
CLI_FLAGS: dict[str, str] = {"chat": "--chat"}  # how a CLI run gets each of APP_DEFAULTS

# key -> (label, default info line). Order is the form's order.
FORM_KEYS: dict[str, tuple[str, str]] = {
    "dtype": ("dtype", "weights dtype of every side (a side's own dtype option wins); 'auto' = the model's own"),
    "max_new_tokens": ("max_new_tokens", "tokens generated after the prompt"),
    "temperature": ("temperature", "0 = greedy (the only setting where streams can match exactly)"),
    "top_p": ("top_p", "nucleus sampling; 1 = off"),
    "top_k": ("top_k", "0 = off"),
    "seed": ("seed", "sampling seed"),
    "logprobs": ("logprobs", "top-k alternatives recorded per position (0-20)"),
    "max_model_len": ("max_model_len", "context limit; empty = the model's own"),
    "batch_size": ("batch_size", "prompts per generate call"),
    "chat": ("chat template", "apply the model's chat template once (both engines get the same ids)"),
    "routes": (
        "MoE routes",
        "record and compare which experts each token used; 'follow the model': on for a mixture-of-experts "
        "model, off for a dense one (what it costs: the docs' MoE routes page)",
    ),
}
# The routes field's choices and their YAML values (null: follow the model).
ROUTES_CHOICES = [("follow the model (on for MoE models)", "auto"), ("on", "on"), ("off", "off")]
ROUTES_VALUE = {"auto": None, "on": True, "off": False}
ROUTES_SHOWN = {None: "auto", True: "on", False: "off"}


def config_from_text(text: str) -> ParityConfig:
    """Parse and validate the editor's YAML. Raises ConfigError naming the key."""
    return config_from_dict(parse_config_text(text, "YAML"))


def default_yaml() -> str:
    return config_from_dict(APP_DEFAULTS).to_yaml()


def preset_yaml(name: str) -> str:
    return config_from_dict({**APP_DEFAULTS, **PRESETS[name]}).to_yaml()


def _shown(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def cli_default_note(key: str, value: Any) -> str:
    """'' unless `key` is one of APP_DEFAULTS and `value` differs from a bare CLI run's; then the
    CLI's default and its flag, e.g. "the CLI's default is off: --chat"."""
    if key not in APP_DEFAULTS:
        return ""
    cli = getattr(ParityConfig(), key)
    return "" if value == cli else f"the CLI's default is {_shown(cli)}: {CLI_FLAGS[key]}"


def app_defaults_note() -> str:
    """The Config tab's line naming where the app's starting config differs from a bare CLI run."""
    diffs = [
        f"{FORM_KEYS[k][0]} {_shown(v)} ({cli_default_note(k, v)})"
        for k, v in APP_DEFAULTS.items()
        if cli_default_note(k, v)
    ]
    if not diffs:
        return ""
    text = "The app starts from the CLI's defaults, except: " + "; ".join(diffs) + "."
    return f'<div class="pc-cfgline">{html.escape(text)}</div>'


def config_summary_html(cfg: ParityConfig) -> str:
    mode = html.escape(decoding_text(cfg))
    sides = " vs ".join(html.escape(s.describe()) for s in cfg.sides)
    chat_note = cli_default_note("chat", cfg.chat)
    parts = [
        f"sides <b>{sides}</b>",
        f"dtype <b>{cfg.dtype}</b>",
        mode,
        f"max_new_tokens {cfg.max_new_tokens}",
        f"chat template {_shown(cfg.chat)}" + (f" <i>({html.escape(chat_note)})</i>" if chat_note else ""),
        f"top-{cfg.logprobs} logprobs",
    ]
    if cfg.max_model_len:
        parts.append(f"max_model_len {cfg.max_model_len}")
    return f'<div class="pc-cfgline">Config: {" · ".join(parts)} <i>(edit in the Config tab)</i></div>'


def mapping_html(rows: list[Any]) -> str:
    names = list(rows[0].sides) if rows else []
    head = (
        "<tr><th>canonical key</th><th>value</th>"
        + "".join(f"<th>{html.escape(n)} gets</th>" for n in names)
        + "<th>note</th></tr>"
    )
    body = "".join(
        f"<tr><td><code>{html.escape(r.key)}</code></td><td><code>{html.escape(repr(r.value))}</code></td>"
        + "".join(f"<td>{html.escape(r.sides[n])}</td>" for n in names)
        + f"<td>{html.escape(r.note)}</td></tr>"
        for r in rows
    )
    return f'<table class="pc-mapping">{head}{body}</table>'


def _raw_form_values(text: str) -> dict[str, Any]:
    """Form values from YAML that failed validation, where the field can show them (so the form
    shows the value the error is about)."""
    try:
        data = parse_config_text(text, "YAML")
    except ConfigError:
        return {}
    out: dict[str, Any] = {}
    for key in FORM_KEYS:
        v = data.get(key)
        if key == "chat" and isinstance(v, bool):
            out[key] = v
        elif key == "routes" and (v is None or isinstance(v, bool)):
            out[key] = v
        elif key == "dtype" and v in DTYPES:
            out[key] = v
        elif key not in ("chat", "dtype", "routes") and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


class ConfigTab:
    def __init__(self, service: Any):
        self.service = service

    # -- layout --------------------------------------------------------------------------------

    def create_ui(self) -> None:
        with gr.Tab("Config", id="config"):
            with gr.Row():
                self.preset = gr.Dropdown(
                    label="Config preset",
                    info=f"a ready config ({', '.join(PRESETS)}): pick one, then Apply preset",
                    choices=list(PRESETS),
                    value=None,
                    scale=3,
                    elem_id="cfg-preset",
                )
                self.apply_preset_btn = gr.Button("Apply preset", scale=1)
                self.reset_btn = gr.Button("Reset to defaults", scale=1)
            gr.HTML(app_defaults_note(), elem_id="cfg-app-defaults")
            with gr.Row():
                with gr.Column(scale=1):
                    self._render_form()
                with gr.Column(scale=1):
                    self.yaml = gr.Code(
                        value=default_yaml(),
                        language="yaml",
                        label="Full config (YAML)",
                        lines=24,
                        max_lines=40,
                        interactive=True,
                        elem_id="cfg-yaml",
                    )
                    self.error = gr.HTML(elem_id="cfg-error")
                    with gr.Row():
                        self.load_file = gr.File(
                            label="Load a config file (.yaml, .yml, .json)",
                            file_types=list(CONFIG_FILE_TYPES),
                            type="filepath",
                            height=90,
                        )
                        with gr.Column():
                            self.save_btn = gr.Button("Save config as YAML")
                            self.saved = gr.File(label="Saved config", interactive=False, height=90)
            gr.Markdown("### How each key reaches the engines")
            self.mapping = gr.HTML(elem_id="cfg-mapping")

    def _render_form(self) -> None:
        d = ParityConfig()
        self.fields: dict[str, Any] = {
            "dtype": gr.Dropdown(choices=list(DTYPES), value=d.dtype, label="dtype", info=FORM_KEYS["dtype"][1]),
            "max_new_tokens": gr.Number(
                value=d.max_new_tokens, precision=0, label="max_new_tokens", info=FORM_KEYS["max_new_tokens"][1]
            ),
            "temperature": gr.Number(value=d.temperature, label="temperature", info=FORM_KEYS["temperature"][1]),
            "top_p": gr.Number(value=d.top_p, label="top_p", info=FORM_KEYS["top_p"][1]),
            "top_k": gr.Number(value=d.top_k, precision=0, label="top_k", info=FORM_KEYS["top_k"][1]),
            "seed": gr.Number(value=d.seed, precision=0, label="seed", info=FORM_KEYS["seed"][1]),
            "logprobs": gr.Number(value=d.logprobs, precision=0, label="logprobs", info=FORM_KEYS["logprobs"][1]),
            "max_model_len": gr.Number(
                value=None, precision=0, label="max_model_len", info=FORM_KEYS["max_model_len"][1]
            ),
            "batch_size": gr.Number(
                value=d.batch_size, precision=0, label="batch_size", info=FORM_KEYS["batch_size"][1]
            ),
            "chat": gr.Checkbox(value=APP_DEFAULTS["chat"], label="chat template", info=FORM_KEYS["chat"][1]),
            "routes": gr.Dropdown(
                choices=ROUTES_CHOICES,
                value=ROUTES_SHOWN[d.routes],
                label="MoE routes",
                info=FORM_KEYS["routes"][1],
                elem_id="cfg-routes",
            ),
        }

    @property
    def field_list(self) -> list[Any]:
        return list(self.fields.values())

    # -- handlers ------------------------------------------------------------------------------

    def _field_updates(self, data: dict[str, Any] | None, bad_key: str | None, message: str) -> dict[Any, Any]:
        out = {}
        for key, comp in self.fields.items():
            label, info = FORM_KEYS[key]
            bad = bad_key is not None and (bad_key == key or bad_key.startswith(key + "."))
            kw: dict[str, Any] = {
                "info": f"⚠ {message}" if bad else info,
                "elem_classes": ["field-error"] if bad else [],
            }
            if data is not None and key in data:
                kw["value"] = ROUTES_SHOWN.get(data[key], "auto") if key == "routes" else data[key]
            out[comp] = type(comp)(**kw)
        return out

    def _validate(self, text: str, model: str, trust: bool, *, set_fields: bool) -> dict[Any, Any]:
        """The error box, the summary line, the mapping table and every form field."""
        try:
            cfg = config_from_text(text)
        except ConfigError as e:
            box = cards.error_html(e.message, e.fix, "Invalid config")
            line = f'<div class="pc-cfgline pc-bad">Config not valid: {html.escape(e.message)} (fix it in the Config tab)</div>'
            raw = _raw_form_values(text) if set_fields else None
            return {self.error: box, self.summary: line, **self._field_updates(raw, e.key.split("[")[0], e.message)}
        data = cfg.to_dict() if set_fields else None
        try:
            table = mapping_html(self.service.mapping(model or "demo", cfg, bool(trust)))
        except ParityError as e:
            table = cards.notice_html(f"The mapping table needs a resolvable model: {e.message}")
        return {
            self.error: "",
            self.summary: config_summary_html(cfg),
            self.mapping: table,
            **self._field_updates(data, None, ""),
        }

    def yaml_changed(self, text: str, model: str, trust: bool) -> dict[Any, Any]:
        return self._validate(text, model, trust, set_fields=True)

    def form_changed(self, text: str, model: str, trust: bool, *values: Any) -> Any:
        """A form field was left (or Enter pressed, or a dtype or chat picked): when a value differs
        from the YAML's, write every form value into the YAML (keeping the other keys). A field left
        unedited writes nothing (the YAML keeps its own formatting and comments). Decided by content,
        not by counting keystrokes in the page: the count of a paste left at once arrived after the
        write it should have caused (issue 46 item 1)."""
        try:
            data = parse_config_text(text, "YAML")
        except ConfigError as e:
            return {self.error: cards.error_html(e.message, "fix the YAML first, then use the form", "Invalid config")}
        form = {}
        for key, value in zip(self.fields, values):
            if isinstance(value, float) and value.is_integer() and key not in ("temperature", "top_p"):
                value = int(value)
            form[key] = ROUTES_VALUE.get(value) if key == "routes" else value
        try:
            current = config_from_text(text).to_dict()
            if all(current.get(k) == v for k, v in form.items()):
                return gr.skip()
        except ConfigError:
            pass  # the YAML is not a valid config: the form's values may be its fix
        data.update(form)
        new_text = yaml.safe_dump(data, sort_keys=False)
        return {self.yaml: new_text, **self._validate(new_text, model, trust, set_fields=False)}

    def apply_preset(self, name: str | None, model: str, trust: bool) -> dict[Any, Any]:
        text = preset_yaml(name) if name in PRESETS else default_yaml()
        return {self.yaml: text, **self._validate(text, model, trust, set_fields=True)}

    def reset(self, model: str, trust: bool) -> dict[Any, Any]:
        text = default_yaml()
        return {self.yaml: text, self.preset: None, **self._validate(text, model, trust, set_fields=True)}

    def load(self, path: str | None, model: str, trust: bool) -> Any:
        if not path:
            return gr.skip()
        p = Path(path)
        problem = None
        if p.suffix.lower() not in CONFIG_FILE_TYPES:
            problem = (f"config file {p.name!r} has type {p.suffix or '(none)'!r}", "use .yaml, .yml or .json")
        elif p.stat().st_size > MAX_CONFIG_BYTES:
            problem = (f"config file {p.name!r} is over 1 MiB", "a config is a few lines of YAML")
        else:
            try:
                text = p.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                problem = (f"config file {p.name!r} is not UTF-8 text", "save it as UTF-8 YAML or JSON")
        if problem:
            return {self.error: cards.error_html(*problem, "Cannot load config")}
        try:  # show JSON files as YAML, like everything else in the editor
            text = yaml.safe_dump(parse_config_text(text, p.name), sort_keys=False)
        except ConfigError:
            pass  # keep the text as is: the validation below names the problem
        return {self.yaml: text, **self._validate(text, model, trust, set_fields=True)}

    def save(self, text: str) -> str:
        folder = Path(tempfile.mkdtemp(prefix="parity-config-"))
        out = folder / "parity-config.yaml"
        out.write_text(text, encoding="utf-8")
        return str(out)

    # -- events --------------------------------------------------------------------------------

    def create_event_handlers(self, model: Any, trust: Any, summary: Any) -> None:
        """`model`, `trust` and `summary` belong to the Compare tab (built before this is called).
        The YAML editor and the number fields are checked when left (or on Enter), not on every
        key: each check is a server round trip (the mapping table resolves the model), and per
        keystroke they queued up on a busy machine. `validations` lists the events after which
        the config is new (the app recounts the prompt after each)."""
        self.summary = summary
        checked = [self.error, summary, self.mapping, *self.field_list]
        ctx = [model, trust]
        self.validations = [
            self.yaml.blur(
                self.yaml_changed,
                [self.yaml, *ctx],
                checked,
                api_name="validate_config",
                trigger_mode="always_last",
                show_progress="hidden",
                concurrency_limit=1,
                concurrency_id="validate",
            )
        ]
        numbers = [c for c in self.field_list if isinstance(c, gr.Number)]
        picks = [c for c in self.field_list if not isinstance(c, gr.Number)]
        self.validations.append(
            gr.on(
                [*[c.blur for c in numbers], *[c.submit for c in numbers], *[c.input for c in picks]],
                self.form_changed,
                [self.yaml, *ctx, *self.field_list],
                [self.yaml, *checked],
                api_name=False,
                trigger_mode="always_last",
                show_progress="hidden",
                concurrency_limit=1,
                concurrency_id="validate",
            )
        )
        # The events that rewrite the YAML wholesale: the app redraws the Sides panel after them.
        self.yaml_rewrites = [
            self.apply_preset_btn.click(
                self.apply_preset, [self.preset, *ctx], [self.yaml, *checked], api_name="apply_preset"
            ),
            self.reset_btn.click(self.reset, ctx, [self.yaml, self.preset, *checked], api_name="reset_config"),
            self.load_file.upload(self.load, [self.load_file, *ctx], [self.yaml, *checked], api_name="load_config"),
        ]
        self.validations += self.yaml_rewrites
        self.save_btn.click(self.save, [self.yaml], [self.saved], api_name="save_config")
        for comp in (model, trust):
            comp.change(self.yaml_changed, [self.yaml, *ctx], checked, api_name=False, show_progress="hidden")
