"""Performance benchmarks (not tests): `python -m benchmarks.perf` runs them all."""
