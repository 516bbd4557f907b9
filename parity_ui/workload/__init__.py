"""Workloads: many prompts run through the same sides, and the statistics pooled over them."""
