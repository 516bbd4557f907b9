"""A finding's fix in the words of the place it is read: flags in a terminal, controls in the app.

Findings carry the concrete change as data (`Finding.setting`: a key, dotted for a side's option,
and a value); this module is the one place that turns it into "--set b.enforce_eager=false" or
"Sides panel: side b, enforce_eager = false". Pure.
"""

from __future__ import annotations

from typing import Any, Literal

from .types import Finding

Place = Literal["cli", "app"]
# Canonical keys the app shows as their own form field (parity_ui.ui.config_tab.FORM_KEYS).
APP_FORM_KEYS = {
    "dtype",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "logprobs",
    "max_model_len",
    "batch_size",
    "chat",
}


def _yaml_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def setting_words(key: str, value: Any, place: Place) -> str:
    side, _, option = key.partition(".")
    shown = _yaml_value(value)
    if place == "cli":
        return f"--set {key}={shown}"
    if option and side != "rope_scaling":
        return f"Sides panel: side {side}, option {option} = {shown}"
    if key in APP_FORM_KEYS:
        label = "chat template" if key == "chat" else key
        return f"Config tab: {label} = {shown}"
    return f"Config tab, YAML editor: {key}: {shown}"


def fix_text(f: Finding, place: Place) -> str:
    """The fix to show for `f` in `place`: the concrete setting first (in that place's words), then
    the prose."""
    if not f.setting:
        return f.fix
    action = setting_words(f.setting["key"], f.setting.get("value"), place)
    return f"{action} ({f.fix})" if f.fix else action
