"""Benchmarks: speed and memory of the plugin's models, the GPU check and before/after comparisons."""
