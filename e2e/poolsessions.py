#!/usr/bin/env python3
"""Pools the rounds of several `BenchmarkPairedSessions -v` runs (see bench_sessions_test.go).

The same pooling as poolpaired.py (the median of all rounds per pair, with its distribution-free 95 %
interval and the interquartile range), for the benchmark's other name:

    python3 e2e/poolsessions.py run1.txt run2.txt ...
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import poolpaired  # noqa: E402

poolpaired.HEADER = re.compile(r"^BenchmarkPairedSessions/(case=\w+)$")

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    poolpaired.main(sys.argv[1:])
