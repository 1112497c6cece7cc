#!/usr/bin/env python3
"""The kernels of the last decode step in an Nsight Compute CSV, one line each, and their sum.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        build/kestrel bench --device cuda --model /dev/shm/s --contexts 64 --sequences 1 --steps 2 > ncu.csv
    python3 tools/ncu_step_table.py ncu.csv

A decode step starts with the embedding gather (the last `gather_rows_kernel` launch) and runs to the end of the
file. Nsight Compute flushes the caches between kernels, so small kernels read cold data: their durations overstate
what they cost inside a step.
"""
import argparse
import csv
import io
import re
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --csv --page raw output with gpu__time_duration.sum")
    args = parser.parse_args()
    lines = open(args.csv, encoding="utf-8").read().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if header is None:
        print(f"{args.csv}: no Nsight Compute table (a line starting with \"ID\")", file=sys.stderr)
        return 1
    rows = list(csv.reader(io.StringIO("\n".join(lines[header:]))))
    names, data = rows[0], rows[2:]  # rows[1] holds the units
    try:
        kernel, duration = names.index("Kernel Name"), names.index("gpu__time_duration.sum")
        grid, block = names.index("Grid Size"), names.index("Block Size")
    except ValueError as missing:
        print(f"{args.csv}: {missing}", file=sys.stderr)
        return 1
    starts = [i for i, row in enumerate(data) if "gather_rows_kernel" in row[kernel]]
    if not starts:
        print(f"{args.csv}: no embedding gather, so no decode step to show", file=sys.stderr)
        return 1
    total = 0.0
    for row in data[starts[-1]:]:
        micros = float(row[duration].replace(",", "")) / 1000  # ns, with thousands separators
        total += micros
        print(f"{micros:8.1f} us {row[grid]:>16} {row[block]:>14}  {re.sub(r'[(].*', '', row[kernel])}")
    print(f"sum {total:.1f} us over {len(data) - starts[-1]} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
