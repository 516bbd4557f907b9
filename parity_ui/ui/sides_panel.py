"""The Sides panel: add or remove a side, pick its kind, environment, model folder and options, or a
preset pair. The config's YAML stays the one source of truth: the panel writes its `sides:` list,
and a YAML edit redraws the panel.

The conversions are pure functions (tested without a browser); `SidesPanel` builds the components
and wires them.

Which is newer, the slots or the YAML, is decided by content, never by counting events: a hidden
field (`drawn`) holds the sides the slots and the YAML last agreed on (set in the same reply that
sets the YAML or redraws the slots, so the page holds the two together). Slots that differ from it
were edited since, and win; slots equal to it were not, and the YAML (perhaps newer, its redraw of
the slots still on its way) stands. Run reads the slots as they are at the click. Counting
keystrokes in the page lagged: a paste and a Tab at once reached the server before the count of the
paste did, so the paste was taken for no edit and the run used the old sides (issue 46 item 1).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import gradio as gr
import yaml

from ..core.config import SIDE_PRESET_LABELS, SIDE_PRESETS, parse_config_text
from ..core.errors import ConfigError
from ..core.kinds import KINDS
from ..core.sides import DEFAULT_SIDES, SIDE_KEYS, parse_side_arg
from .edits import EditCounter, WriteOrder

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


def agreed(sides: list[dict[str, Any]]) -> str:
    """The sides as the slots would give them back once drawn (at most MAX_UI_SIDES, options as the
    slots parse them), in one canonical JSON text: equal texts, the same sides."""
    count, values = slots_from_sides(sides)
    return json.dumps(sides_from_slots(count, values), sort_keys=True)


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
        name = s.get("name")
        section = data.get(name) if name is not None else None  # a nameless side has no section
        if isinstance(section, dict):
            s.update(section)
    return sides


class SidesPanel:
    """The slots. A slot writes into the YAML when it is left (or on Enter, or a kind is picked),
    not on every key (parity_ui.ui.edits says why); Run writes whatever the slots hold that the YAML
    has not had (the module docstring says how that is told). The page's edit counter only orders
    two writes in flight (WriteOrder)."""

    def create_ui(self) -> None:
        with gr.Accordion("Sides: what is compared (the first is the reference)", open=False, elem_id="sides-panel"):
            with gr.Row():
                self.preset = gr.Dropdown(
                    label="Sides preset",
                    info="a ready pair of sides: pick one, then Use preset (it replaces the sides below)",
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
            # The sides the slots and the YAML last agreed on (the module docstring says why).
            self.drawn = gr.Textbox(agreed([dict(s) for s in DEFAULT_SIDES]), visible=False, elem_id="sides-drawn")
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
            sides = sides_from_slots(count, values)
            return {self.yaml: yaml_with_sides(text, sides), self.error: "", self.drawn: agreed(sides)}
        except ConfigError as e:
            return {self.error: error_html(e.message, e.fix, "Sides not usable")}

    def from_yaml(self, text: str) -> Any:
        """A YAML edit (or preset, reset, load): redraw the slots from its sides, and note them as
        agreed."""
        try:
            sides = sides_in_yaml(text)
        except ConfigError:
            return gr.skip()
        count, values = slots_from_sides(sides)
        try:
            drawn = agreed(sides)
        except ConfigError:
            drawn = ""  # sides the slots cannot give back (one has no name): whatever the slots hold differs
        return {**self._show(count, values), self.drawn: drawn}

    def agreed_in(self, text: str) -> Any:
        """After a write of the slots whole (add, remove, a preset; their outputs are an API's):
        the YAML's sides, noted as agreed. Until it lands the slots differ from the old note, so
        a Run between writes them again: the same sides."""
        try:
            return agreed(sides_in_yaml(text))
        except ConfigError:
            return gr.skip()

    def flush(
        self, request: gr.Request, text: str, drawn: str | None, edits: int | None, count: int, *values: str
    ) -> Any:
        """A slot was left (or Enter pressed, or a kind picked): slots edited since they last agreed
        with the YAML go into it, or the error box says what is wrong. A write that read older slots
        than one already written is dropped (WriteOrder says why)."""
        try:
            edited = agreed(sides_from_slots(count, list(values))) != drawn
        except ConfigError:
            edited = True  # _written names the problem
        if not edited:
            return {self.error: ""}  # left unedited (or edited back): the YAML keeps its own formatting
        if not self.order.newer(getattr(request, "session_hash", None), edits):
            return gr.skip()
        return self._written(text, count, list(values))

    def commit(self, text: str, drawn: str | None, edits: int | None, count: int, *values: str) -> Any:
        """Run pressed: the slots as they are at the click, where they were edited since they last
        agreed with the YAML, go into it before the run reads it (the write of a slot just left may
        still be on its way, or not started). Raises gr.Error when those slots do not make valid
        sides (the run would otherwise use the old ones)."""
        try:
            sides = sides_from_slots(count, list(values))
        except ConfigError as e:
            raise gr.Error(f"Sides not usable: {e.message}. Fix: {e.fix}", title="Sides not usable") from None
        if agreed(sides) == drawn:
            return gr.skip()  # not edited: the YAML is as new (or newer: its redraw of the slots is on its way)
        try:
            text = yaml_with_sides(text, sides)
        except ConfigError:
            return gr.skip()  # the YAML itself does not parse: the run says so, and stores it
        return {self.yaml: text, self.error: "", self.drawn: agreed(sides)}

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
        written = self._written(text, count - 1, vals)
        written.pop(self.drawn, None)
        return {**written, **self._show(count - 1, vals)}

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
        self.counter.count(self.slots)  # orders two writes in flight (WriteOrder); decides nothing else
        after_yaml(
            gr.on(
                [*[c.blur for c in texts], *[c.submit for c in texts], *[c.input for c in kinds]],
                self.flush,
                [cfg_yaml, *self.state],
                [cfg_yaml, self.error, self.drawn],
                api_name=False,
                trigger_mode="always_last",
                show_progress="hidden",
            )
        )
        written = [cfg_yaml, *shown]
        rewrites = [self.add_btn.click(self.add, [cfg_yaml, self.count, *self.slots], written, api_name="add_side")]
        rewrites += [
            btn.click(
                partial(self.remove, i),
                [cfg_yaml, self.count, *self.slots],
                [*written, self.error],
                api_name=False,
            )
            for i, btn in enumerate(self.remove_btns)
        ]
        rewrites.append(
            self.apply_btn.click(self.apply_preset, [self.preset, cfg_yaml], written, api_name="sides_preset")
        )
        for event in rewrites:
            event.then(self.agreed_in, [cfg_yaml], [self.drawn], api_name=False, queue=False)
            after_yaml(event)
        cfg_yaml.blur(
            self.from_yaml,
            [cfg_yaml],
            self.redrawn,
            api_name=False,
            trigger_mode="always_last",
            show_progress="hidden",
        )

    @property
    def state(self) -> list[Any]:
        """What `flush` and `commit` read after the YAML: the agreed sides, the page's edit count
        (for ordering only), the slots."""
        return [self.drawn, self.counter.edits, self.count, *self.slots]

    @property
    def shown(self) -> list[Any]:
        return [self.count, *self.rows, *self.slots]

    @property
    def redrawn(self) -> list[Any]:
        """What `from_yaml` sets: the slots shown, and the sides noted as agreed."""
        return [*self.shown, self.drawn]
