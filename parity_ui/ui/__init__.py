"""The Gradio app. The only package (with app.py) that imports gradio or plotly."""
from .app import create_app, launch_kwargs, main

__all__ = ["create_app", "launch_kwargs", "main"]
