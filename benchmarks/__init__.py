"""Benchmarks run by ``make bench`` (``python -m benchmarks.run``)."""
