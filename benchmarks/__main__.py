"""`python -m benchmarks [--quick]`: the benchmark suite (see benchmarks/suite.py)."""

from benchmarks.suite import main

main()
