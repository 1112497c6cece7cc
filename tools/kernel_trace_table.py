#!/usr/bin/env python3
"""A decode step's kernels as they ran on the GPU, from kestrel_cuda_kernel_trace's CSV, and where the time went.

    build/kestrel_cuda_kernel_trace /dev/shm/s 4 > trace.csv
    python3 tools/kernel_trace_table.py trace.csv [--step N]

One line per kernel of the step (the last by default): its start from the step's first kernel, its duration, the
gap since the latest end of any kernel before it (negative: it started while an earlier one was still running, as a
dependent launch does), and how much later than that latest end it ended (what it added to the step: a dependent
launch's duration counts its wait for the kernel before, this does not; the column sums to the span). Then the
step's span (first start to last end), the sum of the kernels' durations, the time no kernel ran, and durations and
additions summed by kernel name.
"""
import argparse
import collections
import csv
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="kestrel_cuda_kernel_trace output")
    parser.add_argument("--step", type=int, help="the step to show (default: the last)")
    args = parser.parse_args()
    with open(args.csv, encoding="utf-8") as f:
        rows = [row for row in csv.DictReader(f) if row.get("step", "").isdigit()]
    if not rows:
        print(f"{args.csv}: no kernel rows (a CSV with step,kernel,start_ns,end_ns,grid,block)", file=sys.stderr)
        return 1
    step = args.step if args.step is not None else max(int(r["step"]) for r in rows)
    kernels = sorted((r for r in rows if int(r["step"]) == step), key=lambda r: int(r["start_ns"]))
    if not kernels:
        print(f"{args.csv}: no kernels in step {step}", file=sys.stderr)
        return 1
    latest_end, idle, busy = None, 0, 0
    by_name = collections.Counter()
    added_by_name = collections.Counter()
    print(f"step {step}: {len(kernels)} kernels")
    print(f"{'start us':>9} {'dur us':>8} {'gap us':>8} {'adds us':>8}  grid          kernel")
    for k in kernels:
        start, end = int(k["start_ns"]), int(k["end_ns"])
        gap = 0 if latest_end is None else start - latest_end
        if gap > 0:
            idle += gap
        added = end - start if latest_end is None else max(0, end - latest_end)
        latest_end = end if latest_end is None else max(latest_end, end)
        busy += end - start
        name = k["kernel"].replace("(anonymous namespace)::", "").split("(")[0].removeprefix("void ")
        by_name[name] += end - start
        added_by_name[name] += added
        print(f"{start / 1e3:9.1f} {(end - start) / 1e3:8.1f} {gap / 1e3:8.1f} {added / 1e3:8.1f}  {k['grid']:<13} "
              f"{name[:90]}")
    span = latest_end - int(kernels[0]["start_ns"])
    print(f"span {span / 1e3:.1f} us; kernels' durations summed {busy / 1e3:.1f} us; no kernel running "
          f"{idle / 1e3:.1f} us ({100.0 * idle / span:.1f} %)")
    print("by kernel:   durations    additions")
    for name, total in by_name.most_common():
        print(f"  {total / 1e3:10.1f} us {added_by_name[name] / 1e3:9.1f} us  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
