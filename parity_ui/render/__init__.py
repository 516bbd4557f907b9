"""Pure renderers: a stored run in, HTML out. Used by the app (parity_ui.ui) and the static report
(parity_ui.render.report); they import neither gradio nor plotly.

May import: core, analysis."""
