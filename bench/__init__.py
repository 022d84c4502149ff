"""Benchmarks: `python -m bench.kernels` times the trit kernels against torch bf16 (and humming)."""
