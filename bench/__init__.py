"""Benchmark harness: ``python -m bench.run`` (``make bench``); results in ``bench/RESULTS.md``."""
