"""crewbot benchmarks: `python -m bench` (or `make bench`) measures each path against a baseline in the same run.

Every benchmark runs in its own worker process (clean peak-memory figures, no state shared between them)
and reports rows of (metric, median, p95, baseline, ratio). See bench/README.md for what each row measures.
"""
