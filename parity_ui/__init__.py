"""parity-ui: compare vLLM and Hugging Face transformers token by token."""

__version__ = "0.1.0"
