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

from ..core.config import SIDE_PRESET_LABELS, SIDE_PRESETS, parse_config_text
from ..core.errors import ConfigError
from ..core.kinds import KINDS
from ..core.sides import DEFAULT_SIDES, SIDE_KEYS, parse_side_arg
from .edits import EditCounter, WriteOrder, pending

MAX_UI_SIDES = 4  # slots on the page; the YAML and the CLI take up to parity_ui.core.sides.MAX_SIDES
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
        values += [
            str(s.get("name", "")),
            str(s.get("kind", "vllm")),
            options_text(s) if s else "",
            str(s.get("model") or ""),
            str(s.get("python") or ""),
        ]
    return min(max(len(sides), 2), MAX_UI_SIDES), values


def sides_from_slots(count: int, values: list[str]) -> list[dict[str, Any]]:
    """The shown slots as side dicts. Raises ConfigError naming the slot and the problem."""
    sides = []
    for i in range(int(count)):
        name, kind, opts, model, python = (str(v or "").strip() for v in values[5 * i : 5 * i + 5])
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
    sides = (
        [dict(s) for s in raw]
        if isinstance(raw, list) and all(isinstance(s, dict) for s in raw)
        else [dict(s) for s in DEFAULT_SIDES]
    )
    for s in sides:
        section = data.get(s.get("name"))
        if isinstance(section, dict):
            s.update(section)
    return sides


