#!/usr/bin/env python3
"""Summarises the `compute-table:` lines of several runs of tests/compute_shares.rs (the logs that
scripts/bench/compute-under-load writes): for each scenario, the range of what was measured over the
runs. Usage: scripts/bench/compute_summary.py LOG..."""
import re
import sys
from collections import defaultdict

# A figure is a number with its unit; bare numbers in a line are part of its text ("p99", "2 GPUs").
NUMBER = re.compile(r"(-?\d+(?:\.\d+)?) ?(%|us\b|ms\b|x\b)")


def figures(line):
    """The scenario's name and its measured figures (shares: each tenant's measured share)."""
    body = line.split("compute-table:", 1)[1].strip()
    if body.startswith("[") or ": [(" in body:
        name, rest = body.split(": [", 1)
        measured = [float(m) for m in re.findall(r"\(\"\w+\", [\d.]+, ([\d.]+)\)", rest)]
        return name, measured
    if ": missed" in body or "starved" in body or "alone without gpuslice" in body:
        return None
    name = re.split(r"[:(]", body, 1)[0].strip()
    return name, [f"{float(n):g} {u}" for n, u in NUMBER.findall(body[len(name):])]


def span(column):
    """min-max of one figure over the runs (shares are numbers, others "value unit" strings)."""
    if isinstance(column[0], str):
        unit = column[0].split()[1]
        values = [float(v.split()[0]) for v in column]
    else:
        unit, values = "", list(column)
    lo, hi = min(values), max(values)
    text = f"{lo:.1f}" if lo == hi else f"{lo:.1f}-{hi:.1f}"
    return f"{text} {unit}".strip()


def main():
    runs = defaultdict(list)
    for path in sys.argv[1:]:
        seen = set()
        for line in open(path, errors="replace"):
            if "compute-table:" not in line:
                continue
            got = figures(line)
            if got is None:
                continue
            name, values = got
            if name in seen:  # a second run after a starved control replaces the first
                runs[name][-1] = values
                continue
            seen.add(name)
            runs[name].append(values)
    for name, series in runs.items():
        columns = list(zip(*[s for s in series if len(s) == len(series[0])]))
        ranges = ", ".join(span(c) for c in columns)
        print(f"{name} ({len(series)} runs): {ranges}")


if __name__ == "__main__":
    main()
