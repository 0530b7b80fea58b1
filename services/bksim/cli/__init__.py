"""Composition roots and the `bksim` command: the only place that picks concrete classes and reads configuration."""