class SidesPanel:
    """The slots. A slot writes into the YAML when it is left (or on Enter, or a kind is picked),
    not on every key (parity_ui.ui.edits says why); the edit counter says whether the panel is
    newer than the YAML when Run is pressed straight from a slot."""

    def create_ui(self) -> None:
        with gr.Accordion("Sides: what is compared (the first is the reference)", open=False, elem_id="sides-panel"):
            with gr.Row():
                self.preset = gr.Dropdown(
                    label="Preset",
                    choices=[(v, k) for k, v in SIDE_PRESET_LABELS.items()],
                    value=None,
                    scale=3,
                    elem_id="sides-preset",
                )
                self.apply_btn = gr.Button("Use preset", scale=1, elem_id="sides-apply")
                self.add_btn = gr.Button("Add side", scale=1, elem_id="sides-add")
            count, values = slots_from_sides([dict(s) for s in DEFAULT_SIDES])
            self.count = gr.State(count)
            self.rows: list[Any] = []
            self.slots: list[Any] = []
            self.remove_btns: list[Any] = []
            kinds = [(f"{k.label}", k.name) for k in KINDS.values()]
            for i in range(MAX_UI_SIDES):
                v = values[5 * i : 5 * i + 5]
                with gr.Row(visible=i < count, equal_height=True) as row:
                    name = gr.Textbox(
                        v[0],
                        label="reference side" if i == 0 else f"side {i + 1}",
                        scale=1,
                        elem_id=f"side-{i}-name",
                        max_lines=1,
                    )
                    kind = gr.Dropdown(kinds, value=v[1], label="kind", scale=1, elem_id=f"side-{i}-kind")
                    opts = gr.Textbox(
                        v[2],
                        label="options (key=value, ...)",
                        scale=3,
                        elem_id=f"side-{i}-options",
                        max_lines=1,
                        placeholder="dtype=bfloat16, enforce_eager=false",
                    )
                    model = gr.Textbox(
                        v[3],
                        label="model folder (optional)",
                        scale=2,
                        elem_id=f"side-{i}-model",
                        max_lines=1,
                        placeholder="the run's model",
                    )
                    python = gr.Textbox(
                        v[4],
                        label="python of another env (optional)",
                        scale=2,
                        elem_id=f"side-{i}-python",
                        max_lines=1,
                        placeholder="this environment",
                    )
                    rm = gr.Button("Remove", scale=0, size="sm", elem_id=f"side-{i}-remove")
                self.rows.append(row)
                self.slots += [name, kind, opts, model, python]
                self.remove_btns.append(rm)
            self.error = gr.HTML(elem_id="sides-error")
            self.counter = EditCounter("sides")
            self.order = WriteOrder()

    # -- handlers ------------------------------------------------------------------------------

    def _show(self, count: int, values: list[str]) -> dict[Any, Any]:
        return {
            self.count: count,
            **{row: gr.Row(visible=i < count) for i, row in enumerate(self.rows)},
            **dict(zip(self.slots, values)),
        }

    def _written(self, text: str, count: int, values: list[str]) -> dict[Any, Any]:
        """The slots' sides written into the YAML, or the error box saying what is wrong with them."""
        from ..render.cards import error_html

        try:
            return {self.yaml: yaml_with_sides(text, sides_from_slots(count, values)), self.error: ""}
        except ConfigError as e:
            return {self.error: error_html(e.message, e.fix, "Sides not usable")}

    def from_yaml(self, text: str, edits: int | None) -> Any:
        """A YAML edit (or preset, reset, load): redraw the slots from its sides (so the panel is
        as new as the YAML: `synced` catches up with `edits`)."""
        try:
            sides = sides_in_yaml(text)
        except ConfigError:
            return gr.skip()
        count, values = slots_from_sides(sides)
        return {**self._show(count, values), self.counter.synced: edits}

    def flush(
        self, request: gr.Request, text: str, edits: int | None, synced: int | None, count: int, *values: str
    ) -> Any:
        """A slot was left (or Enter pressed, or a kind picked): its edits since the last write go
        into the YAML, or the error box says what is wrong (and they stay pending). A write that
        read older slots than one already written is dropped (WriteOrder says why)."""
        if not pending(edits, synced):
            return gr.skip()
        if not self.order.newer(getattr(request, "session_hash", None), edits):
            return gr.skip()
        out = self._written(text, count, list(values))
        if self.yaml in out:
            out[self.counter.synced] = edits  # after the YAML in `outputs`: a Run reading between sees it pending
        return out

    def commit(self, text: str, edits: int | None, synced: int | None, count: int, *values: str) -> Any:
        """Before a run: edits the YAML has not had yet go in. Pressing Run straight from a slot
        leaves it, but that write is still on its way when the run reads the YAML. Raises gr.Error
        when those edits do not make valid sides (the run would otherwise use the old ones)."""
        if not pending(edits, synced):
            return gr.skip()
        try:
            sides = sides_from_slots(count, list(values))
        except ConfigError as e:
            raise gr.Error(f"Sides not usable: {e.message}. Fix: {e.fix}", title="Sides not usable") from None
        try:
            text = yaml_with_sides(text, sides)
        except ConfigError:
            return gr.skip()  # the YAML itself does not parse: the run says so, and stores it
        return {self.yaml: text, self.error: "", self.counter.synced: edits}

    def add(self, text: str, count: int, *values: str) -> Any:
        if count >= MAX_UI_SIDES:
            return gr.skip()
        names = {values[5 * i] for i in range(count)}
        new = next(f"s{j}" for j in range(2, 99) if f"s{j}" not in names)
        vals = list(values)
        vals[5 * count : 5 * count + 5] = [new, "vllm", "", "", ""]
        out = self._show(count + 1, vals)
        written = self._written(text, count + 1, vals)
        if self.yaml in written:
            out[self.yaml] = written[self.yaml]
        return out

    def remove(self, index: int, text: str, count: int, *values: str) -> Any:
        if count <= 2:
            from ..render.cards import notice_html

            return {self.error: notice_html("A comparison needs two sides: change this one instead of removing it.")}
        vals = list(values)
        del vals[5 * index : 5 * index + 5]
        vals += ["", "vllm", "", "", ""]
        return {**self._written(text, count - 1, vals), **self._show(count - 1, vals)}

    def apply_preset(self, name: str | None, text: str) -> Any:
        if name not in SIDE_PRESETS:
            return gr.skip()
        sides = [dict(s) for s in SIDE_PRESETS[name]]
        count, values = slots_from_sides(sides)
        return {self.yaml: yaml_with_sides(text, sides), **self._show(count, values)}

    # -- events --------------------------------------------------------------------------------

    def create_event_handlers(self, cfg_yaml: Any, after_yaml: Any) -> None:
        """`after_yaml(event)` chains the config's validation after the panel rewrote the YAML."""
        self.yaml = cfg_yaml
        shown = [self.count, *self.rows, *self.slots]
        texts = [c for c in self.slots if isinstance(c, gr.Textbox)]
        kinds = [c for c in self.slots if not isinstance(c, gr.Textbox)]
        self.counter.count(self.slots)  # before `flush`: a kind's pick triggers both
        after_yaml(
            gr.on(
                [*[c.blur for c in texts], *[c.submit for c in texts], *[c.input for c in kinds]],
                self.flush,
                [cfg_yaml, *self.state],
                [cfg_yaml, self.error, self.counter.synced],
                api_name=False,
                trigger_mode="always_last",
                show_progress="hidden",
            )
        )
        rewrites = [
            self.add_btn.click(self.add, [cfg_yaml, self.count, *self.slots], [cfg_yaml, *shown], api_name="add_side")
        ]
        rewrites += [
            btn.click(
                partial(self.remove, i),
                [cfg_yaml, self.count, *self.slots],
                [cfg_yaml, *shown, self.error],
                api_name=False,
            )
            for i, btn in enumerate(self.remove_btns)
        ]
        rewrites.append(
            self.apply_btn.click(
                self.apply_preset, [self.preset, cfg_yaml], [cfg_yaml, *shown], api_name="sides_preset"
            )
        )
        for event in rewrites:
            event.then(
                self.counter.caught_up, [self.counter.edits], [self.counter.synced], api_name=False, queue=False
            )  # the slots were written whole: nothing is pending
            after_yaml(event)
        cfg_yaml.blur(
            self.from_yaml,
            [cfg_yaml, self.counter.edits],
            self.redrawn,
            api_name=False,
            trigger_mode="always_last",
            show_progress="hidden",
        )

    @property
    def state(self) -> list[Any]:
        """What `flush` and `commit` read after the YAML: the two counters, the slots."""
        return [self.counter.edits, self.counter.synced, self.count, *self.slots]

    @property
    def shown(self) -> list[Any]:
        return [self.count, *self.rows, *self.slots]

    @property
    def redrawn(self) -> list[Any]:
        """What `from_yaml` sets: the slots shown, and the counter of edits written."""
        return [*self.shown, self.counter.synced]
