"""Benchmarks: ``python -m bench.run`` prints ratios against baselines measured in the same run."""
