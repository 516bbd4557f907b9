"""Workloads: many prompts run as one, read from a file (source), judged with pooled statistics against
the reference's own noise (stats). Importing the package imports nothing."""
