"""What the user hands in, read and checked once: the model (demo, folder, hub id), prompts (text,
JSONL, chat template applied and tokenized ONCE), images, and a workload's prompt file (streamed).

May import: core.
"""
