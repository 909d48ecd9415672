#!/usr/bin/env python3
"""Side-by-side time table from an `oxccl-bench --vs` log: collective, bytes, A µs, B µs, A/B.

usage: scripts/vs-table.py vs.log [--min BYTES] [--max BYTES]
"""
import re
import sys


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    lo, hi = 0, 1 << 62
    if "--min" in args:
        lo = int(args[args.index("--min") + 1])
    if "--max" in args:
        hi = int(args[args.index("--max") + 1])
    rows = {}
    coll = {"A": None, "B": None}
    for line in open(args[0]):
        m = re.match(r"\[(A|B)\] # Collective: (\S+)", line)
        if m:
            coll[m.group(1)] = m.group(2)
            continue
        m = re.match(r"\[(A|B)\]\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)", line)
        if m and coll[m.group(1)]:
            size = int(m.group(2))
            if lo <= size <= hi:
                rows.setdefault((coll[m.group(1)], size), {})[m.group(1)] = float(m.group(3))
    print(f"{'collective':>15} {'bytes':>11} {'A us':>9} {'B us':>9} {'A/B':>6}")
    for (c, size), t in rows.items():
        a, b = t.get("A"), t.get("B")
        ratio = f"{a / b:6.2f}" if a and b else "     -"
        print(f"{c:>15} {size:>11} {a or 0:9.1f} {b or 0:9.1f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
