#!/usr/bin/env python3
"""Pools the rounds of several `BenchmarkPaired -v` runs (see bench_paired_test.go).

Every run logs one line per round; a single run's median moves between runs by more than its own
interval says, so `make bench-paired RUNS=n` runs the benchmark n times and this script takes the
median of all their rounds together, per case and per library-against-baseline pair, with a
distribution-free 95 % confidence interval of that median (order statistics of the binomial).

    python3 e2e/poolpaired.py run1.txt run2.txt ...
"""
import math
import re
import sys

HEADER = re.compile(r"^BenchmarkPaired/(case=\w+)$")
ROUND = re.compile(r"round +(\d+): (.*)$")
RATIO = re.compile(r"([\w-]+/[\w-]+) ([0-9.]+) \(cpu ([0-9.]+)\)")


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def ci95(xs):
    """The order statistics that bracket the median with at least 95 % confidence."""
    s = sorted(xs)
    n = len(s)
    # the largest k with P(Binomial(n, 1/2) < k) <= 2.5 %
    k, cum = 0, 0.0
    while True:
        p = math.comb(n, k) / 2**n
        if cum + p > 0.025:
            break
        cum += p
        k += 1
    if k == 0:
        return float("nan"), float("nan")
    return s[k - 1], s[n - k]


def rounds_of(path):
    """Yields (case, [ratio lines]) per case block of one run, without the testing package's
    first, one-round warm-up run."""
    case, lines = None, []
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        h = HEADER.match(line)
        if h:
            if case:
                yield case, lines
            case, lines = h.group(1), []
            continue
        m = ROUND.search(line)
        if case and m:
            lines.append((int(m.group(1)), m.group(2)))
    if case:
        yield case, lines


def main(paths):
    pooled = {}  # (case, pair) -> ([throughput ratios], [cpu ratios])
    runs = {}
    for path in paths:
        for case, lines in rounds_of(path):
            if len(lines) > 1 and lines[0][0] == 1 and lines[1][0] == 1:
                lines = lines[1:]  # the warm-up run's only round
            runs.setdefault(case, 0)
            runs[case] += 1
            for _, text in lines:
                for pair, thr, cpu in RATIO.findall(text):
                    t, c = pooled.setdefault((case, pair), ([], []))
                    t.append(float(thr))
                    c.append(float(cpu))
    for (case, pair), (t, c) in sorted(pooled.items()):
        lo, hi = ci95(t)
        clo, chi = ci95(c)
        q = sorted(t)
        print(f"{case:15s} {pair:24s} runs {runs[case]} rounds {len(t):3d}  "
              f"throughput {median(t):.3f} [{lo:.3f}, {hi:.3f}] (IQR {q[len(q) // 4]:.3f}-{q[(3 * len(q)) // 4]:.3f})  "
              f"cpu {median(c):.3f} [{clo:.3f}, {chi:.3f}]")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
