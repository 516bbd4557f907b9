"""The Sides panel: add or remove a side, pick its kind, environment, model folder and options, or a
preset pair. The config's YAML stays the one source of truth: the panel writes its `sides:` list,
and a YAML edit redraws the panel.

The conversions are pure functions (tested without a browser); `SidesPanel` builds the components
and wires them.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import gradio as gr
import yaml

from ..config import SIDE_PRESET_LABELS, SIDE_PRESETS, parse_config_text
from ..errors import ConfigError
from ..kinds import KINDS
from ..sides import DEFAULT_SIDES, SIDE_KEYS, parse_side_arg

MAX_UI_SIDES = 4  # slots on the page; the YAML and the CLI take up to parity_ui.sides.MAX_SIDES
FIELDS = ("name", "kind", "options", "model", "python")


def options_text(side: dict[str, Any]) -> str:
    """A side's options as `key=value, key=value` (YAML scalars)."""
    parts = []
    for k, v in side.items():
        if k in SIDE_KEYS:
            continue
        shown = yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
        parts.append(f"{k}={shown}")
    return ", ".join(parts)


def slots_from_sides(sides: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """(how many slots show, the flat slot values name, kind, options, model, python per slot)."""
    values: list[str] = []
    for i in range(MAX_UI_SIDES):
        s = sides[i] if i < len(sides) else {}
        values += [str(s.get("name", "")), str(s.get("kind", "vllm")), options_text(s) if s else "",
                   str(s.get("model") or ""), str(s.get("python") or "")]
    return min(max(len(sides), 2), MAX_UI_SIDES), values


def sides_from_slots(count: int, values: list[str]) -> list[dict[str, Any]]:
    """The shown slots as side dicts. Raises ConfigError naming the slot and the problem."""
    sides = []
    for i in range(int(count)):
        name, kind, opts, model, python = (str(v or "").strip() for v in values[5 * i: 5 * i + 5])
        if not name:
            raise ConfigError(f"side {i + 1}", "has no name", "give every side a name, e.g. ref, a, b")
        side = parse_side_arg(f"{name}={kind}" + (f",{opts}" if opts else ""))
        if model:
            side["model"] = model
        if python:
            side["python"] = python
        sides.append(side)
    return sides


def yaml_with_sides(text: str, sides: list[dict[str, Any]]) -> str:
    """The config YAML with its sides replaced (and the legacy per-side sections folded in)."""
    data = parse_config_text(text, "YAML")
    for s in sides:
        data.pop(s["name"], None)
    data["sides"] = sides
    return yaml.safe_dump(data, sort_keys=False)


def sides_in_yaml(text: str) -> list[dict[str, Any]]:
    """The sides a YAML text names, its per-side sections merged in; the defaults when it names none.
    Raises ConfigError on YAML that does not parse."""
    data = parse_config_text(text, "YAML")
    raw = data.get("sides")
    sides = [dict(s) for s in raw] if isinstance(raw, list) and all(isinstance(s, dict) for s in raw) else \
        [dict(s) for s in DEFAULT_SIDES]
    for s in sides:
        section = data.get(s.get("name"))
        if isinstance(section, dict):
            s.update(section)
    return sides


class SidesPanel:
    def create_ui(self) -> None:
        with gr.Accordion("Sides: what is compared (the first is the reference)", open=False, elem_id="sides-panel"):
            with gr.Row():
                self.preset = gr.Dropdown(label="Preset", choices=[(v, k) for k, v in SIDE_PRESET_LABELS.items()],
                                          value=None, scale=3, elem_id="sides-preset")
                self.apply_btn = gr.Button("Use preset", scale=1, elem_id="sides-apply")
                self.add_btn = gr.Button("Add side", scale=1, elem_id="sides-add")
            count, values = slots_from_sides([dict(s) for s in DEFAULT_SIDES])
            self.count = gr.State(count)
            self.rows: list[Any] = []
            self.slots: list[Any] = []
            self.remove_btns: list[Any] = []
            kinds = [(f"{k.label}", k.name) for k in KINDS.values()]
            for i in range(MAX_UI_SIDES):
                v = values[5 * i: 5 * i + 5]
                with gr.Row(visible=i < count, equal_height=True) as row:
                    name = gr.Textbox(v[0], label="reference side" if i == 0 else f"side {i + 1}", scale=1,
                                      elem_id=f"side-{i}-name", max_lines=1)
                    kind = gr.Dropdown(kinds, value=v[1], label="kind", scale=1, elem_id=f"side-{i}-kind")
                    opts = gr.Textbox(v[2], label="options (key=value, ...)", scale=3, elem_id=f"side-{i}-options",
                                      max_lines=1, placeholder="dtype=bfloat16, enforce_eager=false")
                    model = gr.Textbox(v[3], label="model folder (optional)", scale=2, elem_id=f"side-{i}-model",
                                       max_lines=1, placeholder="the run's model")
                    python = gr.Textbox(v[4], label="python of another env (optional)", scale=2,
                                        elem_id=f"side-{i}-python", max_lines=1, placeholder="this environment")
                    rm = gr.Button("Remove", scale=0, size="sm", elem_id=f"side-{i}-remove")
                self.rows.append(row)
                self.slots += [name, kind, opts, model, python]
                self.remove_btns.append(rm)
            self.error = gr.HTML(elem_id="sides-error")

    # -- handlers ------------------------------------------------------------------------------

    def _show(self, count: int, values: list[str]) -> list[Any]:
        rows = [gr.Row(visible=i < count) for i in range(MAX_UI_SIDES)]
        return [count, *rows, *values]

    def from_yaml(self, text: str) -> list[Any]:
        """A YAML edit (or preset, reset, load): redraw the slots from its sides."""
        try:
            sides = sides_in_yaml(text)
        except ConfigError:
            return [gr.skip()] * (1 + MAX_UI_SIDES + len(self.slots))
        count, values = slots_from_sides(sides)
        return self._show(count, values)

    def to_yaml(self, text: str, count: int, *values: str) -> tuple[str, str]:
        """A slot changed: write the sides into the YAML, or say what is wrong with them."""
        from ..render.cards import error_html

        try:
            return yaml_with_sides(text, sides_from_slots(count, list(values))), ""
        except ConfigError as e:
            return gr.skip(), error_html(e.message, e.fix, "Sides not usable")

    def add(self, text: str, count: int, *values: str) -> list[Any]:
        if count >= MAX_UI_SIDES:
            return [gr.skip()] * (2 + MAX_UI_SIDES + len(self.slots))
        names = {values[5 * i] for i in range(count)}
        new = next(f"s{j}" for j in range(2, 99) if f"s{j}" not in names)
        vals = list(values)
        vals[5 * count: 5 * count + 5] = [new, "vllm", "", "", ""]
        shown = self._show(count + 1, vals)
        text_out, _ = self.to_yaml(text, count + 1, *vals)
        return [text_out, *shown]

    def remove(self, index: int, text: str, count: int, *values: str) -> list[Any]:
        if count <= 2:
            from ..render.cards import notice_html

            return [gr.skip(), *([gr.skip()] * (1 + MAX_UI_SIDES + len(self.slots))),
                    notice_html("A comparison needs two sides: change this one instead of removing it.")]
        vals = list(values)
        del vals[5 * index: 5 * index + 5]
        vals += ["", "vllm", "", "", ""]
        text_out, err = self.to_yaml(text, count - 1, *vals)
        return [text_out, *self._show(count - 1, vals), err]

    def apply_preset(self, name: str | None, text: str) -> list[Any]:
        if name not in SIDE_PRESETS:
            return [gr.skip()] * (1 + 1 + MAX_UI_SIDES + len(self.slots))
        sides = [dict(s) for s in SIDE_PRESETS[name]]
        count, values = slots_from_sides(sides)
        return [yaml_with_sides(text, sides), *self._show(count, values)]

    # -- events --------------------------------------------------------------------------------

    def create_event_handlers(self, cfg_yaml: Any, after_yaml: Any) -> None:
        """`after_yaml(event)` chains the config's validation after the panel rewrote the YAML."""
        shown = [self.count, *self.rows, *self.slots]
        for comp in self.slots:
            after_yaml(comp.input(self.to_yaml, [cfg_yaml, self.count, *self.slots], [cfg_yaml, self.error],
                                  api_name=False, trigger_mode="always_last", show_progress="hidden"))
        after_yaml(self.add_btn.click(self.add, [cfg_yaml, self.count, *self.slots], [cfg_yaml, *shown],
                                      api_name="add_side"))
        for i, btn in enumerate(self.remove_btns):
            after_yaml(btn.click(partial(self.remove, i), [cfg_yaml, self.count, *self.slots],
                                 [cfg_yaml, *shown, self.error], api_name=False))
        after_yaml(self.apply_btn.click(self.apply_preset, [self.preset, cfg_yaml], [cfg_yaml, *shown],
                                        api_name="sides_preset"))
        cfg_yaml.input(self.from_yaml, [cfg_yaml], shown, api_name=False, trigger_mode="always_last",
                       show_progress="hidden")

    @property
    def shown(self) -> list[Any]:
        return [self.count, *self.rows, *self.slots]
