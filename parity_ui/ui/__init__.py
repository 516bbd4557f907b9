"""The Gradio app. The only package (with app.py) that imports gradio or plotly. It reaches every
command and the store through the service.

May import: service, core, inputs, render."""

from .app import create_app, launch_kwargs, main

__all__ = ["create_app", "launch_kwargs", "main"]
