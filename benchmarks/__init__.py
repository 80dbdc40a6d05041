"""jaxrunner benchmarks (run `python -m benchmarks`; see suite.py)."""
